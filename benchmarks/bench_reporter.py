"""Benchmark of the status reporter against the local cluster: writes, latency, RSS and CPU.

Why: the reporter's promises to an administrator are operational ones -- it stays silent when
nothing changes (no status writes, so no resourceVersion churn waking every watcher of the
CR), it reflects a change within seconds, and it is cheap to run. Those can only be measured
against a real API server, so this script deploys drivers from the pure builders (as
tests/e2e/reporter_helpers.py does; reused from there), runs ``python -m reporter`` as a
subprocess and measures:

(a) steady state: status writes (``pmem_csi_reporter_status_writes_total``) and CR
    resourceVersion changes over a window with a short ``--resync-seconds``; expected 0;
(b) change-to-status latency, per repetition, both from the reporter's
    ``pmem_csi_reporter_change_to_write_seconds`` histogram (exact per write: the delta of its
    _sum when one write happened) and from the client side (a watch on the CR; from just
    before the change request to the CR event that shows it). Changes: delete a Service and
    re-create it; add a fake node and delete it again (DaemonSet scale);
(c) the reporter's RSS and CPU seconds (from /proc) at steady state;
(d) the same with N CRs (unique names and namespaces) served by one reporter, with all N
    changed at once.

Sharing the cluster: other engineers' tests may run on it concurrently. Every object has a
unique ``bench-<suffix>`` name, the reporter gets explicit ``--deployment`` names (it never
touches anyone else's CR), and the drivers select only this run's own fake nodes (label
``bench.pmem-csi.intel.com/run=<suffix>``, not ``storage=pmem``), so adding and removing
nodes cannot change another test's DaemonSets. Everything is deleted at the end.

The reporter runs with the admin kubeconfig (the RBAC is covered by tests/e2e), production
defaults for everything but ``--resync-seconds``, and ``--log-level INFO``. Run:

    .venv/bin/python -m tools.cluster start
    .venv/bin/python -m benchmarks.bench_reporter [--steady-seconds 120] [--reps 10] [--crs 10]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client, config

from benchmarks.bench_status import machine
from pmem_components import certs as certs_mod
from pmem_components.config import DeploymentConfig
from reporter.kubeapi import RawApi, Resource
from tests.e2e.reporter_helpers import (
    AS_PULUMI,
    CR_RESOURCE,
    Driver,
    ReporterProcess,
    component,
    condition,
    delete_object,
    deploy_driver,
    ensure_crd,
    resource_of,
)
from tests.e2e.waiting import wait_for
from tools import cluster

Obj = dict[str, Any]
NODE = Resource("Node", "v1", "nodes", False)
SERVICE = Resource("Service", "v1", "services", True)
NODE_LABEL = "bench.pmem-csi.intel.com/run"
CHANGE_TIMEOUT = 90.0


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- CR watch


@dataclass
class CrEvent:
    at: float  # time.monotonic() when the event arrived
    name: str
    resource_version: str
    status: Obj


@dataclass
class CrWatcher:
    """Records every ADDED/MODIFIED event of the named CRs, with its arrival time.

    A watch, not polling: the arrival time is then the moment the API server told a client
    about the write, without a poll interval added to every latency sample.
    """

    raw: RawApi
    names: set[str]
    events: list[CrEvent] = field(default_factory=list)
    _cv: threading.Condition = field(default_factory=threading.Condition)
    _stop: threading.Event = field(default_factory=threading.Event)
    _stream: Any = None

    def start(self) -> None:
        items, rv = self.raw.list(CR_RESOURCE)
        self._rv = rv
        self.latest: dict[str, CrEvent] = {}
        for obj in items:
            self._record(obj, time.monotonic(), initial=True)
        threading.Thread(target=self._run, daemon=True, name="cr-watch").start()

    def _record(self, obj: Obj, at: float, initial: bool = False) -> None:
        meta = obj.get("metadata") or {}
        name = meta.get("name") or ""
        if name not in self.names:
            return
        ev = CrEvent(at, name, str(meta.get("resourceVersion")), dict(obj.get("status") or {}))
        with self._cv:
            if not initial:
                self.events.append(ev)
            self.latest[name] = ev
            self._cv.notify_all()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                stream = self.raw.watch(CR_RESOURCE, self._rv, timeout_seconds=600)
                self._stream = stream
                for event in stream:
                    obj = event.get("object") or {}
                    rv = (obj.get("metadata") or {}).get("resourceVersion")
                    if rv:
                        self._rv = rv
                    if event.get("type") in ("ADDED", "MODIFIED"):
                        self._record(obj, time.monotonic())
            except Exception as exc:
                if self._stop.is_set():
                    return
                log(f"CR watch restarted: {exc}")
                time.sleep(0.5)
                with contextlib.suppress(Exception):
                    self._rv = self.raw.list(CR_RESOURCE)[1]

    def stop(self) -> None:
        self._stop.set()
        if self._stream is not None:
            with contextlib.suppress(Exception):
                self._stream.close()

    def mark(self) -> int:
        with self._cv:
            return len(self.events)

    def count(self, since: int, name: str | None = None) -> int:
        with self._cv:
            return sum(1 for e in self.events[since:] if name is None or e.name == name)

    def wait(
        self, name: str, since: int, pred: Callable[[Obj], bool], timeout: float = CHANGE_TIMEOUT
    ) -> CrEvent:
        """The first event of ``name`` after index ``since`` whose status satisfies ``pred``."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while True:
                for ev in self.events[since:]:
                    if ev.name == name and pred(ev.status):
                        return ev
                left = deadline - time.monotonic()
                if left <= 0:
                    last = self.latest.get(name)
                    raise TimeoutError(
                        f"{name}: no matching status in {timeout:.0f}s; last: "
                        f"{last.status if last else None}"
                    )
                self._cv.wait(left)

    def status(self, name: str) -> Obj:
        with self._cv:
            ev = self.latest.get(name)
            return ev.status if ev else {}


