"""Interrupted and concurrent ``pulumi up`` runs, driven with the real CLI as an administrator.

Three scenarios, one stack each, all in one copy of the checkout with a file backend of this
module's own (the offline environment of ``tools/localenv.py``):

- ``pulumi up`` stopped with Ctrl-C (SIGINT to its process group, as a terminal sends it) half
  way, then docs/day2.md's steps for that case;
- ``pulumi up`` killed with SIGKILL while an object is being created, then docs/day2.md's
  steps for a killed run (``pulumi cancel``, ``pulumi refresh --clear-pending-creates``,
  ``pulumi up``);
- a second ``pulumi up`` (and a ``pulumi destroy``) while the first one runs: refused by the
  file backend's stack lock; and ``pulumi cancel`` shown to remove that lock without stopping
  the run, which is why docs/day2.md says to check the lock's pid first.

The steps are read from the section "When ``pulumi up`` was interrupted" of docs/day2.md and
run line by line, as written, on the scenario's stack (selected with ``pulumi stack select``).

"Half way" is made deterministic with a gate, not a sleep: each stack patches the controller
StatefulSet with a ``nodeSelector`` that no node matches until the test labels a node. The
provider's await then holds the StatefulSet's creation open, so a run can never finish before
the test acts, whatever the machine's load; the test acts on what the CLI prints (an object
created, the StatefulSet being awaited). Labelling a node is the "cause fixed" step before the
run that must complete.

Every scenario ends with the same checks (:func:`assert_converged`): the objects the builders
say the config makes exist exactly once in the cluster, found by the project's instance label
(no duplicate, no orphan under another name), the state holds each of them once with no
pending operation and the expected number of resources, and ``pulumi preview
--expect-no-changes`` passes.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pmem_components import names
from pmem_components.config import DeploymentConfig
from pmem_components.manifests import bundle
from tests.e2e.readme import Shell, project_copy, sh_blocks
from tests.e2e.waiting import wait_for
from tools import localenv, toolchain

pytestmark = pytest.mark.timeout(900)

SECTION = "## When `pulumi up` was interrupted"
# How a Ctrl-C'ed run can end when the host stops the program before the engine's cancel ends it.
PROGRAM_STOPPED = "program exited with non-zero exit code: 130"
HOOK_STOPPED = re.compile(r'after hook "pmem-csi-\S+" failed: rpc error: code = Unavailable')
GATE_LABEL = "interrupt-gate"
# What a stack holds besides its Kubernetes objects: the stack, the four components, the
# dynamic resource that generates the certificates and the three default providers (the
# builtin "pulumi" one serves the preflight's read of the stack's own state,
# pmem_components/identity.py).
OTHER_RESOURCES = Counter(
    {
        "pulumi:pulumi:Stack": 1,
        "pmem-csi:index:PmemCsiDeployment": 1,
        "pmem-csi:index:DriverCertificates": 1,
        "pmem-csi:index:ControllerDriver": 1,
        "pmem-csi:index:NodeDriver": 1,
        "pulumi-python:dynamic/pmem-csi:Certificates": 1,
        "pulumi:providers:kubernetes": 1,
        "pulumi:providers:pulumi-python": 1,
        "pulumi:providers:pulumi": 1,
    }
)
LOCKED = "the stack is currently locked by 1 lock(s)"
NO_CHANGES = "pulumi preview --expect-no-changes"
STS_CREATE = ("creating", "kubernetes:apps/v1:StatefulSet")

Key = tuple[str, str, str]  # (kind, namespace or "", name)


@dataclass
class Admin(Shell):
    """An administrator's shell in the checkout: the CLI, kubectl, and the backend."""

    backend: Path = field(kw_only=True)

    def kubectl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(toolchain.bin_path("kubectl")), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=check,
        )

    def start(self, line: str) -> subprocess.Popen[str]:
        """A CLI run in a session of its own, as in a terminal (Ctrl-C reaches its group)."""
        return subprocess.Popen(
            ["bash", "-c", f"exec {line}"],
            cwd=self.cwd,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )

    def lock_files(self, stack: str) -> list[Path]:
        locks = self.backend / ".pulumi" / "locks"
        return [p for p in locks.rglob("*.json") if p.parent.name == stack]


