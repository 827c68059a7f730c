"""A local Kubernetes control plane with fake PMEM nodes.

kwokctl's binary runtime starts etcd, kube-apiserver (RBAC on, secure port, service-account
token signing), kube-controller-manager, kube-scheduler and the kwok controller from the
binaries built by :mod:`tools.toolchain`. kwok then plays the kubelet for the fake nodes: it
keeps them Ready and marks the pods scheduled onto them Running and Ready.

Usage: ``python -m tools.cluster start [--nodes N]``, ``python -m tools.cluster stop``.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import yaml

from tools import localenv, realnode, toolchain

CLUSTER_NAME = "pmem-csi"
# kwokctl gives each component the first free port below 32767, chosen afresh by each process:
# two clusters created at the same moment (the test suite's xdist workers, the second cluster of
# tests/e2e/test_one_cluster.py, another checkout) would pick the same ports. So one creation at
# a time on this machine, until its components listen (``--wait``).
CREATE_LOCK = Path(tempfile.gettempdir()) / "pmem-csi-pulumi-cluster-create.lock"
PMEM_LABEL = {"storage": "pmem"}
# kwokctl's kwok controller manages the nodes that carry this annotation.
KWOK_NODE_ANNOTATION = {"kwok.x-k8s.io/node": "fake"}
DEFAULT_PMEM_NODES = 3
DEFAULT_PLAIN_NODES = 1


def _log(msg: str) -> None:
    print(f"[cluster] {msg}", file=sys.stderr, flush=True)


def kwok_workdir(state_dir: Path | None = None) -> Path:
    """kwokctl's work directory of this checkout's cluster, or of ``state_dir``'s."""
    return (state_dir or localenv.state_dir()) / "kwok"


def _kwokctl_env() -> dict[str, str]:
    env = dict(os.environ)
    env["KWOK_WORKDIR"] = str(kwok_workdir())
    env["PATH"] = os.pathsep.join([*map(str, toolchain.path_dirs()), env.get("PATH", "")])
    return env


def _kwokctl(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(toolchain.bin_path("kwokctl")), "--name", CLUSTER_NAME, *args],
        env=_kwokctl_env(),
        check=check,
        capture_output=True,
        text=True,
    )


def is_running() -> bool:
    """True when the API server of the local cluster answers /readyz."""
    if not localenv.kubeconfig_path().exists():
        return False
    result = subprocess.run(
        [str(toolchain.bin_path("kubectl")), "get", "--raw", "/readyz"],
        env={**os.environ, "KUBECONFIG": str(localenv.kubeconfig_path())},
        capture_output=True,
        text=True,
        timeout=20,
    )
    return result.returncode == 0 and result.stdout.strip() == "ok"


def node_manifest(name: str, labels: dict[str, str]) -> dict:
    """A fake node, managed by kwok; no taints, so DaemonSet pods land on it."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": dict(KWOK_NODE_ANNOTATION),
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                **labels,
            },
        },
        "status": {
            "allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110"},
            "capacity": {"cpu": "32", "memory": "256Gi", "pods": "110"},
        },
    }


def _core_api():  # imported late: `stop` and `status` must work without the client
    from kubernetes import client, config

    api_client = config.new_client_from_config(config_file=str(localenv.kubeconfig_path()))
    return client.CoreV1Api(api_client)


def add_node(name: str, labels: dict[str, str], timeout: float = 60) -> None:
    """Create a fake node and wait until kwok reports it Ready."""
    core = _core_api()
    core.create_node(node_manifest(name, labels))
    wait_nodes_ready([name], timeout=timeout)


# kwok marks a fake node Ready within seconds on an idle machine; on a loaded 2-core one (two
# test workers, a demo, a nested session) it took over 60 s once. The limit only says when to
# give up on a cluster that will not come up.
NODES_READY_TIMEOUT = 300.0


def wait_nodes_ready(names: list[str], timeout: float = NODES_READY_TIMEOUT) -> None:
    core = _core_api()
    deadline = time.monotonic() + timeout
    pending = set(names)
    while pending:
        for node in core.list_node().items:
            ready = any(
                c.type == "Ready" and c.status == "True" for c in node.status.conditions or []
            )
            if ready:
                pending.discard(node.metadata.name)
        if not pending:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"nodes not Ready after {timeout:.0f}s: {sorted(pending)}")
        time.sleep(0.5)


# kube-controller-manager and kube-scheduler exit when they cannot renew their leader Lease
# within the renew deadline (10 s by default), and nothing restarts them in a kwokctl cluster
# (a kubelet would in a real one). On this 2-core machine, with a test run per core, an API
# server busy for 10 s happened once: the cluster then had no controllers. 45 s of patience
# instead; a process that starts still takes a Lease at once when it is free.
LEADER_ELECTED_CONTROLLERS = ("kube-controller-manager", "kube-scheduler")
CONTROLLER_LEADER_ELECTION = [
    {"key": "leader-elect-lease-duration", "value": "60s"},
    {"key": "leader-elect-renew-deadline", "value": "45s"},
    {"key": "leader-elect-retry-period", "value": "2s"},
]


# kube-controller-manager gives the API server 10 s (hard-coded) to answer /healthz once it
# holds its Lease, and exits when it does not ("failed to wait for apiserver being healthy").
# kwokctl starts it together with the API server and never restarts it: on a loaded machine
# (2026-12-02, three test workers and other work on 2 cores) the API server's start hooks took
# longer, and that worker's cluster ran without controllers (DaemonSets at 0 desired, every
# `pulumi up` awaiting rollouts forever). So every start checks the components by their pid
# files and starts again, with kwokctl's command line, one whose process is gone.
CONTROLLERS_READY_TIMEOUT = 300.0
MAX_COMPONENT_RESTARTS = 3
# The components that hold and serve the cluster's objects (ensure_controllers says why they
# are started again only in a cluster just created).
CONTROL_PLANE_STORE = ("etcd", "kube-apiserver")


def cluster_dir(state_dir: Path | None = None) -> Path:
    """kwokctl's directory of the cluster: ``kwok.yaml``, ``pids/``, ``logs/``."""
    return kwok_workdir(state_dir) / "clusters" / CLUSTER_NAME


