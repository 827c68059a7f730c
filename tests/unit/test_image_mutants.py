"""The reporter image's cache key (:func:`tools.image.cache_key`) follows file contents.

Why: ``make image`` rebuilds only when the key changes. The recipe test checks which files
the key covers and that the epoch is in it; a key made of the file names alone passed it
(mutation testing found it), and an edit of ``reporter/status.py`` would then ship the old
image from the cache.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tools import image


def test_the_cache_key_changes_when_an_input_file_changes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "reporter").mkdir()
    source = tmp_path / "reporter" / "status.py"
    lock = tmp_path / "image-packages.lock"
    source.write_text("PHASE = 'Running'\n", encoding="utf-8")
    lock.write_text("busybox 1\n", encoding="utf-8")
    monkeypatch.setattr(image, "PROJECT_DIR", tmp_path)
    monkeypatch.setattr(
        image, "input_files", lambda: [Path("reporter/status.py"), Path("image-packages.lock")]
    )
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")

    before = image.cache_key()
    assert image.cache_key() == before  # same contents, same key

    source.write_text("PHASE = 'Failed'\n", encoding="utf-8")
    after_source = image.cache_key()
    assert after_source != before

    lock.write_text("busybox 2\n", encoding="utf-8")
    assert image.cache_key() not in (before, after_source)

    # Back to the first contents: back to the first key (the key is of contents, not times).
    source.write_text("PHASE = 'Running'\n", encoding="utf-8")
    lock.write_text("busybox 1\n", encoding="utf-8")
    assert image.cache_key() == before
