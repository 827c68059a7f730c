"""One real node (containerd + kubelet) beside the kwok nodes of the local cluster.

Why: kwok's pods run no process, so the reporter Deployment the program writes (probes,
projected ServiceAccount token, cgroup limits, restarts, rolling updates, Lease hand-over)
would otherwise never run under a kubelet. This module joins one real kubelet to the local
kwokctl cluster (:mod:`tools.cluster`) and tears it down without leftovers.

Isolation (a hard rule here: no packet to any address outside the loopback range or the
namespaces made here):

* The node (containerd, kubelet, the pods' host side) lives in its own network namespace
  (:data:`NETNS`), entered with ``nsenter --net`` (``ip netns exec`` would remount /sys and
  hide the cgroups). It holds only ``lo`` and the CNI bridge :data:`BRIDGE` (whose address is
  the node's IP); nothing in it is wired to the host's uplink.
* Before containerd starts (so before any pod gets an address): blackhole routes in that
  namespace (default, the service and node ranges) and on the host (the service and node
  ranges), and an nftables table there whose output and forward chains drop everything that
  does not stay on ``lo`` or the bridge. :func:`guard_problems` checks all of it and
  :func:`start` refuses to go on unless it reports nothing.
* The API server (on the host's loopback) is reached only through :func:`forward`, a process
  that listens inside the namespace and connects to one loopback target on the host: the
  kubelet's kubeconfig names it at 127.0.0.1 in the namespace, and the ``kubernetes``
  Service's ClusterIP is DNATed to it for the pods (so the API server's certificate must name
  that ClusterIP; :mod:`tools.cluster` adds it).
* The API server never connects to the kubelet: the node's address is blackholed on the
  host, so ``kubectl logs``/``exec`` fail at once; read logs from :func:`pod_log_dir`.

Only one real node per machine: the kubelet's device-plugin socket, ``/var/log/containers``
and ``/var/lib/cni`` are machine-wide. A lock file enforces it (held by the starting process,
then by the forwarder for the node's life time); :func:`cleanup` runs only with it held and
removes processes (by PID and start time, from the node's cgroups), the kernel tunables the
kubelet changed (written back), mounts, cgroups, the namespace, the Node object and then the
routes, and those paths; it runs at every start too, so a killed run's leftovers go before
anything new is made.

Usage: ``python -m tools.realnode start|stop|status|check-guard|restart-kubelet``.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import fcntl
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tools import hostpkg, localenv, toolchain

NODE_NAME = "real-node-1"
# The node's label and taint: only pods that tolerate the taint (and select the label, like the
# reporter patch in tools/demo.py) run here; the driver's pods and every other test's pods stay
# on the kwok nodes, whose images do not exist on this machine.
NODE_LABEL = ("pmem-csi-pulumi/real-node", "true")
NODE_TAINT = f"{NODE_LABEL[0]}={NODE_LABEL[1]}:NoSchedule"

# Address ranges. kwokctl's API server and kwok itself default to 10.0.0.0/24 for Services and
# fake pods alike; tools.cluster moves the Services to SERVICE_CIDR so the three never overlap.
SERVICE_CIDR = "10.96.0.0/16"
KUBERNETES_SERVICE_IP = "10.96.0.1"
NODE_CIDR = "10.98.0.0/16"  # the node and its pods, blackholed on the host
POD_CIDR = "10.98.1.0/24"
# kwok's fake pods (kwok's default; tools.cluster leaves it): nothing is there, so nothing
# may be sent there either.
KWOK_POD_CIDR = "10.0.0.0/24"
NODE_IP = "10.98.1.1"  # the bridge's address: the pods' gateway and the forwarder's listener
FORWARD_PORT = 6443

NETNS = "pmem-csi-node"
BRIDGE = "pmemcsi0"
NFT_TABLE = "pmem_csi_guard"
# Machine-wide, because the node is: see the module docstring.
NODE_ROOT = Path("/var/lib/pmem-csi-pulumi-node")
NODE_RUN = Path("/run/pmem-csi-pulumi-node")
LOCK_FILE = Path("/run/pmem-csi-pulumi-node.lock")
# One change of the node at a time: start, stop and restart-kubelet each hold this flock from
# their first look at the record to their last write (always before LOCK_FILE). LOCK_FILE
# cannot serve: the forwarder holds it for as long as the node lives (that is what makes a
# running node "in use" for every other process), so a restart of a running node could never
# take it.
CHANGE_LOCK_FILE = Path("/run/pmem-csi-pulumi-node.change.lock")
# How long a change waits for one under way (a start builds nothing when the tools are
# cached, so this is a kubelet restart's or a start's worst case on a loaded machine).
CHANGE_WAIT = 300.0
# How long a stop waits for the node lock (a start under way in this checkout holds it), and
# how long a teardown retries the rmdir of a cgroup whose last processes the kernel still counts.
STOP_LOCK_WAIT = 10.0
CGROUP_REMOVE_WAIT = 10.0
RECORD_FILE = Path("/run/pmem-csi-pulumi-node.json")
# What the machine looked like before the first node ran (the paths of HARD_CODED_PATHS that
# existed, the kernel tunables the kubelet changes). Outside /run, so that it outlives a
# reboot; removed only by a teardown that leaves nothing behind, so a half-done one never
# makes the old node's paths look like the machine's own.
BASELINE_FILE = Path("/var/lib/pmem-csi-pulumi-node.baseline.json")
NETNS_DIR = Path("/run/netns")
SYSCTL_ROOT = Path("/proc/sys")
# Machine-wide kernel tunables the kubelet sets at start (protectKernelDefaults false:
# setupKernelTunables): saved before it starts, written back by the teardown.
KUBELET_SYSCTLS = (
    "kernel/panic",
    "kernel/panic_on_oops",
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)
# Paths the kubelet and containerd use whatever their configuration says.
HARD_CODED_PATHS = (
    Path("/var/lib/kubelet"),
    Path("/var/log/containers"),
    Path("/var/log/pods"),
    Path("/var/lib/cni"),
    Path("/run/containerd"),
    Path("/etc/cni"),
    Path("/opt/cni"),
)
# In the pids hierarchy: containerd, shims, kubelet; in every hierarchy: the kubelet's
# cgroupRoot (its kubepods and the pods' cgroups below).
TRACKING_CGROUP = "pmem-csi-node"
CGROUP_ROOT = Path("/sys/fs/cgroup")
PAUSE_IMAGE = "localhost/pmem-csi-pause:" + toolchain.PAUSE_IMAGE_TAG
REPORTER_IMAGE_BASE = "localhost/pmem-csi-reporter"
NODE_PACKAGES = {  # Debian package -> a file it installs
    "runc": Path("/usr/sbin/runc"),
    "containernetworking-plugins": Path("/usr/lib/cni/bridge"),
    "nftables": Path("/usr/sbin/nft"),
}
RUNC = NODE_PACKAGES["runc"]
CNI_BIN_DIR = Path("/usr/lib/cni")
NODE_GROUPS = ("kubelet", "containerd", "pause")


def reporter_patch() -> dict:
    """A ``patches`` entry (the product's own setting) that puts the reporter on this node.

    It selects the only Deployment a driver deployment has, the reporter's, and gives it the
    node's label as node selector and a toleration of the node's taint; the driver's
    StatefulSet and DaemonSet tolerate nothing and stay on the kwok nodes.
    """
    key, value = NODE_LABEL
    return {
        "kind": "Deployment",
        "apiVersion": "apps/v1",
        "mergePatch": {
            "spec": {
                "template": {
                    "spec": {
                        "nodeSelector": {key: value},
                        "tolerations": [
                            {"key": key, "operator": "Equal", "value": value,
                             "effect": "NoSchedule"}
                        ],
                    }
                }
            }
        },
    }  # fmt: skip


class RealNodeError(RuntimeError):
    """The real node cannot start (busy machine, missing guard, a component that failed)."""


def _log(msg: str) -> None:
    print(f"[realnode] {msg}", file=sys.stderr, flush=True)


def log_dir() -> Path:
    """The components' logs, kept in the state directory after the node is gone."""
    path = localenv.state_dir() / "realnode-logs"
    path.mkdir(parents=True, exist_ok=True)
    return path


def pod_log_dir() -> Path:
    """The kubelet's ``podLogsDir``: where a pod's logs are read (the API server cannot)."""
    return NODE_ROOT / "pod-logs"


# Written by the forwarder once it listens; under NODE_RUN, so removed with the node.
FORWARDER_READY = NODE_RUN / "forwarder.ready"


def containerd_socket() -> Path:
    return NODE_RUN / "containerd.sock"


@dataclass
class Record:
    """What a running node is made of, so that any later process can tear it down."""

    state_dir: str
    pids: dict[str, int] = field(default_factory=dict)
    # Start time (boottime seconds, /proc/PID/stat) of each of ``pids``: a PID whose process
    # started at another time is a reused PID, not the node's, and is never signalled.
    pid_starts: dict[str, float] = field(default_factory=dict)
    # The process running start(): while it lives (or the forwarder does) the node is not a
    # leftover, whatever else is missing.
    starter_pid: int | None = None
    starter_start: float | None = None
    host_routes: list[str] = field(default_factory=list)
    guarded_at_boottime: float | None = None
    started_at_boottime: float | None = None

    def save(self) -> None:
        tmp = RECORD_FILE.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        tmp.replace(RECORD_FILE)

    @classmethod
    def load(cls) -> Record | None:
        try:
            return cls(**json.loads(RECORD_FILE.read_text()))
        except (FileNotFoundError, json.JSONDecodeError, TypeError):
            return None


@dataclass
class Baseline:
    """The machine before the first node ran (see BASELINE_FILE)."""

    # Of HARD_CODED_PATHS, those that existed: never removed.
    foreign_paths: list[str] = field(default_factory=list)
    # KUBELET_SYSCTLS -> value before the kubelet ran.
    sysctls: dict[str, str] = field(default_factory=dict)

    def save(self) -> None:
        tmp = BASELINE_FILE.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        tmp.replace(BASELINE_FILE)

    @classmethod
    def load(cls) -> Baseline | None:
        try:
            return cls(**json.loads(BASELINE_FILE.read_text()))
        except (FileNotFoundError, json.JSONDecodeError, TypeError):
            return None

    @classmethod
    def take(cls) -> Baseline:
        """The one saved before an earlier node, else the machine as it is now (saved)."""
        baseline = cls.load()
        if baseline is None:
            baseline = cls(
                foreign_paths=[str(p) for p in HARD_CODED_PATHS if p.exists()],
                sysctls={name: read_sysctl(name) for name in KUBELET_SYSCTLS},
            )
            baseline.save()
        return baseline


def read_sysctl(name: str) -> str:
    return (SYSCTL_ROOT / name).read_text().strip()


def _restore_sysctls(baseline: Baseline | None) -> None:
    for name, value in (baseline.sysctls if baseline else {}).items():
        if read_sysctl(name) != value:
            (SYSCTL_ROOT / name).write_text(value + "\n")


def boottime() -> float:
    """Seconds since boot, the clock of a process's start time in /proc/PID/stat."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def process_start_boottime(pid: int) -> float:
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[19]) / os.sysconf("SC_CLK_TCK")


def _start_of(pid: int) -> float | None:
    try:
        return process_start_boottime(pid)
    except (OSError, ValueError, IndexError):
        return None


def _same_process(pid: int | None, start: float | None) -> bool:
    """``pid`` is alive and is the process that started at ``start`` (not a reused PID)."""
    if not pid or not _alive(pid):
        return False
    if start is None:
        return False  # no start time saved: cannot tell it from a reused PID
    now = _start_of(pid)
    return now is not None and abs(now - start) <= 2 / os.sysconf("SC_CLK_TCK")


# pidfd_open's answers for a PID that names no process now: gone (ESRCH), or a thread, not a
# process (ENOENT on current kernels, EINVAL on older ones). A PID once a process's may be a
# thread's when reused.
NOT_A_PROCESS = frozenset({errno.ESRCH, errno.ENOENT, errno.EINVAL})


def _pin(pid: int) -> int | None:
    """A pidfd for ``pid``'s process, or None when the PID names no process now."""
    try:
        return os.pidfd_open(pid)
    except OSError as err:
        if err.errno in NOT_A_PROCESS:
            return None
        # out of descriptors, ...: not known to be gone
        raise RealNodeError(
            f"cannot open a pidfd for PID {pid} to signal it: {err.strerror or err}"
        ) from err


def _signal_recorded(pid: int | None, start: float | None, sig: int) -> bool:
    """Send ``sig`` to ``pid`` only if it is the process that started at ``start``; True if sent.

    The only way a recorded PID is signalled. Through a pidfd opened before the start time is
    compared: the descriptor names the process that had the PID then, so a PID that is
    reused after the check is never hit (the signal finds the old process gone).
    """
    if not pid or start is None:
        return False
    fd = _pin(pid)
    if fd is None:
        return False
    try:
        if not _same_process(pid, start):
            return False
        signal.pidfd_send_signal(fd, sig)
        return True
    except ProcessLookupError:
        return False
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- commands


def _run(
    cmd: Sequence[str | Path], check: bool = True, **kw: object
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)  # type: ignore[call-overload]
    if check and result.returncode != 0:
        raise RealNodeError(
            f"{' '.join(map(str, cmd))} failed ({result.returncode}): {result.stderr.strip()}"
        )
    return result


def netns_path() -> Path:
    return NETNS_DIR / NETNS


def in_netns(*cmd: str | Path) -> list[str]:
    """``cmd`` run inside the node's network namespace (mounts and cgroups stay the host's)."""
    return ["nsenter", f"--net={netns_path()}", "--", *map(str, cmd)]


def ensure_node_packages() -> None:
    """Install runc, the CNI plugins and nft from Debian with apt-get when missing."""
    paths = {str(path): pkg for pkg, path in NODE_PACKAGES.items()}
    try:
        hostpkg.ensure(paths, found=lambda path: Path(path).exists())
    except hostpkg.HostPackageError as err:
        raise RealNodeError(str(err)) from err


# --------------------------------------------------------------------------- the guard


def _guard_ruleset() -> str:
    """nftables rules of the node's namespace: nothing leaves but by ``lo`` or the bridge."""
    return f"""
table inet {NFT_TABLE} {{
  chain output {{
    type filter hook output priority -200; policy drop;
    oif "lo" accept
    oifname "{BRIDGE}" accept
    counter
  }}
  chain forward {{
    type filter hook forward priority -200; policy drop;
    iifname "{BRIDGE}" oifname "{BRIDGE}" accept
    counter
  }}
  chain prerouting {{
    type nat hook prerouting priority -110;
    ip daddr {KUBERNETES_SERVICE_IP} tcp dport 443 dnat ip to {NODE_IP}:{FORWARD_PORT}
  }}
}}
"""


def _netns_blackholes() -> list[str]:
    # A high metric: the bridge's own connected route (POD_CIDR) wins while the bridge is up;
    # without it, or for anything else, the packet dies in routing, before any interface.
    return ["default", SERVICE_CIDR, NODE_CIDR]


def _host_blackholes() -> list[str]:
    return [SERVICE_CIDR, NODE_CIDR, KWOK_POD_CIDR]


def _route_conflicts(routes: list[dict]) -> list[str]:
    """Host routes (``ip -j route show``) that overlap a range to be blackholed.

    ``ip route replace blackhole`` would replace a connected route of the same prefix (and
    cut the machine off a network it uses); a start refuses instead.
    """
    import ipaddress

    found = []
    for route in routes:
        if route.get("type") == "blackhole" or route.get("dst") in (None, "default"):
            continue
        net = ipaddress.ip_network(route["dst"], strict=False)
        for dst in _host_blackholes():
            if net.version == 4 and net.overlaps(ipaddress.ip_network(dst)):
                found.append(
                    f"a host route to {route['dst']} (dev {route.get('dev')}) overlaps the "
                    f"range {dst}"
                )
    return found


BLACKHOLE_METRIC = "4000"


def _make_netns() -> None:
    _run(["ip", "netns", "add", NETNS])
    ip = ["ip", "-n", NETNS]
    _run([*ip, "link", "set", "lo", "up"])
    for dst in _netns_blackholes():
        _run([*ip, "route", "add", "blackhole", dst, "metric", BLACKHOLE_METRIC])
    _run(in_netns("sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1"))
    _run(in_netns("sysctl", "-q", "-w", "net.ipv6.conf.default.disable_ipv6=1"))
    _run(in_netns("nft", "-f", "-"), input=_guard_ruleset())
    _run([*ip, "link", "add", BRIDGE, "type", "bridge"])
    _run([*ip, "addr", "add", f"{NODE_IP}/{POD_CIDR.split('/')[1]}", "dev", BRIDGE])
    _run([*ip, "link", "set", BRIDGE, "up"])


def guard_problems() -> list[str]:
    """What is missing of the isolation the module docstring describes (empty: all there)."""
    problems: list[str] = []
    if not netns_path().exists():
        return [f"network namespace {NETNS} does not exist"]
    links = json.loads(_run(["ip", "-n", NETNS, "-j", "link", "show"]).stdout)
    names = sorted(link["ifname"] for link in links)
    extra = [n for n in names if n not in ("lo", BRIDGE) and not _is_bridge_port(links, n)]
    if extra:
        problems.append(f"interfaces in {NETNS} besides lo, {BRIDGE} and its ports: {extra}")
    routes = json.loads(_run(["ip", "-n", NETNS, "-j", "route", "show"]).stdout)
    blackholes = {r["dst"] for r in routes if r.get("type") == "blackhole"}
    for dst in _netns_blackholes():
        if dst not in blackholes:
            problems.append(f"no blackhole route {dst} in {NETNS}")
    for route in routes:
        if route.get("type") != "blackhole" and route.get("gateway"):
            problems.append(f"a route with a gateway in {NETNS}: {route}")
        if route.get("type") != "blackhole" and route.get("dst") == "default":
            problems.append(f"a default route in {NETNS}: {route}")
    host = json.loads(_run(["ip", "-j", "route", "show", "type", "blackhole"]).stdout)
    for dst in _host_blackholes():
        if dst not in {r["dst"] for r in host}:
            problems.append(f"no blackhole route {dst} on the host")
    listed = _run(in_netns("nft", "-j", "list", "table", "inet", NFT_TABLE), check=False)
    if listed.returncode != 0:
        problems.append(f"nftables table inet {NFT_TABLE} missing in {NETNS}")
    else:
        chains = {
            item["chain"]["name"]: item["chain"]
            for item in json.loads(listed.stdout)["nftables"]
            if "chain" in item
        }
        for name in ("output", "forward"):
            if chains.get(name, {}).get("policy") != "drop":
                problems.append(f"chain {name} of {NFT_TABLE} does not drop by default")
    ipv6 = _run(in_netns("sysctl", "-n", "net.ipv6.conf.all.disable_ipv6")).stdout.strip()
    if ipv6 != "1":
        problems.append(f"IPv6 is enabled in {NETNS}")
    return problems


def _is_bridge_port(links: list[dict], name: str) -> bool:
    return any(link["ifname"] == name and link.get("master") == BRIDGE for link in links)


# --------------------------------------------------------------------------- the forwarder

CLONE_NEWNET = 0x40000000


def _setns(path: Path | str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns {path}: {os.strerror(err)}")
    finally:
        os.close(fd)


def _pump(src: socket.socket, dst: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := src.recv(65536):
            dst.sendall(data)
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)


def _is_loopback(host: str) -> bool:
    try:
        return socket.inet_aton(host)[0] == 127
    except OSError:
        return False


def forward(target_host: str, target_port: int, lock_fd: int | None = None) -> None:
    """Listen on FORWARD_PORT inside the namespace; connect only to the loopback target.

    The listening sockets are made after ``setns`` into the node's namespace and keep living
    there; the process then goes back to the host's namespace, where every upstream
    connection is opened. ``lock_fd`` (inherited) is the machine-wide node lock, held as long
    as this process lives.
    """
    del lock_fd  # held open by being inherited; nothing to do with it
    if not _is_loopback(target_host):
        raise RealNodeError(f"refusing to forward to {target_host}: not a loopback address")
    host_ns = os.open("/proc/self/ns/net", os.O_RDONLY)
    _setns(netns_path())
    listeners = []
    for addr in ("127.0.0.1", NODE_IP):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((addr, FORWARD_PORT))
        sock.listen(128)
        listeners.append(sock)
    _setns(f"/proc/self/fd/{host_ns}")
    os.close(host_ns)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))

    def serve(listener: socket.socket) -> None:
        while True:
            conn, _ = listener.accept()
            try:
                upstream = socket.create_connection((target_host, target_port), timeout=10)
                upstream.settimeout(None)
            except OSError:
                conn.close()
                continue
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=_pump, args=(a, b), daemon=True).start()

    threads = [threading.Thread(target=serve, args=(s,), daemon=True) for s in listeners]
    for t in threads:
        t.start()
    FORWARDER_READY.write_text(f"{os.getpid()}\n")
    for t in threads:
        t.join()


