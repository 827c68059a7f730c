"""Where the CRD file is found (:func:`pmem_components.manifests.crd._crd_file`) in a checkout.

Why: ``CRD_FILE`` is computed once at import, so the tests that load the CRD never run the
look-up again; mutation testing found a wrong fallback path unnoticed.
"""

from __future__ import annotations

from pathlib import Path

from pmem_components.manifests import crd

ROOT = Path(__file__).resolve().parents[2]


def test_the_crd_file_is_the_checkouts_or_the_packaged_copy_of_it() -> None:
    found = crd._crd_file()
    assert found.is_file()
    expected = (ROOT / "crd" / crd.CRD_FILENAME).read_text(encoding="utf-8")
    assert found.read_text(encoding="utf-8") == expected
    assert crd.load_crd(found)["kind"] == "CustomResourceDefinition"