# --------------------------------------------------------------------------- predicates


def is_running(status: Obj) -> bool:
    return status.get("phase") == "Running"


def deployed_false(status: Obj) -> bool:
    return condition(status, "DriverDeployed").get("status") == "False"


def node_ready_with(n: int) -> Callable[[Obj], bool]:
    want = f"All {n} node driver pod(s) running successfully"
    return lambda s: is_running(s) and component(s, "Node").get("reason") == want


def node_reflects(n: int) -> Callable[[Obj], bool]:
    """The first status that knows the node count changed (Ready or still rolling out)."""
    return lambda s: f" {n} " in f" {component(s, 'Node').get('reason', '')} "


# --------------------------------------------------------------------------- process stats


_CLK_TCK = os.sysconf("SC_CLK_TCK")


def proc_stats(pid: int) -> dict[str, float]:
    """CPU seconds (user+system), RSS, peak RSS and thread count of a process, from /proc."""
    with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # fields[0] is field 3 (state): utime is field 14, stime field 15.
    cpu = (int(fields[11]) + int(fields[12])) / _CLK_TCK
    values: dict[str, float] = {"cpu_seconds": cpu}
    with open(f"/proc/{pid}/status", encoding="utf-8") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                values[key] = int(rest.split()[0]) / 1024  # MiB
            elif key == "Threads":
                values["threads"] = int(rest)
    return values


# --------------------------------------------------------------------------- metrics


def histogram(metrics: dict[str, float], name: str) -> tuple[float, float, dict[float, float]]:
    """(sum, count, {le: cumulative count}) of a histogram in parsed /metrics samples."""
    buckets: dict[float, float] = {}
    prefix = f'{name}_bucket{{le="'
    for key, value in metrics.items():
        if key.startswith(prefix):
            le = key[len(prefix) :].split('"', 1)[0]
            buckets[float("inf") if le == "+Inf" else float(le)] = value
    return metrics.get(f"{name}_sum", 0.0), metrics.get(f"{name}_count", 0.0), buckets


