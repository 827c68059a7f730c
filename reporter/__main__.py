"""``python -m reporter`` / ``pmem-csi-reporter``: wire caches, election, writer and probes.

The main loop itself (one thread, one CR at a time) is ``reporter.schedule``.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import re
import signal
import socket
import sys
import threading
import time
from collections.abc import Sequence
from datetime import timedelta

from pmem_components.names import (
    CLUSTER_EVENT_NAMESPACE,
    DNS_SUBDOMAIN_MAX,
    LABEL_INSTANCE,
    LABEL_VALUE_MAX,
    DeploymentNames,
)
from reporter.health import HealthServer
from reporter.kubeapi import (
    CONNECTION_POOL_SIZE,
    KubeconfigError,
    RawApi,
    http2_watch_pool,
    load_api_client,
)
from reporter.leader import LeaderElector
from reporter.metrics import Metrics
from reporter.observe import Observer, most_watches
from reporter.schedule import ReconcileLoop
from reporter.write import CONFLICT_QUIET_SECONDS, KubeStatusApi, StatusWriter

log = logging.getLogger("reporter")

NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
FALLBACK_NAMESPACE = "pmem-csi"
DEFAULT_LEASE = "pmem-csi-reporter"


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


# The leader renews this often (LeaderElector.retry_period) and stops writing once its last
# successful renewal is older than RENEW_DEADLINE_SHARE x the lease duration.
RENEW_PERIOD = 2.0
RENEW_DEADLINE_SHARE = 0.7
# client-go's rule: renew deadline > JitterFactor (1.2) x retry period.
JITTER_FACTOR = 1.2


def min_lease_duration() -> int:
    """The shortest lease whose renew deadline exceeds JITTER_FACTOR renew periods."""
    shortest = int(JITTER_FACTOR * RENEW_PERIOD / RENEW_DEADLINE_SHARE)
    while RENEW_DEADLINE_SHARE * shortest <= JITTER_FACTOR * RENEW_PERIOD:
        shortest += 1
    return shortest


# Shorter quiet periods make every write of the other writer a new, logged and counted
# conflict at nearly that writer's own rate.
MIN_CONFLICT_QUIET_SECONDS = 1.0


def quiet_seconds(value: str) -> float:
    """``--conflict-quiet-seconds``: a period flag of at least MIN_CONFLICT_QUIET_SECONDS."""
    number = seconds(value)
    if number < MIN_CONFLICT_QUIET_SECONDS:
        raise argparse.ArgumentTypeError(
            f"{value!r} is under {MIN_CONFLICT_QUIET_SECONDS:g} s: every write of the other "
            "writer would be a new conflict"
        )
    return number


def seconds(value: str) -> float:
    """A period flag: a positive, finite number of seconds.

    Why: 0 for ``--message-interval`` divided 0/0 on every reconcile (no status was ever
    written), a negative ``--progress-deadline-seconds`` made every Progressing deployment
    Failed at once, and ``nan`` for ``--resync-seconds`` never resynced.
    """
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not math.isfinite(number) or number <= 0:
        raise argparse.ArgumentTypeError(f"{value!r} is not a positive, finite number of seconds")
    return number


_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def _is_dns_subdomain(value: str) -> bool:
    return len(value) <= DNS_SUBDOMAIN_MAX and all(
        _DNS_LABEL.fullmatch(part) for part in value.split(".")
    )


_DNS_SUBDOMAIN_RULE = (
    "a DNS subdomain is expected (lower-case letters, digits, '-' and '.', starting and "
    f"ending with a letter or digit, at most {DNS_SUBDOMAIN_MAX} characters)"
)


def deployment_name(value: str) -> str:
    """``--deployment``: a name a Deployment CR can have (a DNS subdomain) whose instance
    label value fits a label.

    Why: the names go into label and field selectors; ``a,b`` selected two deployments'
    objects, and a name no CR can have gave selectors the API server refuses, for ever; so
    did a subdomain longer than a label value (review of issue 16: every list a 400).
    """
    if not _is_dns_subdomain(value):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a Deployment CR name: {_DNS_SUBDOMAIN_RULE}"
        )
    hyphened = DeploymentNames(value).hyphened
    if len(hyphened) > LABEL_VALUE_MAX:
        raise argparse.ArgumentTypeError(
            f"{value!r} is too long: its objects' label {LABEL_INSTANCE} ({hyphened!r}) can "
            f"have at most {LABEL_VALUE_MAX} characters, so no list would be accepted"
        )
    return value


def lease_name(value: str) -> str:
    """``--lease-name``: a name a Lease can have; else every renewal failed, every 2 s."""
    if not _is_dns_subdomain(value):
        raise argparse.ArgumentTypeError(f"{value!r} is not a Lease name: {_DNS_SUBDOMAIN_RULE}")
    return value


def namespace_name(value: str) -> str:
    """``--namespace``: a namespace name (a DNS label)."""
    if len(value) > 63 or not _DNS_LABEL.fullmatch(value):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a namespace name: a DNS label is expected (lower-case letters, "
            "digits and '-', starting and ending with a letter or digit, at most 63 "
            "characters)"
        )
    return value


def port(value: str) -> int:
    """``--metrics-port``: a TCP port, or 0 for a free one."""
    try:
        number = int(value)
    except ValueError:
        number = -1
    if not 0 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"{value!r} is not a port number from 0 to 65535")
    return number


def lease_duration(value: str) -> int:
    """``--lease-duration``: whole seconds, long enough for the renew period.

    Whole, because the Lease's ``leaseDurationSeconds`` is an integer: 4.9 was written as 4,
    so another replica took over while this one still believed it led. Long enough, because
    with a renew deadline shorter than about one renew period every renewal's latency became
    a gap in leadership (and changes seen in it were held back).
    """
    try:
        seconds = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a whole number of seconds (the Lease's leaseDurationSeconds is "
            "an integer; a fraction would be cut off, letting another replica lead while this "
            "one still writes)"
        ) from None
    shortest = min_lease_duration()
    if seconds < shortest:
        raise argparse.ArgumentTypeError(
            f"{seconds} is too short: must be at least {shortest} s. The leader renews every "
            f"{RENEW_PERIOD:g} s and stops writing once its last renewal is older than "
            f"{RENEW_DEADLINE_SHARE:g} x the lease duration; below {shortest} s that deadline "
            f"is under {JITTER_FACTOR:g} renew periods, so an ordinary renewal would interrupt "
            "leadership"
        )
    return seconds


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
        type=deployment_name,
        default=[],
        metavar="NAME",
        help="Deployment CR to report on; repeatable (default: every CR)",
    )
    p.add_argument(
        "--shared-watches",
        action="store_true",
        help="with --deployment: one cluster-wide watch per kind for all of them (Secrets: one "
        "per driver namespace) instead of watches per deployment; what the Pulumi program "
        "deploys (one reporter per stack)",
    )
    p.add_argument(
        "--namespace",
        type=namespace_name,
        default=None,
        help="namespace of the Lease (default: the pod's namespace, else "
        f"{FALLBACK_NAMESPACE}); Events about the cluster-scoped CRs go to "
        f"{CLUSTER_EVENT_NAMESPACE}",
    )
    p.add_argument(
        "--lease-name",
        type=lease_name,
        default=None,
        help="Lease name (default: <first --deployment>-reporter, the name the program's "
        f"RBAC grants; without --deployment {DEFAULT_LEASE})",
    )
    p.add_argument("--identity", default=None, help="leader election identity (default: host_pid)")
    p.add_argument(
        "--metrics-port",
        type=port,
        default=8080,
        help="port of /healthz, /readyz and /metrics; 0 picks a free one and prints it",
    )
    p.add_argument("--resync-seconds", type=seconds, default=60.0, help="full recompute period")
    p.add_argument(
        "--message-interval",
        type=seconds,
        default=10.0,
        help="non-urgent status writes of one CR (Running<->Progressing, counts in messages) "
        "are limited to 3 at once, then one per this many seconds; failures and condition "
        "changes are written at once",
    )
    p.add_argument(
        "--progress-deadline-seconds",
        type=seconds,
        default=600.0,
        help="how long a deployment may be Progressing without progress before it is Failed",
    )
    p.add_argument(
        "--conflict-quiet-seconds",
        type=quiet_seconds,
        default=CONFLICT_QUIET_SECONDS,
        help="after another writer replaced a served CR's status (a second stack's reporter, "
        "an old per-deployment one), write that CR again only once the other has left its "
        f"status alone this long (default {CONFLICT_QUIET_SECONDS:g})",
    )
    p.add_argument(
        "--lease-duration",
        type=lease_duration,
        default=10,
        help=f"Lease duration in whole seconds, at least {min_lease_duration()} (default 10)",
    )
    p.add_argument(
        "--log-level", type=log_level, default=logging.INFO, help="level name or 0-5 verbosity"
    )
    args = p.parse_args(argv)
    if args.shared_watches and not args.deployment:
        # It was ignored: every CR watched with cluster-wide informers, which the stack's
        # RBAC does not grant.
        p.error("--shared-watches needs at least one --deployment")
    return args


class Reporter:
    """The assembled service; ``run`` blocks until ``stop`` is set."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.stop = threading.Event()
        namespace = args.namespace or default_namespace()
        if args.lease_name:
            lease = args.lease_name
        elif args.deployment:
            # The stack's reporter is named after its first deployment (manifests.reporter).
            lease = DeploymentNames(args.deployment[0]).reporter
        else:
            lease = DEFAULT_LEASE
        identity = args.identity or f"{socket.gethostname()}_{os.getpid()}"
        # The watches share HTTP/2 connections (reporter.h2watch). Should the server refuse
        # HTTP/2, each watch needs a connection of its own, kept for the next watch: the
        # HTTP/1.1 pool has room for them all besides the Lease, status writes and Events.
        pool = CONNECTION_POOL_SIZE + most_watches(len(args.deployment or ()))
        api_client = load_api_client(args.kubeconfig, pool)
        self.raw = RawApi(api_client, watch_pool=http2_watch_pool(api_client))
        self.metrics = Metrics()
        self.observer = Observer(
            self.raw,
            self.metrics,
            deployments=args.deployment or None,
            shared_watches=args.shared_watches,
        )
        renew_deadline = args.lease_duration * RENEW_DEADLINE_SHARE
        self.elector = LeaderElector(
            # GET + PUT of one renewal must fit well inside the renew deadline.
            self.raw.with_timeout(max(1.0, renew_deadline / 3)),
            namespace,
            lease,
            identity,
            lease_duration=args.lease_duration,
            renew_deadline=renew_deadline,
            retry_period=RENEW_PERIOD,
            on_started_leading=self._started_leading,
            on_stopped_leading=self._stopped_leading,
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
            conflict_quiet=args.conflict_quiet_seconds,
        )
        self.http = HealthServer(
            args.metrics_port,
            healthy=self.healthy,
            ready=lambda: self.observer.synced,
            registry=self.metrics.registry,
        )
        self._leader_thread: threading.Thread | None = None
        self.loop = ReconcileLoop(
            self.observer, self.writer, self.elector.is_leader, self.stop, args.resync_seconds
        )
        self.stall_seconds = max(args.resync_seconds, 1.0) + 120.0
        log.info(
            "reporter %s: deployments=%s lease=%s/%s",
            identity,
            ",".join(args.deployment) or "<all>",
            namespace,
            lease,
        )

    def _stopped_leading(self) -> None:
        self.metrics.is_leader.set(0)
        self.writer.not_leading()

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
            # A writer stuck in a call (which request timeouts should prevent) must turn
            # /healthz red, not hide behind a live Lease thread.
            and time.monotonic() - self.loop.beat < self.stall_seconds
        )

    def run(self) -> None:
        self.http.start()
        print(
            f"pmem-csi-reporter: serving /healthz /readyz /metrics on port {self.http.port}",
            flush=True,
        )
        self.observer.start()
        self._leader_thread = self.elector.start(self.stop)
        self.loop.run()

    def shutdown(self) -> None:
        self.stop.set()
        self.observer.shutdown()
        if self._leader_thread is not None:
            self._leader_thread.join(timeout=5)
        self.http.stop()
        if self.raw.watch_pool is not None:
            self.raw.watch_pool.close()


def install_signal_handlers(stop: threading.Event) -> None:
    """SIGTERM/SIGINT only set ``stop``.

    The handler runs on the main thread between any two bytecodes, possibly while that thread
    holds a cache lock, so a handler that takes locks can deadlock (one did: SIGTERM left the
    process running forever). The main loop wakes at least every
    ``reporter.schedule.STOP_CHECK`` seconds.
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
    # HPACK logs the headers it encodes at DEBUG: the Authorization header among them.
    logging.getLogger("hpack").setLevel(logging.WARNING)
    logging.getLogger("h2").setLevel(logging.WARNING)
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
