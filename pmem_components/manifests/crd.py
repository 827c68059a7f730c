"""The CustomResourceDefinition of ``deployments.pmem-csi.intel.com``, loaded from ``crd/``.

The YAML file is the source of truth so that clusters that manage the CRD elsewhere
(``pmem-csi:manageCrd: false``) can ``kubectl apply`` the very same file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from pmem_components import names

CRD_FILE = (
    Path(__file__).resolve().parents[2] / "crd" / f"{names.CRD_GROUP}_{names.CRD_PLURAL}.yaml"
)


def load_crd(path: Path = CRD_FILE) -> dict[str, Any]:
    """The CRD object as a dict; the file must hold exactly one document."""
    with path.open(encoding="utf-8") as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    if len(docs) != 1 or docs[0].get("kind") != "CustomResourceDefinition":
        raise ValueError(f"{path}: expected exactly one CustomResourceDefinition")
    return docs[0]