# --------------------------------------------------------------------------- configuration


def _containerd_config() -> str:
    bin_dir = toolchain.bin_path("containerd").parent
    return f"""version = 4
root = "{NODE_ROOT / "containerd"}"
state = "{NODE_RUN / "containerd"}"
disabled_plugins = [
  "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.erofs", "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing", "io.containerd.nri.v1.nri",
  "io.containerd.internal.v1.opt", "io.containerd.image-verifier.v1.bindir",
  "io.containerd.differ.v1.erofs", "io.containerd.mount-handler.v1.erofs",
]

imports = []

[plugins."io.containerd.server.v1.grpc"]
  address = "{containerd_socket()}"

[plugins."io.containerd.server.v1.ttrpc"]
  address = "{NODE_RUN / "containerd.sock.ttrpc"}"

[plugins."io.containerd.server.v1.debug"]
  address = ""

[plugins."io.containerd.server.v1.metrics"]
  address = ""

[plugins."io.containerd.cri.v1.runtime"]
  enable_selinux = false
  # No CAP_SYS_RESOURCE on these machines: without this, runc fails to lower oom_score_adj.
  restrict_oom_score_adj = true
  # The pods' network namespaces under the state directory (NODE_RUN), not /run/netns where
  # other runtimes keep theirs: the teardown removes them with it.
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "{RUNC}"
        Root = "{NODE_RUN / "runc"}"
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{CNI_BIN_DIR}"]
    conf_dir = "{NODE_ROOT / "cni" / "net.d"}"

[plugins."io.containerd.cri.v1.images"]
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{PAUSE_IMAGE}"

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

# The shim and runc are found next to containerd and in /usr/sbin.
# (shim binary: {bin_dir / "containerd-shim-runc-v2"})
"""


