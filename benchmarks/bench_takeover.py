"""What the field take-over (``pmem-csi:takeOverFields``) costs a ``pulumi up`` with nothing to do.

Why: with the setting on (the default) every object of a deployment is read from the API
server right before the provider diffs it (a resource transform, see
``pmem_components/takeover_transform.py``), on every ``pulumi up`` and preview, also when
nobody changed anything. This measures that overhead: two stacks of one deployment each
(reporter included, 21 objects taken care of), one with the setting on and one with it off,
no-op ``up``s interleaved so that the machine's load hits both alike. Per ``up``: wall clock,
CPU of this process (the inline program: transforms, reads) and of the processes it started
(CLI, providers). Also, once: a ``pulumi up --refresh`` after every object of the first stack
was changed by three clients (``tests/e2e/test_drift.py``'s changes).

    make cluster-start
    .venv/bin/python -m benchmarks.bench_takeover --reps 5
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks.bench_status import machine
from pmem_components.program import main as program
from tools import cluster, localenv
from tools import pulumi_stack as ps


def _cpu() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime


def _timed_up(stack: Any, **kwargs: Any) -> tuple[float, float, float, dict[str, int]]:
    own0, kids0 = _cpu()
    start = time.monotonic()
    result = stack.up(**kwargs)
    wall = time.monotonic() - start
    own1, kids1 = _cpu()
    changes = {k: v for k, v in (result.summary.resource_changes or {}).items() if v}
    return wall, own1 - own0, kids1 - kids0, changes


def _raw(suffix: str) -> dict[str, Any]:
    return {
        "name": f"bench-to-{suffix}.pmem-csi.intel.com",
        "namespace": f"bench-to-{suffix}",
        "labels": {"e2e.example.com/suite": "drift", "e2e.example.com/tier": "storage"},
        "reporter": {"image": "registry.example/pmem-csi-reporter:bench"},
    }


def _config(raw: dict[str, Any], take_over: bool) -> dict[str, Any]:
    return {
        "pmem-csi:manageCrd": False,
        "pmem-csi:retainNamespaces": False,
        "pmem-csi:takeOverFields": take_over,
        "pmem-csi:deployments": [raw],
    }


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    kubeconfig = cluster.start()
    localenv.apply_pulumi_env()
    import os

    os.environ["KUBECONFIG"] = str(kubeconfig)
    # The shared CRD, as the tests install it (left in place).
    from kubernetes import config as kconfig

    from reporter.kubeapi import RawApi
    from tests.e2e.reporter_helpers import ensure_crd

    api_client = kconfig.new_client_from_config(config_file=str(kubeconfig))
    ensure_crd(RawApi(api_client))
    time.sleep(2)

    base = Path(tempfile.mkdtemp(prefix="bench-takeover-"))
    stacks: dict[bool, Any] = {}
    raws: dict[bool, dict[str, Any]] = {}
    try:
        for mode in (True, False):
            raws[mode] = _raw(uuid.uuid4().hex[:6])
            name = f"b{uuid.uuid4().hex[:8]}"
            stacks[mode] = ps.select_stack(name, program, base / name, _config(raws[mode], mode))
            stacks[mode].up()
        rows: dict[bool, list[tuple[float, float, float]]] = {True: [], False: []}
        for _ in range(args.reps):
            for mode in (True, False):
                wall, own, kids, changes = _timed_up(stacks[mode])
                assert set(changes) == {"same"}, changes
                rows[mode].append((wall, own, kids))
        print(f"machine: {machine()}; load average {os.getloadavg()}")
        print("| takeOverFields | wall (s) | program CPU (s) | CLI + providers CPU (s) |")
        print("| --- | --- | --- | --- |")
        for mode in (True, False):
            cols = list(zip(*rows[mode], strict=True))
            print(f"| {str(mode).lower()} | " + " | ".join(_median(list(c)) for c in cols) + " |")

        # The restore, once: every object changed by three clients, then up --refresh.
        from kubernetes.dynamic import DynamicClient  # noqa: F401  (the test's clients use it)

        from pmem_components.manifests import bundle
        from tests.e2e import test_drift as td
        from tests.e2e.test_program import Cluster, parsed

        kubectl_bin = str(__import__("tools.toolchain").toolchain.bin_path("kubectl"))
        import subprocess

        def kubectl(*a: str) -> Any:
            return subprocess.run(
                [kubectl_bin, "--kubeconfig", str(kubeconfig), *a],
                check=True,
                capture_output=True,
                text=True,
            )

        clients = td.Clients(Cluster(api_client), kubectl)
        cfg = parsed(raws[True])
        built = bundle.build_deployment_objects(cfg).all()
        objects = [o for o in built if o["kind"] != "Namespace"]
        for i, obj in enumerate(objects):
            for j, change in enumerate(td.CHANGES):
                clients.change(td.CLIENTS[(i + j) % len(td.CLIENTS)], obj, change)
        wall, own, kids, changes = _timed_up(stacks[True], refresh=True)
        print(
            f"restoring up --refresh of {len(objects)} changed objects: wall {wall:.2f} s, "
            f"program CPU {own:.2f} s, CLI + providers CPU {kids:.2f} s, changes {changes}"
        )
    finally:
        for stack in stacks.values():
            stack.destroy()
            stack.workspace.remove_stack(stack.name)


if __name__ == "__main__":
    main()