def bucket_quantile(q: float, before: dict[float, float], after: dict[float, float]) -> float:
    """Prometheus-style histogram_quantile over the samples added between two scrapes."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    total = counts[-1] if counts else 0.0
    if total <= 0:
        return float("nan")
    rank = q * total
    prev_bound, prev_count = 0.0, 0.0
    for bound, count in zip(bounds, counts, strict=True):
        if count >= rank:
            if bound == float("inf"):
                return prev_bound
            return prev_bound + (bound - prev_bound) * (rank - prev_count) / (count - prev_count)
        prev_bound, prev_count = bound, count
    return bounds[-1]


H = "pmem_csi_reporter_change_to_write_seconds"


# --------------------------------------------------------------------------- summaries


def percentile(samples: list[float], q: float) -> float:
    """Nearest-rank percentile: an actual sample."""
    ordered = sorted(samples)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def summary(samples: list[float]) -> dict[str, float]:
    if not samples:
        return {"n": 0}
    return {
        "n": len(samples),
        "p50": statistics.median(samples),
        "p90": percentile(samples, 90),
        "min": min(samples),
        "max": max(samples),
    }


def fmt(s: dict[str, float]) -> str:
    if not s.get("n"):
        return "no samples"
    return (
        f"p50 {s['p50']:.3f}s  p90 {s['p90']:.3f}s  min {s['min']:.3f}s  max {s['max']:.3f}s"
        f"  (n={s['n']})"
    )


# --------------------------------------------------------------------------- the bench


class Bench:
    """One run: the cluster handles, this run's unique suffix, and what to clean up."""

    def __init__(self, kubeconfig: Path, workdir: Path, resync: float) -> None:
        self.kubeconfig = kubeconfig
        self.workdir = workdir
        self.resync = resync
        self.suffix = uuid.uuid4().hex[:6]
        self.raw = RawApi(config.new_client_from_config(config_file=str(kubeconfig)))
        # A second client for the watch, so a long-lived stream never holds a pooled connection
        # the benchmark's own requests wait for.
        self.watch_raw = RawApi(config.new_client_from_config(config_file=str(kubeconfig)))
        self.core = client.CoreV1Api(self.raw.api_client)
        self.node_labels = {NODE_LABEL: self.suffix}
        self.nodes: list[str] = []
        self.drivers: list[Driver] = []
        self.reporters: list[ReporterProcess] = []

    # --- setup and cleanup -----------------------------------------------------------------

    def add_node(self, name: str) -> None:
        self.nodes.append(name)
        cluster.add_node(name, self.node_labels)

    def delete_node(self, name: str) -> None:
        delete_object(self.raw, NODE, name)
        self.nodes.remove(name)

    def deploy(self, tag: str, driver_certs: certs_mod.DriverCertificates) -> Driver:
        base = f"bench-{self.suffix}-{tag}"
        cfg = DeploymentConfig(
            name=f"{base}.pmem-csi.intel.com", namespace=base, node_selector=self.node_labels
        )
        drv = deploy_driver(self.raw, cfg, driver_certs)
        self.drivers.append(drv)
        return drv

    def start_reporter(self, drivers: list[Driver], identity: str) -> ReporterProcess:
        extra: list[str] = ["--log-level", "INFO", "--lease-name", f"bench-{self.suffix}"]
        for drv in drivers[1:]:
            extra += ["--deployment", drv.name]
        proc = ReporterProcess(
            self.kubeconfig,
            drivers[0].name,
            drivers[0].namespace,  # the Lease's namespace, deleted with the driver
            identity,
            self.workdir / f"reporter-{identity}.log",
            resync_seconds=self.resync,
            extra_args=tuple(extra),
        )
        self.reporters.append(proc)
        return proc

    def cleanup(self) -> None:
        for proc in self.reporters:
            with contextlib.suppress(Exception):
                proc.stop()
        for drv in self.drivers:
            try:
                drv.delete()
            except Exception as exc:
                log(f"cleanup of {drv.name} failed: {exc}")
        for name in list(self.nodes):
            with contextlib.suppress(Exception):
                self.delete_node(name)

    # --- measurements ----------------------------------------------------------------------

    def steady(
        self, proc: ReporterProcess, watcher: CrWatcher, drivers: list[Driver], seconds: float
    ) -> dict[str, Any]:
        """(a)+(c): writes, resourceVersion changes, reconciles, RSS and CPU over a window."""
        rvs = {d.name: watcher.latest[d.name].resource_version for d in drivers}
        m0, s0, e0, t0 = proc.metrics(), proc_stats(proc.pid), watcher.mark(), time.monotonic()
        peak = s0["VmRSS"]
        while time.monotonic() - t0 < seconds:
            time.sleep(min(5.0, max(0.0, seconds - (time.monotonic() - t0))))
            peak = max(peak, proc_stats(proc.pid)["VmRSS"])
        elapsed = time.monotonic() - t0
        m1, s1 = proc.metrics(), proc_stats(proc.pid)
        rv_changed = sum(
            1 for d in drivers if watcher.latest[d.name].resource_version != rvs[d.name]
        )

        def delta(key: str) -> float:
            return m1.get(key, 0.0) - m0.get(key, 0.0)

        def delta_all(prefix: str) -> float:
            keys = {k for k in (*m0, *m1) if k.startswith(prefix)}
            return sum(m1.get(k, 0.0) - m0.get(k, 0.0) for k in keys)

        cpu = s1["cpu_seconds"] - s0["cpu_seconds"]
        return {
            "seconds": round(elapsed, 1),
            "crs": len(drivers),
            "status_writes": delta("pmem_csi_reporter_status_writes_total"),
            "cr_watch_events": watcher.count(e0),
            "crs_with_resource_version_change": rv_changed,
            "reconciles": delta("pmem_csi_reporter_reconciles_total"),
            "watch_restarts": delta_all("pmem_csi_reporter_watch_restarts_total"),
            "relists": delta_all("pmem_csi_reporter_relists_total"),
            "cpu_seconds": round(cpu, 2),
            "cpu_percent_of_one_core": round(100 * cpu / elapsed, 2),
            "rss_mib_end": round(s1["VmRSS"], 1),
            "rss_mib_peak_sampled": round(peak, 1),
            "rss_mib_hwm": round(s1["VmHWM"], 1),
            "threads": s1["threads"],
        }

    def change_latency(
        self,
        proc: ReporterProcess,
        watcher: CrWatcher,
        drivers: list[Driver],
        change: Callable[[Driver], None],
        expect: Callable[[Obj], bool],
    ) -> tuple[list[float], list[float], dict[str, float]]:
        """Apply ``change`` to every driver at once; latency until each CR shows ``expect``.

        Returns the client-side samples, the reporter-side sample (exact when exactly one
        write happened, else nothing) and the raw histogram deltas.
        """
        m0 = proc.metrics()
        s0, c0, b0 = histogram(m0, H)
        mark = watcher.mark()
        started: dict[str, float] = {}
        for drv in drivers:
            started[drv.name] = time.monotonic()
            change(drv)
        client_side = [watcher.wait(d.name, mark, expect).at - started[d.name] for d in drivers]
        # The histogram is updated after the patch returns, so our watch event may overtake
        # it: give the scrape a moment. It may also never count a write: when a resync
        # reconciled the CR (with no change time) before the change's own event was taken,
        # that write has no change-to-write sample (see BENCHMARKS.md), so do not insist.
        deadline = time.monotonic() + 3.0
        while histogram(proc.metrics(), H)[1] < c0 + len(drivers) and (time.monotonic() < deadline):
            time.sleep(0.1)
        s1, c1, b1 = histogram(proc.metrics(), H)
        reporter_side = [s1 - s0] if c1 - c0 == 1 else []
        return client_side, reporter_side, {"sum": s1 - s0, "count": c1 - c0, **_b(b0, b1)}