def _cni_config() -> dict:
    return {
        "cniVersion": "1.0.0",
        "name": "pmem-csi-node",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_CIDR, "gateway": NODE_IP}]],
                    # Only the Services: a pod has no default route.
                    "routes": [{"dst": SERVICE_CIDR}],
                    "dataDir": str(NODE_ROOT / "cni" / "ipam"),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def _kubelet_config() -> dict:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "cgroupDriver": "cgroupfs",
        # The pods' cgroups under the node's own (made in every hierarchy before the kubelet
        # starts), not the machine-wide /kubepods another kubelet may use.
        "cgroupRoot": f"/{TRACKING_CGROUP}",
        "failCgroupV1": False,  # these machines run cgroup v1 (hybrid)
        "failSwapOn": False,
        "containerRuntimeEndpoint": f"unix://{containerd_socket()}",
        "address": NODE_IP,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},
        "podLogsDir": str(pod_log_dir()),
        "volumePluginDir": str(NODE_ROOT / "volume-plugins"),
        # Pods' resolv.conf then names 127.0.0.1 (the kubelet's fallback): nothing answers
        # there, and no name server off the machine is ever named.
        "resolvConf": "",
        "registerWithTaints": [
            {"key": NODE_LABEL[0], "value": NODE_LABEL[1], "effect": "NoSchedule"}
        ],
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "2%",
                         "imagefs.available": "2%"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        "maxPods": 30,
    }  # fmt: skip