def _component_pids_dir() -> Path:
    return cluster_dir() / "pids"


def start_component(name: str) -> subprocess.Popen[bytes]:
    """Start one component as kwokctl does: its binary, arguments and working directory from
    the cluster's ``kwok.yaml``, output appended to its log, its pid written to its pid file
    (``kwokctl delete cluster`` stops components by those files).

    Not ``kwokctl start cluster``: that takes a component for running while its pid answers
    signal 0, which a zombie does (a killed component stays one when nothing reaps it).
    """
    docs = yaml.safe_load_all((cluster_dir() / "kwok.yaml").read_text(encoding="utf-8"))
    config = next(d for d in docs if d and d.get("kind") == "KwokctlConfiguration")
    component = next(c for c in config["components"] if c["name"] == name)
    with (cluster_dir() / "logs" / f"{name}.log").open("ab") as log:
        proc = subprocess.Popen(
            [component["binary"], *component.get("args", [])],
            cwd=component.get("workDir") or str(cluster_dir()),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # like kwokctl: detached from the caller's session
        )
    (_component_pids_dir() / f"{name}.pid").write_text(str(proc.pid))
    # The caller holds the creation lock while the component's ports are free: keep it until
    # they are this process's again (or the process gave up), or a cluster created meanwhile
    # could take them.
    ports = [p["port"] for p in component.get("ports", [])]
    deadline = time.monotonic() + PORTS_TIMEOUT
    while proc.poll() is None and not all(map(_listening, ports)):
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
    return proc


PORTS_TIMEOUT = 30.0


def _listening(port: int) -> bool:
    """A socket of this network namespace listens on TCP ``port`` (read, not connected to)."""
    suffix = f":{port:04X}"
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text(encoding="ascii").splitlines()[1:]
        except OSError:
            continue
        if any(r.split()[1].endswith(suffix) and r.split()[3] == "0A" for r in rows):
            return True
    return False


def program_of(pid: int) -> str | None:
    """The program a process runs (``argv[0]``); None when gone (a zombie has no cmdline)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return os.fsdecode(cmdline.split(b"\0", 1)[0]) or None  # as str(Path) holds the bytes


def dead_components() -> list[str]:
    """The components kwokctl started whose process is gone (by its pid file).

    A zombie, or a PID that now names another program or another cluster's component
    (reused), counts as gone: ``/proc/PID/cmdline`` must start with this cluster's
    ``bin/<name>`` (kwokctl links each binary there).
    """
    dead = []
    for pid_file in sorted(_component_pids_dir().glob("*.pid")):
        name = pid_file.stem
        try:
            program = program_of(int(pid_file.read_text().strip()))
        except (OSError, ValueError):
            program = None
        if program != str(cluster_dir() / "bin" / name):
            dead.append(name)
    return dead


def runs_api_server(state_dir: Path) -> bool:
    """Whether a process runs the kube-apiserver of ``state_dir``'s cluster (its ``bin/``
    link, as kwokctl and :func:`start_component` start it), found in ``/proc``: also when its
    pid file or its kwokctl directory is gone (a stop killed half-way, or whose
    ``kwokctl delete`` failed)."""
    binary = str(cluster_dir(state_dir) / "bin" / "kube-apiserver")
    return any(program_of(pid) == binary for pid in _pids())


def _pids() -> list[int]:
    return [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]


def _kill_left_components(timeout: float = 10) -> None:
    """SIGKILL every process that still runs one of this cluster's binaries (its ``bin/``
    links), found in ``/proc``: after a ``kwokctl delete`` that failed, or state removed
    before (the pid files gone), they would run on, and an API server among them keeps the
    real node's host routes (tools/realnode.py ``_delete_node_object``)."""
    prefix = str(cluster_dir() / "bin") + os.sep
    left = [pid for pid in _pids() if (program_of(pid) or "").startswith(prefix)]
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while any((program_of(pid) or "").startswith(prefix) for pid in left):
        if time.monotonic() > deadline:
            raise RuntimeError(f"components of {cluster_dir()} did not exit: {left}")
        time.sleep(0.05)


