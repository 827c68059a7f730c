"""The mutual-TLS check needs no writable file system (the reporter's pod has a read-only root).

``SSLContext.load_cert_chain`` only reads paths; the check used to write a temporary file for
it, so in its own container (read-only root, no /tmp volume) every verdict failed with "No
usable temporary directory found". Here every way to make a temporary file fails, and the
handshake must still run and still tell a good set from a bad one.
"""

from __future__ import annotations

import builtins
import datetime as dt
import os
import tempfile
from typing import Any

import pytest
from certutil import good_set

from pmem_components import certs
from reporter.certcheck import FAILURE_RETRY, CertVerifier, VerifierError


@pytest.fixture
def no_temp_files(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make every file creation fail, as on a read-only root; record the attempts."""
    attempts: list[str] = []

    def refuse(*args: Any, **_: Any) -> Any:
        attempts.append(str(args[:1]))
        raise OSError(30, "Read-only file system")

    for name in ("TemporaryDirectory", "mkdtemp", "mkstemp", "NamedTemporaryFile"):
        monkeypatch.setattr(tempfile, name, refuse)
    monkeypatch.setattr(tempfile, "tempdir", "/nonexistent-read-only")
    real_open, real_os_open = builtins.open, os.open

    def guarded_open(file: Any, mode: str = "r", *a: Any, **k: Any) -> Any:
        if any(c in mode for c in "wax+"):
            refuse(file)
        return real_open(file, mode, *a, **k)

    def guarded_os_open(path: Any, flags: int, *a: Any, **k: Any) -> int:
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            refuse(path)
        return real_os_open(path, flags, *a, **k)

    monkeypatch.setattr(builtins, "open", guarded_open)
    monkeypatch.setattr(os, "open", guarded_os_open)
    return attempts


def test_handshake_runs_without_any_writable_file_system(no_temp_files: list[str]) -> None:
    assert certs.check_mutual_tls(*good_set().args()) == []
    assert certs.validate_driver_certificates(*good_set().args()) == []
    assert no_temp_files == []


def test_handshake_still_rejects_without_writable_file_system(no_temp_files: list[str]) -> None:
    s = good_set()
    s.node_controller_cert, s.node_controller_key = s.registry_cert, s.registry_key
    problems = certs.check_mutual_tls(*s.args())
    assert [(p.field, p.reason) for p in problems] == [("nodeControllerCert", "HandshakeFailed")]
    assert no_temp_files == []


def test_no_descriptor_is_left_open() -> None:
    before = set(os.listdir("/proc/self/fd"))
    for _ in range(3):
        assert certs.check_mutual_tls(*good_set().args()) == []
    assert set(os.listdir("/proc/self/fd")) <= before


def test_without_memfd_it_falls_back_to_a_temporary_file(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delattr(os, "memfd_create")
    made: list[str] = []
    real = tempfile.TemporaryDirectory

    def spy(*a: Any, **k: Any) -> Any:
        made.append("dir")
        return real(*a, **k)

    monkeypatch.setattr(tempfile, "TemporaryDirectory", spy)
    assert certs.check_mutual_tls(*good_set().args()) == []
    assert made == ["dir", "dir"]  # one per side


NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def test_a_failing_verifier_is_cached_for_the_retry_interval() -> None:
    runs: list[int] = []

    def broken(*_: Any, **__: Any) -> list[certs.CertProblem]:
        runs.append(1)
        raise OSError("No usable temporary directory found")

    verifier = CertVerifier(broken)
    args = good_set().args()
    for when in (NOW, NOW + FAILURE_RETRY / 2):
        # Raised as VerifierError naming the original (issue 16: no cached exception object).
        with pytest.raises(VerifierError, match="OSError: No usable temporary directory"):
            verifier(*args, now=when)
    assert len(runs) == 1
    with pytest.raises(VerifierError):
        verifier(*args, now=NOW + FAILURE_RETRY)
    assert len(runs) == 2