@dataclass
class Scenario:
    """One stack with one deployment of its own name, and the gate holding its StatefulSet."""

    stack: str
    suffix: str
    started: list[subprocess.Popen[str]] = field(default_factory=list)

    @property
    def namespace(self) -> str:
        return f"intr-{self.suffix}"

    @property
    def gate_value(self) -> str:
        """The gate label's value: never all digits (`config set --path` would store a number)."""
        return f"g{self.suffix}"

    @property
    def cfg(self) -> DeploymentConfig:
        name = f"{self.namespace}.pmem-csi.intel.com"
        return DeploymentConfig(name=name, namespace=self.namespace)

    def built(self) -> list[dict[str, Any]]:
        """The objects the program's builders make from this config."""
        o = bundle.build_deployment_objects(self.cfg)
        every = [o.namespace, *o.secrets, o.csi_driver, *o.controller, *o.node, *o.reporter]
        return [obj for obj in [*every, o.deployment_cr] if obj is not None]

    def kinds(self) -> str:
        """The kinds the program makes, as one kubectl resource list."""
        kinds = set()
        for obj in self.built():
            group = obj["apiVersion"].rpartition("/")[0]
            kinds.add(f"{obj['kind'].lower()}.{group}" if group else obj["kind"].lower())
        return ",".join(sorted(kinds))

    def selector(self) -> str:
        return f"{names.LABEL_INSTANCE}={self.cfg.names.hyphened}"

    def expected(self) -> list[Key]:
        """What the builders say this config makes: the truth the cluster is held to."""
        return sorted(_key(o) for o in self.built())

    def statefulset(self) -> Key:
        return ("StatefulSet", self.namespace, self.cfg.names.controller_driver)


def _key(obj: dict[str, Any]) -> Key:
    meta = obj["metadata"]
    return (obj["kind"], meta.get("namespace") or "", meta["name"])


@pytest.fixture(scope="module")
def admin(
    pulumi_ready: dict[str, str], local_cluster: Path, tmp_path_factory: pytest.TempPathFactory
) -> Admin:
    """A copy of the project as an administrator's clone has it, with a backend of its own."""
    root = project_copy(tmp_path_factory.mktemp("checkout"))
    backend = tmp_path_factory.mktemp("backend")
    env = {**os.environ, **localenv.pulumi_env()}
    env["PULUMI_BACKEND_URL"] = backend.as_uri()
    env["KUBECONFIG"] = str(local_cluster)
    shell = Admin(root, env, backend=backend)
    # manageCrd is false in these stacks (destroying them must not remove the shared CRD), so
    # the CRD is applied as docs/configuration.md documents for that setting.
    shell.kubectl("apply", "--server-side", "-f", str(root / "crd"))
    return shell


@pytest.fixture
def scenario(admin: Admin, request: pytest.FixtureRequest) -> Iterator[Scenario]:
    """A fresh stack with its gate closed; afterwards every process, object and label gone."""
    suffix = uuid.uuid4().hex[:6]
    sc = Scenario(stack=f"{request.node.name.removeprefix('test_')[:16]}-{suffix}", suffix=suffix)
    patch = "pmem-csi:deployments[0].patches[0]"
    gate = f"{patch}.mergePatch.spec.template.spec.nodeSelector.{GATE_LABEL}"
    for line in (
        f"pulumi stack init {sc.stack}",
        "pulumi config set pmem-csi:manageCrd false",
        f"pulumi config set --path 'pmem-csi:deployments[0].name' {sc.cfg.name}",
        f"pulumi config set --path 'pmem-csi:deployments[0].namespace' {sc.namespace}",
        f"pulumi config set --path '{patch}.kind' StatefulSet",
        f"pulumi config set --path '{gate}' {sc.gate_value}",
    ):
        admin.run(line)
    try:
        yield sc
    finally:
        for proc in sc.started:
            _end_session(proc)
        admin.kubectl("label", "nodes", "--all", f"{GATE_LABEL}-", check=False)
        # Our own processes are gone, so no lock can belong to a live run.
        admin.run(f"pulumi cancel --yes --stack {sc.stack}", check=False)
        admin.run(f"pulumi destroy --yes --skip-preview --stack {sc.stack}")
        admin.run(f"pulumi stack rm --yes {sc.stack}")
        # What no state knew of (a create cut short, a failed test) must not reach later tests.
        admin.kubectl("delete", sc.kinds(), "-A", "-l", sc.selector(), "--wait=false")


