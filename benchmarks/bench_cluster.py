"""Warm start time of the local cluster (``python -m tools.cluster start`` with tools cached).

Why: every e2e session and ``make demo`` pays it, so it bounds how fast the feedback loop of
a developer can be. "Warm" means the Go tools are already built (``tools.toolchain`` finds
them cached), so only kwokctl's binary runtime (etcd, kube-apiserver, controller-manager,
scheduler, kwok) and the fake nodes are timed.

Two modes:

- ``--runs N`` (active): stop the cluster, then ``start`` / ``stop`` it N times in
  subprocesses, timing the wall clock and parsing the ``[cluster] API server healthy after``
  and ``ready in`` lines. Stopping the cluster kills whatever else runs on it, so this refuses
  to run while another process (pytest, a reporter, another benchmark) seems to use it,
  unless ``--force``.
- ``--from-logs`` (passive, safe while others use the cluster): reconstruct the last start
  from what it left behind: the PKI's creation time (kwokctl writes it first), the component
  logs' first lines, and the fake nodes' Ready transition. Second precision at best, and the
  toolchain check before kwokctl is not included.

    .venv/bin/python -m benchmarks.bench_cluster --from-logs
    .venv/bin/python -m benchmarks.bench_cluster --runs 3     # only on an otherwise idle host
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.bench_status import machine
from tools import cluster, localenv

PROJECT_DIR = Path(__file__).resolve().parents[1]
_HEALTHY = re.compile(r"API server healthy after ([\d.]+)s")
_READY = re.compile(r"ready in ([\d.]+)s")
# Processes that mean somebody else is using the cluster right now.
_USERS = re.compile(r"pytest|-m reporter|bench_reporter|tools\.demo|pulumi")


def other_users() -> list[str]:
    """Command lines of processes (not this one) that look like they use the cluster."""
    out = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    users = []
    for line in out.splitlines():
        pid, _, args = line.strip().partition(" ")
        if int(pid) != os.getpid() and _USERS.search(args) and "bench_cluster" not in args:
            users.append(line.strip()[:160])
    return users


def _run(cmd: str) -> tuple[float, str]:
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "tools.cluster", cmd],
        cwd=PROJECT_DIR,
        capture_output=True,
        text=True,
        check=True,
    )
    return time.perf_counter() - t0, proc.stderr


def active(runs: int) -> dict[str, Any]:
    _run("stop")
    samples = []
    for i in range(runs):
        wall, log = _run("start")
        healthy = _HEALTHY.search(log)
        ready = _READY.search(log)
        samples.append(
            {
                "wall_seconds": round(wall, 2),
                "api_healthy_seconds": float(healthy.group(1)) if healthy else None,
                "ready_seconds": float(ready.group(1)) if ready else None,
            }
        )
        print(f"run {i + 1}/{runs}: {samples[-1]}", file=sys.stderr, flush=True)
        if i < runs - 1:
            _run("stop")
    walls = [s["wall_seconds"] for s in samples]
    return {
        "mode": "active",
        "runs": samples,
        "wall_median": statistics.median(walls),
        "wall_min": min(walls),
        "wall_max": max(walls),
    }


def _first_timestamp(path: Path) -> dt.datetime | None:
    """The first timestamp in a component log (klog 'I1129 16:26:44.1' or JSON 'ts'/'time')."""
    try:
        with path.open(encoding="utf-8", errors="replace") as f:
            for line in f:
                m = re.search(r'"(?:ts|time)":"([^"]+)"', line)
                if m:
                    return dt.datetime.fromisoformat(m.group(1)[:26].rstrip("Z")).replace(
                        tzinfo=dt.UTC
                    )
                m = re.match(r"[IWEF](\d\d)(\d\d) (\d\d:\d\d:\d\d\.\d+)", line)
                if m:
                    year = dt.datetime.fromtimestamp(path.stat().st_mtime, dt.UTC).year
                    return dt.datetime.strptime(
                        f"{year}-{m.group(1)}-{m.group(2)} {m.group(3)[:15]}",
                        "%Y-%m-%d %H:%M:%S.%f",
                    ).replace(tzinfo=dt.UTC)
    except OSError:
        return None
    return None


def passive() -> dict[str, Any]:
    base = cluster.kwok_workdir() / "clusters" / cluster.CLUSTER_NAME
    pki = base / "pki" / "ca.crt"
    if not pki.exists():
        raise SystemExit("no running local cluster to read the last start from")
    begin = dt.datetime.fromtimestamp(pki.stat().st_mtime, dt.UTC)
    components = {p.stem: _first_timestamp(p) for p in sorted((base / "logs").glob("*.log"))}
    from kubernetes import client, config

    core = client.CoreV1Api(
        config.new_client_from_config(config_file=str(localenv.kubeconfig_path()))
    )
    ready = []
    for node in core.list_node().items:
        if node.metadata.name.startswith(("pmem-node-", "plain-node-")):
            for c in node.status.conditions or []:
                if c.type == "Ready" and c.status == "True":
                    ready.append(c.last_transition_time)
    nodes_ready = max(ready) if ready else None
    return {
        "mode": "from-logs",
        "pki_created": begin.isoformat(),
        "component_first_log_line_after_pki_seconds": {
            k: round((v - begin).total_seconds(), 2) if v else None for k, v in components.items()
        },
        "nodes_ready_after_pki_seconds": (
            round((nodes_ready - begin).total_seconds(), 1) if nodes_ready else None
        ),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_cluster", description=__doc__)
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--runs", type=int, help="active mode: stop/start the cluster N times")
    mode.add_argument("--from-logs", action="store_true", help="passive mode (see above)")
    p.add_argument("--force", action="store_true", help="active mode even if others use it")
    args = p.parse_args(argv)
    if args.runs:
        users = other_users()
        if users and not args.force:
            print("the cluster seems to be in use; not stopping it:", file=sys.stderr)
            print("\n".join(f"  {u}" for u in users), file=sys.stderr)
            return 2
        result = active(args.runs)
    else:
        result = passive()
    print(json.dumps({"machine": machine(), **result}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
