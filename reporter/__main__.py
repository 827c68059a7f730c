"""``python -m reporter`` / ``pmem-csi-reporter``: wire caches, election, writer and probes.

The main thread only waits for dirty CRs (or the resync timer, or a deferred message-only
write falling due) and reconciles them one at a time: a single writer means no two patches
for one CR race inside one process, and the work per change (dict lookups and a status
computation over the cached, trimmed objects; no API read) is far below what one thread can
do for many CRs.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Sequence
from datetime import timedelta

from pmem_components.names import CLUSTER_EVENT_NAMESPACE, DeploymentNames
from reporter.health import HealthServer
from reporter.kubeapi import KubeconfigError, RawApi, load_api_client
from reporter.leader import LeaderElector
from reporter.metrics import Metrics
from reporter.observe import Observer
from reporter.write import KubeStatusApi, StatusWriter

log = logging.getLogger("reporter")

NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
FALLBACK_NAMESPACE = "pmem-csi"
DEFAULT_LEASE = "pmem-csi-reporter"
# Coalesce a burst of watch events (a rollout touches many pods) into one reconcile.
DEBOUNCE_SECONDS = 0.05
# A CR whose message-only write is pending is recomputed at most this often while events keep
# coming (a rollout over thousands of nodes): each computation walks all of its pods.
RECOMPUTE_SECONDS = 0.5
# The main loop looks at the stop flag (set by SIGTERM) at least this often.
STOP_CHECK = 1.0


def default_namespace() -> str:
    try:
        with open(NAMESPACE_FILE, encoding="utf-8") as f:
            return f.read().strip() or FALLBACK_NAMESPACE
    except OSError:
        return FALLBACK_NAMESPACE


def log_level(value: str) -> int:
    """A Python level name, or a klog-style verbosity like the driver's (0 quiet ... 5 debug)."""
    if value.isdigit():
        verbosity = int(value)
        if verbosity == 0:
            return logging.WARNING
        return logging.INFO if verbosity < 4 else logging.DEBUG
    level = logging.getLevelName(value.upper())
    if not isinstance(level, int):
        raise argparse.ArgumentTypeError(f"unknown log level {value!r}")
    return level


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="pmem-csi-reporter",
        description="Write the status of deployments.pmem-csi.intel.com objects.",
    )
    p.add_argument(
        "--kubeconfig",
        default=None,
        help="kubeconfig file (default: in-cluster config, else $KUBECONFIG or ~/.kube/config)",
    )
    p.add_argument(
        "--deployment",
        action="append",
        default=[],
        metavar="NAME",
        help="Deployment CR to report on; repeatable (default: every CR)",
    )
    p.add_argument(
        "--namespace",
        default=None,
        help="namespace of the Lease (default: the pod's namespace, else "
        f"{FALLBACK_NAMESPACE}); Events about the cluster-scoped CRs go to "
        f"{CLUSTER_EVENT_NAMESPACE}",
    )
    p.add_argument(
        "--lease-name",
        default=None,
        help="Lease name (default: <deployment>-reporter for one --deployment, else "
        f"{DEFAULT_LEASE})",
    )
    p.add_argument("--identity", default=None, help="leader election identity (default: host_pid)")
    p.add_argument(
        "--metrics-port",
        type=int,
        default=8080,
        help="port of /healthz, /readyz and /metrics; 0 picks a free one and prints it",
    )
    p.add_argument("--resync-seconds", type=float, default=60.0, help="full recompute period")
    p.add_argument(
        "--message-interval",
        type=float,
        default=10.0,
        help="non-urgent status writes of one CR (Running<->Progressing, counts in messages) "
        "are limited to 3 at once, then one per this many seconds; failures and condition "
        "changes are written at once",
    )
    p.add_argument(
        "--progress-deadline-seconds",
        type=float,
        default=600.0,
        help="how long a deployment may be Progressing without progress before it is Failed",
    )
    p.add_argument("--lease-duration", type=float, default=10.0, help="Lease duration (seconds)")
    p.add_argument(
        "--log-level", type=log_level, default=logging.INFO, help="level name or 0-5 verbosity"
    )
    return p.parse_args(argv)


def merge_dirty(into: dict[str, float | None], more: dict[str, float | None]) -> None:
    """Union of two dirty sets, keeping each CR's earliest known change time."""
    for name, changed_at in more.items():
        known = [t for t in (into.get(name), changed_at) if t is not None]
        into[name] = min(known) if known else None