def _start_up(admin: Admin, sc: Scenario) -> subprocess.Popen[str]:
    proc = admin.start(f"pulumi up --yes --skip-preview --stack {sc.stack}")
    sc.started.append(proc)
    return proc


def _read_until(proc: subprocess.Popen[str], pattern: str, lines: list[str]) -> None:
    """Consume the CLI's output up to the first line matching ``pattern``."""
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if re.search(pattern, line):
            return
    raise AssertionError(f"the run ended before {pattern!r}:\n{''.join(lines)}")


def _session_pids(sid: int) -> list[int]:
    """Live processes of a session: the CLI run's own descendants, plugins included."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            pids.append(int(stat.parent.name))
    return pids


def _end_session(proc: subprocess.Popen[str]) -> None:
    """Stop a run this test started and whatever its session left behind, by pid."""
    if proc.poll() is None:
        proc.kill()
        proc.communicate(timeout=60)
    for pid in _session_pids(proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _open_gate(admin: Admin, sc: Scenario) -> None:
    """Label one node so the controller pod can schedule: the held-back creation completes."""
    node = admin.kubectl("get", "nodes", "-o", "name").stdout.split()[0]
    admin.kubectl("label", "--overwrite", node, f"{GATE_LABEL}={sc.gate_value}")


def _wait_at_the_gate(
    admin: Admin, sc: Scenario, proc: subprocess.Popen[str], lines: list[str]
) -> list[Key]:
    """Until the run has saved every object but the StatefulSet, whose create waits at the gate.

    The provider's await message comes after the engine saved the create as pending; the
    other steps' ends are printed before they are saved, hence the poll of the saved state.
    Returns the objects created.
    """
    _read_until(proc, r"StatefulSet .* Waiting for StatefulSet", lines)
    others = sorted(set(sc.expected()) - {sc.statefulset()})

    def only_the_statefulset_pending() -> bool:
        state = _state(admin, sc)
        return _pending(state) == [STS_CREATE] and _state_objects(state) == others

    wait_for(only_the_statefulset_pending, 120, "only the StatefulSet's create pending")
    return others


def _state(admin: Admin, sc: Scenario) -> dict[str, Any]:
    return json.loads(admin.run(f"pulumi stack export --stack {sc.stack}").stdout)["deployment"]


def _state_objects(state: dict[str, Any]) -> list[Key]:
    """The Kubernetes objects the state records (provider entries are not objects)."""
    out = []
    for r in state["resources"]:
        if r["type"].startswith("kubernetes:"):
            obj = r.get("outputs") or r["inputs"]
            out.append(_key(obj))
    return sorted(out)


def _creates_cut_short(out: str) -> set[Key]:
    """Objects whose create the CLI reports as failed (display: ``ns/name`` or ``name``)."""
    cut = set()
    failed = r"\*\*creating failed(?: \([\d.]+m?s\))?\*\*"  # with its duration or not
    for m in re.finditer(rf"^ \+  kubernetes:\S*:(\w+) (\S+) {failed}", out, re.M):
        namespace, _, name = m.group(2).rpartition("/")
        cut.add((m.group(1), namespace, name))
    return cut


def _pending(state: dict[str, Any]) -> list[tuple[str, str]]:
    return [(op["type"], op["resource"]["type"]) for op in state.get("pending_operations") or []]


def _cluster_objects(admin: Admin, sc: Scenario) -> dict[Key, list[str]]:
    """Every object of the kinds the program makes that carries this deployment's label."""
    got = admin.kubectl("get", sc.kinds(), "-A", "-l", sc.selector(), "-o", "json")
    uids: dict[Key, list[str]] = {}
    for obj in json.loads(got.stdout)["items"]:
        uids.setdefault(_key(obj), []).append(obj["metadata"]["uid"])
    return uids


def _uids(found: dict[Key, list[str]]) -> dict[Key, str]:
    assert all(len(u) == 1 for u in found.values()), found
    return {k: u[0] for k, u in found.items()}


