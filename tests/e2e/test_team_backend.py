"""A team's shared state backend: "Choosing a state backend" (docs/configuration.md), run on
PostgreSQL.

Two administrators, each with a checkout of their own (``project_copy``) and a Pulumi home of
their own (their own ``pulumi login``; the provider plugin shared), run that section's
blocks line by line against a local PostgreSQL server (``postgres_server``, tools/postgres.py), the
section's example URL replaced by the local server's:

1. the first administrator deploys on a file backend, then moves the stack to PostgreSQL with
   the section's first block (``stack export``, ``login postgres://…``, ``stack init``,
   ``stack import``, ``preview --expect-no-changes``);
2. the second administrator, in the other checkout (``Pulumi.prod.yaml`` shared as a commit
   would share it), runs the section's second block (``login``, ``stack select``, ``up``) while
   the first administrator's ``pulumi up`` runs: that ``up`` is refused by the stack's lock,
   and succeeds once the first run has finished;
3. nothing in the database (a ``pg_dump`` of it) or in the exported state holds a private key
   in plaintext.

"While the first runs" is made deterministic with a gate, not a sleep: the first
administrator's update creates the reporter's Deployment with a ``nodeSelector`` (a patch) that
no node matches, so the provider's await holds that create (and the stack's lock) until the test
labels a node. (A gate on an update would not hold with pulumi-kubernetes 4.25: its StatefulSet
await passed an update whose new pod could never be scheduled.)
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pmem_components import names
from pmem_components.config import DeploymentConfig
from pmem_components.manifests import bundle
from tests.e2e.readme import Shell, project_copy, sh_blocks
from tests.e2e.test_bad_input_and_leaks import PRIVATE_MARKER, needles
from tests.e2e.waiting import wait_for
from tools import localenv, postgres, toolchain

pytestmark = pytest.mark.timeout(900)

SECTION = "## Choosing a state backend"
# The URL the documented blocks log in to; the test logs in to the local server instead.
README_URL = "postgres://pulumi@db.example.com:5432/pulumi?sslmode=verify-full"
LOCKED = "the stack is currently locked by 1 lock(s)"
STACK = "prod"
# Pulumi's marker of a secret value in a state file; its ciphertext sits next to it.
SECRET_SIG = "4dabf18193072939515e22adb298388d"
GATE_LABEL = "team-backend-gate"


@dataclass
class Team:
    """The two administrators and the deployment they share."""

    first: Shell
    second: Shell
    cfg: DeploymentConfig
    suffix: str

    def kubectl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(toolchain.bin_path("kubectl")), *args],
            env=self.first.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=check,
        )


def _administrator(
    name: str, tmp_path_factory: pytest.TempPathFactory, local_cluster: Path
) -> Shell:
    """One administrator: a checkout, a Pulumi home and a login of their own."""
    root = project_copy(tmp_path_factory.mktemp(f"checkout-{name}"))
    home = tmp_path_factory.mktemp(f"pulumi-home-{name}")
    # The locally built provider, registered once for the session (no download here).
    (home / "plugins").symlink_to(localenv.pulumi_home() / "plugins")
    env = {**os.environ, **localenv.pulumi_env(), **postgres.client_env()}
    env.pop("PULUMI_BACKEND_URL")  # the backend is what `pulumi login` chose
    env["PULUMI_HOME"] = str(home)
    env["KUBECONFIG"] = str(local_cluster)
    return Shell(root, env)


@pytest.fixture(scope="module")
def team(
    pulumi_ready: dict[str, str],
    local_cluster: Path,
    postgres_server: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Team]:
    suffix = uuid.uuid4().hex[:6]
    namespace = f"team-{suffix}"
    cfg = DeploymentConfig(name=f"{namespace}.pmem-csi.intel.com", namespace=namespace)
    t = Team(
        first=_administrator("first", tmp_path_factory, local_cluster),
        second=_administrator("second", tmp_path_factory, local_cluster),
        cfg=cfg,
        suffix=suffix,
    )
    # manageCrd is false (destroying the stack must not remove the shared CRD), so the CRD is
    # applied as docs/configuration.md documents for that setting.
    t.kubectl("apply", "--server-side", "-f", str(t.first.cwd / "crd"))
    try:
        yield t
    finally:
        t.kubectl("label", "nodes", "--all", f"{GATE_LABEL}-", check=False)
        t.first.run(f"pulumi cancel --yes --stack {STACK}", check=False)
        t.first.run(f"pulumi destroy --yes --skip-preview --stack {STACK}", check=False)
        t.first.run(f"pulumi stack rm --yes {STACK}", check=False)
        objects = bundle.build_deployment_objects(cfg)
        every = [objects.namespace, *objects.secrets, objects.csi_driver, *objects.controller,
                 *objects.node, *objects.reporter, objects.deployment_cr]  # fmt: skip
        kinds = set()
        for obj in (o for o in every if o is not None):
            group = obj["apiVersion"].rpartition("/")[0]
            kinds.add(f"{obj['kind'].lower()}.{group}" if group else obj["kind"].lower())
        selector = f"{names.LABEL_INSTANCE}={cfg.names.hyphened}"
        t.kubectl("delete", ",".join(sorted(kinds)), "-A", "-l", selector, "--wait=false",
                  check=False)  # fmt: skip


def _local(line: str, url: str) -> str:
    """A documented line with its example URL replaced by the local server's."""
    return line.replace(README_URL, url)


