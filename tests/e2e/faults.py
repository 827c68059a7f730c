"""Control-plane faults on the local kwok cluster, for the fault e2e tests.

Why by hand: kwokctl (binary runtime) starts and stops whole clusters only. Its components are
plain processes whose command lines are in the cluster's ``kwok.yaml`` and whose pids are in
``pids/<component>.pid``, so restarting the API server means killing that pid and starting the
same binary with the same arguments, working directory and log file, and writing the new pid
back (``kwokctl delete cluster`` stops components by those pid files).

etcd is reached over its HTTP/JSON gateway (``/v3/kv/range``, ``/v3/kv/compaction``), which
needs no etcdctl and no client library.

``Blackhole`` is a TCP forwarder placed between the reporter and the API server: while cut,
it accepts connections and holds them without a byte either way, and stops moving bytes on the
connections it had; those stay silent until the forwarder closes (as after a load balancer or
NAT failover, where the old path is gone for good). After ``heal`` new connections work.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from tools import cluster

APISERVER = "kube-apiserver"
# Components that hold a leader Lease (kube-system/<name>) and exit when they lose it.
CONTROLLERS = cluster.LEADER_ELECTED_CONTROLLERS
KWOK_CONTROLLER = "kwok-controller"


# Component processes this test process started: reaped by ``kill``, or they would linger
# as zombies (and keep their pid file pointing at a process that never goes away).
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


cluster_dir = cluster.cluster_dir


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie is dead: it only waits to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


class ControlPlane:
    """The local cluster's component processes, as kwokctl started them."""

    def __init__(self) -> None:
        # This session's cluster: start() goes through cluster.start_component, which reads
        # the same directory.
        self.dir = cluster_dir()
        docs = yaml.safe_load_all((self.dir / "kwok.yaml").read_text(encoding="utf-8"))
        config = next(d for d in docs if d and d.get("kind") == "KwokctlConfiguration")
        self._components = {c["name"]: c for c in config["components"]}
        # While a component is down its port is free, and a cluster created meanwhile (another
        # xdist worker's) could take it: kill() holds cluster.CREATE_LOCK until every component
        # killed here is started again.
        self._down: set[str] = set()
        self._create_lock: contextlib.ExitStack | None = None

    def pid(self, name: str) -> int:
        return int((self.dir / "pids" / f"{name}.pid").read_text().strip())

    def running(self, name: str) -> bool:
        try:
            return _alive(self.pid(name))
        except (OSError, ValueError):
            return False

    def kill(self, name: str, sig: int = signal.SIGKILL, timeout: float = 30) -> None:
        """Signal the component and wait until its process is gone."""
        if self._create_lock is None:
            self._create_lock = contextlib.ExitStack()
            self._create_lock.enter_context(cluster.one_create_at_a_time())
        self._down.add(name)
        pid = self.pid(name)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        child = _CHILDREN.pop(pid, None)
        if child is not None:
            child.wait(timeout)
            return
        # Not started here: wait until it is reaped (by init, or by us if this test process
        # started it through another path). A zombie leader is not enough: the other threads
        # of a Go process may still hold its listening socket for a moment.
        deadline = time.monotonic() + timeout
        while os.path.exists(f"/proc/{pid}"):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} (pid {pid}) still running {timeout:.0f}s after {sig}")
            time.sleep(0.05)

    def start(self, name: str) -> int:
        """Start the component with kwokctl's command line; its pid goes to the pid file."""
        proc = cluster.start_component(name)
        _CHILDREN[proc.pid] = proc
        self._down.discard(name)
        if not self._down and self._create_lock is not None:
            self._create_lock.close()
            self._create_lock = None
        return proc.pid

    def ensure_running(self, name: str) -> None:
        if not self.running(name):
            self.start(name)

    def restart_clients(
        self,
        delete_leases: Callable[[], None],
        leases: Callable[[], dict[str, str]],
        timeout: float,
    ) -> None:
        """Fresh kube-controller-manager, kube-scheduler and kwok controller, leading at once.

        Why after an API server restart: kube-controller-manager and kube-scheduler exit when
        they cannot renew their leader Lease for 45 s (tools.cluster.CONTROLLER_LEADER_ELECTION;
        in a real cluster the kubelet restarts them, here nobody would), and the survivors'
        informers back off for up to a minute
        (kube-controller-manager 1.36 then refuses to act on a stale pod cache: "read version
        ... is not as new as written version"), which would leave the next tests without
        pods. ``delete_leases`` runs between stop and start: it deletes the controllers' leader
        Leases and the node Leases the old kwok controller holds (for 200 s), so the new
        processes need not wait them out. ``leases`` returns each leader Lease's renewTime.
        """
        since = datetime.now(UTC)
        for name in (*CONTROLLERS, KWOK_CONTROLLER):
            if self.running(name):
                self.kill(name, signal.SIGTERM)
        delete_leases()
        for name in (*CONTROLLERS, KWOK_CONTROLLER):
            self.start(name)
        deadline = time.monotonic() + timeout
        while True:
            renewed = leases()
            fresh = [
                n
                for n in CONTROLLERS
                if n in renewed
                and datetime.fromisoformat(renewed[n].replace("Z", "+00:00")) > since
            ]
            if len(fresh) == len(CONTROLLERS):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"controllers not leading after {timeout:.0f}s: {renewed}")
            time.sleep(0.2)

    # --- etcd through its JSON gateway ------------------------------------------------------

    @property
    def etcd_url(self) -> str:
        for arg in self._components["etcd"]["args"]:
            if arg.startswith("--advertise-client-urls="):
                url = arg.split("=", 1)[1].split(",")[0]
                return url.replace("0.0.0.0", "127.0.0.1")
        raise KeyError("etcd has no --advertise-client-urls")

    def _etcd(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        req = urllib.request.Request(
            self.etcd_url + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())

    def etcd_revision(self) -> int:
        """etcd's current revision (the header of any range request carries it)."""
        key = base64.b64encode(b"\0").decode()
        return int(self._etcd("/v3/kv/range", {"key": key})["header"]["revision"])

    def history(self, key: str, since: int) -> list[tuple[int, dict[str, Any]]]:
        """Every version of a JSON-stored object (a custom resource) written at or after
        revision ``since``, oldest first, read back from etcd's own history.

        Walks back from the current value: each version's mod_revision - 1 is where the one
        before it is still visible. Independent of the API server (restarted or not) and of
        any client's watch, so no write can be missed.
        """
        out: list[tuple[int, dict[str, Any]]] = []
        body: dict[str, Any] = {"key": base64.b64encode(key.encode()).decode()}
        while True:
            kvs = self._etcd("/v3/kv/range", body).get("kvs") or []
            if not kvs:
                break
            mod = int(kvs[0]["mod_revision"])
            if mod < since:
                break
            out.append((mod, json.loads(base64.b64decode(kvs[0]["value"]))))
            body = {**body, "revision": mod - 1}
        return out[::-1]

    def compact_etcd(self) -> int:
        """Compact (physically) up to the current revision; returns that revision."""
        revision = self.etcd_revision()
        self._etcd("/v3/kv/compaction", {"revision": revision, "physical": True})
        return revision


class Blackhole:
    """A TCP forwarder that can cut every connection through it silently; see module doc."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._cut = threading.Event()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        # Per forwarded connection: set when the cut found it; it never moves bytes again. Set
        # under the connection's gate, which its pumps hold from their check of it through a
        # chunk's send: once cut() returns, no byte of a chunk read before it is sent.
        self._connections: list[tuple[threading.Event, threading.Lock]] = []
        self.forwarded = 0
        self.held = 0
        threading.Thread(target=self._accept, name="blackhole-accept", daemon=True).start()

    def _keep(self, *socks: socket.socket) -> None:
        with self._lock:
            self._sockets.extend(socks)

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self._keep(conn)
            if self._cut.is_set():
                self.held += 1  # accepted, then silence: no upstream, nothing read
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=10)
                upstream.settimeout(None)
            except OSError:
                conn.close()
                continue
            self._keep(upstream)
            dead, gate = threading.Event(), threading.Lock()
            with self._lock:
                self._connections.append((dead, gate))
                if self._cut.is_set():  # cut since the check above: this one is cut too
                    dead.set()
            self.forwarded += 1
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=self._pump, args=(a, b, dead, gate), daemon=True).start()

    def _pump(
        self, src: socket.socket, dst: socket.socket, dead: threading.Event, gate: threading.Lock
    ) -> None:
        with contextlib.suppress(OSError, ValueError):
            while not dead.is_set():
                ready, _, _ = select.select([src], [], [], 0.2)
                if not ready:
                    continue
                with gate:  # the check and the chunk's send, as one step against cut()
                    if dead.is_set():
                        break
                    data = src.recv(65536)
                    if not data:
                        dst.shutdown(socket.SHUT_WR)
                        return
                    dst.sendall(data)
        # Cut: keep both sockets open and unread until close(); the peers see silence.

    def cut(self) -> None:
        """From now on: no byte moves on any existing connection; new ones are held."""
        self._cut.set()
        with self._lock:
            connections = list(self._connections)
        for dead, gate in connections:
            with gate:
                dead.set()

    def heal(self) -> None:
        """New connections are forwarded again (the cut ones stay silent)."""
        self._cut.clear()

    def close(self) -> None:
        self._closed.set()
        self.cut()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            socks, self._sockets = self._sockets, []
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.close()


def point_kubeconfig_at(kubeconfig: Path, host: str, port: int) -> tuple[str, int]:
    """Rewrite the (single) cluster's server to host:port; return the old host and port.

    The API server's certificate is for 127.0.0.1, so a forwarder on that address keeps TLS
    verification working.
    """
    config = yaml.safe_load(kubeconfig.read_text(encoding="utf-8"))
    cluster_entry = config["clusters"][0]["cluster"]
    old = cluster_entry["server"]
    hostport = old.split("://", 1)[1].rstrip("/")
    old_host, old_port = hostport.rsplit(":", 1)
    cluster_entry["server"] = f"https://{host}:{port}"
    kubeconfig.write_text(yaml.safe_dump(config), encoding="utf-8")
    return old_host, int(old_port)


def freeze(pid: int) -> None:
    os.kill(pid, signal.SIGSTOP)


def thaw(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)