class Reporter:
    """The assembled service; ``run`` blocks until ``stop`` is set."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.stop = threading.Event()
        namespace = args.namespace or default_namespace()
        if args.lease_name:
            lease = args.lease_name
        elif len(set(args.deployment)) == 1:
            lease = DeploymentNames(args.deployment[0]).reporter
        else:
            lease = DEFAULT_LEASE
        identity = args.identity or f"{socket.gethostname()}_{os.getpid()}"
        self.raw = RawApi(load_api_client(args.kubeconfig))
        self.metrics = Metrics()
        self.observer = Observer(self.raw, self.metrics, deployments=args.deployment or None)
        renew_deadline = args.lease_duration * 0.7
        self.elector = LeaderElector(
            # GET + PUT of one renewal must fit well inside the renew deadline.
            self.raw.with_timeout(max(1.0, renew_deadline / 3)),
            namespace,
            lease,
            identity,
            lease_duration=args.lease_duration,
            renew_deadline=renew_deadline,
            on_started_leading=self._started_leading,
            on_stopped_leading=lambda: self.metrics.is_leader.set(0),
        )
        self.writer = StatusWriter(
            KubeStatusApi(self.raw),
            self.observer,
            self.metrics,
            is_leader=self.elector.is_leader,
            # The API server accepts Events about cluster-scoped objects only there.
            event_namespace=CLUSTER_EVENT_NAMESPACE,
            message_interval=args.message_interval,
            progress_deadline=timedelta(seconds=args.progress_deadline_seconds),
        )
        self.http = HealthServer(
            args.metrics_port,
            healthy=self.healthy,
            ready=lambda: self.observer.synced,
            registry=self.metrics.registry,
        )
        self._leader_thread: threading.Thread | None = None
        # The main loop's last sign of life: a writer stuck in a call (which request
        # timeouts should prevent) must turn /healthz red, not hide behind a live Lease thread.
        self._beat = time.monotonic()
        self.stall_seconds = max(args.resync_seconds, 1.0) + 120.0
        log.info(
            "reporter %s: deployments=%s lease=%s/%s",
            identity,
            ",".join(args.deployment) or "<all>",
            namespace,
            lease,
        )

    def _started_leading(self) -> None:
        self.metrics.is_leader.set(1)
        # Whatever changed while nobody (or another replica) was leading gets looked at now.
        self.observer.mark_all_dirty()

    def healthy(self) -> bool:
        return (
            not self.stop.is_set()
            and self.observer.healthy
            and self._leader_thread is not None
            and self._leader_thread.is_alive()
            and time.monotonic() - self._beat < self.stall_seconds
        )

    def run(self) -> None:
        self.http.start()
        print(
            f"pmem-csi-reporter: serving /healthz /readyz /metrics on port {self.http.port}",
            flush=True,
        )
        self.observer.start()
        self._leader_thread = self.elector.start(self.stop)
        resync = max(self.args.resync_seconds, 1.0)
        next_resync = time.monotonic() + resync
        # CR -> (due, earliest change time): message-only writes the writer put off.
        pending: dict[str, tuple[float, float | None]] = {}
        last_run: dict[str, float] = {}
        while not self.stop.is_set():
            wake = min([next_resync, *(due for due, _ in pending.values())])
            dirty = self.observer.take_dirty(min(STOP_CHECK, max(0.0, wake - time.monotonic())))
            self._beat = time.monotonic()
            if self.stop.is_set():
                break
            now = time.monotonic()
            for name, (due, changed_at) in list(pending.items()):
                if name in dirty:
                    # Fold new changes into the pending entry; look again soon, not at once.
                    later = dirty.pop(name)
                    known = [t for t in (changed_at, later) if t is not None]
                    changed_at = min(known) if known else None
                    due = min(due, last_run.get(name, 0.0) + RECOMPUTE_SECONDS)
                    pending[name] = (due, changed_at)
                if due <= now:
                    del pending[name]
                    merge_dirty(dirty, {name: changed_at})
            if time.monotonic() >= next_resync:
                next_resync = time.monotonic() + resync
                for cr in self.observer.crs():
                    name = (cr.get("metadata") or {}).get("name")
                    if name:
                        dirty.setdefault(name, None)
            if not dirty or not self.elector.is_leader():
                continue  # non-leaders keep caches warm; leading again marks everything dirty
            time.sleep(DEBOUNCE_SECONDS)
            merge_dirty(dirty, self.observer.take_dirty(0))
            for name, changed_at in sorted(dirty.items()):
                if self.stop.is_set():
                    break
                last_run[name] = time.monotonic()
                try:
                    self.writer.reconcile(name, changed_at)
                except Exception:
                    log.exception("%s: reconcile failed", name)
                    self.observer.mark_dirty(name, changed_at)
                self._beat = time.monotonic()
                due = self.writer.deferred.pop(name, None)
                if due is not None:
                    pending[name] = (due, changed_at)

    def shutdown(self) -> None:
        self.stop.set()
        self.observer.shutdown()
        if self._leader_thread is not None:
            self._leader_thread.join(timeout=5)
        self.http.stop()


def install_signal_handlers(stop: threading.Event) -> None:
    """SIGTERM/SIGINT only set ``stop``.

    The handler runs on the main thread between any two bytecodes, possibly while that thread
    holds a cache lock, so a handler that takes locks can deadlock (one did: SIGTERM left the
    process running forever). The main loop wakes at least every ``STOP_CHECK`` seconds.
    """

    def on_signal(_signum: int, _frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # The HTTP client logs request/response bodies at DEBUG; those may hold Secret data.
    logging.getLogger("urllib3").setLevel(logging.WARNING)
    logging.getLogger("kubernetes").setLevel(logging.WARNING)
    try:
        reporter = Reporter(args)
    except KubeconfigError as exc:
        print(f"pmem-csi-reporter: error: {exc}", file=sys.stderr)
        return 2

    install_signal_handlers(reporter.stop)
    try:
        reporter.run()
        log.info("shutting down")
    finally:
        reporter.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