def _lock_keys() -> list[str]:
    rows = postgres.psql("SELECT key FROM pulumi_state WHERE key LIKE '%/locks/%' ORDER BY key")
    return [row for row in rows.splitlines() if f"/{STACK}/" in row]


def _private_keys(team: Team) -> list[str]:
    keys = []
    for secret in (team.cfg.names.registry_secret, team.cfg.names.node_secret):
        out = team.kubectl("get", "secret", "-n", team.cfg.namespace, secret, "-o", "json")
        keys.append(base64.b64decode(json.loads(out.stdout)["data"]["tls.key"]).decode())
    return keys


def _stored_objects() -> dict[str, str]:
    """Every object the backend stored, decoded: its table keeps each as ``{"data": base64}``."""
    rows = postgres.psql("SELECT key || ' ' || (data->>'data') FROM pulumi_state ORDER BY key")
    out = {}
    for row in rows.splitlines():
        key, _, encoded = row.partition(" ")
        blob = base64.b64decode(encoded)
        out[key] = (gzip.decompress(blob) if key.endswith(".gz") else blob).decode()
    return out


def _leaks(text: str, keys: list[str]) -> list[str]:
    found = [f"key {i} ({n[:12]}...)" for i, k in enumerate(keys) for n in needles(k) if n in text]
    return found + ([PRIVATE_MARKER] if PRIVATE_MARKER in text else [])