# kube-controller-manager takes its Lease, then gives the API server 10 s to be healthy; a
# Lease renewed this long after it was taken shows a process past that check.
PAST_START_CHECK = timedelta(seconds=11)


def _lease_renewed_since(coordination: object, name: str, since: datetime) -> bool:
    lease = coordination.read_namespaced_lease(name, "kube-system", _request_timeout=10)
    spec = lease.spec
    if not (spec and spec.holder_identity and spec.renew_time and spec.acquire_time):
        return False
    return spec.acquire_time > since and spec.renew_time - spec.acquire_time >= PAST_START_CHECK


def _controllers_working(restarted: dict[str, datetime]) -> bool:
    """The controllers work, judged by what a live process made.

    At a creation (fresh etcd): kube-controller-manager is past its start-up check once its
    service-account controller has made ``default/default``, and kube-scheduler holds its
    Lease. A controller started again here must have renewed its Lease since (the old
    ServiceAccount and Lease holder outlive the process that made them). A busy API server
    (429, 5xx, no answer) means "not yet", not an error.
    """
    import urllib3
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core = _core_api()
    coordination = client.CoordinationV1Api(core.api_client)
    try:
        core.read_namespaced_service_account("default", "default", _request_timeout=10)
        scheduler = coordination.read_namespaced_lease(
            "kube-scheduler", "kube-system", _request_timeout=10
        )
        return bool(scheduler.spec and scheduler.spec.holder_identity) and all(
            _lease_renewed_since(coordination, name, since)
            for name, since in restarted.items()
            if name in LEADER_ELECTED_CONTROLLERS
        )
    except ApiException as err:
        if err.status == 404 or err.status == 429 or err.status >= 500:
            return False
        raise
    except urllib3.exceptions.HTTPError:
        return False
    finally:
        core.api_client.close()


def _forget_lease(name: str) -> None:
    """Delete the Lease a dead controller held: its successor need not wait it out (60 s)."""
    import urllib3
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core = _core_api()
    try:
        client.CoordinationV1Api(core.api_client).delete_namespaced_lease(
            name, "kube-system", _request_timeout=10
        )
    except ApiException as err:
        # Gone already, or a busy API server: the successor then waits the Lease out.
        if err.status not in (404, 429) and err.status < 500:
            raise
    except urllib3.exceptions.HTTPError:
        pass
    finally:
        core.api_client.close()


def ensure_controllers(
    timeout: float = CONTROLLERS_READY_TIMEOUT, just_created: bool = False
) -> None:
    """Return once every component runs and the controllers work; start again a component
    that exited (:func:`start_component`), at most :data:`MAX_COMPONENT_RESTARTS` times.

    etcd and the API server are started again only in a cluster ``just_created`` (a fresh
    etcd): an older one may hold the real node's Node, whose host routes a teardown removes
    once that API server is gone (tools/realnode.py ``_delete_node_object``); started again,
    it could dial the node's address off the machine. Such a cluster is an error here, and
    the next start deletes it and creates it anew.
    """
    deadline = time.monotonic() + timeout
    restarts = 0
    restarted: dict[str, datetime] = {}
    while True:
        dead = dead_components()
        _refuse_stopped_store(dead, just_created)
        if dead:
            logs = cluster_dir() / "logs"
            if restarts == MAX_COMPONENT_RESTARTS:
                raise RuntimeError(
                    f"{', '.join(dead)} exited again after {restarts} restart(s); "
                    f"see {', '.join(str(logs / f'{name}.log') for name in dead)}"
                )
            restarts += 1
            _log(
                f"{', '.join(dead)} not running (exited at start? see "
                f"{', '.join(str(logs / f'{name}.log') for name in dead)}); starting it again"
            )
            # Under the creation lock: a component that is down left its port free, and a
            # cluster created meanwhile (kwokctl takes the first free port) could take it.
            with one_create_at_a_time():
                dead = dead_components()  # again: another start may have restarted them
                _refuse_stopped_store(dead, just_created)  # or the API server died meanwhile
                for name in dead:
                    if name in LEADER_ELECTED_CONTROLLERS:
                        _forget_lease(name)
                    restarted[name] = datetime.now(UTC)
                    start_component(name)
        elif _controllers_working(restarted):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"kube-controller-manager / kube-scheduler not working after {timeout:.0f}s "
                "(no default/default ServiceAccount, no kube-scheduler Lease holder, or no "
                "Lease renewed by a controller started again)"
            )
        time.sleep(0.5)


