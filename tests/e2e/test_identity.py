"""Whose objects: stacks of the same name, on two backends or one after another (issue 14, 4).

The real CLI and engine on the local cluster, stacks on file backends of their own:

a) two teams run ``pmem-csi-pulumi/prod`` on two backends against one cluster: the second
   team's ``preview`` and ``up`` are refused, naming the namespace and the CR, the identity
   they carry and ``pmem-csi:adopt``, and change nothing; with the consent ``up`` adopts them;
   the first team's next ``preview`` is refused in turn: its state holds them, but another
   stack's field manager has replaced its own; told to drop the deployment, its ``up`` is
   refused too (it would delete the second team's objects by name), and after the
   ``pulumi state delete`` commands the refusal names, its ``up`` forgets them and leaves
   every object of the second team as it was (same resourceVersions). One object carries
   the stamp of an earlier take-over when the second team adopts it: the run after the
   adoption has nothing to change;
b) ``pulumi destroy`` (the namespace is retained), ``pulumi stack rm``, ``pulumi stack
   init`` of the same name: the retained namespace is adopted only with ``pmem-csi:adopt``
   (the refusal names the interrupted-run case too), and not with ``takeOverFields: false``
   (refused, naming both settings);
d) after each adoption the earlier stack's field manager (``pulumi-kubernetes-<random>``) is
   gone from every adopted object, and a later ``pulumi up`` that changes a field both owned
   (a namespace label, with the consent removed again) succeeds instead of failing with a
   server-side apply conflict.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from pulumi import automation as auto

from pmem_components import names
from pmem_components.config import load_config
from pmem_components.fieldowners import is_pulumi_manager
from pmem_components.manifests import bundle
from pmem_components.program import main as program
from pmem_components.takeover_transform import TAKEN_OVER_ANNOTATION
from tests.e2e.test_program import Cluster
from tools import localenv, toolchain
from tools import pulumi_stack as ps

pytestmark = pytest.mark.timeout(900)

STACK = "prod"
IDENTITY = f"organization/{ps.PROJECT_NAME}/{STACK}"


def stack_on(backend: Path, work_dir: Path, config: dict[str, Any]) -> auto.Stack:
    """Stack ``prod`` of this project on the file backend ``backend`` (an administrator's
    checkout ``work_dir`` logged in there)."""
    env = {**localenv.apply_pulumi_env(), "PULUMI_BACKEND_URL": backend.as_uri()}
    backend.mkdir(parents=True, exist_ok=True)
    work_dir.mkdir(parents=True, exist_ok=True)
    (work_dir / "Pulumi.yaml").write_text(
        yaml.safe_dump({"name": ps.PROJECT_NAME, "runtime": "python", **ps.project_config()})
    )
    ps.write_stack_config(work_dir, STACK, config)
    opts = auto.LocalWorkspaceOptions(
        work_dir=str(work_dir),
        pulumi_home=env["PULUMI_HOME"],
        env_vars=env,
        secrets_provider="passphrase",
        pulumi_command=ps._command(),
    )
    return auto.create_or_select_stack(
        stack_name=STACK, project_name=ps.PROJECT_NAME, program=program, opts=opts
    )


def state_cli(stack: auto.Stack, *args: str) -> None:
    """Run ``pulumi <args>`` on the stack as its administrator would, in its checkout."""
    env = {**os.environ, **stack.workspace.env_vars}
    subprocess.run(
        [str(toolchain.bin_path("pulumi")), *args, "--stack", STACK],
        cwd=stack.workspace.work_dir,
        env=env,
        check=True,
        timeout=120,
    )


def configure(stack: auto.Stack, config: dict[str, Any]) -> None:
    ps.write_stack_config(Path(stack.workspace.work_dir), STACK, config)


def config_of(raw: dict[str, Any], **top: Any) -> dict[str, Any]:
    out = {"pmem-csi:manageCrd": False, "pmem-csi:deployments": [raw]}
    out.update({f"pmem-csi:{k}": v for k, v in top.items()})
    return out


def refused(action: Any) -> str:
    with pytest.raises(auto.CommandError) as err:
        action()
    return str(err.value)


def pulumi_managers(live: dict[str, Any]) -> set[str]:
    return {
        str(e.get("manager"))
        for e in (live.get("metadata") or {}).get("managedFields") or []
        if is_pulumi_manager(str(e.get("manager") or "")) and e.get("operation") == "Apply"
    }


def state_managers(stack: auto.Stack) -> dict[str, str]:
    """(kind/name) -> the field manager the stack's state records for it."""
    out = {}
    for r in stack.export_stack().deployment["resources"]:
        outs = r.get("outputs") or {}
        if r["type"].startswith("kubernetes:") and outs.get("__fieldManager"):
            out[f"{outs['kind']}/{outs['metadata']['name']}"] = outs["__fieldManager"]
    return out


