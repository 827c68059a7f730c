"""Review of issue 14's tail, end to end: the real CLI and engine on the local cluster.

* finding 1: ``pulumi stack rename prod prod2`` leaves every object annotated with the old
  identity, written by this stack's own field manager; the next ``pulumi up`` of ``prod2``
  succeeds (it was refused as "taken over", naming the stack's own manager) and writes the
  new identity.
* finding 7: the kubeconfig scalar table (tests/unit/test_tail14_review.py) through the
  locally built kubectl, whose ``--kubeconfig`` file goes through client-go's
  ``clientcmd.Load``: the table is client-go's behaviour.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from pulumi import automation as auto

from pmem_components import names
from pmem_components.program import main as program
from tests.e2e import test_identity as tid
from tests.e2e.test_program import Cluster
from tests.unit.test_tail14_review import BOOL_CASES, STRING_CASES
from tools import localenv, toolchain
from tools import pulumi_stack as ps

pytestmark = pytest.mark.timeout(900)

deployment = tid.deployment  # the fixture: a unique deployment, its namespace removed after


def _select(work_dir: Path, backend: Path, name: str) -> auto.Stack:
    env = {**localenv.apply_pulumi_env(), "PULUMI_BACKEND_URL": backend.as_uri()}
    opts = auto.LocalWorkspaceOptions(
        work_dir=str(work_dir),
        pulumi_home=env["PULUMI_HOME"],
        env_vars=env,
        secrets_provider="passphrase",
        pulumi_command=ps._command(),
    )
    return auto.select_stack(
        stack_name=name, project_name=ps.PROJECT_NAME, program=program, opts=opts
    )


def _identities(api_client: Any, raw: dict[str, Any]) -> set[str]:
    kube = Cluster(api_client)
    out = set()
    for obj in tid.objects_of(raw):
        if obj["kind"] not in ("Namespace", names.CRD_KIND):
            continue
        live = kube.get(obj)
        assert live is not None
        out.add((live["metadata"].get("annotations") or {}).get(names.STACK_ANNOTATION, ""))
    return out


def test_the_update_after_a_stack_rename_is_not_refused(
    pulumi_ready: dict[str, str],
    crd: None,
    tmp_path: Path,
    api_client: Any,
    deployment: dict[str, Any],
) -> None:
    raw = deployment
    backend, work = tmp_path / "backend", tmp_path / "work"
    stack = tid.stack_on(backend, work, tid.config_of(raw))
    renamed: auto.Stack | None = None
    try:
        assert stack.up(on_output=ps.printer("[prod] ")).summary.result == "succeeded"
        assert _identities(api_client, raw) == {tid.IDENTITY}
        tid.state_cli(stack, "stack", "rename", "prod2")
        renamed = _select(work, backend, "prod2")
        result = renamed.up(on_output=ps.printer("[prod2] "))
        assert result.summary.result == "succeeded"
        assert _identities(api_client, raw) == {f"organization/{ps.PROJECT_NAME}/prod2"}
        tid.only_the_stacks_manager(Cluster(api_client), raw, renamed)
        ns = client.CoreV1Api(api_client).read_namespace(raw["namespace"])
        assert ns.metadata.labels["tier"] == "one"
    finally:
        current = renamed or stack
        current.destroy(on_output=ps.printer("[cleanup] "))
        current.workspace.remove_stack(current.name)


def _view(tmp_path: Path, text: str) -> tuple[int, dict[str, Any] | None, str]:
    path = tmp_path / "config"
    path.write_text(text)
    result = subprocess.run(
        [str(toolchain.bin_path("kubectl")), "--kubeconfig", str(path), "config", "view",
         "-o", "json"],
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    doc = json.loads(result.stdout) if result.returncode == 0 else None
    return result.returncode, doc, result.stderr


@pytest.mark.parametrize("case", STRING_CASES, ids=[c[0] for c in STRING_CASES])
def test_kubectl_types_plain_strings_as_the_table_says(
    case: tuple[str, str | None], tmp_path: Path, local_cluster: Path
) -> None:
    value, expected = case
    text = f"current-context: {value}\ncontexts:\n- name: c\n  context: {{namespace: {value}}}\n"
    code, doc, stderr = _view(tmp_path, text)
    if expected is None:
        assert code != 0 and doc is None, stderr
        return
    assert doc is not None, stderr
    assert doc.get("current-context", "") == expected
    assert doc["contexts"][0]["context"].get("namespace", "") == expected


@pytest.mark.parametrize("case", BOOL_CASES, ids=[c[0] for c in BOOL_CASES])
def test_kubectl_reads_the_tables_booleans(
    case: tuple[str, bool | None], tmp_path: Path, local_cluster: Path
) -> None:
    value, expected = case
    text = (
        "clusters:\n- name: a\n"
        f'  cluster: {{server: "https://x:1", insecure-skip-tls-verify: {value}}}\n'
    )
    code, doc, stderr = _view(tmp_path, text)
    if expected is None:
        assert code != 0 and doc is None, stderr
        return
    assert doc is not None, stderr
    assert doc["clusters"][0]["cluster"].get("insecure-skip-tls-verify", False) is expected
