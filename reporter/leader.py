"""Lease-based leader election (coordination.k8s.io/v1), so only one replica writes status.

Why not simply run one replica: the issue wants a new writer within 15 s of the old one's
death, faster than a Deployment replaces a pod on a dead node. Why a Lease: it is what
client-go's leader election and kube-controller-manager use, so ``kubectl get lease`` shows the
holder the way administrators expect.

The algorithm follows client-go's ``leaderelection`` package:
- a Lease is held while ``observed time of its last change + leaseDurationSeconds`` lies in
  the future; the observed time is this process's monotonic clock when it saw renewTime (or the
  holder) change, so clock skew between nodes does not matter;
- every update is a PUT carrying the resourceVersion it was computed from (optimistic
  concurrency): of two candidates racing for an expired Lease one wins, the other gets 409;
- the leader renews every ``retry_period``; ``is_leader()`` turns False as soon as a renewal
  sees another holder, and also once no renewal has succeeded for ``renew_deadline`` (shorter
  than the lease duration), so a partitioned leader has stopped writing before anybody else can
  acquire the Lease.
- ``renew_deadline`` counts from when the successful renewal was *sent*, not from when its
  answer arrived: the renewTime it wrote is the send time, and others measure the Lease's
  expiry from their first sight of it, which is after the send. A slow answer therefore eats
  into our leadership, never into the safety margin. The Lease API handed in must have a
  per-request timeout well below ``renew_deadline`` and no hidden client retries
  (``reporter.kubeapi``): an answer that would arrive after the deadline is worthless.

Takeover bound with the defaults (lease 10 s, candidates retry every 1 s): a candidate sees the
dead leader's last renewal at most 1 s late, waits out 10 s, and acquires on its next try:
at most about 12 s after the leader's last renewal.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from kubernetes.client.exceptions import ApiException

from reporter.kubeapi import Obj, Resource
from reporter.retry import describe_error

log = logging.getLogger(__name__)

LEASE = Resource("Lease", "coordination.k8s.io/v1", "leases", True)


class LeaseApi(Protocol):
    def get(self, res: Resource, name: str, namespace: str | None = None) -> Obj | None: ...

    def create(self, res: Resource, body: Obj, namespace: str | None = None) -> Obj: ...

    def replace(self, res: Resource, name: str, body: Obj, namespace: str | None = None) -> Obj: ...


def micro_time(t: datetime) -> str:
    """metav1.MicroTime's wire format."""
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class LeaderElector:
    api: LeaseApi
    namespace: str
    name: str
    identity: str
    lease_duration: float = 10.0
    renew_deadline: float = 7.0
    retry_period: float = 2.0  # leader's renew interval
    acquire_period: float = 1.0  # candidates' retry interval
    clock: Callable[[], float] = time.monotonic
    now: Callable[[], datetime] = lambda: datetime.now(UTC)
    on_started_leading: Callable[[], None] = lambda: None
    on_stopped_leading: Callable[[], None] = lambda: None
    labels: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not float(self.lease_duration).is_integer():
            # leaseDurationSeconds is an integer: a fraction would be cut off in the Lease,
            # and others would take over while this replica still believes it leads.
            raise ValueError(
                f"lease_duration must be a whole number of seconds, not {self.lease_duration}"
            )
        if not self.renew_deadline < self.lease_duration:
            raise ValueError("renew_deadline must be shorter than lease_duration")
        self._leading = False
        self._last_renew = float("-inf")
        self._observed_record: tuple[Any, ...] | None = None
        self._observed_time = float("-inf")
        self._lock = threading.Lock()
        self.holder: str | None = None

    # --- the one question the writer asks ---------------------------------------------------

    def is_leader(self) -> bool:
        """True only while we hold the Lease by a renewal younger than renew_deadline."""
        with self._lock:
            return self._leading and self.clock() - self._last_renew < self.renew_deadline

    # --- one round --------------------------------------------------------------------------

    def _spec(self, acquire_time: str, transitions: int, now: datetime) -> Obj:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(self.lease_duration),
            "acquireTime": acquire_time,
            "renewTime": micro_time(now),
            "leaseTransitions": transitions,
        }

    def try_acquire_or_renew(self) -> bool:
        """One attempt; True when we hold the Lease afterwards. API errors propagate."""
        sent = self.clock()  # leadership from this renewal is counted from here
        now_wall = self.now()
        lease = self.api.get(LEASE, self.name, self.namespace)
        if lease is None:
            body = {
                "apiVersion": LEASE.api_version,
                "kind": LEASE.kind,
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": self._spec(micro_time(now_wall), 0, now_wall),
            }
            if self.labels:
                body["metadata"]["labels"] = dict(self.labels)
            try:
                created = self.api.create(LEASE, body, self.namespace)
            except ApiException as exc:
                if exc.status == 409:  # somebody else created it first
                    return False
                raise
            self._observe(created)
            self._renewed(sent)
            return True

        spec = lease.get("spec") or {}
        self._observe(lease)
        holder = spec.get("holderIdentity") or ""
        self.holder = holder or None
        duration = float(spec.get("leaseDurationSeconds") or self.lease_duration)
        if holder and holder != self.identity and self._observed_time + duration > self.clock():
            return False  # held by another, not expired
        if holder == self.identity:
            acquire_time = spec.get("acquireTime") or micro_time(now_wall)
            transitions = int(spec.get("leaseTransitions") or 0)
        else:
            acquire_time = micro_time(now_wall)
            transitions = int(spec.get("leaseTransitions") or 0) + 1
        body = {
            **lease,
            "metadata": {**(lease.get("metadata") or {})},  # keeps resourceVersion
            "spec": {**spec, **self._spec(acquire_time, transitions, now_wall)},
        }
        try:
            updated = self.api.replace(LEASE, self.name, body, self.namespace)
        except ApiException as exc:
            if exc.status == 409:  # lost a race or our copy is stale; look again next round
                return False
            raise
        self._observe(updated)
        self._renewed(sent)
        return True

    def _observe(self, lease: Obj) -> None:
        spec = lease.get("spec") or {}
        # resourceVersion changes with every write, even one within the same microsecond.
        record = (
            spec.get("holderIdentity"),
            spec.get("renewTime"),
            (lease.get("metadata") or {}).get("resourceVersion"),
        )
        if record != self._observed_record:
            self._observed_record = record
            self._observed_time = self.clock()

    def _renewed(self, sent: float) -> None:
        with self._lock:
            self._last_renew = max(self._last_renew, sent)
        self.holder = self.identity

    def step(self) -> bool:
        """One round of the election loop, firing the start/stop callbacks on transitions."""
        try:
            held = self.try_acquire_or_renew()
        except Exception as exc:
            log.warning("lease %s/%s: %s", self.namespace, self.name, describe_error(exc))
            held = False
            # Keep leading through a short API outage: is_leader() expires by itself.
            with self._lock:
                if self._leading and self.clock() - self._last_renew < self.renew_deadline:
                    return True
        self._set_leading(held)
        return held

    def _set_leading(self, held: bool) -> None:
        with self._lock:
            was = self._leading
            self._leading = held
        if held and not was:
            log.info("lease %s/%s acquired by %s", self.namespace, self.name, self.identity)
            self.on_started_leading()
        elif was and not held:
            log.warning("lease %s/%s lost by %s", self.namespace, self.name, self.identity)
            self.on_stopped_leading()

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.step()
            stop.wait(self.retry_period if self._leading else self.acquire_period)
        self.release()

    def release(self) -> None:
        """Hand the Lease over at shutdown: others need not wait for it to expire."""
        with self._lock:
            was = self._leading
            self._leading = False
        if not was:
            return
        try:
            lease = self.api.get(LEASE, self.name, self.namespace)
            if lease and (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                spec = {
                    **lease["spec"],
                    "holderIdentity": "",
                    "leaseDurationSeconds": 1,
                    "renewTime": micro_time(self.now()),
                }
                self.api.replace(LEASE, self.name, {**lease, "spec": spec}, self.namespace)
                log.info("lease %s/%s released", self.namespace, self.name)
        except Exception as exc:
            log.warning("releasing lease failed: %s", describe_error(exc))
        self.on_stopped_leading()

    def start(self, stop: threading.Event) -> threading.Thread:
        thread = threading.Thread(target=self.run, args=(stop,), name="leader", daemon=True)
        thread.start()
        return thread
