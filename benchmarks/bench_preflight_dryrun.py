"""Benchmark of the preflight's immutable-field check (``preflight.patch_rejections``) at
100 deployments.

Why: since the tail of issue 15 every declared object that exists live is a candidate for a
server-side dry run, not only the objects a patch selects (a removed patch or a config change
can change an immutable field too). The check first compares the built object with the live
one locally and dry-runs only the objects the update changes, so its cost has two parts:

- local: building every deployment's objects and comparing them with the live ones (CPU,
  every ``pulumi preview``/``up``), measured here at 100 deployments;
- requests: one dry-run PATCH per changed object (two when a patched object is refused),
  8 in parallel. Counted here for the steady state (nothing changed: none) and for an update
  that changes one field of every deployment's StatefulSet (100); with ``--kubeconfig`` the
  latency of one real dry-run PATCH is measured against that cluster (the ``default``
  namespace; nothing is written).

Run: ``.venv/bin/python -m benchmarks.bench_preflight_dryrun [--repeat 5] [--kubeconfig F]``
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from typing import Any

from pmem_components import preflight
from pmem_components.config import load_config
from pmem_components.manifests import bundle, controller

MANAGER = "pulumi-kubernetes-bench"


def _owned(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {f"f:{k}": _owned(v) for k, v in obj.items()}
    return {}


def stack(n: int, patches: list[dict[str, Any]] | None = None) -> Any:
    deps = [
        {"name": f"d{i}.pmem-csi.example", "namespace": f"ns{i}", "patches": patches or []}
        for i in range(n)
    ]
    return load_config({"deployments": deps}, check_certificates=False)


def lives(s: Any) -> dict[str, Any]:
    out = {}
    for d in s.deployments:
        for obj in bundle.build_deployment_objects(d, create_namespace=False).all():
            meta = obj["metadata"]
            live = copy.deepcopy(obj)
            live["metadata"]["managedFields"] = [
                {"manager": MANAGER, "operation": "Apply", "fieldsV1": _owned(obj)}
            ]
            live["status"] = {"observedGeneration": 1}
            out[preflight._path(obj["apiVersion"], obj["kind"], meta.get("namespace"),
                                meta["name"])] = live
    return out


class Counting:
    def __init__(self) -> None:
        self.calls = 0

    def dry_apply(self, path: str, obj: Any, manager: str) -> tuple[int, dict[str, Any]]:
        self.calls += 1
        return 200, dict(obj)


def timed(fn: Any, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def real_latency(kubeconfig: str, samples: int) -> list[float]:
    from kubernetes import config as kconfig

    client = kconfig.new_client_from_config(config_file=kubeconfig)
    reader = preflight._Reader(client)
    obj = controller.build_controller_statefulset(load_config({}).deployments[0])
    obj["metadata"]["namespace"] = "default"
    path = preflight._path("apps/v1", "StatefulSet", "default", obj["metadata"]["name"])
    out = []
    for _ in range(samples):
        start = time.perf_counter()
        status, _ = reader.dry_apply(path, obj, MANAGER)
        out.append(time.perf_counter() - start)
        assert 200 <= status <= 299, status
    client.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--deployments", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--kubeconfig")
    args = parser.parse_args()
    n = args.deployments
    steady = stack(n)
    live = lives(steady)
    api = Counting()
    samples = timed(lambda: preflight.patch_rejections(api, steady, live), args.repeat)
    print(f"{n} deployments, {len(live)} live objects")
    print(f"steady state: {statistics.median(samples) * 1000:.0f} ms local (median of "
          f"{args.repeat}), {api.calls // args.repeat} dry runs")
    policy = [{"kind": "StatefulSet", "mergePatch": {"spec": {"minReadySeconds": 7}}}]
    changed = stack(n, policy)
    api = Counting()
    samples = timed(lambda: preflight.patch_rejections(api, changed, live), args.repeat)
    print(f"one StatefulSet field changed per deployment: "
          f"{statistics.median(samples) * 1000:.0f} ms local, "
          f"{api.calls // args.repeat} dry runs")
    if args.kubeconfig:
        lat = real_latency(args.kubeconfig, 50)
        med = statistics.median(lat)
        print(f"one real dry-run PATCH: median {med * 1000:.1f} ms, "
              f"max {max(lat) * 1000:.1f} ms; {n} of them 8 in parallel: about "
              f"{med * n / 8 * 1000:.0f} ms")


if __name__ == "__main__":
    main()