def assert_converged(admin: Admin, sc: Scenario, *, preview: bool = True) -> dict[Key, str]:
    """Cluster, state and program agree, exactly once each; returns the objects' UIDs.

    ``preview=False`` when the docs/day2.md block just run ended with ``pulumi preview
    --expect-no-changes`` (and passed), to spend one program run less.
    """
    expected = sc.expected()
    found = _cluster_objects(admin, sc)
    # Each expected object once, nothing else with the deployment's label (no orphan).
    assert sorted(k for k, uids in found.items() for _ in uids) == expected

    state = _state(admin, sc)
    assert _pending(state) == [], state.get("pending_operations")
    urns = [r["urn"] for r in state["resources"]]
    assert len(urns) == len(set(urns)), "a resource twice in the state"
    assert _state_objects(state) == expected
    others = [r["type"] for r in state["resources"] if not r["type"].startswith("kubernetes:")]
    assert Counter(others) == OTHER_RESOURCES
    assert len(state["resources"]) == len(expected) + sum(OTHER_RESOURCES.values())

    if preview:
        result = admin.run(f"pulumi preview --expect-no-changes --stack {sc.stack}")
        out = result.stdout + result.stderr
        assert re.search(r"\d+ unchanged", out), out
        assert not re.search(r"to (create|update|delete|replace)", out), out
    return _uids(found)


def _report(what: str, started: float) -> None:
    """The recovery times of docs/day2.md's table come from here (``pytest -s``); never asserted."""
    print(f"\nrecovery {what}: the documented steps took {time.monotonic() - started:.1f} s")


def _select(admin: Admin, sc: Scenario) -> None:
    """The documented steps act on the selected stack, as an administrator's shell does."""
    admin.run(f"pulumi stack select {sc.stack}")


# ---------------------------------------------------------------------------------- scenarios


def test_up_stopped_with_ctrl_c_half_way_completes_when_run_again(
    admin: Admin, scenario: Scenario
) -> None:
    sc = scenario
    after_ctrl_c, _ = sh_blocks(SECTION)
    proc = _start_up(admin, sc)
    lines: list[str] = []
    # Some objects exist (the namespace), the StatefulSet cannot (the gate): half way.
    _read_until(proc, rf"kubernetes:core/v1:Namespace {sc.namespace} created", lines)
    os.killpg(proc.pid, signal.SIGINT)
    rest, _ = proc.communicate(timeout=300)
    out = "".join(lines) + rest
    assert proc.returncode != 0, out
    assert "^C received; cancelling" in out, out
    # The engine starts nothing new and tells the provider to cancel: operations under way
    # either finish ("update canceled") or are cut short ("context canceled", "update failed").
    cut_short = _creates_cut_short(out)
    if cut_short:
        # Cut short by the provider's cancel, or by the program's stop while the engine ran
        # the program's after-create hook (the host stops the program on Cancel, as the
        # official host does).
        assert "context canceled" in out or HOOK_STOPPED.search(out), out
    else:
        # Or the host's stop of the program (on the CLI's Cancel) ends the run first.
        assert "update canceled" in out or PROGRAM_STOPPED in out, out
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out
    # The engine and its plugins are gone, and so is the lock.
    wait_for(lambda: not _session_pids(proc.pid), 30, "the interrupted run's processes to exit")
    assert admin.lock_files(sc.stack) == []

    state = _state(admin, sc)
    assert _pending(state) == []
    recorded = _state_objects(state)
    found = _cluster_objects(admin, sc)
    # Every recorded object exists. One that exists unrecorded is one whose create was cut
    # short after its request had reached the API server: why docs/day2.md says `up`, not
    # `destroy`, next. Which case a run meets depends on timing; both are checked.
    untracked = set(found) - set(recorded)
    print(f"\nCtrl-C: creates cut short {sorted(cut_short)}, untracked {sorted(untracked)}")
    assert set(recorded) <= set(found)
    assert untracked <= cut_short, (untracked, cut_short)
    # Half way: the namespace was created; the controller's create had not even started (it
    # waits for the certificates and Secrets, seconds after the namespace).
    assert ("Namespace", "", sc.namespace) in recorded
    assert sc.statefulset() not in found
    before = _uids(found)

    _open_gate(admin, sc)
    _select(admin, sc)
    assert after_ctrl_c[-1] == NO_CHANGES
    started = time.monotonic()
    # docs/day2.md: a namespace or Deployment CR whose create was cut short carries the
    # stack's identity without being in the state; `up` refuses it until pmem-csi:adopt
    # names it, and the setting is removed after.
    adopt = [
        f"{kind} {name}"
        for kind, ns, name in sorted(untracked)
        if kind in ("Namespace", "Deployment") and not ns  # a CSIDriver is taken over by name
    ]
    for i, ref in enumerate(adopt):
        admin.run(f"pulumi config set --path 'pmem-csi:adopt[{i}]' '{ref}'")
    for line in after_ctrl_c:
        admin.run(line)
    if adopt:
        admin.run("pulumi config rm pmem-csi:adopt")
        admin.run(after_ctrl_c[-1])
    _report("after Ctrl-C", started)
    after = assert_converged(admin, sc, preview=False)
    # The objects from the interrupted run, recorded or not, were kept, not replaced.
    assert {k: after[k] for k in before} == before