def test_two_administrators_share_a_stack_on_postgresql(team: Team, postgres_server: str) -> None:
    move, each = sh_blocks(SECTION)
    first, second = team.first, team.second
    assert any(README_URL in line for line in move) and any(README_URL in line for line in each)

    # ---- the first administrator's stack, deployed on a file backend of their own.
    old_backend = first.cwd.parent / f"{first.cwd.name}-file-backend"
    old_backend.mkdir()
    first.run(f"pulumi login {old_backend.as_uri()}")
    for line in (
        f"pulumi stack init {STACK}",
        "pulumi config set pmem-csi:manageCrd false",
        f"pulumi config set --path 'pmem-csi:deployments[0].name' {team.cfg.name}",
        f"pulumi config set --path 'pmem-csi:deployments[0].namespace' {team.cfg.namespace}",
        "pulumi up --yes --skip-preview",
    ):
        first.run(line)

    # ---- Block 1: the stack moves to PostgreSQL.
    for line in move:
        first.run(_local(line, postgres_server))
    exported = (first.cwd / "prod-state.json").read_text()
    assert postgres.psql(
        f"SELECT count(*) FROM pulumi_state WHERE key LIKE '%/stacks/%/{STACK}.json'"
    ).strip() == "1"

    # ---- the second administrator's checkout, with the stack file as a commit shares it.
    shutil.copyfile(first.cwd / f"Pulumi.{STACK}.yaml", second.cwd / f"Pulumi.{STACK}.yaml")

    # ---- the first administrator starts an update that the gate holds open.
    patch = "pmem-csi:deployments[0].patches[0]"
    gate = f"{patch}.mergePatch.spec.template.spec.nodeSelector.{GATE_LABEL}"
    image = "registry.example.com/pmem-csi-reporter:v1"
    first.run(f"pulumi config set --path 'pmem-csi:deployments[0].reporter.image' {image}")
    first.run(f"pulumi config set --path '{patch}.kind' Deployment")
    first.run(f"pulumi config set --path '{patch}.apiVersion' apps/v1")  # not the CR's kind
    first.run(f"pulumi config set --path '{gate}' g{team.suffix}")
    # Its output goes to a file: a pipe nobody reads while it waits could fill and block it.
    first_log = first.cwd.parent / f"{first.cwd.name}-held-up.log"
    with first_log.open("w") as log:
        running = subprocess.Popen(
            ["bash", "-c", "exec pulumi up --yes --skip-preview"],
            cwd=first.cwd,
            env=first.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        reporter = team.cfg.names.reporter

        def held_at_the_gate() -> bool:
            if running.poll() is not None:  # not a wait: the run it waits for is over
                raise RuntimeError(f"the first update ended:\n{first_log.read_text()}")
            jsonpath = "jsonpath={.spec.template.spec.nodeSelector}"
            got = team.kubectl(
                "get", "deployment", "-n", team.cfg.namespace, reporter, "-o", jsonpath, check=False
            )
            return GATE_LABEL in got.stdout and len(_lock_keys()) == 1

        wait_for(held_at_the_gate, 180, "the first update applied and holding the lock", 1.0)

        # ---- Block 2 by the second administrator, while the first update runs.
        for line in each[:-1]:
            second.run(_local(line, postgres_server))
        refused = second.run(_local(each[-1], postgres_server), check=False)
        out = refused.stdout + refused.stderr
        assert refused.returncode != 0, out
        assert LOCKED in out, out
        assert len(_lock_keys()) == 1  # the first run's lock, untouched

        # ---- the gate opens, the first update completes and releases the lock.
        node = team.kubectl("get", "nodes", "-o", "name").stdout.split()[0]
        team.kubectl("label", "--overwrite", node, f"{GATE_LABEL}=g{team.suffix}")
        running.wait(timeout=600)
        assert running.returncode == 0, first_log.read_text()
    finally:
        if running.poll() is None:
            running.kill()
            running.wait(timeout=60)
    assert _lock_keys() == []

    # ---- the second administrator pulls the stack file and runs the same `up`: it now runs.
    shutil.copyfile(first.cwd / f"Pulumi.{STACK}.yaml", second.cwd / f"Pulumi.{STACK}.yaml")
    second.run(_local(each[-1], postgres_server))
    second.run("pulumi preview --expect-no-changes")

    # ---- no private key in plaintext: not in the database, not in the exported state.
    keys = _private_keys(team)
    dump = postgres.dump()
    assert _leaks(dump, keys) == []
    stored = _stored_objects()
    checkpoints = [k for k in stored if k.endswith(f"/stacks/pmem-csi-pulumi/{STACK}.json")]
    assert len(checkpoints) == 1, list(stored)
    assert SECRET_SIG in stored[checkpoints[0]]  # the keys are there, as ciphertext only
    for key, text in stored.items():  # checkpoint, its history and backups, locks
        assert _leaks(text, keys) == [], key
    assert _leaks(exported, keys) == []