def _b(before: dict[float, float], after: dict[float, float]) -> dict[str, float]:
    return {f"le_{k}": after[k] - before.get(k, 0.0) for k in sorted(after)}


DAEMON_SET = Resource("DaemonSet", "apps/v1", "daemonsets", True)


class DaemonSetPoller:
    """When the node DaemonSet's own status first says ``n`` pods desired and ready.

    Scaling is mostly the cluster's work (node Ready, DaemonSet controller, kwok, pod GC);
    this splits the client-side latency into the cluster's share and the reporter's.
    """

    def __init__(self, raw: RawApi, drv: Driver, n: int, interval: float = 0.1) -> None:
        self.at: float | None = None
        self._stop = threading.Event()

        def run() -> None:
            while not self._stop.is_set():
                ds = raw.get(DAEMON_SET, drv.names.node_driver, drv.namespace) or {}
                st = ds.get("status") or {}
                if st.get("desiredNumberScheduled") == n and st.get("numberReady") == n:
                    self.at = time.monotonic()
                    return
                self._stop.wait(interval)

        self._thread = threading.Thread(target=run, daemon=True, name="ds-poll")
        self._thread.start()

    def result(self, timeout: float = 5.0) -> float | None:
        self._thread.join(timeout)
        self._stop.set()
        return self.at