def _refuse_stopped_store(dead: list[str], just_created: bool) -> None:
    stopped = [name for name in dead if name in CONTROL_PLANE_STORE]
    if stopped and not just_created:
        raise RuntimeError(
            f"{', '.join(stopped)} not running: a cluster that stopped is not started "
            "again with its old state; `python -m tools.cluster start` deletes it and "
            f"creates it anew (logs: {cluster_dir() / 'logs'})"
        )


def kwokctl_config() -> str:
    """kwokctl's configuration: what the real node (tools/realnode.py) needs of the cluster.

    kwok manages only the fake nodes (by their annotation), never the real node; Services get
    a range of their own (kwok gives fake pods 10.0.0.0/24, the API server's default Service
    range too); the API server's certificate names the ``kubernetes`` Service's ClusterIP,
    which is how pods reach it; the API server reaches a kubelet only by its InternalIP (the
    real node's is blackholed on the host), never by resolving its name.
    """
    ((key, value),) = KWOK_NODE_ANNOTATION.items()
    return json.dumps(
        {
            "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
            "kind": "KwokctlConfiguration",
            "options": {"kubeApiserverCertSANs": [realnode.KUBERNETES_SERVICE_IP]},
            "componentsPatches": [
                {
                    "name": "kube-apiserver",
                    "extraArgs": [
                        {"key": "service-cluster-ip-range", "value": realnode.SERVICE_CIDR},
                        # Dial a kubelet (logs, exec) by its InternalIP, never by its name: a
                        # name lookup would send a DNS query off the machine.
                        {"key": "kubelet-preferred-address-types", "value": "InternalIP"},
                    ],
                },
                *(
                    {"name": name, "extraArgs": CONTROLLER_LEADER_ELECTION}
                    for name in LEADER_ELECTED_CONTROLLERS
                ),
                {
                    "name": "kwok-controller",
                    "extraArgs": [
                        {"key": "manage-all-nodes", "value": "false"},
                        {"key": "manage-nodes-with-annotation-selector", "value": f"{key}={value}"},
                    ],
                },
            ],
        },
        indent=1,
    )


def start(
    pmem_nodes: int = DEFAULT_PMEM_NODES,
    plain_nodes: int = DEFAULT_PLAIN_NODES,
    real_node: bool = False,
) -> Path:
    """Start the cluster (or reuse a running one) and return its kubeconfig path.

    ``real_node`` also joins the machine's one real node (tools/realnode.py) with the reporter
    image (tools/image.py, built when missing) in its containerd.
    """
    kubeconfig = _start_control_plane(pmem_nodes, plain_nodes)
    if real_node:
        from tools import image

        reporter = image.build()
        realnode.start(images=[(reporter.archive, realnode.REPORTER_IMAGE_BASE)])
    return kubeconfig


