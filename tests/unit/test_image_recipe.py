"""The reporter image's recipe (tools/image.py): its inputs, pins and cache key.

Building and running the image is tests/e2e/test_reporter_image.py; these checks catch a
stale lock or a cache key that would miss a change, without root or network.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pmem_components.manifests.reporter import REPORTER_UID
from tools import image

ROOT = Path(__file__).resolve().parents[2]


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        match = re.match(r"^([A-Za-z0-9_.-]+)==([^\s;]+)", line)
        if match:
            pins[match.group(1).lower().replace("_", "-")] = match.group(2)
    return pins


def test_every_reporter_pin_is_in_the_wheel_lock_at_the_same_version() -> None:
    """A requirements bump without `python -m tools.image lock` fails here."""
    wanted = _pins(ROOT / "reporter" / "requirements.txt")
    locked = _pins(image.WHEELS_LOCK)
    assert wanted
    assert {k: locked.get(k) for k in wanted} == wanted


def test_every_locked_wheel_has_a_sha256() -> None:
    lines = [
        line
        for line in image.WHEELS_LOCK.read_text(encoding="utf-8").splitlines()
        if line and not line.startswith("#")
    ]
    assert lines
    for line in lines:
        assert re.fullmatch(r"[a-z0-9.-]+==\S+ --hash=sha256:[0-9a-f]{64}", line), line


def test_debian_lock_pins_python_and_no_compiler_or_shell() -> None:
    pins = image.read_packages_lock()
    assert pins["python3.11"].startswith("3.11.")
    assert all(re.fullmatch(r"[a-z0-9][a-z0-9.+-]*", name) for name in pins)
    for unwanted in ("gcc-12", "cpp-12", "binutils", "dash", "bash", "python3-pip", "apt"):
        assert unwanted not in pins


def test_sources_are_the_reporter_and_the_pmem_components_it_imports() -> None:
    sources = {str(p) for p in image.reporter_sources()}
    assert {str(p.relative_to(ROOT)) for p in (ROOT / "reporter").glob("*.py")} <= sources
    assert {"pmem_components/__init__.py", "pmem_components/names.py"} <= sources
    assert "pmem_components/certs.py" in sources
    # Lazily imported Pulumi parts and the config model stay out of the image.
    for absent in ("config.py", "components.py", "program.py", "cert_resource.py"):
        assert f"pmem_components/{absent}" not in sources


def test_the_cache_key_covers_every_input_and_the_epoch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    inputs = {str(p) for p in image.input_files()}
    assert {
        "tools/image.py",
        "reporter/image-packages.lock",
        "reporter/requirements-image.txt",
        "reporter/requirements.txt",
        "reporter/__main__.py",
        "pmem_components/certs.py",
    } <= inputs
    key = image.cache_key()
    assert key == image.cache_key()
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1")
    assert image.cache_key() != key


def test_the_image_user_is_the_pods_run_as_user() -> None:
    assert image.reporter_uid() == REPORTER_UID != 0