def objects_of(raw: dict[str, Any]) -> list[dict[str, Any]]:
    cfg = load_config({"deployments": [raw]}, check_certificates=False).deployments[0]
    objs = bundle.build_deployment_objects(cfg)
    return [o for o in objs.all() if o is not None]


def versions(kube: Cluster, raw: dict[str, Any]) -> dict[str, tuple[str, str]]:
    out = {}
    for obj in objects_of(raw):
        live = kube.get(obj)
        assert live is not None, f"{obj['kind']} {obj['metadata']['name']} missing"
        meta = live["metadata"]
        out[f"{obj['kind']}/{meta['name']}"] = (meta["uid"], meta["resourceVersion"])
    return out


def only_the_stacks_manager(kube: Cluster, raw: dict[str, Any], stack: auto.Stack) -> None:
    """Every object of the deployment has exactly one Pulumi apply entry: the stack's own."""
    recorded = state_managers(stack)
    for obj in objects_of(raw):
        live = kube.get(obj)
        assert live is not None
        ref = f"{obj['kind']}/{obj['metadata']['name']}"
        assert pulumi_managers(live) == {recorded[ref]}, (ref, pulumi_managers(live))


@pytest.fixture
def deployment(api_client: Any) -> Iterator[dict[str, Any]]:
    sfx = uuid.uuid4().hex[:6]
    raw = {
        "name": f"id-{sfx}.pmem-csi.intel.com",
        "namespace": f"id-{sfx}",
        "reporter": {"enabled": False},
        "labels": {"tier": "one"},
    }
    yield raw
    try:
        client.CoreV1Api(api_client).delete_namespace(raw["namespace"])
    except ApiException as err:
        if err.status != 404:
            raise
    for obj in objects_of(raw):
        if not obj["metadata"].get("namespace") and obj["kind"] != "Namespace":
            # What a failed test left behind; gone already when it passed.
            with contextlib.suppress(Exception):
                Cluster(api_client).resource(obj["apiVersion"], obj["kind"]).delete(
                    name=obj["metadata"]["name"]
                )


def test_two_teams_same_stack_name_on_two_backends(
    pulumi_ready: dict[str, str],
    crd: None,
    tmp_path: Path,
    api_client: Any,
    deployment: dict[str, Any],
) -> None:
    kube = Cluster(api_client)
    raw = deployment
    first = stack_on(tmp_path / "backend-a", tmp_path / "team-a", config_of(raw))
    second = stack_on(tmp_path / "backend-b", tmp_path / "team-b", config_of(raw))
    try:
        assert first.up(on_output=ps.printer("[team a] ")).summary.result == "succeeded"
        # An earlier take-over on one object: its stamp is on it when the second team adopts.
        account = next(o for o in objects_of(raw) if o["kind"] == "ServiceAccount")
        client.CoreV1Api(api_client).patch_namespaced_service_account(
            account["metadata"]["name"],
            raw["namespace"],
            {"metadata": {"labels": {"tier": "edited"}}},
            field_manager="kubectl-edit",
        )
        assert first.up(on_output=ps.printer("[team a takes over] ")).summary.result == (
            "succeeded"
        )
        stamped = kube.get(account)
        assert stamped is not None
        assert TAKEN_OVER_ANNOTATION in stamped["metadata"]["annotations"]
        before = versions(kube, raw)
        # The second team, same project and stack names, its own (empty) state.
        for action in (second.preview, second.up):
            text = refused(action)
            assert f"namespace {raw['namespace']!r} carries this stack's identity" in text
            assert f"the Deployment CR {raw['name']!r} carries this stack's identity" in text
            assert repr(IDENTITY) in text
            assert f'pmem-csi:adopt: ["Namespace {raw["namespace"]}"]' in text
            assert f'pmem-csi:adopt: ["Deployment {raw["name"]}"]' in text
        assert versions(kube, raw) == before, "the refused runs changed nothing"
        # With the consent the second team takes the deployment over.
        adopt = [f"Namespace {raw['namespace']}", f"Deployment {raw['name']}"]
        configure(second, config_of(raw, adopt=adopt))
        result = second.up(on_output=ps.printer("[team b adopts] "))
        assert result.summary.result == "succeeded"
        after = versions(kube, raw)
        assert {k: v[0] for k, v in after.items()} == {k: v[0] for k, v in before.items()}
        # D3: the adoption kept the take-over stamp: the next run has nothing to change.
        second.preview(expect_no_changes=True, on_output=ps.printer("[team b, no changes] "))
        # d) the consent removed, a field both stacks' managers had set changes.
        changed = {**raw, "labels": {"tier": "two"}}
        configure(second, config_of(changed))
        assert second.up(on_output=ps.printer("[team b] ")).summary.result == "succeeded"
        ns = client.CoreV1Api(api_client).read_namespace(raw["namespace"])
        assert ns.metadata.labels["tier"] == "two"
        only_the_stacks_manager(kube, changed, second)
        # The first team's state still holds them, but it no longer applies them unasked.
        before = versions(kube, changed)
        text = refused(first.preview)
        assert f"namespace {raw['namespace']!r} is in this stack's state, but another" in text
        assert f"the Deployment CR {raw['name']!r} is in this stack's state" in text
        assert versions(kube, changed) == before
        # D1: told to drop the deployment, the first team's stack would delete the second
        # team's objects by name. Refused, naming the state delete that forgets them.
        configure(first, {"pmem-csi:manageCrd": False, "pmem-csi:deployments": []})
        text = refused(first.up)
        assert f"{raw['name']!r} (in this stack's state) is no longer configured" in text
        assert f"namespace {raw['namespace']!r} (in this stack's state) is created by" in text
        assert versions(kube, changed) == before, "the refused up deleted nothing"
        # (The CLI prints the program's error twice.)
        commands = list(dict.fromkeys(re.findall(r"pulumi state delete [^']*'urn:[^']+'", text)))
        assert len(commands) == 2, commands
        for command in commands:  # the deployment's first: the namespace is its dependency
            state_cli(first, *shlex.split(command)[1:])
        assert first.up(on_output=ps.printer("[team a forgets] ")).summary.result == "succeeded"
        assert versions(kube, changed) == before, "the second team's objects are untouched"
        assert state_managers(first) == {}
    finally:
        second.destroy(on_output=ps.printer("[cleanup b] "))
        second.workspace.remove_stack(STACK)
        first.workspace.remove_stack(STACK, force=True)


