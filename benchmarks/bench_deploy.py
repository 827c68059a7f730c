"""Deployment time, side by side: ``kubectl apply --server-side`` versus the Pulumi CLI.

Why: an administrator choosing this project over a kubectl pipeline pays Pulumi's engine,
provider and await per ``pulumi up``; this shows how much, for 1, 10 and 50 driver
deployments of the default config (reporter included), on the local cluster.

The same objects on both sides: the kubectl side applies what the builders render
(``pmem_components.manifests.bundle``, the CRD included, one pre-generated certificate set
reused by every deployment) and then waits with ``kubectl rollout status`` for every
StatefulSet, DaemonSet and Deployment (up to 8 at a time); the Pulumi side runs the CLI as an
administrator does (``__main__.py`` through the language host next to the CLI), in a project
directory of its own with its own file backend, and generates each deployment's certificates
once in its first ``up`` (3 RSA-3072 keys per deployment), which the kubectl side does not.

Steps per side and size, each repeated ``--reps`` times on an empty cluster namespace set:

- kubectl: apply (+ rollout status) = "first up", apply again = "no-op", delete --wait;
- pulumi: ``preview`` of the empty stack, ``up --yes --skip-preview`` (first), ``up --yes
  --skip-preview`` (no-op), ``up --yes`` (no-op with its preview), ``destroy --yes
  --skip-preview``.

    .venv/bin/python -m benchmarks.bench_deploy --sizes 1 10 --reps 3
    .venv/bin/python -m benchmarks.bench_deploy --sizes 50 --reps 1

It uses the local cluster of this checkout (``make cluster-start``) and must not share it
with tests (deployment names ``bench-<i>.pmem-csi.intel.com``; the CRD is installed and, by
the delete/destroy steps, removed).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from benchmarks.bench_status import machine
from pmem_components import certs as certlib
from pmem_components.config import load_config
from pmem_components.manifests import bundle
from pmem_components.manifests.crd import load_crd
from tools import cluster, localenv, toolchain

WORKLOAD_KINDS = ("StatefulSet", "DaemonSet", "Deployment")


def deployments(n: int) -> list[dict[str, Any]]:
    return [
        {"name": f"bench-{i}.pmem-csi.intel.com", "namespace": f"bench-{i}"} for i in range(n)
    ]


def render(n: int) -> list[dict[str, Any]]:
    """The kubectl side's objects: the CRD plus every builder object of n deployments."""
    generated = certlib.generate_driver_certificates()
    values = bundle.CertificateValues(
        generated.ca_cert,
        generated.registry_cert,
        generated.registry_key,
        generated.node_controller_cert,
        generated.node_controller_key,
    )
    stack = load_config({"deployments": deployments(n)})
    objs = [load_crd()]
    for dep in stack.deployments:
        objs += bundle.build_deployment_objects(dep, values).all()
    return objs


def timed(fn: Callable[[], Any]) -> tuple[float, float]:
    """Wall-clock seconds and CPU seconds of the child processes (user + system).

    The CPU figure covers every process the step started and waited for (the CLI, its
    language host, the program, the providers; or the kubectl processes), not the API server.
    It depends much less on what else runs on a shared machine than the wall clock does.
    """
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    fn()
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


class Kubectl:
    def __init__(self, env: dict[str, str], workdir: Path) -> None:
        self.env = env
        self.bin = str(toolchain.bin_path("kubectl"))
        self.workdir = workdir

    def run(self, *args: str) -> None:
        subprocess.run(
            [self.bin, *args], env=self.env, check=True, capture_output=True, timeout=900
        )

    def rollout(self, objs: list[dict[str, Any]]) -> None:
        workloads = [
            (o["kind"].lower(), o["metadata"]["namespace"], o["metadata"]["name"])
            for o in objs
            if o["kind"] in WORKLOAD_KINDS and o["apiVersion"] == "apps/v1"
        ]
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(
                pool.map(
                    lambda w: self.run("rollout", "status", f"{w[0]}/{w[2]}", "-n", w[1]),
                    workloads,
                )
            )

    def measure(self, n: int) -> dict[str, tuple[float, float]]:
        objs = render(n)
        # The CR must come after its CRD is established: apply the CRD first (not timed).
        crd_file = self.workdir / "crd.yaml"
        crd_file.write_text(yaml.safe_dump(objs[0]))
        rest = self.workdir / f"objects-{n}.yaml"
        rest.write_text(yaml.safe_dump_all(objs[1:]))
        self.run("apply", "--server-side", "-f", str(crd_file))
        self.run("wait", "--for=condition=Established", "-f", str(crd_file))
        out = {
            "first up": timed(
                lambda: (
                    self.run("apply", "--server-side", "-f", str(rest)),
                    self.rollout(objs),
                )
            ),
            "no-op up": timed(lambda: self.run("apply", "--server-side", "-f", str(rest))),
            "destroy": timed(lambda: self.run("delete", "--wait=true", "-f", str(rest))),
        }
        self.run("delete", "--wait=true", "-f", str(crd_file))
        return out


