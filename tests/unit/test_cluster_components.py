"""The local cluster starts again a component that exited (tools/cluster.py ``ensure_controllers``).

kube-controller-manager exits when the API server is not healthy 10 s after it took its Lease,
and kwokctl never restarts it: the cluster then has no controllers, and every rollout waits
forever. The start finds such a component by its pid file and has kwokctl start it again.
"""

from __future__ import annotations

import subprocess
import sys
import time
import types
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.unit.procs import running_as
from tools import cluster, toolchain


@pytest.fixture
def pids(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PMEM_CSI_STATE_DIR", str(tmp_path))
    path = cluster._component_pids_dir()
    path.mkdir(parents=True)
    return path


def _binary(name: str) -> str:
    return str(cluster.cluster_dir() / "bin" / name)


@pytest.fixture
def controller_manager(pids: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A process whose program is this cluster's kube-controller-manager (``exec -a``)."""
    proc = subprocess.Popen(
        ["bash", "-c", f"exec -a {_binary('kube-controller-manager')} sleep 600"]
    )
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _wait_exec(proc: subprocess.Popen[bytes]) -> None:
    while Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")[0] != (
        _binary("kube-controller-manager").encode()
    ):
        time.sleep(0.01)


def test_a_component_is_dead_when_its_process_is_gone_reused_or_unreadable(
    pids: Path, controller_manager: subprocess.Popen[bytes]
) -> None:
    _wait_exec(controller_manager)
    (pids / "kube-controller-manager.pid").write_text(f"{controller_manager.pid}\n")
    # The same PID under another component's name: the PID now names another program.
    (pids / "kube-scheduler.pid").write_text(f"{controller_manager.pid}\n")
    gone = subprocess.Popen(["true"])
    gone.wait()
    (pids / "etcd.pid").write_text(str(gone.pid))
    (pids / "kwok-controller.pid").write_text("not a pid")
    # Another cluster's kube-apiserver under a PID reused for this one's: not this cluster's.
    other = subprocess.Popen(["bash", "-c", "exec -a /elsewhere/bin/kube-apiserver sleep 600"])
    try:
        while b"/elsewhere" not in Path(f"/proc/{other.pid}/cmdline").read_bytes():
            time.sleep(0.01)
        (pids / "kube-apiserver.pid").write_text(str(other.pid))
        assert cluster.dead_components() == [
            "etcd",
            "kube-apiserver",
            "kube-scheduler",
            "kwok-controller",
        ]
    finally:
        other.kill()
        other.wait()


def test_a_zombie_component_is_dead(pids: Path) -> None:
    proc = subprocess.Popen(["bash", "-c", f"exec -a {_binary('kube-scheduler')} sleep 0"])
    (pids / "kube-scheduler.pid").write_text(str(proc.pid))
    try:
        while Path(f"/proc/{proc.pid}/stat").read_text().split(") ")[1][0] != "Z":
            time.sleep(0.01)
        assert cluster.dead_components() == ["kube-scheduler"]
    finally:
        proc.wait()


def _fake_cluster(
    monkeypatch: pytest.MonkeyPatch, dead: list[list[str]], working: list[bool]
) -> list[str]:
    started: list[str] = []
    monkeypatch.setattr(cluster, "dead_components", lambda: dead.pop(0) if dead else [])
    monkeypatch.setattr(cluster, "_controllers_working", lambda restarted: working.pop(0))
    monkeypatch.setattr(cluster, "_forget_lease", lambda name: started.append(f"lease {name}"))
    monkeypatch.setattr(cluster.time, "sleep", lambda s: None)

    def start_component(name: str) -> None:
        # The restart holds the creation lock: the exited component's port is free.
        assert getattr(cluster._lock_held, "depth", 0) == 1
        started.append(name)

    monkeypatch.setattr(cluster, "start_component", start_component)
    return started


def test_an_exited_controller_manager_is_started_again_then_awaited(
    pids: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(cluster, "CREATE_LOCK", tmp_path / "create.lock")
    # Each round reads the pid files twice: before and again under the creation lock.
    dead = [["kube-controller-manager"], ["kube-controller-manager"], []]
    started = _fake_cluster(monkeypatch, dead, [False, True])
    cluster.ensure_controllers()
    # Its Lease is deleted first: the successor need not wait for the dead holder's to expire.
    assert started == ["lease kube-controller-manager", "kube-controller-manager"]


def test_a_component_that_keeps_exiting_is_an_error_naming_it_and_its_log(
    pids: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(cluster, "CREATE_LOCK", tmp_path / "create.lock")
    dead = [["kube-controller-manager"]] * (2 * cluster.MAX_COMPONENT_RESTARTS + 1)
    started = _fake_cluster(monkeypatch, dead, [])
    with pytest.raises(RuntimeError, match=r"kube-controller-manager exited again after 3") as err:
        cluster.ensure_controllers()
    assert "kube-controller-manager.log" in str(err.value)
    assert (
        started
        == [
            "lease kube-controller-manager",
            "kube-controller-manager",
        ]
        * cluster.MAX_COMPONENT_RESTARTS
    )


def test_controllers_that_never_work_time_out_naming_what_is_missing(
    pids: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = iter(range(0, 10_000, 100))
    monkeypatch.setattr(cluster.time, "monotonic", lambda: float(next(clock)))
    _fake_cluster(monkeypatch, [], [False] * 100)
    with pytest.raises(TimeoutError, match="no kube-scheduler Lease holder"):
        cluster.ensure_controllers(timeout=250)


@pytest.mark.parametrize(
    ("component", "dead"),
    [
        ("kube-apiserver", [["kube-apiserver"], ["kube-apiserver"], []]),
        ("etcd", [["etcd"], ["etcd"], []]),
        # Dead kube-controller-manager at the first read; by the time the creation lock is
        # held the API server died too (a second review of 011138f).
        (
            "kube-apiserver",
            [["kube-controller-manager"], ["kube-apiserver", "kube-controller-manager"], []],
        ),
    ],
    ids=["api-server", "etcd", "api-server-dead-only-under-the-lock"],
)
def test_the_api_server_or_etcd_of_a_running_cluster_is_never_started_again(
    component: str,
    dead: list[list[str]],
    pids: Path,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    # Its etcd may hold the real node's Node, whose host routes another checkout's teardown
    # removed once this API server was gone: started again, it could dial the node's address
    # off the machine (review of 011138f). The next start creates the cluster anew instead.
    monkeypatch.setattr(cluster, "CREATE_LOCK", tmp_path / "create.lock")
    started = _fake_cluster(monkeypatch, dead, [True])
    with pytest.raises(RuntimeError, match=f"{component} not running: a cluster that stopped"):
        cluster.ensure_controllers()
    assert started == []


def test_in_a_cluster_just_created_an_exited_api_server_is_started_again(
    pids: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(cluster, "CREATE_LOCK", tmp_path / "create.lock")
    started = _fake_cluster(monkeypatch, [["kube-apiserver"], ["kube-apiserver"], []], [True])
    cluster.ensure_controllers(just_created=True)
    assert started == ["kube-apiserver"]


@pytest.mark.parametrize("running", [True, False])
def test_every_start_checks_the_components_also_of_a_running_cluster(
    running: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PMEM_CSI_STATE_DIR", str(tmp_path))
    monkeypatch.setattr(cluster, "CREATE_LOCK", tmp_path / "create.lock")
    monkeypatch.setattr(cluster.toolchain, "build_all", lambda groups: None)
    monkeypatch.setattr(cluster, "is_running", lambda: running)
    monkeypatch.setattr(cluster, "stop", lambda quiet=False: None)
    monkeypatch.setattr(
        cluster, "_create_cluster", lambda c, k: subprocess.CompletedProcess([], 0, "", "")
    )
    checked: list[int] = []
    # At a creation under its lock (the exited component's port must not go to another
    # cluster); for a running cluster the lock is taken only to restart something.
    monkeypatch.setattr(
        cluster,
        "ensure_controllers",
        lambda just_created=False: checked.append(
            (getattr(cluster._lock_held, "depth", 0), just_created)
        ),
    )

    class Core:
        def create_node(self, body: object) -> None:
            pass

    monkeypatch.setattr(cluster, "_core_api", Core)
    monkeypatch.setattr(cluster, "wait_nodes_ready", lambda names: None)
    cluster.start()
    # Only a cluster created here may have its etcd or API server started again.
    assert checked == [(0, False) if running else (1, True)]


def test_a_component_is_started_with_kwokctls_command_line_log_and_pid_file(
    pids: Path,
) -> None:
    """The restart runs what kwokctl recorded in kwok.yaml for the component, nothing else."""
    (pids.parent / "logs").mkdir()
    (pids.parent / "kwok.yaml").write_text(
        "kind: KwokCluster\n---\n"
        "kind: KwokctlConfiguration\n"
        "components:\n"
        "- name: etcd\n  binary: /bin/false\n"
        "- name: kube-scheduler\n  binary: /bin/sh\n"
        f"  args: ['-c', 'pwd; echo started']\n  workDir: {toolchain.PROJECT_DIR}\n"
    )
    proc = cluster.start_component("kube-scheduler")
    assert proc.wait(30) == 0
    assert (pids / "kube-scheduler.pid").read_text() == str(proc.pid)
    log = (pids.parent / "logs" / "kube-scheduler.log").read_text()
    assert log == f"{toolchain.PROJECT_DIR}\nstarted\n"
    assert not (pids / "etcd.pid").exists()


def test_a_component_restarted_meanwhile_by_another_start_is_not_started_twice(
    pids: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Dead when first read, running again once the lock is held: nothing is started."""
    monkeypatch.setattr(cluster, "CREATE_LOCK", tmp_path / "create.lock")
    started = _fake_cluster(monkeypatch, [["kube-controller-manager"], [], []], [True])
    cluster.ensure_controllers()
    assert started == []


class _Leases:
    """CoordinationV1Api's read of one Lease, or an error."""

    def __init__(self, spec: object) -> None:
        self.spec = spec

    def read_namespaced_lease(self, name: str, namespace: str, **kw: object) -> object:
        if isinstance(self.spec, Exception):
            raise self.spec
        return types.SimpleNamespace(spec=self.spec)


def _lease(acquired: float, renewed: float) -> object:
    base = datetime(2026, 12, 2, tzinfo=UTC)
    return types.SimpleNamespace(
        holder_identity="vm_1",
        acquire_time=base + timedelta(seconds=acquired),
        renew_time=base + timedelta(seconds=renewed),
    )


@pytest.mark.parametrize(
    ("acquired", "renewed", "working"),
    [
        (-30, 5, False),  # taken before the restart: the dead process's Lease
        (1, 5, False),  # taken since, but not yet past the 10 s start-up check
        (1, 12, True),  # taken since and renewed 11 s later: past the check
    ],
)
def test_a_restarted_controller_counts_once_its_new_lease_outlived_the_start_check(
    acquired: float, renewed: float, working: bool
) -> None:
    since = datetime(2026, 12, 2, tzinfo=UTC)
    leases = _Leases(_lease(acquired, renewed))
    assert cluster._lease_renewed_since(leases, "kube-controller-manager", since) is working


def test_a_started_component_is_awaited_until_its_ports_listen(pids: Path) -> None:
    """The creation lock is held while a component's port is free: start_component returns
    once the new process listens there, so no cluster created meanwhile can take the port."""
    import socket

    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    assert not cluster._listening(port)
    (pids.parent / "logs").mkdir()
    script = (
        "import socket, time; time.sleep(1); s = socket.socket(); "
        f"s.bind(('127.0.0.1', {port})); s.listen(); time.sleep(60)"
    )
    (pids.parent / "kwok.yaml").write_text(
        "kind: KwokctlConfiguration\ncomponents:\n"
        f"- name: kube-scheduler\n  binary: {sys.executable}\n"
        f"  args: ['-c', {script!r}]\n  ports: [{{name: https, port: {port}}}]\n"
    )
    proc = cluster.start_component("kube-scheduler")
    try:
        assert proc.poll() is None
        assert cluster._listening(port)
    finally:
        proc.kill()
        proc.wait()


def test_stop_kills_the_components_its_pid_files_no_longer_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `kwokctl delete` failed and the state went anyway, or the pid files were lost: an API
    # server that runs on keeps the real node's host routes, and the stop the teardown's error
    # names would find nothing to stop (third review of the routes fix).
    monkeypatch.setenv("PMEM_CSI_STATE_DIR", str(tmp_path))
    monkeypatch.setattr(cluster.realnode, "stop", lambda quiet=False: None)
    with (
        running_as(_binary("kube-apiserver")) as ours,
        running_as("/elsewhere/bin/kube-apiserver") as theirs,
    ):
        assert cluster.runs_api_server(tmp_path)
        cluster.stop(quiet=True)
        assert ours.poll() == -9  # killed, and gone from /proc before stop returned
        assert not cluster.runs_api_server(tmp_path)
        assert theirs.poll() is None  # another cluster's is left alone