def _kubelet_kubeconfig() -> tuple[dict, str, int]:
    """The cluster's kubeconfig pointed at the forwarder, and the API server's loopback address."""
    import yaml

    config = yaml.safe_load(localenv.kubeconfig_path().read_text())
    (cluster,) = config["clusters"]
    url = urllib.parse.urlsplit(cluster["cluster"]["server"])
    host, port = url.hostname or "", url.port or 443
    if not _is_loopback(host):
        raise RealNodeError(f"the API server is not on loopback ({url.geturl()}); refusing")
    cluster["cluster"]["server"] = f"https://127.0.0.1:{FORWARD_PORT}"
    return config, host, port


def apiserver_has_service_san() -> bool:
    """Whether the API server's certificate names the ``kubernetes`` Service's ClusterIP."""
    import ssl

    _, host, port = _kubelet_kubeconfig()
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with socket.create_connection((host, port), timeout=10) as raw, ctx.wrap_socket(raw) as tls:
        der = tls.getpeercert(binary_form=True)
    from cryptography import x509

    cert = x509.load_der_x509_certificate(der)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    import ipaddress

    return ipaddress.ip_address(KUBERNETES_SERVICE_IP) in sans.get_values_for_type(x509.IPAddress)


def _apiserver_args(port: int) -> list[str] | None:
    """The command line of the kube-apiserver process serving ``port`` (None: not found)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            args = (proc / "cmdline").read_bytes().decode().split("\0")
        except OSError:
            continue
        if args and Path(args[0]).name == "kube-apiserver" and f"--secure-port={port}" in args:
            return args
    return None


def cluster_problems(api_port: int) -> list[str]:
    """What the running control plane lacks for the real node (see tools.cluster)."""
    problems = []
    if not apiserver_has_service_san():
        problems.append(f"the API server's certificate does not name {KUBERNETES_SERVICE_IP}")
    args = _apiserver_args(api_port) or []
    if "--kubelet-preferred-address-types=InternalIP" not in args:
        # Else `kubectl logs` of a pod here makes the API server look the node's name up.
        problems.append("kube-apiserver runs without --kubelet-preferred-address-types=InternalIP")
    return problems


# --------------------------------------------------------------------------- start


_change_held = threading.local()


@contextlib.contextmanager
def _changing(wait: float = CHANGE_WAIT) -> Iterator[None]:
    """Hold the node's change lock (CHANGE_LOCK_FILE); ``wait`` seconds for a change under way.

    Re-entered freely by the thread that holds it (a restart that finds the guard broken runs
    stop()). Another thread or process waits, then is refused naming the lock.
    """
    if getattr(_change_held, "depth", 0):
        _change_held.depth += 1
        try:
            yield
        finally:
            _change_held.depth -= 1
        return
    fd = os.open(CHANGE_LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise RealNodeError(
                        "another start, stop or kubelet restart of the real node is under way "
                        f"(waited {wait:.0f}s for {CHANGE_LOCK_FILE}); try again when it is done"
                    ) from None
                time.sleep(0.2)
        _change_held.depth = 1
        try:
            yield
        finally:
            _change_held.depth = 0
    finally:
        os.close(fd)


@contextlib.contextmanager
def _lock(wait: float = 0) -> Iterator[int]:
    """The machine's node lock; ``wait`` seconds for a holder that is exiting (a forwarder)."""
    fd = os.open(LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + wait
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() < deadline:
                    time.sleep(0.2)
                    continue
            os.close(fd)
            record = Record.load()
            owner = record.state_dir if record else "another process"
            raise RealNodeError(
                f"the machine's one real node is in use (by {owner}); stop it first with "
                f"`python -m tools.realnode stop` in that checkout"
            ) from None
        yield fd
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)


def _spawn(
    name: str, cmd: list[str], env: dict[str, str] | None = None, pass_fds: tuple[int, ...] = ()
) -> subprocess.Popen[bytes]:
    """Start a long-lived component in the tracking cgroup, its output in ``log_dir()``.

    The child enters the cgroup by a shell prefix that writes 0 (itself) to cgroup.procs and
    execs the command (same PID, so the recorded PID is the component's), not by
    ``preexec_fn``: with one, CPython forks instead of using vfork, and a fork runs the fork
    handlers of the gRPC library the Pulumi SDK loads in the same (test) process, which
    crashed initdb's child in tools/postgres.py (its ``setpriv`` prefix). The path is the
    script's ``$0`` and the command ``"$@"``, so neither is ever parsed by the shell; a
    failed write exits before the exec, its message in the log.
    """
    log = open(log_dir() / f"{name}.log", "ab")  # noqa: SIM115 (owned by the child)
    procs = CGROUP_ROOT / "pids" / TRACKING_CGROUP / "cgroup.procs"
    wrapped = ["/bin/sh", "-c", 'echo 0 > "$0" && exec "$@"', str(procs), *cmd]
    proc = subprocess.Popen(
        wrapped, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
        start_new_session=True, pass_fds=pass_fds,
    )  # fmt: skip
    log.close()
    return proc


