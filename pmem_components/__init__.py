"""PMEM-CSI driver deployment as Pulumi component resources.

Importing this package is cheap and does not import pulumi: the reporter shares
``pmem_components.names`` and ``pmem_components.certs`` with the Pulumi program, and must run
without the Pulumi SDK. The component classes are loaded on first attribute access.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ControllerDriver", "NodeDriver", "PmemCsiDeployment"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from pmem_components import components

        return getattr(components, name)
    raise AttributeError(f"module 'pmem_components' has no attribute {name!r}")