def service_body(drv: Driver, name: str) -> Obj:
    for obj in drv.objects:
        if obj["kind"] == "Service" and obj["metadata"]["name"] == name:
            return obj
    raise KeyError(name)


def delete_service(raw: RawApi) -> Callable[[Driver], None]:
    def change(drv: Driver) -> None:
        delete_object(raw, SERVICE, drv.names.metrics_service, drv.namespace)

    return change


def create_service(raw: RawApi) -> Callable[[Driver], None]:
    def change(drv: Driver) -> None:
        body = service_body(drv, drv.names.metrics_service)
        raw.create(resource_of(body), body, drv.namespace, field_manager=AS_PULUMI)

    return change


def wait_gone(raw: RawApi, drv: Driver) -> None:
    wait_for(
        lambda: raw.get(SERVICE, drv.names.metrics_service, drv.namespace) is None,
        30,
        "Service deletion",
    )


# --------------------------------------------------------------------------- scenarios


def single_cr(bench: Bench, args: argparse.Namespace) -> dict[str, Any]:
    """(a) (b) (c) with one CR."""
    out: dict[str, Any] = {}
    drv = bench.deploy("one", certs_mod.generate_driver_certificates())
    watcher = CrWatcher(bench.watch_raw, {drv.name})
    watcher.start()
    try:
        t0 = time.monotonic()
        proc = bench.start_reporter([drv], "single")
        ev = watcher.wait(drv.name, 0, node_ready_with(3), timeout=120)
        out["startup_to_running_seconds"] = round(ev.at - t0, 2)
        out["writes_until_running"] = proc.metric("pmem_csi_reporter_status_writes_total")
        out["startup"] = proc_stats(proc.pid)
        log(f"single CR Running after {ev.at - t0:.1f}s; steady window {args.steady_seconds}s")
        out["steady"] = bench.steady(proc, watcher, [drv], args.steady_seconds)
        log(f"steady: {out['steady']}")

        lat: dict[str, dict[str, list[float]]] = {}

        def record(kind: str, client_side: list[float], reporter_side: list[float]) -> None:
            entry = lat.setdefault(kind, {"client": [], "reporter": []})
            entry["client"] += client_side
            entry["reporter"] += reporter_side

        for i in range(args.reps):
            c, r, _ = bench.change_latency(
                proc, watcher, [drv], delete_service(bench.raw), deployed_false
            )
            record("delete Service -> DriverDeployed=False", c, r)
            wait_gone(bench.raw, drv)
            c, r, _ = bench.change_latency(
                proc, watcher, [drv], create_service(bench.raw), is_running
            )
            record("re-create Service -> Running", c, r)
            log(f"service rep {i + 1}/{args.reps}: {lat}")
            time.sleep(1.0)

        for i in range(args.scale_reps):
            node = f"bench-{bench.suffix}-extra-{i}"
            n = len(bench.nodes)
            for verb, target in (("add", n + 1), ("delete", n)):
                m0, mark = proc.metrics(), watcher.mark()
                t0 = time.monotonic()
                poller = DaemonSetPoller(bench.raw, drv, target)
                if verb == "add":
                    bench.add_node(node)
                else:
                    bench.delete_node(node)
                first = watcher.wait(drv.name, mark, node_reflects(target))
                done = watcher.wait(drv.name, mark, node_ready_with(target))
                ds_at = poller.result()
                s0, c0, _ = histogram(m0, H)
                s1, c1, _ = histogram(proc.metrics(), H)
                key = f"{verb} node -> Node Ready with {'N+1' if verb == 'add' else 'N'}"
                entry = lat.setdefault(
                    key,
                    {"client": [], "reporter": [], "first": [], "daemonset": [], "writes": []},
                )
                entry["client"].append(done.at - t0)
                entry["first"].append(first.at - t0)
                if ds_at is not None:
                    entry["daemonset"].append(ds_at - t0)
                if c1 - c0 >= 1:
                    # Mean over the writes the scale caused (usually one).
                    entry["reporter"].append((s1 - s0) / (c1 - c0))
                entry["writes"].append(watcher.count(mark, drv.name))
            log(f"scale rep {i + 1}/{args.scale_reps}: {lat}")
            time.sleep(1.0)
        out["latency"] = {
            kind: {k: summary(v) if k != "writes" else v for k, v in entry.items()}
            for kind, entry in lat.items()
        }
        out["latency_samples"] = lat
        out["final"] = {
            "metrics": {
                k: v for k, v in proc.metrics().items() if k.startswith("pmem_csi_reporter_")
            },
            "proc": proc_stats(proc.pid),
        }
        proc.stop()
    finally:
        watcher.stop()
    return out