def _wait(what: str, ready, timeout: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if proc is not None and proc.poll() is not None:
            raise RealNodeError(f"{what}: the process exited ({proc.returncode}); see {log_dir()}")
        if time.monotonic() > deadline:
            raise RealNodeError(f"{what}: not ready after {timeout:.0f}s; see {log_dir()}")
        time.sleep(0.2)


def ctr(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """The node's containerd client, in the Kubernetes namespace."""
    return _run([toolchain.bin_path("ctr"), "-a", containerd_socket(), "-n", "k8s.io", *args])


def import_image(archive: Path, base_name: str) -> None:
    """Import an OCI archive into the node's containerd as ``base_name:<its ref name>``."""
    ctr("images", "import", "--base-name", base_name, archive)


def is_running() -> bool:
    record = Record.load()
    return bool(
        record
        and record.pids
        and all(_same_process(pid, record.pid_starts.get(n)) for n, pid in record.pids.items())
    )


def _holder_alive(record: Record) -> bool:
    """Whether the process starting the node, or its forwarder (the lock's holder), lives.

    Such a node is not a leftover, even when is_running() is False (mid-start: the record
    has no kubelet yet): nobody but its owner may tear it down.
    """
    return _same_process(record.starter_pid, record.starter_start) or _same_process(
        record.pids.get("forwarder"), record.pid_starts.get("forwarder")
    )


def _remember(record: Record, name: str, pid: int) -> None:
    record.pids[name] = pid
    start = _start_of(pid)
    if start is not None:
        record.pid_starts[name] = start
    record.save()


def _isolation_problems(api_port: int) -> list[str]:
    """guard_problems() and cluster_problems(): what must be empty while the node runs."""
    return guard_problems() + cluster_problems(api_port)


def _kubelet_down_only(record: Record) -> bool:
    """Everything of the node lives but its kubelet: a restart that did not finish.

    (Killed or failed after the old kubelet stopped.) Such a node keeps its pods: a restart
    or a start brings the kubelet back instead of tearing it all down.
    """
    others = {name: pid for name, pid in record.pids.items() if name != "kubelet"}
    return (
        # A restart keeps the old kubelet's entry until the new one replaces it; a start
        # killed before its kubelet (and its configuration) never wrote one: a leftover.
        "kubelet" in record.pids
        and "forwarder" in others
        and "containerd" in others
        and all(_same_process(pid, record.pid_starts.get(n)) for n, pid in others.items())
        and not _same_process(record.pids.get("kubelet"), record.pid_starts.get("kubelet"))
    )


def start(
    images: Sequence[tuple[Path, str]] = (), timeout: float = 120, wait: float = CHANGE_WAIT
) -> Record:
    """Join the real node to the running local cluster; ``images`` are (archive, base name).

    ``timeout`` bounds the wait for the kubelet's registration and the Node's Ready; ``wait``
    the wait for another start, stop or restart under way (the change lock). Reuses a node
    that this state directory started and that still runs (importing the images again, which
    is cheap when present), and brings back the kubelet of one whose restart did not finish.
    Refuses a node of another checkout.
    """
    t0 = time.monotonic()
    # Checked before the change lock too (and again under it), so that another checkout's
    # change under way never holds up a refusal; packages and builds need no lock either.
    _refuse_anothers(Record.load())
    ensure_node_packages()
    toolchain.build_all(list(NODE_GROUPS))
    with _changing(wait):
        return _start_changing(images, timeout, t0)


def _anothers(record: Record | None, here: Path) -> bool:
    """Whether ``record`` is a node of another checkout (not of ``here`` or a state directory
    inside it) that lives or is being started."""
    return bool(
        record
        and not Path(record.state_dir).is_relative_to(here)
        and (is_running() or _holder_alive(record))
    )


def _refuse_anothers(record: Record | None) -> None:
    if record and record.state_dir != str(localenv.state_dir()) and (
        is_running() or _holder_alive(record)
    ):
        raise RealNodeError(f"the machine's one real node belongs to {record.state_dir}")


def _start_changing(images: Sequence[tuple[Path, str]], timeout: float, t0: float) -> Record:
    record = Record.load()
    ours = str(localenv.state_dir())
    _refuse_anothers(record)
    if record and record.state_dir == ours and _kubelet_down_only(record):
        _log("the node's kubelet is not running (a restart did not finish); starting it")
        _restart_locked(record, timeout)
        for archive, base in images:
            import_image(archive, base)
        return record
    if record and is_running() and "kubelet" in record.pids:
        _, _, api_port = _kubelet_kubeconfig()
        problems = _isolation_problems(api_port)
        if problems:
            _log("the running node's isolation is incomplete; removing it")
            stop(quiet=True)
            raise RealNodeError("the node's isolation was incomplete: " + "; ".join(problems))
        for archive, base in images:
            import_image(archive, base)
        return record
    _, api_host, api_port = _kubelet_kubeconfig()
    problems = cluster_problems(api_port)
    if problems:
        raise RealNodeError(
            "the running cluster was started without what the real node needs ("
            + "; ".join(problems)
            + "); restart it (`make cluster-stop`)"
        )
    if record is not None:
        # A node of this checkout that is only partly alive (a killed run) or one whose
        # owner is dead: its forwarder may still hold the lock; stopped by its verified PID.
        _stop_forwarder(record)
    with _lock() as lock_fd:
        cleanup(quiet=True)
        Baseline.take()
        me = os.getpid()
        record = Record(state_dir=ours, starter_pid=me, starter_start=_start_of(me))
        record.host_routes = _host_blackholes()
        record.save()
        try:
            _start_locked(record, lock_fd, api_host, api_port, images, timeout)
        except BaseException:
            _log("start failed; removing what was made")
            cleanup(quiet=True)
            raise
    _log(f"node {NODE_NAME} Ready in {time.monotonic() - t0:.1f}s (logs in {log_dir()})")
    return record


def _start_locked(record: Record, lock_fd: int, api_host: str, api_port: int,
                  images: Sequence[tuple[Path, str]], timeout: float) -> None:  # fmt: skip
    conflicts = _route_conflicts(json.loads(_run(["ip", "-j", "route", "show"]).stdout))
    if conflicts:
        raise RealNodeError("the node's address ranges are in use here: " + "; ".join(conflicts))
    for dst in record.host_routes:
        _run(["ip", "route", "replace", "blackhole", dst])
    _make_netns()
    for d in (NODE_ROOT / "cni" / "net.d", NODE_RUN, pod_log_dir()):
        d.mkdir(parents=True, exist_ok=True)
    for hierarchy in _cgroup_hierarchies():
        (hierarchy / TRACKING_CGROUP).mkdir(exist_ok=True)
    problems = guard_problems()
    if problems:
        raise RealNodeError("the node's isolation is incomplete: " + "; ".join(problems))
    record.guarded_at_boottime = boottime()
    record.save()
    _log("isolation in place (namespace, blackhole routes, nftables); starting containerd")

    (NODE_ROOT / "cni" / "net.d" / "10-pmem-csi-node.conflist").write_text(
        json.dumps(_cni_config(), indent=1)
    )
    (NODE_RUN / "containerd.toml").write_text(_containerd_config())
    env = _component_env()
    containerd = _spawn(
        "containerd",
        in_netns(toolchain.bin_path("containerd"), "--config", NODE_RUN / "containerd.toml"),
        env=env,
    )
    _remember(record, "containerd", containerd.pid)
    _wait("containerd", lambda: _run([toolchain.bin_path("ctr"), "-a", containerd_socket(),
                                      "version"], check=False).returncode == 0,
          60, containerd)  # fmt: skip
    import_image(toolchain.bin_path(toolchain.PAUSE_IMAGE_ARCHIVE), PAUSE_IMAGE.split(":")[0])
    for archive, base in images:
        import_image(archive, base)

    forwarder = _spawn(
        "forwarder",
        [sys.executable, "-m", "tools.realnode", "forward", api_host, str(api_port),
         "--lock-fd", str(lock_fd)],
        env={**os.environ, "PYTHONPATH": str(toolchain.PROJECT_DIR)},
        pass_fds=(lock_fd,),
    )  # fmt: skip
    _remember(record, "forwarder", forwarder.pid)
    _wait("forwarder", FORWARDER_READY.exists, 30, forwarder)

    kubeconfig, _, _ = _kubelet_kubeconfig()
    (NODE_RUN / "kubeconfig").write_text(json.dumps(kubeconfig))
    (NODE_RUN / "kubelet.json").write_text(json.dumps(_kubelet_config(), indent=1))
    kubelet, since = _spawn_kubelet(record, env)
    _wait("node Ready", lambda: _node_ready_since(since), timeout, kubelet)
    # The kubelet (and containerd's CNI) changed the namespace while starting: check again.
    problems = _isolation_problems(api_port)
    if problems:
        raise RealNodeError("the node's isolation broke while it started: " + "; ".join(problems))


def _component_env() -> dict[str, str]:
    """containerd's and the kubelet's environment: the shim next to containerd, runc, nft."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join(
        [str(toolchain.bin_path("containerd").parent), "/usr/sbin", "/usr/bin", "/sbin", "/bin"]
    )
    return env


def _kubelet_command() -> list[str]:
    return in_netns(
        toolchain.bin_path("kubelet"),
        "--config", NODE_RUN / "kubelet.json",
        "--kubeconfig", NODE_RUN / "kubeconfig",
        "--root-dir", NODE_ROOT / "kubelet",
        "--cert-dir", NODE_ROOT / "kubelet-pki",
        "--hostname-override", NODE_NAME,
        "--node-ip", NODE_IP,
        "--node-labels", f"{NODE_LABEL[0]}={NODE_LABEL[1]},type=real",
        "--v=2",
    )  # fmt: skip


def _spawn_kubelet(record: Record, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], float]:
    """Start the kubelet (in the tracking cgroup, inside the namespace) and record its PID.

    Called once every earlier kubelet of the node has exited. Also returns the wall-clock
    second from which a Node heartbeat can only be this kubelet's: the API server keeps
    heartbeats in whole seconds, so the start is moved past the second in which the last one
    exited (at most a second's wait) and a stamp of that second stays the old kubelet's.
    """
    now = time.time()
    time.sleep(math.floor(now) + 1 - now)
    since = float(math.floor(time.time()))
    kubelet = _spawn("kubelet", _kubelet_command(), env=env)
    record.started_at_boottime = boottime()
    _remember(record, "kubelet", kubelet.pid)
    return kubelet, since


def _kubelet_healthy() -> bool:
    """The kubelet's /healthz (on 127.0.0.1 inside the namespace) answers ok."""
    try:
        return node_http_get("127.0.0.1", 10248, "/healthz", timeout=2) == (200, "ok")
    except OSError:
        return False


def restart_kubelet(timeout: float = 120, wait: float = CHANGE_WAIT) -> Record:
    """Stop the node's kubelet and start it again; containerd, the pods and the guard stay.

    What a kubelet upgrade or crash does to a node. The kubelet keeps some state in memory
    only, the pods' ServiceAccount tokens among it: the new process requests a token for
    every running pod's projected volume and writes it (tests/e2e/test_real_node.py uses
    that to rotate a token now rather than at 80 % of its lifetime). Returns once the Node is
    Ready with a heartbeat the new kubelet wrote.

    Only this checkout's node, with its guard complete before, just before the new kubelet
    starts, and after, under the node's change lock (one start, stop or restart at a time,
    ``wait`` seconds for one under way).
    A node whose last restart did not finish (its kubelet dead, or one it started but never
    recorded) is restarted all the same. The node's lock stays with the forwarder for the
    node's life: the new kubelet is started only while that process (verified by PID and
    start time) still holds it, so never beside a teardown.
    """
    with _changing(wait):
        record = Record.load()
        if record is None or not (is_running() or _kubelet_down_only(record)):
            raise RealNodeError("no real node runs")
        if record.state_dir != str(localenv.state_dir()):
            raise RealNodeError(f"the machine's one real node belongs to {record.state_dir}")
        return _restart_locked(record, timeout)


def _restart_locked(record: Record, timeout: float) -> Record:
    """restart_kubelet() with the change lock held: of a running node, or one whose kubelet died."""
    _, _, api_port = _kubelet_kubeconfig()
    problems = _isolation_problems(api_port)
    if problems:
        # As start() does with a reused node that fails its checks: an unguarded node does
        # not keep running.
        stop(quiet=True)
        raise RealNodeError(
            "the node's isolation is incomplete: " + "; ".join(problems) + "; node torn down"
        )

    def lock_holder_lives() -> bool:
        return _same_process(record.pids.get("forwarder"), record.pid_starts.get("forwarder"))

    if not lock_held():
        raise RealNodeError("the node's lock is not held: its forwarder is not the node's")
    left = _stop_kubelets(record)
    if left:
        raise RealNodeError(f"the node's kubelet ({', '.join(map(str, left))}) did not exit")
    if not lock_holder_lives() or not lock_held():
        raise RealNodeError("the node's forwarder (the lock's holder) is gone: being torn down")
    # Again now: stopping the old kubelet can take 30 s, and no kubelet starts pods unguarded.
    problems = _isolation_problems(api_port)
    if problems:
        stop(quiet=True)
        raise RealNodeError("the node's isolation broke while its kubelet stopped: "
                            + "; ".join(problems) + "; node torn down")  # fmt: skip
    kubelet, since = _spawn_kubelet(record, _component_env())
    if not lock_holder_lives():  # a teardown began meanwhile: it kills the cgroup, and so do we
        kubelet.kill()  # our child, not yet reaped: its PID cannot have been reused
        kubelet.wait()
        raise RealNodeError("the node was torn down while its kubelet restarted")
    _wait("kubelet /healthz", _kubelet_healthy, timeout, kubelet)
    _wait("node Ready", lambda: _node_ready_since(since), timeout, kubelet)
    problems = _isolation_problems(api_port)
    if problems:
        stop(quiet=True)
        raise RealNodeError("the node's isolation broke as the kubelet restarted: "
                            + "; ".join(problems) + "; node torn down")  # fmt: skip
    _log(f"kubelet restarted (pid {kubelet.pid})")
    return record


def _node_kubelets() -> dict[int, float]:
    """The node's kubelet processes, recorded or not: PID -> start time.

    Those in the node's tracking cgroup (where _spawn puts every component; the shims and
    containerd are there too) whose command line names the node's kubelet configuration.
    One a killed restart started but never recorded is found here, so it is never doubled.
    """
    config = str(NODE_RUN / "kubelet.json")
    found = {}
    for pid in _cgroup_pids([CGROUP_ROOT / "pids" / TRACKING_CGROUP]):
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        start = _start_of(pid)
        if config in args and start is not None and _alive(pid):
            found[pid] = start
    return found


def _stop_kubelets(record: Record) -> list[int]:
    """Stop the recorded kubelet and any other of the node's; the PIDs still alive after.

    SIGTERM (as a node's kubelet is stopped), SIGKILL after 30 s; each by _signal_recorded,
    so a PID reused since it was read is never signalled. The recorded one is signalled only
    if it still is the process the record names.
    """
    targets = _node_kubelets()
    recorded, start = record.pids.get("kubelet"), record.pid_starts.get("kubelet")
    if recorded and start is not None and _same_process(recorded, start):
        targets[recorded] = start
    for sig, grace in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        sent = {pid for pid, t in targets.items() if _signal_recorded(pid, t, sig)}
        _wait_gone(sent, grace)
        for pid in targets:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)
        targets = {pid: t for pid, t in targets.items() if _same_process(pid, t)}
        if not targets:
            break
    return sorted(targets)


def _node_ready_condition() -> dict | None:
    """The Node's Ready condition as the API server has it (None: no Node yet, or no answer).

    ``lastHeartbeatTime`` as epoch seconds (whole seconds: what the API server keeps).
    """
    from tools import cluster

    try:
        node = cluster._core_api().read_node(NODE_NAME, _request_timeout=10)
    except Exception:  # not registered yet, or the API server is busy
        return None
    for cond in node.status.conditions or []:
        if cond.type == "Ready":
            beat = cond.last_heartbeat_time
            return {"status": cond.status,
                    "lastHeartbeatTime": beat.timestamp() if beat else None}  # fmt: skip
    return None


def _node_ready_since(since: float) -> bool:
    """The Node is Ready by a heartbeat stamped at ``since`` or later (the new kubelet's).

    A Ready condition written before is the kubelet's that was stopped: the node controller
    leaves it True for its grace period, whatever the new kubelet finds.
    """
    cond = _node_ready_condition()
    beat = (cond or {}).get("lastHeartbeatTime")
    return bool(cond and cond["status"] == "True" and beat is not None and beat >= since)


# --------------------------------------------------------------------------- inspection


def task_pid(container_id: str) -> int:
    """Host PID of a container's main process (``containerd://<id>`` or the bare id)."""
    cid = container_id.removeprefix("containerd://")
    for line in ctr("tasks", "ls").stdout.splitlines()[1:]:
        task, pid, *_ = line.split()
        if task == cid:
            return int(pid)
    raise RealNodeError(f"no task {cid} in the node's containerd")


def node_http_get(host: str, port: int, path: str, timeout: float = 5) -> tuple[int, str]:
    """GET ``http://host:port/path`` from inside the node's namespace (where pods are routed).

    The connection is opened by a thread that entered the namespace; the API server cannot
    do this (it would have to reach the node's address from the host).
    """
    import http.client

    box: dict[str, object] = {}

    def inner() -> None:
        try:
            _setns(netns_path())
            conn = http.client.HTTPConnection(host, port, timeout=timeout)
            conn.request("GET", path)
            resp = conn.getresponse()
            box["value"] = (resp.status, resp.read().decode(errors="replace"))
            conn.close()
        except BaseException as exc:  # re-raised in the caller
            box["error"] = exc

    thread = threading.Thread(target=inner, daemon=True)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]  # type: ignore[return-value]


# --------------------------------------------------------------------------- teardown


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # the process may be reaped between the signal and the read (a teardown's kill loop)
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][:1] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def _cgroup_hierarchies() -> list[Path]:
    """The mounted hierarchies (``cpu,cpuacct``, not its ``cpu`` and ``cpuacct`` links)."""
    if not CGROUP_ROOT.exists():
        return []
    return sorted(h for h in CGROUP_ROOT.iterdir() if h.is_dir() and not h.is_symlink())


