"""The reporter image's recipe (tools/image.py): its inputs, pins and cache key.

Building and running the image is tests/e2e/test_reporter_image.py; these checks catch a
stale lock or a cache key that would miss a change, without root or network.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
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


class FakeHost:
    """``shutil.which`` and ``subprocess.run`` of a host where apt-get installs packages."""

    def __init__(self, present: set[str], lists_fresh: bool) -> None:
        self.present = set(present)
        self.lists_fresh = lists_fresh
        self.calls: list[list[str]] = []

    def which(self, name: str) -> str | None:
        return f"/usr/bin/{name}" if name in self.present | {"apt-get"} else None

    def run(self, cmd: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        self.calls.append(list(cmd))
        if cmd[:2] == ["apt-get", "update"]:
            self.lists_fresh = True
        elif cmd[:2] == ["apt-get", "install"]:
            if not self.lists_fresh:
                return subprocess.CompletedProcess(cmd, 100, "", "E: Unable to locate package")
            self.present |= set(cmd[4:])
        return subprocess.CompletedProcess(cmd, 0, "", "")


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch) -> Callable[..., FakeHost]:
    def make(present: set[str], lists_fresh: bool = True) -> FakeHost:
        fake = FakeHost(present, lists_fresh)
        monkeypatch.setattr(image.shutil, "which", fake.which)
        monkeypatch.setattr(image.subprocess, "run", fake.run)
        monkeypatch.setattr(image.os, "geteuid", lambda: 0)
        return fake

    return make


def test_host_tools_present_means_no_apt_get(host: Callable[..., FakeHost]) -> None:
    fake = host({"mmdebstrap", "umoci", "skopeo", "runc"})
    image.ensure_host_tools()
    assert fake.calls == []


def test_only_missing_host_tools_are_installed(host: Callable[..., FakeHost]) -> None:
    fake = host({"mmdebstrap", "runc"})
    image.ensure_host_tools()
    assert fake.calls == [["apt-get", "install", "-y", "-q", "umoci", "skopeo"]]


def test_a_fresh_machine_gets_package_lists_first(host: Callable[..., FakeHost]) -> None:
    fake = host(set(), lists_fresh=False)
    image.ensure_host_tools()
    assert [c[:2] for c in fake.calls] == [
        ["apt-get", "install"],
        ["apt-get", "update"],
        ["apt-get", "install"],
    ]
    assert fake.present >= {"mmdebstrap", "umoci", "skopeo", "runc"}


def test_missing_host_tools_without_root_name_the_packages(
    host: Callable[..., FakeHost], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = host({"mmdebstrap"})
    monkeypatch.setattr(image.os, "geteuid", lambda: 1000)
    with pytest.raises(image.ImageError, match="umoci skopeo runc"):
        image.ensure_host_tools()
    assert fake.calls == []


def test_mirrors_come_from_the_hosts_apt_sources_in_both_formats(tmp_path: Path) -> None:
    """The image is built from the mirror the host's apt uses, not from a fixed host name."""
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list").write_text(
        "# comment\ndeb [arch=amd64] http://mirror.example/debian bookworm-updates main\n"
        "deb http://mirror.example/debian trixie main\n"
    )
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm\n"
        "Components: main contrib\n\nTypes: deb-src\nURIs: http://src.example\n"
        "Suites: bookworm\nComponents: main\n\nTypes: deb\nURIs: http://off.example\n"
        "Suites: bookworm\nComponents: main\nEnabled: no\n"
    )
    assert image.host_mirrors(tmp_path) == [
        "deb http://mirror.example/debian bookworm-updates main",
        "deb http://mirror.example/debian bookworm main contrib",
    ]


def test_no_source_for_the_suite_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "sources.list").write_text("deb http://mirror.example/debian trixie main\n")
    with pytest.raises(image.ImageError, match="no apt source for Debian bookworm"):
        image.host_mirrors(tmp_path)