def test_a_retained_namespace_is_adopted_by_a_new_stack_of_the_name_only_when_told(
    pulumi_ready: dict[str, str],
    crd: None,
    tmp_path: Path,
    api_client: Any,
    deployment: dict[str, Any],
) -> None:
    kube = Cluster(api_client)
    raw = deployment
    backend = tmp_path / "backend"
    old = stack_on(backend, tmp_path / "checkout", config_of(raw))
    assert old.up(on_output=ps.printer("[old] ")).summary.result == "succeeded"
    old.destroy(on_output=ps.printer("[old destroy] "))
    old.workspace.remove_stack(STACK)
    core = client.CoreV1Api(api_client)
    kept = core.read_namespace(raw["namespace"])  # retainNamespaces (the default) kept it
    assert kept.metadata.annotations[names.STACK_ANNOTATION] == IDENTITY
    new = stack_on(backend, tmp_path / "checkout", config_of(raw))
    try:
        text = refused(new.up)
        assert f"namespace {raw['namespace']!r} carries this stack's identity" in text
        assert f'pmem-csi:adopt: ["Namespace {raw["namespace"]}"]' in text
        assert "createNamespace: false" in text
        # D6: the same refusal meets what an interrupted run created and did not record.
        assert "a pulumi up of this stack that was interrupted" in text
        # D4: adopting without the take-over would leave the earlier stack's manager on it.
        adopt = [f"Namespace {raw['namespace']}"]
        configure(new, config_of(raw, adopt=adopt, takeOverFields=False))
        text = refused(new.preview)
        assert "pmem-csi:takeOverFields: false" in text and "pmem-csi:adopt" in text
        assert core.read_namespace(raw["namespace"]).metadata.resource_version == (
            kept.metadata.resource_version
        )
        configure(new, config_of(raw, adopt=adopt))
        assert new.up(on_output=ps.printer("[new adopts] ")).summary.result == "succeeded"
        live = kube.get(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": raw["namespace"]}}
        )
        assert live is not None and live["metadata"]["uid"] == kept.metadata.uid
        # d) without the consent, a label both stacks' managers had set changes.
        changed = {**raw, "labels": {"tier": "two"}}
        configure(new, config_of(changed))
        assert new.up(on_output=ps.printer("[new] ")).summary.result == "succeeded"
        assert core.read_namespace(raw["namespace"]).metadata.labels["tier"] == "two"
        only_the_stacks_manager(kube, changed, new)
    finally:
        new.destroy(on_output=ps.printer("[cleanup] "))
        new.workspace.remove_stack(STACK)
