"""Scale benchmark of the status reporter: many kwok nodes, many deployments.

Why: the reporter's limits show at scale -- memory grows with cached pods, a rollout over
thousands of nodes is a storm of pod events, and every deployment may add watches and threads.
It measures the layout the Pulumi program deploys: one reporter per stack with the arguments
of the Deployment that ``pmem_components.manifests.reporter`` builds for the stack's
deployments (``--deployment`` per CR, ``--shared-watches``), run as its 2 replicas (two
processes, one leading). Figures are per process and summed ("pods"). On the local cluster
(kwok nodes; ``python -m tools.cluster start``):

``--nodes N`` (one deployment):
  1. N fake nodes labelled for this run; a driver whose node DaemonSet first selects no node
     (phase Running, 0 pods), the reporter started and Running;
  2. steady window (no pods): writes, reporter CPU/RSS/threads/sockets, API server requests;
  3. readiness burst: the DaemonSet's node selector is switched to the run's label, so N pods
     are created and become Ready (paced by the cluster); status writes until the CR says
     "All N node driver pod(s)", writes per 1,000 pods, every phase seen, peak RSS;
  4. steady window with N pods (same figures);
  5. change-to-status latency, client side (a watch on the CR, from just before the change
     request to the CR event showing it): one node pod made crash-looping (the status names
     the pod: Progressing below 100 nodes, Running with the pod tolerated above) and made
     Ready again (Running, the pod no longer named), ``--reps`` times each.

``--deployments D`` (``--nodes-per`` nodes shared by all): D drivers in D namespaces, each
  DaemonSet on the same nodes, one stack reporter serving all; steady-state figures (pods,
  threads, watches, sockets, RSS, CPU, Lease and status requests per minute) and the
  crash-loop/restore latency on ``--reps`` drivers in turn.

API requests at steady state come from the API server's ``apiserver_request_total``: the
delta over the window for the resources the reporter reads or writes, and the same delta over
an equal window with the reporter paused (SIGSTOP), so the other clients' traffic (kwok,
controllers) can be told apart. Run (one scenario per invocation, so each is bounded):

    .venv/bin/python -m tools.cluster start
    .venv/bin/python -m benchmarks.bench_reporter_scale --nodes 1000 --json /tmp/n1000.json
    .venv/bin/python -m benchmarks.bench_reporter_scale --deployments 100 --json /tmp/d100.json
    .venv/bin/python -m benchmarks.bench_reporter_scale --nodes 5000 --json /tmp/n5000.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from kubernetes import client, config

from benchmarks.bench_reporter import CrWatcher, percentile, proc_stats
from benchmarks.bench_status import machine
from pmem_components import certs as certs_mod
from pmem_components.config import DeploymentConfig
from pmem_components.manifests.reporter import build_reporter_deployment
from reporter.kubeapi import RawApi, Resource
from tests.e2e.reporter_helpers import (
    AS_PULUMI,
    PROJECT_DIR,
    Driver,
    component,
    container_status_patch,
    deploy_driver,
    ensure_crd,
)
from tools import cluster

Obj = dict[str, Any]
NODE_LABEL = "bench.pmem-csi.intel.com/run"
DAEMON_SET = Resource("DaemonSet", "apps/v1", "daemonsets", True)
POD = Resource("Pod", "v1", "pods", True)
# Resources the reporter touches; apiserver_request_total is read for these.
REPORTER_RESOURCES = {
    "deployments",
    "pods",
    "secrets",
    "services",
    "serviceaccounts",
    "roles",
    "rolebindings",
    "clusterroles",
    "clusterrolebindings",
    "csidrivers",
    "statefulsets",
    "daemonsets",
    "leases",
    "events",
}


def log(msg: str) -> None:
    print(f"[scale {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- the reporter


class Reporter:
    """``python -m reporter`` with the admin kubeconfig, production defaults, INFO logs."""

    def __init__(
        self, kubeconfig: Path, args: list[str], log_path: Path, env: dict[str, str] | None = None
    ) -> None:
        self.log_path = log_path
        cmd = [
            sys.executable,
            "-m",
            "reporter",
            "--kubeconfig",
            str(kubeconfig),
            "--metrics-port",
            "0",
            "--log-level",
            "INFO",
            *args,
        ]
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"} | (env or {})
        self._log = log_path.open("w", encoding="utf-8")
        self.proc = subprocess.Popen(
            cmd, cwd=PROJECT_DIR, env=env, stdout=subprocess.PIPE, stderr=self._log, text=True
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        self.port = int(line.rsplit(" ", 1)[1])

    @property
    def pid(self) -> int:
        return self.proc.pid

    def metrics(self) -> dict[str, float]:
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10) as r:
            text = r.read().decode()
        out: dict[str, float] = {}
        for raw_line in text.splitlines():
            if raw_line.startswith("#") or not raw_line.strip():
                continue
            key, _, value = raw_line.rpartition(" ")
            with contextlib.suppress(ValueError):
                out[key] = float(value)
        return out

    def writes(self) -> float:
        return self.metrics().get("pmem_csi_reporter_status_writes_total", 0.0)

    def sockets(self) -> int:
        n = 0
        for fd in os.listdir(f"/proc/{self.pid}/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{self.pid}/fd/{fd}").startswith("socket:"):
                    n += 1
        return n

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self._log.close()


# Replicas of the reporter Deployment the program builds (config.Reporter's default).
REPLICAS = 2


def _deployed_container(drivers: list[Driver]) -> dict[str, Any]:
    """The container of the stack reporter serving ``drivers``, as the program builds it."""
    dep = build_reporter_deployment(
        [(d.names, d.namespace) for d in drivers], drivers[0].namespace, "img", REPLICAS, {}, 3, ""
    )
    return dep["spec"]["template"]["spec"]["containers"][0]


def deployed_args(drivers: list[Driver]) -> list[str]:
    """The container arguments of the stack reporter serving ``drivers``, as the program
    builds them, without ``--log-level``/``--metrics-port`` (``Reporter`` sets its own)."""
    args = list(_deployed_container(drivers)["args"])
    for flag in ("--log-level", "--metrics-port"):
        i = args.index(flag)
        del args[i : i + 2]
    return args


def deployed_env(drivers: list[Driver]) -> dict[str, str]:
    """The environment the program gives the stack reporter's container (glibc tunables)."""
    return {e["name"]: e["value"] for e in _deployed_container(drivers).get("env", [])}


