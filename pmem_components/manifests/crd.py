"""The CustomResourceDefinition of ``deployments.pmem-csi.intel.com``, loaded from ``crd/``.

The YAML file is the source of truth so that clusters that manage the CRD elsewhere
(``pmem-csi:manageCrd: false``) can ``kubectl apply`` the very same file. The wheel ships it
as package data (``pmem_components/crd/``, mapped from ``crd/`` in pyproject.toml), so
``install_crd()`` works from an installed package; in a checkout it is read from ``crd/``.
"""

from __future__ import annotations

from importlib import resources
from importlib.abc import Traversable
from pathlib import Path
from typing import Any

import yaml

from pmem_components import names

CRD_FILENAME = f"{names.CRD_GROUP}_{names.CRD_PLURAL}.yaml"


def _crd_file() -> Path | Traversable:
    """The packaged file (also inside a zipped wheel), else the checkout's ``crd/``."""
    packaged = resources.files("pmem_components") / "crd" / CRD_FILENAME
    if packaged.is_file():
        return packaged
    return Path(__file__).resolve().parents[2] / "crd" / CRD_FILENAME


CRD_FILE = _crd_file()


def load_crd(path: Path | Traversable = CRD_FILE) -> dict[str, Any]:
    """The CRD object as a dict; the file must hold exactly one document."""
    docs = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]
    if len(docs) != 1 or docs[0].get("kind") != "CustomResourceDefinition":
        raise ValueError(f"{path}: expected exactly one CustomResourceDefinition")
    return docs[0]
