"""Benchmark of the reporter's pure status computation (``reporter.status.compute_status``).

Why: the reporter recomputes a CR's status on every watch event that touches the CR and at
every resync, so this is the CPU cost per event. The certificate check inside it
(``validate_driver_certificates``: key loading plus an in-memory mutual-TLS handshake) is by
far the most expensive part, which is why ``reporter.certcheck`` memoizes its verdict. This
script measures both regimes so the memo's value is a number, not a claim:

- warm: the verdict is cached (the normal case: certificates rarely change);
- cold: every call runs the real verifier (first reconcile, rotated Secrets, or a memo miss);
- the verifier alone, with and without the handshake, to split the cold cost;
- the full pure path of one reconcile that writes nothing: compute + compare
  (``status_equal_ignoring_time``) against the status written before.

Inputs are built like tests/unit/test_status.py builds them (camelCase dicts as the watch
caches hold them, real certificates), for a healthy deployment with 3 and with 100 nodes.

Method: ``timeit.Timer.repeat``: ``--repeat`` samples of ``number`` calls each; a sample is the
mean per-call time of its batch (batches smooth out timer resolution for microsecond calls).
Reported: median, p90, min and max over the samples. Run:

    .venv/bin/python -m benchmarks.bench_status [--repeat 50] [--json out.json]
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import json
import os
import platform
import statistics
import sys
import timeit
from collections.abc import Callable
from typing import Any

from pmem_components import certs
from pmem_components.names import DeploymentNames
from reporter import status as st
from reporter.certcheck import CertVerifier
from reporter.model import DAEMON_SET, SECRET, STATEFUL_SET, Observed, expected_objects

Obj = dict[str, Any]

NAME = "pmem-csi.intel.com"
NAMES = DeploymentNames(NAME)
NS = "pmem-csi"


# --------------------------------------------------------------------------- inputs


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _secret(name: str, ca_pem: str, cert_pem: str, key_pem: str) -> Obj:
    data = {"ca.crt": _b64(ca_pem), "tls.crt": _b64(cert_pem), "tls.key": _b64(key_pem)}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "data": data}


def _pod(name: str, node: str, now_s: str) -> Obj:
    """A Running, Ready pod as kwok (or a kubelet) reports it."""
    return {
        "metadata": {"name": name, "namespace": NS},
        "spec": {"nodeName": node},
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": "Ready", "status": "True"},
                {"type": "PodScheduled", "status": "True"},
            ],
            "containerStatuses": [
                {"name": "pmem-driver", "ready": True, "state": {"running": {"startedAt": now_s}}}
            ],
        },
    }


def _daemonset(desired: int) -> Obj:
    return {
        "metadata": {"name": NAMES.node_driver, "namespace": NS, "generation": 2},
        "spec": {},
        "status": {
            "observedGeneration": 2,
            "desiredNumberScheduled": desired,
            "currentNumberScheduled": desired,
            "updatedNumberScheduled": desired,
            "numberAvailable": desired,
            "numberReady": desired,
        },
    }


def _statefulset() -> Obj:
    return {
        "metadata": {"name": NAMES.controller_driver, "namespace": NS, "generation": 1},
        "spec": {"replicas": 1, "updateStrategy": {"type": "RollingUpdate"}},
        "status": {
            "observedGeneration": 1,
            "replicas": 1,
            "readyReplicas": 1,
            "currentReplicas": 1,
            "updatedReplicas": 1,
            "currentRevision": "ctrl-1",
            "updateRevision": "ctrl-1",
        },
    }


def _node(name: str) -> Obj:
    ready = {"type": "Ready", "status": "True"}
    return {"metadata": {"name": name}, "status": {"conditions": [ready]}}


def healthy_observed(
    nodes: int, driver_certs: certs.DriverCertificates, now: dt.datetime
) -> Observed:
    """A healthy deployment on ``nodes`` nodes, with the status it already wrote.

    The CR carries the status computed once before, as at steady state: each recompute then
    carries every timestamp over, which is the path the reporter takes on a resync.
    """
    now_s = st.format_time(now)
    objects: dict[str, dict[str, Obj | None]] = {}
    for kind, _, name in expected_objects(NAMES):
        objects.setdefault(kind, {})[name] = {"kind": kind, "metadata": {"name": name}}
    c = driver_certs
    objects[SECRET][NAMES.registry_secret] = _secret(
        NAMES.registry_secret, c.ca_cert, c.registry_cert, c.registry_key
    )
    objects[SECRET][NAMES.node_secret] = _secret(
        NAMES.node_secret, c.ca_cert, c.node_controller_cert, c.node_controller_key
    )
    objects[DAEMON_SET][NAMES.node_driver] = _daemonset(nodes)
    objects[STATEFUL_SET][NAMES.controller_driver] = _statefulset()
    node_names = [f"worker-{i}" for i in range(nodes)]
    cr: Obj = {
        "apiVersion": "pmem-csi.intel.com/v1beta1",
        "kind": "Deployment",
        "metadata": {"name": NAME, "generation": 1},
        "spec": {"namespace": NS},
    }
    observed = Observed(
        cr=cr,
        objects=objects,
        controller_pods=[_pod(f"{NAMES.controller_driver}-0", node_names[0], now_s)],
        node_pods=[_pod(f"{NAMES.hyphened}-node-{n}", n, now_s) for n in node_names],
        nodes=[_node(n) for n in node_names],
    )
    first = st.compute_status(observed, now, verify_certs=CertVerifier())
    assert first["phase"] == st.PHASE_RUNNING, first
    return Observed(
        cr={**cr, "status": first},
        objects=observed.objects,
        controller_pods=observed.controller_pods,
        node_pods=observed.node_pods,
        nodes=observed.nodes,
    )


# --------------------------------------------------------------------------- measuring


def _percentile(samples: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100): an actual sample, no interpolation."""
    ordered = sorted(samples)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def measure(fn: Callable[[], object], repeat: int, number: int) -> dict[str, float]:
    """Per-call seconds: median/p90/min/max over ``repeat`` batches of ``number`` calls."""
    fn()  # warm-up: imports, lazy OpenSSL init, first-call caches
    batches = timeit.Timer(fn).repeat(repeat=repeat, number=number)
    per_call = [b / number for b in batches]
    return {
        "median": statistics.median(per_call),
        "p90": _percentile(per_call, 90),
        "min": min(per_call),
        "max": max(per_call),
        "repeat": repeat,
        "number": number,
    }