def _cgroup_dirs() -> list[Path]:
    """The node's cgroups in every hierarchy, deepest first (the order rmdir needs).

    Only TRACKING_CGROUP and below: the kubelet's cgroupRoot is there, so a machine-wide
    ``kubepods`` (another kubelet's) is never the node's. A container's cgroup is removed by
    runc, its shim or the kubelet once its processes are gone, also during this walk:
    ``os.walk`` skips a directory that is gone by the time it is read (``Path.rglob`` raised
    FileNotFoundError).
    """
    found: list[Path] = []
    for hierarchy in _cgroup_hierarchies():
        base = hierarchy / TRACKING_CGROUP
        if base.is_dir():
            found.extend(Path(top) / d for top, dirs, _ in os.walk(base) for d in dirs)
            found.append(base)
    return sorted(set(found), key=lambda p: len(p.parts), reverse=True)


def _cgroup_pids(dirs: list[Path]) -> set[int]:
    pids: set[int] = set()
    for d in dirs:
        with contextlib.suppress(OSError):
            pids.update(int(x) for x in (d / "cgroup.procs").read_text().split())
    return pids


def _kill_in_node_cgroups(pids: set[int], sig: int) -> None:
    """Send ``sig`` to each of ``pids`` that is still in the node's cgroups.

    The PIDs were read from the cgroups a moment ago; one that exited since may be reused by
    a process elsewhere on the machine. So, as in _signal_recorded: a pidfd pins each process
    first, the cgroups are read again after that (the same files, so the same view), and the
    signal goes through the pidfd, to the process that was checked or to none.
    """
    pinned: dict[int, int] = {}
    try:
        for pid in pids:
            fd = _pin(pid)
            if fd is not None:
                pinned[pid] = fd
        still = _cgroup_pids(_cgroup_dirs())
        for pid, fd in pinned.items():
            if pid in still:
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(fd, sig)
    finally:
        for fd in pinned.values():
            os.close(fd)