def many_crs(bench: Bench, args: argparse.Namespace) -> dict[str, Any]:
    """(a) (b) (c) with ``--crs`` CRs, each with its own certificates, on one reporter."""
    out: dict[str, Any] = {}
    log(f"deploying {args.crs} drivers (own certificates each)")
    drivers = [
        bench.deploy(f"m{i}", certs_mod.generate_driver_certificates()) for i in range(args.crs)
    ]
    watcher = CrWatcher(bench.watch_raw, {d.name for d in drivers})
    watcher.start()
    try:
        t0 = time.monotonic()
        proc = bench.start_reporter(drivers, "many")
        at = [watcher.wait(d.name, 0, node_ready_with(3), timeout=180).at - t0 for d in drivers]
        out["startup_to_running_seconds"] = summary(at)
        out["writes_until_running"] = proc.metric("pmem_csi_reporter_status_writes_total")
        log(f"{args.crs} CRs Running: {fmt(out['startup_to_running_seconds'])}")
        out["steady"] = bench.steady(proc, watcher, drivers, args.steady_seconds)
        log(f"steady: {out['steady']}")
        client_del: list[float] = []
        client_add: list[float] = []
        hist: list[dict[str, float]] = []
        for i in range(args.burst_reps):
            c, _, h = bench.change_latency(
                proc, watcher, drivers, delete_service(bench.raw), deployed_false
            )
            client_del += c
            hist.append(h)
            for d in drivers:
                wait_gone(bench.raw, d)
            c, _, h = bench.change_latency(
                proc, watcher, drivers, create_service(bench.raw), is_running
            )
            client_add += c
            hist.append(h)
            log(f"burst rep {i + 1}/{args.burst_reps}: delete {fmt(summary(client_del))}")
            time.sleep(1.0)
        total_sum = sum(h["sum"] for h in hist)
        total_count = sum(h["count"] for h in hist)
        out["latency"] = {
            f"delete Service in all {args.crs} -> DriverDeployed=False": summary(client_del),
            f"re-create Service in all {args.crs} -> Running": summary(client_add),
        }
        out["reporter_histogram"] = {
            "writes": total_count,
            "writes_expected": 2 * args.crs * args.burst_reps,
            "mean_seconds": total_sum / total_count if total_count else None,
        }
        out["latency_samples"] = {"delete": client_del, "create": client_add, "hist": hist}
        out["final_proc"] = proc_stats(proc.pid)
        proc.stop()
    finally:
        watcher.stop()
    return out