class PulumiCli:
    def __init__(self, env: dict[str, str], workdir: Path, program: Path) -> None:
        self.bin = str(toolchain.bin_path("pulumi"))
        self.workdir = workdir
        backend = workdir / "backend"
        backend.mkdir(exist_ok=True)
        self.env = {**env, "PULUMI_BACKEND_URL": backend.as_uri()}
        project = yaml.safe_load((toolchain.PROJECT_DIR / "Pulumi.yaml").read_text())
        project["main"] = str(program)
        # The checkout's own virtualenv: Pulumi.yaml names `.venv` relative to itself, and a
        # project directory without one would have the language host create and fill it
        # inside the first timed command.
        project["runtime"]["options"]["virtualenv"] = str(program / ".venv")
        (workdir / "Pulumi.yaml").write_text(yaml.safe_dump(project))

    def run(self, *args: str) -> str:
        result = subprocess.run(
            [self.bin, *args],
            cwd=self.workdir,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        if result.returncode != 0:
            raise RuntimeError(f"pulumi {' '.join(args)}:\n{result.stdout}\n{result.stderr}")
        return result.stdout

    def measure(self, n: int) -> dict[str, tuple[float, float]]:
        stack = f"bench{n}"
        self.run("stack", "init", stack)
        try:
            # Destroy removes the namespaces and the CRD too, as `kubectl delete` does on the
            # other side (and the next stack may create the same namespaces).
            config = {
                "pmem-csi:manageCrd": True,
                "pmem-csi:retainCrd": False,
                "pmem-csi:retainNamespaces": False,
                "pmem-csi:deployments": deployments(n),
            }
            path = self.workdir / f"Pulumi.{stack}.yaml"
            settings = yaml.safe_load(path.read_text()) or {}
            settings["config"] = config
            path.write_text(yaml.safe_dump(settings))
            return {
                "preview": timed(lambda: self.run("preview", "-s", stack)),
                "first up": timed(lambda: self.run("up", "--yes", "--skip-preview", "-s", stack)),
                "no-op up": timed(lambda: self.run("up", "--yes", "--skip-preview", "-s", stack)),
                "no-op up with preview": timed(lambda: self.run("up", "--yes", "-s", stack)),
                "destroy": timed(
                    lambda: self.run("destroy", "--yes", "--skip-preview", "-s", stack)
                ),
            }
        finally:
            self.run("stack", "rm", "--yes", "--force", stack)


def summary(samples: list[tuple[float, float]] | None) -> str:
    """``median (min-max)`` of the wall clock, then the median CPU seconds in brackets."""
    if not samples:
        return "-"
    walls = [w for w, _ in samples]
    cpu = statistics.median(c for _, c in samples)
    if len(walls) == 1:
        return f"{walls[0]:.1f} [cpu {cpu:.1f}]"
    wall = f"{statistics.median(walls):.1f} ({min(walls):.1f}-{max(walls):.1f})"
    return f"{wall} [cpu {cpu:.1f}]"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 10])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", type=Path, help="also write the raw samples here")
    ap.add_argument(
        "--program",
        type=Path,
        default=toolchain.PROJECT_DIR,
        help="checkout whose __main__.py the pulumi side runs (e.g. an older commit, exported "
        "with `git archive`, with a .venv link), to compare before/after a change",
    )
    ap.add_argument("--only", choices=("kubectl", "pulumi"), help="measure one side only")
    args = ap.parse_args(argv)

    if not cluster.is_running():
        print("start the local cluster first: make cluster-start", file=sys.stderr)
        return 1
    env = {**os.environ, **localenv.apply_pulumi_env()}
    load_before = os.getloadavg()
    results: dict[int, dict[str, dict[str, list[tuple[float, float]]]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-deploy-") as tmp:
        kubectl = Kubectl(env, Path(tmp))
        pulumi = PulumiCli(env, Path(tmp), args.program.resolve())
        for n in args.sizes:
            side: dict[str, dict[str, list[tuple[float, float]]]] = {"kubectl": {}, "pulumi": {}}
            for rep in range(args.reps):
                for name, tool in (("kubectl", kubectl), ("pulumi", pulumi)):
                    if args.only and name != args.only:
                        continue
                    got = tool.measure(n)
                    for step, seconds in got.items():
                        side[name].setdefault(step, []).append(seconds)
                    steps = ", ".join(f"{k} {w:.1f}s/cpu {c:.1f}s" for k, (w, c) in got.items())
                    print(f"n={n} rep={rep + 1} {name}: {steps}", file=sys.stderr, flush=True)
            results[n] = side

    print(f"machine: {json.dumps(machine())}")
    print(f"load average (1/5/15 min) before: {load_before}, after: {os.getloadavg()}")
    print("| deployments | step | kubectl (s) | pulumi (s) |")
    print("| --- | --- | --- | --- |")
    steps = ("preview", "first up", "no-op up", "no-op up with preview", "destroy")
    for n, side in results.items():
        for step in steps:
            kubectl_s = summary(side["kubectl"].get(step))
            pulumi_s = summary(side["pulumi"].get(step))
            print(f"| {n} | {step} | {kubectl_s} | {pulumi_s} |")
    if args.json:
        args.json.write_text(json.dumps({str(n): s for n, s in results.items()}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