def _node_mounts() -> list[str]:
    """Mount points under the node's directories (not its namespaces: ``ip netns del``)."""
    prefixes = [str(p) for p in (NODE_ROOT, NODE_RUN, *HARD_CODED_PATHS)]
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].encode().decode("unicode_escape")
        if any(point == p or point.startswith(p + "/") for p in prefixes):
            mounts.append(point)
    return sorted(set(mounts), key=len, reverse=True)


def _node_netns() -> list[Path]:
    """The node's namespace (its pods' are under NODE_RUN: netns_mounts_under_state_dir)."""
    return [netns_path()] if netns_path().exists() else []


def _stop_forwarder(record: Record) -> None:
    """SIGTERM the record's forwarder (the lock's holder), if it still is that process."""
    pid = record.pids.get("forwarder")
    if pid and _signal_recorded(pid, record.pid_starts.get("forwarder"), signal.SIGTERM):
        _wait_gone({pid}, 10)
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


def cleanup(quiet: bool = False) -> None:
    """Remove the node and every trace of it: also what a killed or failed run left.

    Only with the lock held (start() and stop() take it): without it, this could be another
    checkout's node in the middle of its start. Order: kubelet first (it would restart
    containers), then every process in the node's cgroups (containers, shims, containerd)
    and the record's (by PID and start time), then the kernel tunables the kubelet changed,
    mounts, cgroups, the namespaces, the Node object and only once it is gone the host's
    routes (while it exists the API server may dial the node's address), the directories.
    The record and the baseline go only when nothing is left.
    """
    record = Record.load()
    # The record's processes, each with its start time: signalled only while still that one.
    starts = {
        pid: record.pid_starts[name]
        for name, pid in (record.pids if record else {}).items()
        if _same_process(pid, record.pid_starts.get(name))  # type: ignore[union-attr]
    }
    # The kubelet first (it would restart containers): the recorded one, and one a killed
    # restart started but did not record.
    kubelets = _node_kubelets()
    if record and record.pids.get("kubelet") in starts:
        kubelets[record.pids["kubelet"]] = starts[record.pids["kubelet"]]
    for pid, start in kubelets.items():
        _signal_recorded(pid, start, signal.SIGTERM)
    _wait_gone(set(kubelets), 10)
    for _ in range(50):
        in_cgroups = {p for p in _cgroup_pids(_cgroup_dirs()) if _alive(p)}
        recorded = {p: t for p, t in starts.items() if _same_process(p, t)}
        alive = in_cgroups | set(recorded)
        if not alive:
            break
        _kill_in_node_cgroups(in_cgroups - set(recorded), signal.SIGKILL)
        for pid, start in recorded.items():
            _signal_recorded(pid, start, signal.SIGKILL)
        time.sleep(0.1)
    else:
        raise RealNodeError(f"processes of the node did not exit: {sorted(alive)}")
    # Components this process started are its children: reap them, or their zombies keep
    # the cgroups busy.
    for pid in set(starts) | set(kubelets):
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)
    baseline = Baseline.load()
    _restore_sysctls(baseline)
    for point in _node_mounts():
        _run(["umount", "-l", point], check=False)
    _remove_cgroups()
    for ns in _node_netns():
        if ns.exists():
            _run(["ip", "netns", "del", ns.name], check=False)
    owner = Path(record.state_dir) if record else localenv.state_dir()
    from tools import cluster

    # Under the creation lock: a fault test (tests/e2e/faults.py) holds it from killing an API
    # server until that runs again, so one seen gone here stays gone until the routes are.
    with cluster.one_create_at_a_time():
        node_gone = _delete_node_object(owner)
        if node_gone:
            for dst in record.host_routes if record else _host_blackholes():
                _run(["ip", "route", "del", "blackhole", dst], check=False)
    foreign = _foreign_paths(baseline)
    for path in [NODE_ROOT, NODE_RUN, *HARD_CODED_PATHS]:
        if str(path) not in foreign:
            shutil.rmtree(path, ignore_errors=True)
    left = leftovers()
    if left:
        if not node_gone:
            left.append(
                f"(the Node {NODE_NAME} may still be in the cluster of {owner}: the host "
                "routes stay until it is gone or that cluster stops: "
                f"`PMEM_CSI_STATE_DIR={owner} python -m tools.cluster stop`)"
            )
        raise RealNodeError("teardown left: " + "; ".join(left))
    RECORD_FILE.unlink(missing_ok=True)
    BASELINE_FILE.unlink(missing_ok=True)
    if not quiet:
        _log("removed (processes, mounts, cgroups, namespaces, routes, directories)")


