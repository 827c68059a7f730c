"""Small per-informer memory costs of the reporter (issue 16: RSS at 100 namespaces)."""

from __future__ import annotations

import random

from reporter.retry import SHARED_JITTER, Backoff


def test_backoffs_share_one_jitter_generator_unless_given_their_own() -> None:
    # A random.Random is 2.5 KiB; the reporter holds ~1,600 Backoffs at 100 namespaces.
    a, b = Backoff(), Backoff(base=1.0, cap=60.0, max_attempts=0)
    assert a.rng is b.rng is SHARED_JITTER
    seeded = random.Random(5)
    assert Backoff(rng=seeded).rng is seeded


def test_the_shared_generator_still_spreads_the_waits() -> None:
    b = Backoff(base=1.0, cap=8.0)
    waits = {round(b.delay(3), 6) for _ in range(50)}
    assert len(waits) > 40 and all(4.0 <= w <= 8.0 for w in waits)


def test_the_reporter_container_runs_without_glibcs_per_thread_caches() -> None:
    # One thread per watch, 8 watches per driver namespace: at 100 namespaces the per-thread
    # caches held ~50 MiB of each pod (BENCHMARKS.md section 6). glibc reads it at exec only.
    from pmem_components import names
    from pmem_components.manifests.reporter import build_reporter_deployment

    served = [(names.DeploymentNames(f"d{i}.example.com"), f"ns{i}") for i in range(3)]
    dep = build_reporter_deployment(served, "ns0", "img", 2, {}, 3, "IfNotPresent")
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    assert {"name": "GLIBC_TUNABLES", "value": "glibc.malloc.tcache_count=0"} in container["env"]


def test_the_benchmark_starts_its_reporters_with_the_deployed_environment() -> None:
    from benchmarks.bench_reporter_scale import deployed_env

    class Drv:
        def __init__(self, i: int) -> None:
            from pmem_components import names

            self.names = names.DeploymentNames(f"d{i}.example.com")
            self.namespace = f"ns{i}"

    assert deployed_env([Drv(0), Drv(1)]) == {"GLIBC_TUNABLES": "glibc.malloc.tcache_count=0"}


def test_a_forked_child_draws_other_jitter_than_its_parent() -> None:
    # In a fresh interpreter: forking this test process (gRPC loaded by other tests) is unsafe.
    import subprocess
    import sys

    script = """
import os
from reporter.retry import SHARED_JITTER
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.write(w, repr(SHARED_JITTER.random()).encode())
    os._exit(0)
os.close(w)
child = float(os.read(r, 64))
os.waitpid(pid, 0)
print(child != SHARED_JITTER.random())
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"