# --------------------------------------------------------------------------- API server


def apiserver_requests(raw: RawApi) -> dict[tuple[str, str], float]:
    """apiserver_request_total summed by (verb, resource) for the reporter's resources."""
    resp = raw.request("GET", "/metrics", timeout=(5, 60))
    text = resp.read().decode()
    out: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels_text, _, value = line.rpartition(" ")
        labels = dict(
            part.split("=", 1)
            for part in labels_text[len("apiserver_request_total{") : -1].split(",")
        )
        labels = {k: v.strip('"') for k, v in labels.items()}
        resource = labels.get("resource", "")
        if resource not in REPORTER_RESOURCES:
            continue
        key = (
            labels.get("verb", ""),
            resource + ("/" + labels["subresource"] if labels.get("subresource") else ""),
        )
        out[key] = out.get(key, 0.0) + float(value)
    return out


def per_minute(before: dict, after: dict, seconds: float) -> dict[str, float]:
    out = {}
    for key in sorted(set(before) | set(after)):
        delta = after.get(key, 0.0) - before.get(key, 0.0)
        if delta:
            out[f"{key[0]} {key[1]}"] = round(delta * 60.0 / seconds, 1)
    return out


# --------------------------------------------------------------------------- bench


class Scale:
    def __init__(self, kubeconfig: Path, workdir: Path) -> None:
        self.kubeconfig = kubeconfig
        self.workdir = workdir
        self.suffix = uuid.uuid4().hex[:6]
        api_client = config.new_client_from_config(config_file=str(kubeconfig))
        api_client.configuration.connection_pool_maxsize = 16
        self.raw = RawApi(api_client, request_timeout=60.0)
        self.watch_raw = RawApi(config.new_client_from_config(config_file=str(kubeconfig)))
        self.core = client.CoreV1Api(api_client)
        self.apps = client.AppsV1Api(api_client)
        self.label = {NODE_LABEL: self.suffix}
        self.nodes: list[str] = []
        self.drivers: list[Driver] = []
        self.reporters: list[Reporter] = []

    def add_nodes(self, n: int) -> None:
        t0 = time.monotonic()
        names = [f"scale-{self.suffix}-{i}" for i in range(n)]

        def create(chunk: list[str]) -> None:
            for name in chunk:
                self.core.create_node(cluster.node_manifest(name, self.label))

        threads = [threading.Thread(target=create, args=(names[i::8],)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.nodes += names
        while True:
            ready = 0
            cont = None
            while True:
                page = self.core.list_node(
                    label_selector=f"{NODE_LABEL}={self.suffix}", limit=1000, _continue=cont
                )
                ready += sum(
                    1
                    for node in page.items
                    if any(
                        c.type == "Ready" and c.status == "True"
                        for c in node.status.conditions or []
                    )
                )
                cont = page.metadata._continue
                if not cont:
                    break
            if ready >= n:
                break
            time.sleep(2)
        log(f"{n} nodes Ready after {time.monotonic() - t0:.0f}s")

    def deploy(self, tag: str, certs: certs_mod.DriverCertificates, selector: dict) -> Driver:
        base = f"scale-{self.suffix}-{tag}"
        cfg = DeploymentConfig(
            name=f"{base}.pmem-csi.intel.com", namespace=base, node_selector=selector
        )
        drv = deploy_driver(self.raw, cfg, certs)
        self.drivers.append(drv)
        return drv

    def reporter(self, args: list[str], tag: str, env: dict[str, str] | None = None) -> Reporter:
        rep = Reporter(self.kubeconfig, args, self.workdir / f"reporter-{tag}.log", env)
        self.reporters.append(rep)
        return rep

    def deployed_reporters(self, drivers: list[Driver], tag: str) -> list[Reporter]:
        """The program's reporter layout for ``drivers``: its args, ``REPLICAS`` processes."""
        args, env = deployed_args(drivers), deployed_env(drivers)
        return [
            self.reporter([*args, "--identity", f"{tag}-{i}"], f"{tag}-{i}", env)
            for i in range(REPLICAS)
        ]

    def node_pods(self, drv: Driver) -> list[Obj]:
        items, _ = self.raw.list(POD, drv.namespace)
        return [
            p
            for p in items
            if any(r.get("kind") == "DaemonSet" for r in p["metadata"].get("ownerReferences") or [])
        ]

    def wait_previous_runs_gone(self, timeout: float = 300.0) -> None:
        """Earlier runs' namespaces are deleted asynchronously; their traffic is noise here."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            left = [
                ns.metadata.name
                for ns in self.core.list_namespace().items
                if ns.metadata.name.startswith("scale-")
            ]
            if not left:
                return
            log(f"waiting for {len(left)} namespace(s) of earlier runs to go")
            time.sleep(10)

    def cleanup(self) -> None:
        for rep in self.reporters:
            with contextlib.suppress(Exception):
                rep.stop()
        for drv in self.drivers:
            with contextlib.suppress(Exception):
                drv.delete()
        if self.nodes:
            with contextlib.suppress(Exception):
                self.core.delete_collection_node(label_selector=f"{NODE_LABEL}={self.suffix}")
            # Pods bound to deleted nodes are removed by the pod GC; do not wait for it.


def steady(
    scale: Scale, reps: list[Reporter], seconds: float, pause_compare: bool
) -> dict[str, Any]:
    """Writes, CPU, RSS, threads, sockets, watches and API requests over a window, per
    reporter process (pod) and summed."""
    m0 = [r.metrics() for r in reps]
    s0 = [proc_stats(r.pid) for r in reps]
    a0, t0 = apiserver_requests(scale.raw), time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - t0
    m1 = [r.metrics() for r in reps]
    s1 = [proc_stats(r.pid) for r in reps]
    a1 = apiserver_requests(scale.raw)

    def delta(key: str) -> float:
        return sum(b.get(key, 0) - a.get(key, 0) for a, b in zip(m0, m1, strict=True))

    pods = [
        {
            "leader": m.get("pmem_csi_reporter_is_leader", 0) == 1,
            "cpu_percent_of_one_core": round(
                100 * (b["cpu_seconds"] - a["cpu_seconds"]) / elapsed, 2
            ),
            "rss_mib": round(b["VmRSS"], 1),
            "rss_mib_peak": round(b["VmHWM"], 1),
            "threads": b["threads"],
            "watches": m.get("pmem_csi_reporter_watches", 0),
            "sockets": r.sockets(),
        }
        for r, m, a, b in zip(reps, m1, s0, s1, strict=True)
    ]
    requests = per_minute(a0, a1, elapsed)
    out: dict[str, Any] = {
        "seconds": round(elapsed, 1),
        "reporter_pods": len(reps),
        "status_writes": delta("pmem_csi_reporter_status_writes_total"),
        "reconciles": delta("pmem_csi_reporter_reconciles_total"),
        "cpu_percent_of_one_core": round(sum(p["cpu_percent_of_one_core"] for p in pods), 2),
        "rss_mib": round(sum(p["rss_mib"] for p in pods), 1),
        "rss_mib_max_pod": max(p["rss_mib"] for p in pods),
        "threads": sum(p["threads"] for p in pods),
        "watches": sum(p["watches"] for p in pods),
        "sockets": sum(p["sockets"] for p in pods),
        "lease_requests_per_minute": round(
            sum(v for k, v in requests.items() if k.endswith(" leases")), 1
        ),
        "status_requests_per_minute": round(
            sum(v for k, v in requests.items() if k.endswith(" deployments/status")), 1
        ),
        "pods": pods,
        "apiserver_requests_per_minute": requests,
    }
    if pause_compare:
        for r in reps:
            os.kill(r.pid, signal.SIGSTOP)
        try:
            b0, t0 = apiserver_requests(scale.raw), time.monotonic()
            time.sleep(seconds)
            b1 = apiserver_requests(scale.raw)
            out["apiserver_requests_per_minute_reporter_paused"] = per_minute(
                b0, b1, time.monotonic() - t0
            )
        finally:
            for r in reps:
                os.kill(r.pid, signal.SIGCONT)
    return out


def break_pod(scale: Scale, pod: Obj) -> None:
    patch = container_status_patch(pod, "CrashLoopBackOff")
    scale.core.patch_namespaced_pod_status(
        pod["metadata"]["name"], pod["metadata"]["namespace"], patch
    )


def heal_pod(scale: Scale, pod: Obj) -> None:
    patch = container_status_patch(pod, None)
    scale.core.patch_namespaced_pod_status(
        pod["metadata"]["name"], pod["metadata"]["namespace"], patch
    )


def latency(
    scale: Scale, watcher: CrWatcher, drivers: list[Driver], reps: int, gap: float = 0.0
) -> dict[str, Any]:
    """Crash-loop one node pod (the Node component names it) and heal it (Running, named no
    more), reps times.

    ``gap`` seconds between repetitions: 0 measures back-to-back changes (which use up the
    writer's per-CR budget for non-urgent writes), 30 measures isolated changes.
    """
    to_failed: list[float] = []
    to_running: list[float] = []
    pods = {
        d.name: sorted(scale.node_pods(d), key=lambda p: p["metadata"]["name"]) for d in drivers
    }
    for i in range(reps):
        drv = drivers[i % len(drivers)]
        pod = pods[drv.name][i % len(pods[drv.name])]
        mark = watcher.mark()
        t0 = time.monotonic()
        name = pod["metadata"]["name"]
        break_pod(scale, pod)
        ev = watcher.wait(
            drv.name,
            mark,
            lambda s, name=name: name in component(s, "Node").get("reason", ""),
            timeout=120,
        )
        to_failed.append(ev.at - t0)
        mark = watcher.mark()
        t0 = time.monotonic()
        heal_pod(scale, pod)
        ev = watcher.wait(
            drv.name,
            mark,
            lambda s, name=name: (
                s.get("phase") == "Running" and name not in component(s, "Node").get("reason", "")
            ),
            timeout=120,
        )
        to_running.append(ev.at - t0)
        time.sleep(gap)
    both = to_failed + to_running
    return {
        "samples": len(both),
        "p50": round(percentile(both, 50), 3),
        "p99": round(percentile(both, 99), 3),
        "max": round(max(both), 3),
        "to_broken": [round(x, 3) for x in to_failed],
        "to_running": [round(x, 3) for x in to_running],
    }


def nodes_scenario(scale: Scale, args: argparse.Namespace) -> dict[str, Any]:
    n = args.nodes
    out: dict[str, Any] = {"nodes": n}
    scale.add_nodes(n)
    drv = scale.deploy("n", certs_mod.generate_driver_certificates(), {NODE_LABEL: "none"})
    watcher = CrWatcher(scale.watch_raw, {drv.name})
    watcher.start()
    try:
        reps = scale.deployed_reporters([drv], f"nodes-{n}")
        watcher.wait(drv.name, 0, lambda s: s.get("phase") == "Running", timeout=120)
        time.sleep(args.message_interval + 2)
        log("Running with 0 pods; steady window without pods")
        out["steady_no_pods"] = steady(scale, reps, args.steady_seconds, pause_compare=False)
        log(f"steady: {out['steady_no_pods']}")
        # The burst: N pods created and becoming Ready.
        w0, mark = sum(r.writes() for r in reps), watcher.mark()
        s0 = [proc_stats(r.pid) for r in reps]
        t0 = time.monotonic()
        scale.apps.patch_namespaced_daemon_set(
            drv.names.node_driver,
            drv.namespace,
            {"spec": {"template": {"spec": {"nodeSelector": {NODE_LABEL: scale.suffix}}}}},
            field_manager=AS_PULUMI,
        )
        want = f"All {n} node driver pod(s) running successfully"
        done = watcher.wait(
            drv.name,
            mark,
            lambda s: s.get("phase") == "Running" and component(s, "Node").get("reason") == want,
            timeout=args.burst_timeout,
        )
        s1 = [proc_stats(r.pid) for r in reps]
        time.sleep(args.message_interval + 2)  # a deferred message-only write would land now
        writes = sum(r.writes() for r in reps) - w0
        phases = [e.status.get("phase") for e in watcher.events[mark:] if e.name == drv.name]
        node_reasons = [
            component(e.status, "Node").get("reason", "")[:160]
            for e in watcher.events[mark:]
            if e.name == drv.name
        ]
        out["burst"] = {
            "pods": n,
            "seconds_to_running": round(done.at - t0, 1),
            "status_writes": writes,
            "status_writes_per_1000_pods": round(writes * 1000 / n, 1),
            "cr_events": len(phases),
            "phases_seen": phases,
            "node_reasons_seen": node_reasons,
            "cpu_seconds": round(
                sum(b["cpu_seconds"] - a["cpu_seconds"] for a, b in zip(s0, s1, strict=True)), 1
            ),
            "rss_mib_peak_max_pod": round(max(b["VmHWM"] for b in s1), 1),
        }
        log(f"burst: {out['burst']}")
        out["steady_with_pods"] = steady(scale, reps, args.steady_seconds, pause_compare=True)
        log(f"steady with pods: {out['steady_with_pods']}")
        out["latency"] = latency(scale, watcher, [drv], args.reps, args.rep_gap)
        log(f"latency: {out['latency']}")
        out["final"] = [proc_stats(r.pid) for r in reps]
    finally:
        watcher.stop()
    return out


def deployments_scenario(scale: Scale, args: argparse.Namespace) -> dict[str, Any]:
    d = args.deployments
    out: dict[str, Any] = {"deployments": d, "nodes": args.nodes_per}
    scale.add_nodes(args.nodes_per)
    certs = certs_mod.generate_driver_certificates()  # one set for all: RSA keygen is slow
    t0 = time.monotonic()
    drivers = [scale.deploy(f"d{i}", certs, dict(scale.label)) for i in range(d)]
    log(f"{d} drivers deployed in {time.monotonic() - t0:.0f}s")
    watcher = CrWatcher(scale.watch_raw, {x.name for x in drivers})
    watcher.start()
    try:
        reps = scale.deployed_reporters(drivers, f"deployments-{d}")
        want = f"All {args.nodes_per} node driver pod(s) running successfully"
        for x in drivers:
            watcher.wait(
                x.name,
                0,
                lambda s: (
                    s.get("phase") == "Running" and component(s, "Node").get("reason") == want
                ),
                timeout=args.burst_timeout,
            )
        out["seconds_to_all_running"] = round(time.monotonic() - t0, 1)
        time.sleep(args.message_interval + 2)  # let deferred message-only writes land first
        out["writes_to_all_running"] = sum(r.writes() for r in reps)
        log(f"all {d} Running")
        out["steady"] = steady(scale, reps, args.steady_seconds, pause_compare=True)
        log(f"steady: {out['steady']}")
        out["latency"] = latency(scale, watcher, drivers, args.reps, args.rep_gap)
        log(f"latency: {out['latency']}")
        out["final"] = [proc_stats(r.pid) for r in reps]
    finally:
        watcher.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_reporter_scale")
    p.add_argument("--nodes", type=int, default=0, help="node scenario with N kwok nodes")
    p.add_argument("--deployments", type=int, default=0, help="deployment scenario with D CRs")
    p.add_argument("--nodes-per", type=int, default=10, help="nodes in the deployment scenario")
    p.add_argument("--steady-seconds", type=float, default=60.0)
    p.add_argument("--reps", type=int, default=20, help="crash-loop/heal repetitions")
    p.add_argument("--rep-gap", type=float, default=0.0, help="seconds between repetitions")
    p.add_argument("--burst-timeout", type=float, default=900.0)
    p.add_argument("--message-interval", type=float, default=10.0)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    kubeconfig = cluster.start()
    workdir = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    report: dict[str, Any] = {"machine": machine(), "args": vars(args)}
    scale = Scale(kubeconfig, workdir)
    log(f"run {scale.suffix}; logs in {workdir}")
    try:
        ensure_crd(scale.raw)
        scale.wait_previous_runs_gone()
        if args.nodes:
            report["nodes"] = nodes_scenario(scale, args)
        if args.deployments:
            report["deployments"] = deployments_scenario(scale, args)
    finally:
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=2, default=str), "utf-8")
        scale.cleanup()
    print(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