def machine() -> dict[str, str]:
    return {
        "nproc": str(os.cpu_count()),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _fmt(seconds: float) -> str:
    if seconds >= 0.1:
        return f"{seconds * 1e3:.0f} ms"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} µs"


def run(repeat: int, cold_repeat: int) -> dict[str, Any]:
    # The handshake runs on OpenSSL's clock, so "now" must be the real time.
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    driver_certs = certs.generate_driver_certificates()
    c = driver_certs
    cert_args = (c.ca_cert, c.registry_cert, c.registry_key, c.node_controller_cert)
    cert_args += (c.node_controller_key,)
    results: dict[str, Any] = {}

    for nodes in (3, 100):
        observed = healthy_observed(nodes, driver_certs, now)
        old = observed.current_status
        warm = CertVerifier()
        st.compute_status(observed, now, verify_certs=warm)  # fill the memo
        number = 200 if nodes == 3 else 50

        def warm_call(o: Observed = observed, v: CertVerifier = warm) -> Obj:
            return st.compute_status(o, now, verify_certs=v)

        def reconcile_pure(o: Observed = observed, v: CertVerifier = warm, prev: Obj = old) -> bool:
            new = st.compute_status(o, now, verify_certs=v)
            return st.status_equal_ignoring_time(prev, new)

        def cold_call(o: Observed = observed) -> Obj:
            return st.compute_status(o, now, verify_certs=CertVerifier())

        assert reconcile_pure(), "steady state must compare equal (else it would write)"
        results[f"compute_status warm, {nodes} nodes"] = measure(warm_call, repeat, number)
        results[f"compute + compare warm, {nodes} nodes"] = measure(reconcile_pure, repeat, number)
        results[f"compute_status cold, {nodes} nodes"] = measure(cold_call, cold_repeat, 1)
        assert warm.calls == 1, f"warm memo missed: {warm.calls} verifier runs"

    results["validate_driver_certificates (handshake)"] = measure(
        lambda: certs.validate_driver_certificates(*cert_args, now=now), cold_repeat, 1
    )
    results["validate_driver_certificates (no handshake)"] = measure(
        lambda: certs.validate_driver_certificates(*cert_args, now=now, handshake=False),
        cold_repeat,
        1,
    )
    results["check_mutual_tls alone"] = measure(
        lambda: certs.check_mutual_tls(*cert_args), cold_repeat, 1
    )
    return {"machine": machine(), "results": results}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_status", description=__doc__)
    p.add_argument("--repeat", type=int, default=50, help="batches for the warm (µs) cases")
    p.add_argument("--cold-repeat", type=int, default=30, help="calls for the cold (ms) cases")
    p.add_argument("--json", default=None, help="also write the results to this file")
    args = p.parse_args(argv)
    report = run(args.repeat, args.cold_repeat)
    m = report["machine"]
    print(f"# {m['date']}  nproc={m['nproc']}  python {m['python']}  {m['cpu']}")
    print(f"{'case':48} {'median':>10} {'p90':>10} {'min':>10} {'max':>10}  samples")
    for case, r in report["results"].items():
        print(
            f"{case:48} {_fmt(r['median']):>10} {_fmt(r['p90']):>10} {_fmt(r['min']):>10} "
            f"{_fmt(r['max']):>10}  {r['repeat']}x{r['number']}"
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
