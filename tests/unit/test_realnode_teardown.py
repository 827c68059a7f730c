"""The real node's teardown and lock rules, on a fake machine (paths in tmp, commands faked).

Why fakes: the real teardown needs root, a running node and the one lock of the machine;
these rules (whose node may be torn down, when, what is restored and what is reported) are
decided by tools/realnode.py alone and are checked here without touching the machine. The
e2e test tests/e2e/test_real_node.py runs the same code against a real node.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.unit.procs import running_as
from tools import cluster, realnode, toolchain

# The values on this kind of machine, and what kubelet 1.36 sets when it starts.
MACHINE_SYSCTLS = {
    "kernel/panic": "1",
    "kernel/panic_on_oops": "0",
    "vm/overcommit_memory": "0",
    "vm/panic_on_oom": "0",
    "kernel/keys/root_maxkeys": "1000000",
    "kernel/keys/root_maxbytes": "25000000",
}
KUBELET_SETS = {"kernel/panic": "10", "kernel/panic_on_oops": "1", "vm/overcommit_memory": "1"}


class FakeMachine:
    """The commands cleanup() runs, against a model of the host's routes and the cluster."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.host_routes: set[str] = set()
        self.api_up = True
        self.node_exists = False
        self.node_deletable = True
        self.api_server_runs = True  # a process runs this checkout's kube-apiserver
        self.events: list[str] = []

    def run(
        self, cmd: list[object], check: bool = True, **_: object
    ) -> subprocess.CompletedProcess[str]:
        args = [str(c) for c in cmd]
        rc, out = 0, ""
        if args[:5] == ["ip", "-j", "route", "show", "type"]:
            out = json.dumps([{"type": "blackhole", "dst": d} for d in sorted(self.host_routes)])
        elif args == ["ip", "-j", "route", "show"]:
            out = json.dumps([{"dst": "default", "gateway": "192.0.2.1", "dev": "eth0"},
                              {"dst": "192.0.2.0/24", "dev": "eth0"}])  # fmt: skip
        elif args[:4] == ["ip", "route", "del", "blackhole"]:
            self.events.append(f"route del {args[4]}")
            self.host_routes.discard(args[4])
        elif args[:4] == ["ip", "route", "replace", "blackhole"]:
            self.host_routes.add(args[4])
        elif args[:3] == ["ip", "netns", "del"]:
            (realnode.NETNS_DIR / args[3]).unlink(missing_ok=True)
        elif Path(args[0]).name == "kubectl":
            verb = args[args.index("--request-timeout=10s") + 1]
            if not self.api_up:
                rc = 1
            elif verb == "delete":
                self.events.append("node delete")
                if self.node_deletable:
                    self.node_exists = False
            elif verb == "get":
                out = f"node/{realnode.NODE_NAME}\n" if self.node_exists else ""
        elif args[0] == "pgrep":
            rc = 1
        elif args[0] != "umount":
            raise AssertionError(f"unexpected command {args}")
        if check and rc:
            raise realnode.RealNodeError(f"{args} failed")
        return subprocess.CompletedProcess(args, rc, out, "")

    # What a node leaves on the machine.
    def make_node_traces(self) -> None:
        realnode.NETNS_DIR.mkdir(parents=True, exist_ok=True)
        realnode.netns_path().write_text("")
        realnode.NODE_RUN.mkdir(parents=True, exist_ok=True)
        realnode.NODE_ROOT.mkdir(parents=True, exist_ok=True)
        self.host_routes.update(realnode._host_blackholes())
        self.node_exists = True

    def node_traces(self) -> list[str]:
        found = [str(p) for p in (realnode.netns_path(), realnode.NODE_RUN, realnode.NODE_ROOT)
                 if p.exists()]  # fmt: skip
        return found + sorted(self.host_routes)


