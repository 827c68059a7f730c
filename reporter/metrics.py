"""The reporter's Prometheus metrics, in one place so their names are defined once.

Metrics live in a ``Metrics`` object with its own registry rather than in module globals: a
unit test (or two reporters in one test process) gets fresh counters without
"Duplicated timeseries" errors, and ``/metrics`` serves exactly this registry.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# Buckets from "a pod turned NotReady" to "the CR says so": sub-second at best, a resync
# period (60 s) or a secret poll at worst.
CHANGE_TO_WRITE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.status_writes = Counter(
            "pmem_csi_reporter_status_writes",
            "Status patches sent to deployments.pmem-csi.intel.com/status and accepted.",
            registry=self.registry,
        )
        self.status_write_errors = Counter(
            "pmem_csi_reporter_status_write_errors",
            "Status patches that failed after all retries.",
            registry=self.registry,
        )
        self.status_conflicts = Counter(
            "pmem_csi_reporter_status_conflicts",
            "Times a served CR's status was found replaced by another writer (another "
            "stack's reporter, or one of the per-deployment layout): this reporter yields. "
            "Counted again every 10 minutes while the other writer goes on.",
            registry=self.registry,
        )
        self.watch_restarts = Counter(
            "pmem_csi_reporter_watch_restarts",
            "Watches that ended and were re-established (timeout, error or 410 Gone re-list).",
            ["resource"],
            registry=self.registry,
        )
        self.relists = Counter(
            "pmem_csi_reporter_relists",
            "Full re-lists of a resource after 410 Gone or an error.",
            ["resource"],
            registry=self.registry,
        )
        self.change_to_write = Histogram(
            "pmem_csi_reporter_change_to_write_seconds",
            "Seconds from an observed change of a CR or sub-object to the status write it caused.",
            buckets=CHANGE_TO_WRITE_BUCKETS,
            registry=self.registry,
        )
        self.events = Counter(
            "pmem_csi_reporter_events",
            "Kubernetes Events created on Deployment CRs (phase changes, broken node pods, "
            "status write conflicts).",
            registry=self.registry,
        )
        self.is_leader = Gauge(
            "pmem_csi_reporter_is_leader",
            "1 while this replica holds the Lease and may write status.",
            registry=self.registry,
        )
        self.watches = Gauge(
            "pmem_csi_reporter_watches",
            "Informers (one list-then-watch loop and one open watch each) currently running.",
            registry=self.registry,
        )
        self.crd_missing = Gauge(
            "pmem_csi_reporter_crd_missing",
            "1 while the deployments.pmem-csi.intel.com CRD is not served (deleted): the "
            "reporter then waits for it, not ready, retrying with backoff.",
            registry=self.registry,
        )
        self.reconciles = Counter(
            "pmem_csi_reporter_reconciles",
            "Status computations of one CR (most of which write nothing).",
            registry=self.registry,
        )