def _foreign_paths(baseline: Baseline | None) -> set[str]:
    """Paths never removed: the baseline's, or every hard-coded one when there is none."""
    if baseline is None:
        return {str(p) for p in HARD_CODED_PATHS}
    return set(baseline.foreign_paths)


def _remove_cgroups() -> None:
    """rmdir the node's cgroups, deepest first, retrying while the kernel still counts exits."""
    deadline = time.monotonic() + CGROUP_REMOVE_WAIT
    while True:
        busy = []
        for d in _cgroup_dirs():
            try:
                d.rmdir()
            except FileNotFoundError:
                pass
            except OSError as err:
                busy.append(f"{d}: {err.strerror}")
        if not busy or time.monotonic() > deadline:
            return  # what is left is reported by leftovers()
        time.sleep(0.2)


def _wait_gone(pids: set[int], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)


def leftovers() -> list[str]:
    """Every trace of a node that is still there (empty after a complete teardown)."""
    found = []
    dirs = _cgroup_dirs()
    if dirs:
        found.append(f"cgroups {[str(d) for d in dirs[-3:]]}")
    mounts = _node_mounts()
    if mounts:
        found.append(f"mounts {mounts[:3]}")
    namespaces = [ns.name for ns in _node_netns() if ns.exists()]
    if namespaces:
        found.append(f"network namespaces {namespaces}")
    host = json.loads(_run(["ip", "-j", "route", "show", "type", "blackhole"]).stdout)
    ours = {r["dst"] for r in host} & set(_host_blackholes())
    if ours:
        found.append(f"host routes {sorted(ours)}")
    baseline = Baseline.load()
    for name, value in (baseline.sysctls if baseline else {}).items():
        now = read_sysctl(name)
        if now != value:
            found.append(f"sysctl {name.replace('/', '.')} = {now} (was {value})")
    foreign = _foreign_paths(baseline)
    for path in [NODE_ROOT, NODE_RUN, *HARD_CODED_PATHS]:
        if path.exists() and str(path) not in foreign:
            found.append(str(path))
    for name in ("kubelet", "containerd", "containerd-shim-runc-v2"):
        pgrep = _run(["pgrep", "-f", str(toolchain.GROUPS[_group_of(name)].install_dir())
                      + f"/bin/{name}"], check=False)  # fmt: skip
        if pgrep.stdout.strip():
            found.append(f"{name} processes {pgrep.stdout.split()}")
    return found


def _group_of(binary: str) -> str:
    return next(g.name for g in toolchain.GROUPS.values() if binary in g.packages)


def stop(quiet: bool = False, wait: float = CHANGE_WAIT) -> None:
    """Tear the node down if this checkout's state directory owns it (or nobody living does).

    A node of another checkout is left alone while it runs, is being started or its
    forwarder lives (one of a state directory inside this checkout's is this checkout's).
    Else the forwarder (which holds the lock) is stopped by its verified PID and the
    teardown runs with the lock held; the lock still taken (a start under way in this
    checkout) is an error, never a teardown without it. All under the change lock (``wait``
    seconds for a start, stop or restart under way).
    """
    here = localenv.state_dir()
    if _anothers(Record.load(), here):  # not ours: no need to wait for a change under way
        if not quiet:
            _log(f"the real node belongs to {Record.load().state_dir}; left alone")
        return
    with _changing(wait):
        _stop_changing(quiet)


def _stop_changing(quiet: bool) -> None:
    record = Record.load()
    # A node of a state directory inside this one (the test session's, .state/test-session,
    # left running by a killed pytest) is this checkout's to stop.
    here = localenv.state_dir()
    if _anothers(record, here):
        if not quiet:
            _log(f"the real node belongs to {record.state_dir}; left alone")
        return
    if record is None and not leftovers():
        return  # never started, or torn down completely
    if record is not None:
        _stop_forwarder(record)
    with _lock(wait=STOP_LOCK_WAIT):
        cleanup(quiet=quiet)


def _delete_node_object(state_dir: Path) -> bool:
    """Remove the Node from the cluster of ``state_dir`` (the pod GC then removes its pods);
    True when gone, or when no API server of that cluster can dial the node again.

    No process runs that cluster's API server (a stopped cluster, or a killed session's:
    its kubeconfig and pid files stay): none can dial the node, and none will again with
    this Node in its etcd, since tools.cluster starts etcd and the API server again only in
    a cluster it just created (``ensure_controllers``): one that does not answer is deleted
    and created anew. An API server that runs but does not answer, or without a kubeconfig
    to reach it, keeps the routes. Else the deletion is waited for and checked.
    """
    from tools import cluster

    kubeconfig = state_dir / "kubeconfig"
    if not cluster.runs_api_server(state_dir):
        return True
    if not toolchain.GROUPS["kubernetes"].is_built():
        return False
    kubectl = [toolchain.bin_path("kubectl"), "--kubeconfig", kubeconfig, "--request-timeout=10s"]
    _run([*kubectl, "delete", "node", NODE_NAME, "--ignore-not-found", "--wait=true",
          "--timeout=30s"], check=False)  # fmt: skip
    got = _run([*kubectl, "get", "node", NODE_NAME, "--ignore-not-found", "-o", "name"],
               check=False)  # fmt: skip
    return got.returncode == 0 and not got.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.realnode", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("start", help="join the real node to the running local cluster")
    sub.add_parser("stop", help="remove the real node and every trace of it")
    sub.add_parser("status", help="exit 0 when the real node runs")
    sub.add_parser("check-guard", help="list what is missing of the node's isolation")
    sub.add_parser("restart-kubelet", help="stop the kubelet and start it again (pods stay)")
    f = sub.add_parser("forward", help=argparse.SUPPRESS)
    f.add_argument("host")
    f.add_argument("port", type=int)
    f.add_argument("--lock-fd", type=int)
    args = parser.parse_args(argv)
    if args.cmd == "start":
        start()
    elif args.cmd == "stop":
        stop()
    elif args.cmd == "restart-kubelet":
        restart_kubelet()
    elif args.cmd == "forward":
        forward(args.host, args.port, args.lock_fd)
    elif args.cmd == "check-guard":
        problems = guard_problems()
        print("\n".join(problems) or "isolation in place")
        return 1 if problems else 0
    else:
        running = is_running()
        record = Record.load()
        if running:
            state = "running"
        elif record and _kubelet_down_only(record):
            state = ("kubelet is not running (a restart did not finish): `restart-kubelet` or "
                     "`start` brings it back, `stop` removes the node")  # fmt: skip
        else:
            # A node being started (or one whose record lacks start times) holds the lock.
            state = "in use (lock held)" if lock_held() else "not running"
        # What it says may be about to change: a start, stop or restart holds the change lock.
        print(state + ("; a start, stop or kubelet restart is under way" if changing() else ""))
        return 0 if running else 1
    return 0


def changing() -> bool:
    """Whether a start, stop or kubelet restart holds the node's change lock now."""
    if getattr(_change_held, "depth", 0):
        return True
    try:
        fd = os.open(CHANGE_LOCK_FILE, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def lock_held() -> bool:
    """Whether some process holds the machine's node lock (a node starting or running)."""
    try:
        with _lock():
            return False
    except RealNodeError:
        return True


if __name__ == "__main__":
    raise SystemExit(main())