def test_up_killed_recovers_with_the_documented_steps(admin: Admin, scenario: Scenario) -> None:
    sc = scenario
    _, after_kill = sh_blocks(SECTION)
    proc = _start_up(admin, sc)
    lines: list[str] = []
    others = _wait_at_the_gate(admin, sc, proc, lines)  # the kill always hits this point
    proc.kill()  # SIGKILL to the CLI alone, as the OOM killer or `kill -9 PID` does
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    # The plugins it started are not told; end them by pid as docs/day2.md says.
    for pid in _session_pids(proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)

    state = _state(admin, sc)
    assert _pending(state) == [STS_CREATE]
    assert _state_objects(state) == others
    killed_sts = _uids(_cluster_objects(admin, sc))[sc.statefulset()]  # in the cluster though
    assert len(admin.lock_files(sc.stack)) == 1

    # What an administrator sees first: the killed run's lock, with its pid.
    _select(admin, sc)
    retry = admin.run("pulumi up --yes", check=False)
    out = retry.stdout + retry.stderr
    assert retry.returncode != 0 and LOCKED in out, out
    assert f"(pid {proc.pid})" in out, out
    assert "pulumi cancel" in out, out

    _open_gate(admin, sc)
    assert after_kill[-1] == NO_CHANGES
    # The checks between the lines below must run: docs/day2.md keeps both steps.
    assert after_kill.count("pulumi cancel --yes") == 1, after_kill
    assert sum(line.startswith("pulumi refresh") for line in after_kill) == 1, after_kill
    started, checks = time.monotonic(), 0.0
    for line in after_kill:
        admin.run(line)
        check_start = time.monotonic()
        if line == "pulumi cancel --yes":
            assert admin.lock_files(sc.stack) == []
        if line.startswith("pulumi refresh"):
            assert _pending(_state(admin, sc)) == []
        checks += time.monotonic() - check_start
    _report("after a kill", started + checks)
    uids = assert_converged(admin, sc, preview=False)
    # The StatefulSet the killed run created was taken over, not duplicated or replaced.
    assert uids[sc.statefulset()] == killed_sts


def test_second_up_while_one_runs_is_refused_by_the_stack_lock(
    admin: Admin, scenario: Scenario
) -> None:
    sc = scenario
    first = _start_up(admin, sc)
    lines: list[str] = []
    _wait_at_the_gate(admin, sc, first, lines)
    # The first run holds the lock and waits at the gate, doing nothing else: the runs overlap
    # for certain, and whatever changes from here on was done by the second.
    before = _uids(_cluster_objects(admin, sc))
    state_before = _state(admin, sc)
    for line in (
        f"pulumi up --yes --skip-preview --stack {sc.stack}",
        f"pulumi destroy --yes --skip-preview --stack {sc.stack}",
    ):
        second = admin.run(line, check=False)
        out = second.stdout + second.stderr
        assert second.returncode != 0 and LOCKED in out, (line, out)
        assert f"(pid {first.pid})" in out, out
    # Refused before doing anything: the cluster and the state are as the first run left them.
    assert _uids(_cluster_objects(admin, sc)) == before
    assert _state_objects(_state(admin, sc)) == _state_objects(state_before)
    assert first.poll() is None

    # `pulumi cancel` (file backend) deletes the lock files and nothing else: it reports the
    # update as canceled, but the run goes on, unprotected. Hence docs/day2.md's pid check.
    cancel = admin.run(f"pulumi cancel --yes --stack {sc.stack}")
    assert "has been canceled" in cancel.stdout, cancel.stdout
    assert admin.lock_files(sc.stack) == []
    assert first.poll() is None

    _open_gate(admin, sc)
    rest, _ = first.communicate(timeout=300)
    out = "".join(lines) + rest
    assert first.returncode == 0, out
    assert "problem deleting the lock" in out, out  # its own lock was gone
    uids = assert_converged(admin, sc)
    # Nothing the first run had created was touched by the refused runs.
    assert {k: uids[k] for k in before} == before
