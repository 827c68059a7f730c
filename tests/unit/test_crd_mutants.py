"""Where the CRD file is found (:func:`pmem_components.manifests.crd._crd_file`) in a checkout.

Why: ``CRD_FILE`` is computed once at import, so the tests that load the CRD never run the
look-up again; mutation testing found a wrong fallback path unnoticed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pmem_components.manifests import crd

ROOT = Path(__file__).resolve().parents[2]


def test_the_crd_file_is_the_checkouts_or_the_packaged_copy_of_it() -> None:
    found = crd._crd_file()
    assert found.is_file()
    expected = (ROOT / "crd" / crd.CRD_FILENAME).read_text(encoding="utf-8")
    assert found.read_text(encoding="utf-8") == expected
    assert crd.load_crd(found)["kind"] == "CustomResourceDefinition"


# ------------------------------------------------------------------ what load_crd accepts


@pytest.mark.parametrize(
    "text",
    [
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n",
        "kind: CustomResourceDefinition\n---\nkind: CustomResourceDefinition\n",
    ],
    ids=["one-document-of-another-kind", "two-crds"],
)
def test_load_crd_refuses_a_single_other_object_and_a_second_crd(tmp_path: Path, text: str) -> None:
    """``install_crd`` applies whatever ``load_crd`` returns as the CRD: a file holding one
    object of another kind, or two CRDs (of which one would be dropped silently), must be
    refused, not half-used."""
    bad = tmp_path / "x.yaml"
    bad.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match="expected exactly one CustomResourceDefinition"):
        crd.load_crd(bad)