@pytest.fixture
def machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeMachine]:
    fake = FakeMachine(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    monkeypatch.setattr(realnode, "RECORD_FILE", run / "node.json")
    monkeypatch.setattr(realnode, "LOCK_FILE", run / "node.lock")
    # The refusals these tests provoke wait for a lock or a cgroup that never comes free here.
    monkeypatch.setattr(realnode, "STOP_LOCK_WAIT", 0.5)
    monkeypatch.setattr(realnode, "CGROUP_REMOVE_WAIT", 0.5)
    monkeypatch.setattr(realnode, "CHANGE_LOCK_FILE", run / "node.change.lock")
    monkeypatch.setattr(realnode, "BASELINE_FILE", tmp_path / "var-lib" / "baseline.json")
    (tmp_path / "var-lib").mkdir()
    monkeypatch.setattr(realnode, "NETNS_DIR", run / "netns")
    monkeypatch.setattr(realnode, "SYSCTL_ROOT", tmp_path / "proc-sys")
    monkeypatch.setattr(realnode, "NODE_ROOT", tmp_path / "var-lib" / "node")
    monkeypatch.setattr(realnode, "NODE_RUN", run / "node")
    monkeypatch.setattr(realnode, "CGROUP_ROOT", tmp_path / "cgroup")
    monkeypatch.setattr(
        realnode, "HARD_CODED_PATHS", (tmp_path / "var-lib" / "kubelet", run / "containerd")
    )
    monkeypatch.setattr(realnode, "_run", fake.run)
    monkeypatch.setattr(cluster, "CREATE_LOCK", run / "create.lock")  # not the machine's
    monkeypatch.setattr(toolchain.Group, "is_built", lambda self: True)
    state = tmp_path / "state"
    state.mkdir()
    (state / "kubeconfig").write_text("{}")
    # This checkout's cluster is up while api_server_runs: a process runs its API server (as
    # /proc/PID/cmdline says: this one stands for it; api_up says whether it answers).
    apiserver = _apiserver(state.resolve())
    monkeypatch.setattr(
        cluster,
        "program_of",
        lambda pid: apiserver if pid == os.getpid() and fake.api_server_runs else None,
    )
    monkeypatch.setenv("PMEM_CSI_STATE_DIR", str(state))
    for name, value in MACHINE_SYSCTLS.items():
        path = tmp_path / "proc-sys" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(value + "\n")
    yield fake


def _sysctls() -> dict[str, str]:
    return {name: realnode.read_sysctl(name) for name in MACHINE_SYSCTLS}


@pytest.fixture
def process() -> Iterator[subprocess.Popen[bytes]]:
    """A live process that is none of the node's (a stand-in for a PID reused)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield proc
    proc.kill()
    proc.wait()


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


# --------------------------------------------------------------------------- sysctls (2)


def test_the_kernel_tunables_the_kubelet_changes_are_reported_and_restored(
    machine: FakeMachine,
) -> None:
    machine.api_up = False
    baseline = realnode.Baseline.take()  # what start() does before anything is made
    assert baseline.sysctls == MACHINE_SYSCTLS
    assert set(realnode.KUBELET_SYSCTLS) == set(MACHINE_SYSCTLS)
    for name, value in KUBELET_SETS.items():  # what the kubelet does at its start
        (realnode.SYSCTL_ROOT / name).write_text(value + "\n")
    left = realnode.leftovers()
    assert "sysctl kernel.panic = 10 (was 1)" in left
    assert "sysctl vm.overcommit_memory = 1 (was 0)" in left
    realnode.cleanup(quiet=True)
    assert _sysctls() == MACHINE_SYSCTLS
    assert realnode.leftovers() == []


# --------------------------------------------------------------------------- lock (1)


def test_a_node_of_another_checkout_being_started_is_never_torn_down(
    machine: FakeMachine, process: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    """Mid-start (record saved, no component yet): is_running() is False, its starter lives."""
    machine.make_node_traces()
    realnode.Record(
        state_dir=str(tmp_path / "other-checkout"),
        starter_pid=process.pid,
        starter_start=realnode.process_start_boottime(process.pid),
        host_routes=realnode._host_blackholes(),
    ).save()
    assert not realnode.is_running()
    realnode.stop(quiet=True)  # what every fresh tools.cluster start does
    assert len(machine.node_traces()) == 3 + len(realnode._host_blackholes())
    assert realnode.RECORD_FILE.exists()
    assert process.poll() is None


def test_no_teardown_without_the_lock(machine: FakeMachine) -> None:
    """This checkout's record, its starter dead; but the lock is held: stop refuses."""
    machine.make_node_traces()
    realnode.Record(state_dir=str(realnode.localenv.state_dir()), starter_pid=_dead_pid(),
                    starter_start=1.0, host_routes=realnode._host_blackholes()).save()  # fmt: skip
    holder = os.open(realnode.LOCK_FILE, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(realnode.RealNodeError, match="in use"):
            realnode.stop(quiet=True)
    finally:
        os.close(holder)
    assert len(machine.node_traces()) == 3 + len(realnode._host_blackholes())


def test_a_node_whose_starter_and_forwarder_are_dead_is_reaped(
    machine: FakeMachine, tmp_path: Path
) -> None:
    machine.make_node_traces()
    realnode.Record(state_dir=str(tmp_path / "other-checkout"), starter_pid=_dead_pid(),
                    starter_start=1.0, pids={"forwarder": _dead_pid()},
                    pid_starts={"forwarder": 1.0},
                    host_routes=realnode._host_blackholes()).save()  # fmt: skip
    (tmp_path / "other-checkout").mkdir()
    realnode.stop(quiet=True)
    assert machine.node_traces() == []
    assert not realnode.RECORD_FILE.exists()


def test_a_running_node_is_reused_only_while_its_guard_holds(
    machine: FakeMachine, process: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    machine.make_node_traces()
    start = realnode.process_start_boottime(process.pid)
    realnode.Record(state_dir=str(realnode.localenv.state_dir()),
                    pids={"kubelet": process.pid}, pid_starts={"kubelet": start},
                    host_routes=realnode._host_blackholes()).save()  # fmt: skip
    assert realnode.is_running()
    monkeypatch.setattr(realnode, "_kubelet_kubeconfig", lambda: ({}, "127.0.0.1", 1))
    monkeypatch.setattr(realnode, "cluster_problems", lambda port: [])
    monkeypatch.setattr(realnode, "guard_problems", lambda: ["no blackhole route default"])
    with pytest.raises(realnode.RealNodeError, match="no blackhole route default"):
        realnode.start()
    # The node whose guard broke is gone, not handed out.
    assert process.wait(timeout=10) is not None
    assert machine.node_traces() == []


# --------------------------------------------------------------------------- PIDs (6)


def test_a_recorded_pid_now_used_by_another_process_is_not_killed(
    machine: FakeMachine, process: subprocess.Popen[bytes]
) -> None:
    machine.api_up = False
    start = realnode.process_start_boottime(process.pid)
    realnode.Record(state_dir=str(realnode.localenv.state_dir()),
                    pids={"containerd": process.pid},
                    pid_starts={"containerd": start - 100}).save()  # fmt: skip
    assert not realnode.is_running()
    realnode.cleanup(quiet=True)
    assert process.poll() is None


# --------------------------------------------------------------------------- routes (3)


def test_host_routes_stay_until_the_node_object_is_gone(machine: FakeMachine) -> None:
    machine.make_node_traces()
    realnode.Record(state_dir=str(realnode.localenv.state_dir()),
                    host_routes=realnode._host_blackholes()).save()  # fmt: skip
    machine.node_deletable = False  # e.g. the API server times out
    with pytest.raises(realnode.RealNodeError, match="host routes"):
        realnode.cleanup(quiet=True)
    assert machine.host_routes == set(realnode._host_blackholes())
    machine.node_deletable = True
    realnode.cleanup(quiet=True)
    routes_deleted = [f"route del {d}" for d in realnode._host_blackholes()]
    assert machine.events[-1 - len(routes_deleted) :] == ["node delete", *routes_deleted]
    assert not machine.node_exists and machine.host_routes == set()


def test_with_the_cluster_stopped_the_host_routes_go(machine: FakeMachine) -> None:
    machine.make_node_traces()
    realnode.Record(state_dir=str(realnode.localenv.state_dir()),
                    host_routes=realnode._host_blackholes()).save()  # fmt: skip
    machine.api_up = machine.api_server_runs = False
    realnode.localenv.kubeconfig_path().unlink()  # what tools.cluster.stop does
    realnode.cleanup(quiet=True)
    assert machine.host_routes == set()


def _killed_cluster(state_dir: Path, apiserver_pid: int) -> None:
    """What a killed run leaves of its cluster: the kubeconfig and kwokctl's pid files."""
    pids = _pids_dir(state_dir)
    pids.mkdir(parents=True)
    (pids / "kube-apiserver.pid").write_text(str(apiserver_pid))
    (state_dir / "kubeconfig").write_text("{}")


def _pids_dir(state_dir: Path) -> Path:
    return state_dir / "kwok" / "clusters" / "pmem-csi" / "pids"


def _apiserver(state_dir: Path) -> str:
    return str(state_dir / "kwok" / "clusters" / "pmem-csi" / "bin" / "kube-apiserver")


def test_the_routes_of_a_node_whose_cluster_was_killed_go_with_its_teardown_elsewhere(
    machine: FakeMachine, tmp_path: Path
) -> None:
    # A session killed with its node and cluster running: every process is gone, the kernel
    # keeps the routes and the checkout its kubeconfig and pid files. No API server can dial
    # the node, and none will again (tools.cluster creates a cluster that does not answer
    # anew), so a start in another checkout (a CI clone) removes the routes instead of
    # failing on them (CI of stop 31).
    machine.make_node_traces()
    other = tmp_path / "killed-checkout"
    _killed_cluster(other, _dead_pid())
    realnode.Record(state_dir=str(other), host_routes=realnode._host_blackholes()).save()
    machine.api_up = False  # kubectl with its kubeconfig: connection refused
    realnode.stop(quiet=True)
    assert machine.node_traces() == []
    assert not realnode.RECORD_FILE.exists()


def test_the_routes_stay_while_the_api_server_of_the_node_runs_but_does_not_answer(
    machine: FakeMachine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Beside a dead kube-controller-manager: only the API server's process counts (review of
    # 011138f: "any dead component releases the routes" passed the other tests).
    machine.make_node_traces()
    other = tmp_path / "busy-checkout"
    _killed_cluster(other, os.getpid())
    (_pids_dir(other) / "kube-controller-manager.pid").write_text(str(_dead_pid()))
    monkeypatch.setattr(cluster, "program_of", lambda pid: _apiserver(other) * (pid == 1) or None)
    realnode.Record(state_dir=str(other), host_routes=realnode._host_blackholes()).save()
    machine.api_up = False  # it runs, but is busy: kubectl times out
    with pytest.raises(realnode.RealNodeError, match=f"cluster of {other}: .*PMEM_CSI_STATE_DIR"):
        realnode.cleanup(quiet=True)
    assert machine.host_routes == set(realnode._host_blackholes())


@pytest.mark.parametrize("kubeconfig", [True, False])
def test_an_api_server_whose_pid_file_and_directory_are_gone_still_keeps_the_routes(
    kubeconfig: bool, machine: FakeMachine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `kwokctl delete` failed and the stop removed the state anyway (its components may still
    # run), or a stop was killed half-way: the API server is found in /proc, not by pid file.
    machine.make_node_traces()
    other = tmp_path / "half-stopped-checkout"
    other.mkdir()
    if kubeconfig:
        (other / "kubeconfig").write_text("{}")
    monkeypatch.setattr(cluster, "program_of", lambda pid: _apiserver(other) * (pid == 1) or None)
    realnode.Record(state_dir=str(other), host_routes=realnode._host_blackholes()).save()
    machine.api_up = False
    with pytest.raises(realnode.RealNodeError, match="host routes"):
        realnode.cleanup(quiet=True)
    assert machine.host_routes == set(realnode._host_blackholes())
    monkeypatch.setattr(cluster, "program_of", lambda pid: None)  # now it is gone
    realnode.stop(quiet=True)
    assert machine.node_traces() == []


def test_the_routes_are_released_under_the_creation_lock(
    machine: FakeMachine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A fault test holds that lock from killing an API server until it runs again
    # (tests/e2e/faults.py): an API server seen gone inside it stays gone until the routes
    # are (third review: `make cluster-stop` in `.state` during a worker's fault test).
    machine.make_node_traces()
    other = tmp_path / "killed-checkout"
    _killed_cluster(other, _dead_pid())
    realnode.Record(state_dir=str(other), host_routes=realnode._host_blackholes()).save()
    real_check = cluster.runs_api_server

    def check(state_dir: Path) -> bool:
        machine.events.append("API server looked for")
        return real_check(state_dir)

    @contextlib.contextmanager
    def lock() -> Iterator[None]:
        machine.events.append("lock taken")
        yield
        machine.events.append("lock released")

    monkeypatch.setattr(cluster, "runs_api_server", check)
    monkeypatch.setattr(cluster, "one_create_at_a_time", lock)
    realnode.stop(quiet=True)
    routes = [f"route del {d}" for d in realnode._host_blackholes()]
    assert machine.events == ["lock taken", "API server looked for", *routes, "lock released"]


def test_the_api_server_of_another_state_dir_is_found_in_proc(tmp_path: Path) -> None:
    # The comparison the rule above rests on, with a real process (not faked), no pid file.
    other = tmp_path / "s"
    with running_as(_apiserver(other)):
        assert cluster.runs_api_server(other)
        assert not cluster.runs_api_server(tmp_path / "another")
    assert not cluster.runs_api_server(other)


def test_the_api_server_of_a_state_dir_whose_name_is_not_utf8_is_found(tmp_path: Path) -> None:
    other = Path(os.fsdecode(os.fsencode(tmp_path) + b"/st\xe9"))
    with running_as(_apiserver(other)):
        assert cluster.runs_api_server(other)


# --------------------------------------------------------------------------- half-done (4)


def test_a_teardown_that_fails_half_way_keeps_what_it_needs_to_finish(
    machine: FakeMachine,
) -> None:
    machine.api_up = machine.api_server_runs = False  # the cluster stopped
    realnode.localenv.kubeconfig_path().unlink()
    realnode.Baseline.take()  # before the node: the kubelet's paths do not exist
    kubelet_dir = realnode.HARD_CODED_PATHS[0]
    kubelet_dir.mkdir()
    machine.make_node_traces()
    realnode.Record(state_dir=str(realnode.localenv.state_dir()),
                    host_routes=realnode._host_blackholes()).save()  # fmt: skip
    busy = realnode.CGROUP_ROOT / "pids" / realnode.TRACKING_CGROUP
    busy.mkdir(parents=True)
    (busy / "stuck").write_text("")  # a cgroup the kernel does not let go (yet)
    with pytest.raises(realnode.RealNodeError, match="teardown left"):
        realnode.cleanup(quiet=True)
    assert realnode.RECORD_FILE.exists() and realnode.BASELINE_FILE.exists()
    # The next start takes the first baseline: the old node's paths are not the machine's.
    assert str(kubelet_dir) not in realnode.Baseline.take().foreign_paths
    (busy / "stuck").unlink()
    realnode.stop(quiet=True)
    assert not kubelet_dir.exists() and realnode.leftovers() == []
    assert not realnode.RECORD_FILE.exists() and not realnode.BASELINE_FILE.exists()


def test_stop_without_a_record_still_removes_what_is_left(machine: FakeMachine) -> None:
    machine.host_routes.update(realnode._host_blackholes())
    assert realnode.leftovers() == [f"host routes {sorted(realnode._host_blackholes())}"]
    realnode.stop(quiet=True)
    assert machine.host_routes == set()


# --------------------------------------------------------------------------- machine-wide (5)


def test_a_cgroup_removed_while_the_teardown_lists_them_is_skipped(
    machine: FakeMachine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A container's cgroup is removed (by runc, its shim or the kubelet) also while the
    teardown walks the tree (seen in a `make demo` then `make test` run: the borrowing of the
    demo's node failed with FileNotFoundError on a pod's cgroup)."""
    base = realnode.CGROUP_ROOT / "cpuacct" / realnode.TRACKING_CGROUP / "kubepods"
    gone, kept = base / "pod-a" / "container-gone", base / "pod-b" / "container-kept"
    gone.mkdir(parents=True)
    kept.mkdir(parents=True)
    scandir = os.scandir

    def vanishing(path: Any = ".") -> Any:  # the directory listed, then removed, then read
        if Path(path) == gone:
            gone.rmdir()
        return scandir(path)

    monkeypatch.setattr(os, "scandir", vanishing)
    found = realnode._cgroup_dirs()
    assert not gone.exists()
    assert found == sorted(found, key=lambda p: len(p.parts), reverse=True)
    assert {kept, kept.parent, gone.parent, base} <= set(found)
    realnode._remove_cgroups()  # a listed cgroup already gone is no error
    assert not base.parent.exists()


def test_a_process_reaped_between_its_signal_and_its_stat_read_is_not_alive(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The teardown's kill loop asks every 0.1 s whether the cgroups' processes live while
    their parents reap them: a /proc entry gone between ``kill(pid, 0)`` and the read is a
    dead process, not an error that aborts ``tools.realnode stop``."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # reaped: /proc/<pid> is gone
    monkeypatch.setattr(realnode.os, "kill", lambda pid, sig: None)  # the signal came first
    with monkeypatch.context() as m:
        m.setattr(Path, "exists", lambda self: True)  # ... and a look at /proc came next
        alive = realnode._alive(child.pid)
    assert alive is False


def test_the_teardown_claims_only_the_nodes_own_cgroups_and_namespaces(
    machine: FakeMachine,
) -> None:
    """Another kubelet's ``kubepods`` and another runtime's ``cni-*`` namespace stay."""
    machine.api_up = machine.api_server_runs = False  # the cluster stopped
    realnode.localenv.kubeconfig_path().unlink()
    # The node's pods: in cgroups under the kubelet's own cgroupRoot, their namespaces under
    # containerd's state directory (removed with it), not in /run/netns.
    assert realnode._kubelet_config()["cgroupRoot"] == f"/{realnode.TRACKING_CGROUP}"
    assert "netns_mounts_under_state_dir = true" in realnode._containerd_config()
    theirs = realnode.CGROUP_ROOT / "memory" / "kubepods" / "pod-theirs"
    ours = realnode.CGROUP_ROOT / "memory" / realnode.TRACKING_CGROUP / "kubepods" / "pod-ours"
    theirs.mkdir(parents=True)
    ours.mkdir(parents=True)
    machine.make_node_traces()
    other_netns = realnode.NETNS_DIR / "cni-0b5e-theirs"
    other_netns.write_text("")
    assert set(realnode._cgroup_dirs()) == {ours, ours.parent, ours.parent.parent}
    assert realnode._node_netns() == [realnode.netns_path()]
    realnode.Record(state_dir=str(realnode.localenv.state_dir()),
                    host_routes=realnode._host_blackholes()).save()  # fmt: skip
    realnode.cleanup(quiet=True)
    assert theirs.is_dir() and other_netns.exists()
    assert not ours.parent.parent.exists()


def test_a_guard_broken_while_the_node_started_fails_the_start(
    machine: FakeMachine, process: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guard is checked before containerd and again once the Node is Ready."""
    checks = iter([[], ["a default route in pmem-csi-node: {'dst': 'default'}"]])
    monkeypatch.setattr(realnode, "guard_problems", lambda: next(checks))
    monkeypatch.setattr(realnode, "cluster_problems", lambda port: [])
    monkeypatch.setattr(realnode, "_make_netns", lambda: None)
    monkeypatch.setattr(realnode, "_spawn", lambda *a, **k: process)
    monkeypatch.setattr(realnode, "_wait", lambda *a, **k: None)
    monkeypatch.setattr(realnode, "import_image", lambda *a: None)
    monkeypatch.setattr(realnode, "_kubelet_kubeconfig", lambda: ({}, "127.0.0.1", 1))
    record = realnode.Record(state_dir=str(realnode.localenv.state_dir()))
    with pytest.raises(realnode.RealNodeError, match="broke while it started: a default route"):
        realnode._start_locked(record, -1, "127.0.0.1", 1, (), 1)
    assert set(record.pids) == {"containerd", "forwarder", "kubelet"}


# --------------------------------------------------------------------------- others (11, 12)


def test_a_start_while_the_lock_is_held_is_refused_and_changes_nothing(
    machine: FakeMachine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No record to name an owner (it is being written): the lock alone refuses the start."""
    monkeypatch.setattr(realnode, "ensure_node_packages", lambda: None)
    monkeypatch.setattr(realnode.toolchain, "build_all", lambda groups: None)
    monkeypatch.setattr(realnode, "_kubelet_kubeconfig", lambda: ({}, "127.0.0.1", 1))
    monkeypatch.setattr(realnode, "cluster_problems", lambda port: [])
    holder = os.open(realnode.LOCK_FILE, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(realnode.RealNodeError, match=r"in use \(by another process\)"):
            realnode.start()
    finally:
        os.close(holder)
    assert not realnode.RECORD_FILE.exists() and not realnode.BASELINE_FILE.exists()
    assert machine.host_routes == set()


def test_the_checkout_stops_the_node_its_killed_test_session_left_running(
    machine: FakeMachine, process: subprocess.Popen[bytes]
) -> None:
    """`make cluster-stop` in .state: a node of .state/test-session (pytest killed) is its own."""
    machine.make_node_traces()
    session = realnode.localenv.state_dir() / "test-session"
    session.mkdir()
    realnode.Record(state_dir=str(session), starter_pid=_dead_pid(), starter_start=1.0,
                    pids={"forwarder": process.pid},
                    pid_starts={"forwarder": realnode.process_start_boottime(process.pid)},
                    host_routes=realnode._host_blackholes()).save()  # fmt: skip
    realnode.stop(quiet=True)
    assert process.wait(timeout=10) is not None
    assert machine.node_traces() == [] and not realnode.RECORD_FILE.exists()


def test_a_node_of_another_checkout_whose_forwarder_lives_is_left_alone(
    machine: FakeMachine, process: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    machine.make_node_traces()
    realnode.Record(state_dir=str(tmp_path / "other-checkout"), starter_pid=_dead_pid(),
                    starter_start=1.0, pids={"forwarder": process.pid},
                    pid_starts={"forwarder": realnode.process_start_boottime(process.pid)},
                    host_routes=realnode._host_blackholes()).save()  # fmt: skip
    realnode.stop(quiet=True)
    assert process.poll() is None and len(machine.node_traces()) == 6


def test_status_says_in_use_while_the_lock_is_held(
    machine: FakeMachine, capsys: pytest.CaptureFixture[str]
) -> None:
    assert realnode.main(["status"]) == 1 and capsys.readouterr().out == "not running\n"
    holder = os.open(realnode.LOCK_FILE, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert realnode.main(["status"]) == 1
        assert capsys.readouterr().out == "in use (lock held)\n"
    finally:
        os.close(holder)


def test_status_says_when_a_change_is_under_way(
    machine: FakeMachine, capsys: pytest.CaptureFixture[str]
) -> None:
    """Review (stop 15): `status` ignored the change lock, so a node being stopped or
    restarted read as plainly running (or not running) to an administrator who checked."""
    holder = os.open(realnode.CHANGE_LOCK_FILE, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert realnode.main(["status"]) == 1
        assert capsys.readouterr().out == (
            "not running; a start, stop or kubelet restart is under way\n"
        )
    finally:
        os.close(holder)
    assert realnode.main(["status"]) == 1 and capsys.readouterr().out == "not running\n"


# --------------------------------------------------------------------------- kubelet restart


@pytest.fixture
def lock_holder() -> Iterator[subprocess.Popen[str]]:
    """A stand-in for the forwarder: a process holding the node's lock until it ends."""
    code = (
        "import fcntl, os, sys, time\n"
        "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "print('locked', flush=True)\n"
        "time.sleep(120)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(realnode.LOCK_FILE)],
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline() == "locked\n"
    yield proc
    proc.kill()
    proc.wait()


def _sleeper(on_term: Path | None = None) -> subprocess.Popen[bytes]:
    """A process that sleeps; with ``on_term``, one that writes that file at SIGTERM and exits."""
    if on_term is None:
        return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    code = (
        "import pathlib, signal, sys, time\n"
        "def term(*_):\n"
        "    pathlib.Path(sys.argv[1]).write_text('TERM')\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, term)\n"
        "print('ready', flush=True)\n"
        "time.sleep(120)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(on_term)], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    return proc


def _kubelet_like(on_term: Path | None = None) -> subprocess.Popen[bytes]:
    """A sleeper whose command line is the kubelet's, in the node's tracking cgroup (faked)."""
    code = (
        "import pathlib, signal, sys, time\n"
        "def term(*_):\n"
        "    if sys.argv[1]:\n"
        "        pathlib.Path(sys.argv[1]).write_text('TERM')\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, term)\n"
        "print('ready', flush=True)\n"
        "time.sleep(120)\n"
    )
    cmd = [sys.executable, "-c", code, str(on_term or ""), *realnode._kubelet_command()]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    procs = realnode.CGROUP_ROOT / "pids" / realnode.TRACKING_CGROUP / "cgroup.procs"
    procs.parent.mkdir(parents=True, exist_ok=True)
    with procs.open("a") as f:
        f.write(f"{proc.pid}\n")
    return proc


def _running_node(forwarder: int, **others: subprocess.Popen[bytes]) -> realnode.Record:
    pids = {"forwarder": forwarder, **{name: p.pid for name, p in others.items()}}
    record = realnode.Record(
        state_dir=str(realnode.localenv.state_dir()),
        pids=pids,
        pid_starts={name: realnode.process_start_boottime(pid) for name, pid in pids.items()},
        host_routes=realnode._host_blackholes(),
    )
    record.save()
    return record


@pytest.fixture
def restart_env(machine: FakeMachine, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict]:
    """restart_kubelet()'s surroundings faked: the guard's answers, _spawn, the kubelet's health."""
    seen: dict = {"spawned": [], "guard": [], "healthy": True}
    monkeypatch.setattr(realnode, "_kubelet_kubeconfig", lambda: ({}, "127.0.0.1", 1))

    def problems(port: int) -> list[str]:
        seen["guard"].append(port)
        return list(seen.get("problems", []))

    def spawn(name: str, cmd: list[str], env: object = None, pass_fds: object = ()) -> object:
        # A stand-in with the kubelet's command line, in the node's tracking cgroup (as _spawn
        # puts it): what the real kubelet looks like to the machine.
        proc = _kubelet_like() if name == "kubelet" else _sleeper()
        seen["spawned"].append((name, cmd, proc))
        return proc

    def ready_condition() -> dict | None:
        seen["ready_reads"] = seen.get("ready_reads", 0) + 1
        heartbeat = seen.get("heartbeat")  # None: the kubelet's fresh one, stamped now
        return {"status": "True", "lastHeartbeatTime": time.time() if heartbeat is None
                else heartbeat() if callable(heartbeat) else heartbeat}  # fmt: skip

    monkeypatch.setattr(realnode, "_isolation_problems", problems)
    monkeypatch.setattr(realnode, "_spawn", spawn)
    monkeypatch.setattr(realnode, "_kubelet_healthy", lambda: seen["healthy"])
    monkeypatch.setattr(realnode, "_node_ready_condition", ready_condition)
    monkeypatch.setattr(realnode.toolchain, "bin_path", lambda name: Path("/tools/bin") / name)
    yield seen
    for _, _, proc in seen["spawned"]:
        proc.kill()
        proc.wait()


def test_a_kubelet_restart_replaces_only_the_kubelet_and_records_the_new_one(
    restart_env: dict, lock_holder: subprocess.Popen[str], tmp_path: Path
) -> None:
    kubelet, containerd = _sleeper(tmp_path / "kubelet-stopped"), _sleeper()
    try:
        _running_node(lock_holder.pid, kubelet=kubelet, containerd=containerd)
        record = realnode.restart_kubelet(timeout=5)
        # Stopped with SIGTERM (as a node's kubelet is), gone and reaped.
        assert (tmp_path / "kubelet-stopped").read_text() == "TERM"
        assert not Path(f"/proc/{kubelet.pid}").exists()
        ((name, cmd, new),) = restart_env["spawned"]
        assert name == "kubelet" and cmd == realnode._kubelet_command()
        assert cmd[:2] == ["nsenter", f"--net={realnode.netns_path()}"]  # in the namespace
        # The record names the new process (by PID and start time); the others are unchanged.
        saved = realnode.Record.load()
        assert saved is not None and saved.pids == record.pids
        assert saved.pids["kubelet"] == new.pid != kubelet.pid
        assert saved.pid_starts["kubelet"] == realnode.process_start_boottime(new.pid)
        assert saved.pids["containerd"] == containerd.pid and containerd.poll() is None
        assert realnode.is_running()
        # checked before the stop, again just before the start, and after it
        assert restart_env["guard"] == [1, 1, 1]
    finally:
        for proc in (kubelet, containerd):
            proc.kill()
            proc.wait()


def test_no_kubelet_restart_while_the_guard_is_incomplete_and_the_node_goes(
    restart_env: dict, lock_holder: subprocess.Popen[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unguarded node does not keep running (review: it did): torn down, as start() does."""
    restart_env["problems"] = ["no blackhole route default in pmem-csi-node"]
    stops: list[bool] = []
    monkeypatch.setattr(realnode, "stop", lambda quiet=False: stops.append(quiet))
    kubelet = _sleeper()
    try:
        _running_node(lock_holder.pid, kubelet=kubelet)
        with pytest.raises(realnode.RealNodeError, match="no blackhole route default"):
            realnode.restart_kubelet(timeout=5)
        assert restart_env["spawned"] == [] and stops == [True]
    finally:
        kubelet.kill()
        kubelet.wait()


def test_a_guard_that_breaks_while_the_old_kubelet_stops_is_seen_before_the_new_one_starts(
    restart_env: dict, lock_holder: subprocess.Popen[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review (stop 15): the guard was checked before the old kubelet was stopped (up to 30 s)
    and again only after the new one was Ready, so a new kubelet could start pods on a node
    whose guard went away in between. Checked again just before the spawn."""
    stops: list[bool] = []
    monkeypatch.setattr(realnode, "stop", lambda quiet=False: stops.append(quiet))
    stop_kubelets = realnode._stop_kubelets

    def guard_gone_meanwhile(record: realnode.Record) -> list[int]:
        left = stop_kubelets(record)
        restart_env["problems"] = ["nftables table inet pmem-csi-node missing"]
        return left

    monkeypatch.setattr(realnode, "_stop_kubelets", guard_gone_meanwhile)
    kubelet = _sleeper()
    try:
        _running_node(lock_holder.pid, kubelet=kubelet)
        with pytest.raises(realnode.RealNodeError, match="nftables table inet pmem-csi-node"):
            realnode.restart_kubelet(timeout=5)
        assert restart_env["spawned"] == [] and stops == [True]
    finally:
        kubelet.kill()
        kubelet.wait()


def test_no_kubelet_restart_without_the_lock_held_or_of_another_checkout(
    restart_env: dict, tmp_path: Path
) -> None:
    """The forwarder recorded but not holding the lock (a teardown has it or nobody does)."""
    kubelet, forwarder = _sleeper(), _sleeper()
    try:
        _running_node(forwarder.pid, kubelet=kubelet)
        with pytest.raises(realnode.RealNodeError, match="lock is not held"):
            realnode.restart_kubelet(timeout=5)
        record = realnode.Record.load()
        assert record is not None
        record.state_dir = str(tmp_path / "other-checkout")
        record.save()
        with pytest.raises(realnode.RealNodeError, match="belongs to"):
            realnode.restart_kubelet(timeout=5)
        assert kubelet.poll() is None and restart_env["spawned"] == []
    finally:
        for proc in (kubelet, forwarder):
            proc.kill()
            proc.wait()


def test_no_kubelet_restart_of_a_node_that_is_not_running(restart_env: dict) -> None:
    realnode.Record(state_dir=str(realnode.localenv.state_dir()),
                    pids={"kubelet": _dead_pid()}, pid_starts={"kubelet": 1.0}).save()  # fmt: skip
    with pytest.raises(realnode.RealNodeError, match="no real node runs"):
        realnode.restart_kubelet(timeout=5)
    assert restart_env["spawned"] == []


def test_a_restarted_kubelet_that_never_gets_healthy_fails_the_restart(
    restart_env: dict, lock_holder: subprocess.Popen[str]
) -> None:
    restart_env["healthy"] = False
    kubelet = _sleeper()
    try:
        _running_node(lock_holder.pid, kubelet=kubelet)
        with pytest.raises(realnode.RealNodeError, match="kubelet /healthz: not ready"):
            realnode.restart_kubelet(timeout=0.5)
    finally:
        kubelet.kill()
        kubelet.wait()


# --------------------------------------------------------------------------- restart review


def _gone(proc: subprocess.Popen[bytes]) -> bool:
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        return False
    return True


def test_a_restart_killed_after_the_old_kubelet_stopped_is_finished_by_the_next_restart(
    restart_env: dict, lock_holder: subprocess.Popen[str]
) -> None:
    """Review (1): the record names a dead kubelet, containerd and the forwarder live on."""
    containerd, old = _sleeper(), _kubelet_like()
    try:
        _running_node(lock_holder.pid, kubelet=old, containerd=containerd)
        old.kill()  # the restart's SIGTERM landed; then the restart itself was killed
        old.wait()
        assert not realnode.is_running()
        record = realnode.restart_kubelet(timeout=5)
        ((_, _, new),) = restart_env["spawned"]
        saved = realnode.Record.load()
        assert saved is not None and saved.pids == record.pids
        assert saved.pids["kubelet"] == new.pid and new.poll() is None
        assert saved.pids["containerd"] == containerd.pid and containerd.poll() is None
        assert realnode.is_running()
    finally:
        containerd.kill()
        containerd.wait()


def test_a_start_after_a_killed_restart_brings_the_kubelet_back_and_keeps_the_pods(
    restart_env: dict, lock_holder: subprocess.Popen[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review (1): start() finishes the restart instead of tearing the node down (stop+start)."""
    monkeypatch.setattr(realnode, "ensure_node_packages", lambda: None)
    monkeypatch.setattr(realnode.toolchain, "build_all", lambda groups: None)
    monkeypatch.setattr(realnode, "cluster_problems", lambda port: [])
    imported: list[str] = []
    monkeypatch.setattr(realnode, "import_image", lambda archive, base: imported.append(base))

    def full_start(*_: object) -> None:
        raise AssertionError("a whole new node was started: the pods were torn down")

    monkeypatch.setattr(realnode, "_start_locked", full_start)
    containerd, old = _sleeper(), _kubelet_like()
    try:
        _running_node(lock_holder.pid, kubelet=old, containerd=containerd)
        old.kill()
        old.wait()
        record = realnode.start(images=[(Path("reporter.tar"), "localhost/r")])
        ((_, _, new),) = restart_env["spawned"]
        assert record.pids["kubelet"] == new.pid and new.poll() is None
        assert lock_holder.poll() is None and containerd.poll() is None  # nothing torn down
        assert realnode.is_running() and imported == ["localhost/r"]
    finally:
        containerd.kill()
        containerd.wait()


def test_a_kubelet_a_killed_restart_started_but_never_recorded_is_replaced_not_doubled(
    restart_env: dict, lock_holder: subprocess.Popen[str], tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Review (1): killed between the new kubelet's spawn and its record; the next restart
    stops that unrecorded kubelet (found in the node's cgroup by its command line) first."""
    containerd, old = _sleeper(), _kubelet_like()
    stray = _kubelet_like(tmp_path / "stray-stopped")
    try:
        _running_node(lock_holder.pid, kubelet=old, containerd=containerd)
        old.kill()
        old.wait()
        assert realnode.main(["status"]) == 1
        assert "kubelet is not running" in capsys.readouterr().out
        realnode.restart_kubelet(timeout=5)
        assert (tmp_path / "stray-stopped").read_text() == "TERM" and _gone(stray)
        ((_, _, new),) = restart_env["spawned"]
        assert realnode.Record.load().pids["kubelet"] == new.pid  # type: ignore[union-attr]
        assert realnode.main(["status"]) == 0
    finally:
        for proc in (containerd, stray):
            proc.kill()
            proc.wait()


def test_a_failed_restart_is_undone_by_the_next_restart(
    restart_env: dict, lock_holder: subprocess.Popen[str]
) -> None:
    """Review (1): the new kubelet never got healthy; the record names it; a restart replaces it."""
    restart_env["healthy"] = False
    containerd, old = _sleeper(), _kubelet_like()
    try:
        _running_node(lock_holder.pid, kubelet=old, containerd=containerd)
        with pytest.raises(realnode.RealNodeError, match="not ready"):
            realnode.restart_kubelet(timeout=0.5)
        ((_, _, failed),) = restart_env["spawned"]
        assert realnode.Record.load().pids["kubelet"] == failed.pid  # type: ignore[union-attr]
        restart_env["healthy"] = True
        record = realnode.restart_kubelet(timeout=5)
        assert _gone(failed)
        assert record.pids["kubelet"] == restart_env["spawned"][1][2].pid
        assert realnode.is_running()
    finally:
        containerd.kill()
        containerd.wait()


def test_two_restarts_at_once_run_one_after_the_other_and_record_a_live_kubelet(
    restart_env: dict, lock_holder: subprocess.Popen[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review (2): both passed their checks together, both killed the old kubelet and both
    started one (the second dies on the first's ports and is recorded). With the node's change
    lock, the second waits for the first: the barrier below is never passed by both."""
    barrier = threading.Barrier(2, timeout=2)
    overlapped: list[bool] = []
    checks = realnode._isolation_problems

    def problems(port: int) -> list[str]:
        if threading.current_thread() is not threading.main_thread():
            try:
                barrier.wait()
                overlapped.append(True)
            except threading.BrokenBarrierError:
                pass
        return checks(port)

    monkeypatch.setattr(realnode, "_isolation_problems", problems)
    containerd, old = _sleeper(), _kubelet_like()
    errors: list[BaseException] = []

    def restart() -> None:
        try:
            realnode.restart_kubelet(timeout=5)
        except BaseException as exc:
            errors.append(exc)

    try:
        _running_node(lock_holder.pid, kubelet=old, containerd=containerd)
        threads = [threading.Thread(target=restart) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not overlapped, "two restarts ran at once"
        assert errors == []
        kubelets = [p for name, _, p in restart_env["spawned"] if name == "kubelet"]
        assert len(kubelets) == 2 and kubelets[0].poll() is not None  # replaced by the second
        assert realnode.Record.load().pids["kubelet"] == kubelets[1].pid  # type: ignore[union-attr]
        assert kubelets[1].poll() is None and realnode.is_running()
    finally:
        for proc in (containerd, old):
            proc.kill()
            proc.wait()


def test_a_change_under_way_elsewhere_makes_a_restart_and_a_start_wait_then_refuse(
    restart_env: dict, lock_holder: subprocess.Popen[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review (2): start, stop and restart take the node's change lock; held, nothing moves."""
    monkeypatch.setattr(realnode, "ensure_node_packages", lambda: None)
    monkeypatch.setattr(realnode.toolchain, "build_all", lambda groups: None)
    monkeypatch.setattr(realnode, "cluster_problems", lambda port: [])
    containerd, old = _sleeper(), _kubelet_like()
    holder = os.open(realnode.CHANGE_LOCK_FILE, os.O_RDWR | os.O_CREAT)
    try:
        _running_node(lock_holder.pid, kubelet=old, containerd=containerd)
        fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        for change in (lambda: realnode.restart_kubelet(timeout=5, wait=0.5),
                       lambda: realnode.start(wait=0.5),
                       lambda: realnode.stop(quiet=True, wait=0.5)):  # fmt: skip
            with pytest.raises(realnode.RealNodeError, match="under way"):
                change()
        assert restart_env["spawned"] == [] and old.poll() is None
        assert lock_holder.poll() is None and containerd.poll() is None
    finally:
        os.close(holder)
        for proc in (containerd, old):
            proc.kill()
            proc.wait()


def test_a_recorded_kubelet_whose_pid_was_reused_meanwhile_is_never_signalled(
    restart_env: dict, lock_holder: subprocess.Popen[str], monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """Review (3): the kubelet checked at the restart's start; before its SIGTERM (after the
    guard checks) the PID belongs to another process (faked: its start time changes)."""
    containerd = _sleeper()
    stand_in = _sleeper(tmp_path / "signalled")  # the other process, now at the kubelet's PID
    checks = realnode._isolation_problems
    start_of = realnode._start_of

    def problems(port: int) -> list[str]:
        reused = start_of(stand_in.pid)
        monkeypatch.setattr(realnode, "_start_of",
                            lambda pid: reused + 50 if pid == stand_in.pid else start_of(pid))
        return checks(port)

    monkeypatch.setattr(realnode, "_isolation_problems", problems)
    try:
        _running_node(lock_holder.pid, kubelet=stand_in, containerd=containerd)
        realnode.restart_kubelet(timeout=5)
        assert not (tmp_path / "signalled").exists() and stand_in.poll() is None
        ((_, _, new),) = restart_env["spawned"]
        assert realnode.Record.load().pids["kubelet"] == new.pid  # type: ignore[union-attr]
    finally:
        for proc in (containerd, stand_in):
            proc.kill()
            proc.wait()


def test_a_signal_goes_only_to_the_process_that_started_at_the_recorded_time(
    process: subprocess.Popen[bytes],
) -> None:
    """Review (3): the one way a recorded PID is signalled (a pidfd, the start time checked)."""
    start = realnode.process_start_boottime(process.pid)
    assert realnode._signal_recorded(process.pid, start + 50, signal.SIGKILL) is False
    assert realnode._signal_recorded(process.pid, None, signal.SIGKILL) is False
    assert process.poll() is None
    assert realnode._signal_recorded(process.pid, start, signal.SIGKILL) is True
    assert process.wait(timeout=10) == -signal.SIGKILL
    assert realnode._signal_recorded(process.pid, start, signal.SIGKILL) is False


def test_a_restart_returns_only_at_node_ready_with_a_heartbeat_after_the_restart(
    restart_env: dict, lock_holder: subprocess.Popen[str]
) -> None:
    """Review (4): /healthz answers before the Node is Ready again; the restart waits for a
    Ready condition whose heartbeat the new kubelet wrote (a stale Ready is the old one's)."""
    containerd, old = _sleeper(), _kubelet_like()
    stale = time.time() - 30
    reads = {"n": 0}

    def heartbeat() -> float:
        reads["n"] += 1
        return stale if reads["n"] <= 3 else time.time()

    restart_env["heartbeat"] = heartbeat
    try:
        _running_node(lock_holder.pid, kubelet=old, containerd=containerd)
        realnode.restart_kubelet(timeout=5)
        assert reads["n"] >= 4
    finally:
        containerd.kill()
        containerd.wait()


def test_a_restart_whose_node_keeps_an_old_heartbeat_fails(
    restart_env: dict, lock_holder: subprocess.Popen[str]
) -> None:
    """Review (4): Ready True, but last written before the restart: not the new kubelet's."""
    restart_env["heartbeat"] = time.time() - 30
    containerd, old = _sleeper(), _kubelet_like()
    try:
        _running_node(lock_holder.pid, kubelet=old, containerd=containerd)
        with pytest.raises(realnode.RealNodeError, match=r"node Ready.*not ready after"):
            realnode.restart_kubelet(timeout=1)
    finally:
        containerd.kill()
        containerd.wait()


def test_stop_leaves_another_checkouts_node_alone_without_waiting_for_a_change_lock(
    machine: FakeMachine, lock_holder: subprocess.Popen[str], tmp_path: Path
) -> None:
    """Every cluster start and stop of every checkout calls stop(): a change under way in
    another checkout (a cold start: apt, builds) must not hold up a kwok-only cluster."""
    kubelet, containerd = _sleeper(), _sleeper()
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import fcntl,os,sys,time; fd=os.open(sys.argv[1], os.O_RDWR|os.O_CREAT);"
         "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)",
         str(realnode.CHANGE_LOCK_FILE)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        record = _running_node(lock_holder.pid, kubelet=kubelet, containerd=containerd)
        record.state_dir = str(tmp_path / "other-checkout")
        record.save()
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        realnode.stop(quiet=True, wait=0.5)  # no "under way" error: it is not ours to change
        assert realnode.Record.load() is not None and _alive_all(kubelet, containerd)
        with pytest.raises(realnode.RealNodeError, match="belongs to"):
            realnode.start(wait=0.5)
    finally:
        for proc in (holder, kubelet, containerd):
            proc.kill()
            proc.wait()


def _alive_all(*procs: subprocess.Popen[bytes]) -> bool:
    return all(proc.poll() is None for proc in procs)


def test_a_start_killed_before_its_kubelet_is_not_taken_for_an_unfinished_restart(
    restart_env: dict, lock_holder: subprocess.Popen[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A start() killed between the forwarder's spawn and the kubelet's leaves a record with
    forwarder and containerd but no kubelet (and no kubelet.json): the next start tears that
    down and starts afresh, instead of "restarting" a kubelet that has no configuration."""
    monkeypatch.setattr(realnode, "ensure_node_packages", lambda: None)
    monkeypatch.setattr(realnode.toolchain, "build_all", lambda groups: None)
    monkeypatch.setattr(realnode, "cluster_problems", lambda port: [])
    monkeypatch.setattr(realnode, "import_image", lambda a, b: None)
    fresh: list[tuple] = []
    monkeypatch.setattr(realnode, "_start_locked", lambda *a: fresh.append(a))
    def stop_forwarder(record: realnode.Record) -> None:
        lock_holder.kill()
        lock_holder.wait()

    monkeypatch.setattr(realnode, "_stop_forwarder", stop_forwarder)
    monkeypatch.setattr(realnode, "cleanup", lambda quiet=False: None)
    containerd = _sleeper()
    try:
        record = _running_node(lock_holder.pid, containerd=containerd)
        record.starter_pid, record.starter_start = 1, 0.0  # the killed starter
        record.save()
        assert not realnode._kubelet_down_only(record)
        realnode.start()
        assert fresh, "a fresh start"
        assert not [n for n, _, _ in restart_env["spawned"] if n == "kubelet"]
    finally:
        containerd.kill()
        containerd.wait()


def test_a_pidfd_that_cannot_be_opened_for_another_reason_than_gone_is_an_error(
    process: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review (stop 15): any ``pidfd_open`` failure was taken for "the process is gone": a
    teardown out of file descriptors (EMFILE) sent no signal, waited, and then reported the
    process as one that "did not exit" instead of the reason it was not signalled."""
    start = realnode.process_start_boottime(process.pid)

    def out_of_descriptors(pid: int) -> int:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(os, "pidfd_open", out_of_descriptors)
    with pytest.raises(realnode.RealNodeError, match=rf"PID {process.pid}.*Too many open files"):
        realnode._signal_recorded(process.pid, start, signal.SIGKILL)
    assert process.poll() is None


def _listed_in_a_node_cgroup(pids: set[int]) -> Path:
    """A container's cgroup of the (fake) node, listing ``pids``; its ``cgroup.procs`` file."""
    cgroup = realnode.CGROUP_ROOT / "pids" / realnode.TRACKING_CGROUP / "kubepods" / "pod-a"
    cgroup.mkdir(parents=True, exist_ok=True)
    procs = cgroup / "cgroup.procs"
    procs.write_text("".join(f"{pid}\n" for pid in pids))
    return procs


def test_a_pid_read_from_the_node_cgroups_then_reused_elsewhere_is_not_killed(
    machine: FakeMachine, process: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review: the teardown's kill loop reads PIDs from the node's cgroups, then signals them.
    Here the listed process exits right then and its PID names ``process`` (outside the node)
    from the moment a pidfd is opened for it: it is left alone."""
    procs = _listed_in_a_node_cgroup({process.pid})
    pidfd_open = os.pidfd_open

    def reused(pid: int, *args: Any) -> int:
        procs.write_text("")  # the node's process is gone; ``process`` has its PID now
        return pidfd_open(pid, *args)

    monkeypatch.setattr(os, "pidfd_open", reused)
    realnode._kill_in_node_cgroups({process.pid}, signal.SIGKILL)
    assert process.poll() is None


def test_a_pid_still_in_the_node_cgroups_is_killed(
    machine: FakeMachine, process: subprocess.Popen[bytes]
) -> None:
    _listed_in_a_node_cgroup({process.pid})
    realnode._kill_in_node_cgroups({process.pid}, signal.SIGKILL)
    assert process.wait(timeout=10) == -signal.SIGKILL


def test_a_pid_of_the_node_cgroups_that_cannot_be_pinned_is_an_error_not_a_silent_skip(
    machine: FakeMachine, process: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review: out of descriptors is not "gone": skipping it would end the kill loop in
    "processes of the node did not exit", the cause lost."""
    _listed_in_a_node_cgroup({process.pid})

    def out_of_descriptors(pid: int, *args: Any) -> int:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(os, "pidfd_open", out_of_descriptors)
    with pytest.raises(realnode.RealNodeError, match=rf"PID {process.pid}.*Too many open files"):
        realnode._kill_in_node_cgroups({process.pid}, signal.SIGKILL)
    assert process.poll() is None


def test_a_pid_of_the_node_cgroups_that_now_names_a_thread_is_skipped(
    machine: FakeMachine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review: a PID reused by a thread (not a process): pidfd_open fails with ENOENT (EINVAL
    on older kernels), which is "not that process", not an error that aborts the teardown."""
    started, done = threading.Event(), threading.Event()
    tids: list[int] = []

    def thread() -> None:
        tids.append(threading.get_native_id())
        started.set()
        done.wait(30)

    worker = threading.Thread(target=thread)
    worker.start()
    try:
        assert started.wait(30)
        (tid,) = tids
        _listed_in_a_node_cgroup({tid})
        # Signal 0 (none sent): were the thread's process pinned, this test's would be hit.
        realnode._kill_in_node_cgroups({tid}, 0)  # no error
        assert realnode._signal_recorded(tid, 0.0, 0) is False
    finally:
        done.set()
        worker.join()