def _start_control_plane(pmem_nodes: int, plain_nodes: int) -> Path:
    t0 = time.monotonic()
    toolchain.build_all(["kubernetes", "etcd", "kwok"])
    kubeconfig = localenv.kubeconfig_path()
    if is_running():
        ensure_controllers()
        _log(f"already running; kubeconfig {kubeconfig}")
        return kubeconfig
    stop(quiet=True)
    _log(f"starting control plane '{CLUSTER_NAME}' (state in {kwok_workdir()})")
    config = localenv.state_dir() / "kwokctl.yaml"
    config.write_text(kwokctl_config())
    with one_create_at_a_time():
        result = _create_cluster(config, kubeconfig)
        if result.returncode != 0:
            raise RuntimeError(
                f"kwokctl create cluster failed ({result.returncode}):\n{result.stdout}\n"
                f"{result.stderr}\nComponent logs: {kwok_workdir() / 'clusters' / CLUSTER_NAME}"
            )
        # Still under the lock: kube-controller-manager exits within seconds when it does,
        # and the port it leaves must not go to another cluster created in between.
        ensure_controllers(just_created=True)
    _log(f"API server and controllers working after {time.monotonic() - t0:.1f}s; creating nodes")
    core = _core_api()
    names = []
    for i in range(1, pmem_nodes + 1):
        names.append(f"pmem-node-{i}")
        core.create_node(node_manifest(names[-1], PMEM_LABEL))
    for i in range(1, plain_nodes + 1):
        names.append(f"plain-node-{i}")
        core.create_node(node_manifest(names[-1], {}))
    wait_nodes_ready(names)
    _log(
        f"ready in {time.monotonic() - t0:.1f}s: {pmem_nodes} PMEM node(s), "
        f"{plain_nodes} plain node(s); KUBECONFIG={kubeconfig}"
    )
    return kubeconfig


_lock_held = threading.local()


@contextlib.contextmanager
def one_create_at_a_time() -> Iterator[None]:
    """Hold :data:`CREATE_LOCK` (waiting for another creation to finish).

    Re-entrant within a thread: a creation restarts a component that exited while it holds
    the lock (:func:`ensure_controllers`), and so may a test that took it to kill one.
    """
    if getattr(_lock_held, "depth", 0):
        _lock_held.depth += 1
        try:
            yield
        finally:
            _lock_held.depth -= 1
        return
    fd = os.open(CREATE_LOCK, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        _lock_held.depth = 1
        yield
    finally:
        _lock_held.depth = 0
        os.close(fd)


def _create_cluster(config: Path, kubeconfig: Path) -> subprocess.CompletedProcess[str]:
    binary = toolchain.bin_path
    return _kwokctl(
        "create",
        "cluster",
        "--config",
        str(config),
        "--runtime",
        "binary",
        "--kube-authorization",
        "--kubeconfig",
        str(kubeconfig),
        "--kube-apiserver-binary",
        str(binary("kube-apiserver")),
        "--kube-controller-manager-binary",
        str(binary("kube-controller-manager")),
        "--kube-scheduler-binary",
        str(binary("kube-scheduler")),
        "--kwok-controller-binary",
        str(binary("kwok")),
        "--etcd-binary",
        str(binary("etcd")),
        "--wait",
        "120s",
        check=False,
    )


def stop(quiet: bool = False) -> None:
    """Stop every component and remove the cluster's state (Pulumi state is kept).

    The real node goes first, when this state directory owns it; if its teardown finds
    something it could not remove, the cluster is still stopped and the error raised after.
    """
    node_error: realnode.RealNodeError | None = None
    try:
        realnode.stop(quiet=quiet)
    except realnode.RealNodeError as err:
        node_error = err
    if (kwok_workdir() / "clusters" / CLUSTER_NAME).exists():
        try:
            _kwokctl("delete", "cluster", "--kubeconfig", str(localenv.kubeconfig_path()))
        except (subprocess.CalledProcessError, FileNotFoundError) as err:
            if not quiet:
                _log(f"kwokctl delete failed ({err}); removing state anyway")
    _kill_left_components()
    shutil.rmtree(kwok_workdir(), ignore_errors=True)
    localenv.kubeconfig_path().unlink(missing_ok=True)
    if node_error is not None:
        # E.g. the Node object could not be confirmed gone, so the host's blackhole routes
        # stayed: with the control plane gone nothing can dial the node; tear down again.
        try:
            realnode.stop(quiet=quiet)
            node_error = None
        except realnode.RealNodeError as err:
            node_error = err
    if not quiet:
        _log("stopped")
    if node_error is not None:
        raise node_error


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.cluster", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("start", help="start the local cluster (builds missing tools)")
    s.add_argument("--nodes", type=int, default=DEFAULT_PMEM_NODES, help="fake PMEM nodes")
    s.add_argument("--plain-nodes", type=int, default=DEFAULT_PLAIN_NODES)
    s.add_argument(
        "--real-node",
        action="store_true",
        help="also join the machine's one real node (containerd + kubelet; tools/realnode.py)",
    )
    sub.add_parser("stop", help="stop the local cluster and remove its state")
    sub.add_parser("status", help="exit 0 when the local cluster answers")
    args = parser.parse_args(argv)
    if args.cmd == "start":
        print(start(args.nodes, args.plain_nodes, real_node=args.real_node))
    elif args.cmd == "stop":
        stop()
    else:
        running = is_running()
        print("running" if running else "not running")
        return 0 if running else 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
