"""One local cluster created at a time on the machine (tools/cluster.py ``CREATE_LOCK``).

kwokctl picks each component's port as the first free one below 32767, in each process on its
own, so two clusters created at once (two xdist workers, the second cluster of a test) would
get the same ports. The creation holds a machine-wide lock until its components listen.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import threading
from pathlib import Path

import pytest

from tools import cluster


def _locked_elsewhere(lock: Path) -> bool:
    fd = os.open(lock, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


@pytest.fixture
def lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "create.lock"
    monkeypatch.setattr(cluster, "CREATE_LOCK", path)
    return path


def test_kwokctl_create_runs_with_the_machine_wide_lock_held(
    lock: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PMEM_CSI_STATE_DIR", str(tmp_path / "state"))
    (tmp_path / "state").mkdir()
    monkeypatch.setattr(cluster.toolchain, "build_all", lambda groups: None)
    monkeypatch.setattr(cluster, "is_running", lambda: False)
    monkeypatch.setattr(cluster, "stop", lambda quiet=False: None)
    seen: list[bool] = []

    def create(config: Path, kubeconfig: Path) -> subprocess.CompletedProcess[str]:
        seen.append(_locked_elsewhere(lock))
        return subprocess.CompletedProcess(["kwokctl"], 1, "", "refused for the test")

    monkeypatch.setattr(cluster, "_create_cluster", create)
    with pytest.raises(RuntimeError, match="kwokctl create cluster failed"):
        cluster.start()
    assert seen == [True]
    # Released afterwards, also when the creation failed.
    assert not _locked_elsewhere(lock)


def test_a_second_creation_waits_for_the_first(lock: Path) -> None:
    order: list[str] = []
    first_inside = threading.Event()
    release_first = threading.Event()

    def first() -> None:
        with cluster.one_create_at_a_time():
            order.append("first in")
            first_inside.set()
            release_first.wait(30)
            order.append("first out")

    def second() -> None:
        first_inside.wait(30)
        with cluster.one_create_at_a_time():
            order.append("second in")

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    first_inside.wait(30)
    # flock locks belong to open file descriptions: the second thread's own open() blocks.
    assert _locked_elsewhere(lock)
    release_first.set()
    for t in threads:
        t.join(30)
    assert order == ["first in", "first out", "second in"]


def test_the_lock_is_reentrant_in_its_thread_and_released_by_the_outermost_exit(
    lock: Path,
) -> None:
    """A creation restarts an exited component while it holds the lock (ensure_controllers)."""
    with cluster.one_create_at_a_time():
        with cluster.one_create_at_a_time():
            assert _locked_elsewhere(lock)
        assert _locked_elsewhere(lock)
    assert not _locked_elsewhere(lock)