@contextlib.contextmanager
def bench_session(args: argparse.Namespace) -> Iterator[Bench]:
    kubeconfig = cluster.start()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bench-reporter-"))
    workdir.mkdir(parents=True, exist_ok=True)
    bench = Bench(kubeconfig, workdir, args.resync_seconds)
    log(f"run {bench.suffix}; reporter logs in {workdir}")
    try:
        ensure_crd(bench.raw)
        for i in range(3):
            bench.add_node(f"bench-{bench.suffix}-{i}")
        yield bench
    finally:
        bench.cleanup()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_reporter", description=__doc__)
    p.add_argument("--steady-seconds", type=float, default=120.0)
    p.add_argument("--resync-seconds", type=float, default=5.0)
    p.add_argument("--reps", type=int, default=10, help="Service delete/re-create repetitions")
    p.add_argument("--scale-reps", type=int, default=3, help="node add/delete repetitions")
    p.add_argument("--crs", type=int, default=10, help="CRs for the many-CR scenario (0: skip)")
    p.add_argument("--burst-reps", type=int, default=5, help="repetitions with all CRs at once")
    p.add_argument("--skip-single", action="store_true")
    p.add_argument("--workdir", default=None, help="where reporter logs go (default: a tmpdir)")
    p.add_argument("--json", default=None, help="write all results and samples to this file")
    args = p.parse_args(argv)
    report: dict[str, Any] = {"machine": machine(), "args": vars(args)}

    def save() -> None:
        # After each scenario, so a later failure does not lose the earlier results.
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=2, default=str), "utf-8")

    with bench_session(args) as bench:
        if not args.skip_single:
            report["single"] = single_cr(bench, args)
            save()
        if args.crs > 0:
            report["many"] = many_crs(bench, args)
            save()
    report["finished"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    save()
    print_report(report)
    return 0


def print_report(report: dict[str, Any]) -> None:
    m = report["machine"]
    print(f"# {m['date']}  nproc={m['nproc']}  python {m['python']}  {m['cpu']}")
    for scenario in ("single", "many"):
        r = report.get(scenario)
        if not r:
            continue
        print(f"\n## {scenario}")
        print(f"startup to Running: {r['startup_to_running_seconds']}")
        print(f"steady: {json.dumps(r['steady'])}")
        for kind, s in r["latency"].items():
            if "client" in s:
                print(f"{kind}\n  client   {fmt(s['client'])}\n  reporter {fmt(s['reporter'])}")
                if "first" in s:
                    print(f"  first write {fmt(s['first'])}; writes per scale {s.get('writes')}")
                    print(f"  DaemonSet status reached N {fmt(s['daemonset'])}")
            else:
                print(f"{kind}\n  client   {fmt(s)}")
        if "reporter_histogram" in r:
            print(f"reporter histogram: {r['reporter_histogram']}")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
    sys.exit(130)
