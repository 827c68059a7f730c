"""One reporter per stack, with the real Pulumi engine on the local cluster (issue 16).

- ``pulumi up`` of a stack with two deployments (each with ``reporter.image``) makes one
  reporter Deployment serving both, and that reporter -- run as a process with the
  Deployment's own arguments and its ServiceAccount's token -- writes both CRs' status;
- a stack made with the layout before (each deployment's reporter a child of its component)
  moves with one ``pulumi up``: the first deployment's reporter objects are updated in place
  (same uids, via aliases), the others' are deleted, and the reporter Deployment was updated
  before the old ones went (the engine's event order).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from pmem_components.config import DeploymentConfig
from reporter.kubeapi import RawApi
from tests.e2e.reporter_helpers import (
    REPORTER_IMAGE,
    ReporterProcess,
    ensure_crd,
    token_kubeconfig,
)
from tests.e2e.test_program import dispose, make_stack, stack_config
from tests.e2e.test_program import program as new_program
from tests.e2e.waiting import wait_for
from tools import pulumi_stack as ps

pytestmark = pytest.mark.timeout(900)

STATUS_TIMEOUT = 120.0


def old_program() -> None:
    """The layout before issue 16: each deployment's own reporter, a child of its component,
    with the objects that program built (``old_reporter_layout``, that commit's builder:
    review of issue 16 -- today's builder made the new layout's RBAC for the "old" stack)."""
    from pmem_components import program
    from tests.e2e import old_reporter_layout

    def per_deployment(stack: Any, components: Any, namespaces: Any) -> list[Any]:
        out = []
        for component, dep in zip(components, stack.deployments, strict=True):
            objs = old_reporter_layout.build_reporter_objects(
                dep.names,
                dep.namespace,
                dep.reporter.image,
                replicas=dep.reporter.replicas,
                labels=dict(dep.labels),
                log_level=dep.reporter.log_level,
                image_pull_policy=dep.image_pull_policy,
            )
            for obj in objs:
                # As that program's component registered them (a child, after its CR).
                out.append(component.register_reporter_object(obj, [component.deployment_cr]))
        return out

    real = program.register_reporter
    program.register_reporter = per_deployment
    try:
        program.main()
    finally:
        program.register_reporter = real


def _deployment(sfx: str, key: str) -> dict[str, Any]:
    return {
        "name": f"{key}-{sfx}.stack.example.org",
        "namespace": f"rs-{key}-{sfx}",
        "reporter": {"image": REPORTER_IMAGE},
    }


@pytest.fixture(scope="module")
def stacks_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("reporter-stack")


@pytest.fixture
def two(pulumi_ready: dict[str, str], api_client: Any, stacks_dir: Path) -> Iterator[Any]:
    ensure_crd(RawApi(api_client))
    sfx = uuid.uuid4().hex[:6]
    raws = [_deployment(sfx, "a"), _deployment(sfx, "b")]
    stack = make_stack(stacks_dir, stack_config(*raws))
    try:
        yield stack, [DeploymentConfig(**r) for r in raws]
    finally:
        dispose(stack)


def _reporter_deployments(apps: client.AppsV1Api, cfgs: list[DeploymentConfig]) -> list[Any]:
    return [
        d
        for cfg in cfgs
        for d in apps.list_namespaced_deployment(cfg.namespace).items
        if d.metadata.name.endswith("-reporter")
    ]


def _uid(read: Any, *args: str) -> str | None:
    try:
        return read(*args).metadata.uid
    except client.exceptions.ApiException as exc:
        if exc.status == 404:
            return None
        raise


def test_one_reporter_serves_every_deployment_of_the_stack(
    two: Any, api_client: Any, local_cluster: Path, tmp_path: Path
) -> None:
    stack, (a, b) = two
    result = stack.up(on_output=ps.printer("[stack reporter] "))
    assert result.summary.result == "succeeded"
    apps = client.AppsV1Api(api_client)
    (dep,) = _reporter_deployments(apps, [a, b])
    assert (dep.metadata.name, dep.metadata.namespace) == (a.names.reporter, a.namespace)
    assert dep.spec.replicas == 2
    (container,) = dep.spec.template.spec.containers
    args = list(container.args)
    assert [args[i + 1] for i, x in enumerate(args) if x == "--deployment"] == [a.name, b.name]
    # Run it as its pod would: its arguments, its ServiceAccount's token (so its RBAC is what
    # the API server enforces), a local port and a short resync for the test.
    kubeconfig = token_kubeconfig(
        api_client, local_cluster, a.names.reporter, a.namespace, tmp_path / "kubeconfig"
    )
    i = args.index("--metrics-port")
    del args[i : i + 2]
    proc = ReporterProcess(
        kubeconfig,
        a.name,
        a.namespace,
        "stack-0",
        tmp_path / "reporter.log",
        resync_seconds=2.0,
        extra_args=tuple(x for x in args if x not in ("--namespace", a.namespace)),
    )
    try:
        custom = client.CustomObjectsApi(api_client)
        for cfg in (a, b):

            def running(cfg: DeploymentConfig = cfg) -> dict[str, Any]:
                obj = custom.get_cluster_custom_object(
                    "pmem-csi.intel.com", "v1beta1", "deployments", cfg.name
                )
                status = obj.get("status") or {}
                fresh = status.get("observedGeneration") == obj["metadata"]["generation"]
                return status if fresh and status.get("phase") == "Running" else {}

            wait_for(running, STATUS_TIMEOUT, f"{cfg.name}: Running, written by the stack reporter")
        assert "403" not in proc.log(), proc.log()[-3000:]
    finally:
        proc.stop()


def test_an_existing_stack_moves_to_one_reporter_with_one_up(two: Any, api_client: Any) -> None:
    stack, (a, b) = two
    stack.workspace.program = old_program
    assert stack.up(on_output=ps.printer("[old layout] ")).summary.result == "succeeded"
    apps, core = client.AppsV1Api(api_client), client.CoreV1Api(api_client)
    assert {d.metadata.name for d in _reporter_deployments(apps, [a, b])} == {
        a.names.reporter,
        b.names.reporter,
    }
    before = {
        "deployment": _uid(apps.read_namespaced_deployment, a.names.reporter, a.namespace),
        "sa": _uid(core.read_namespaced_service_account, a.names.reporter, a.namespace),
    }
    assert all(before.values())

    stack.workspace.program = new_program
    events: list[Any] = []
    result = stack.up(on_output=ps.printer("[new layout] "), on_event=events.append)
    assert result.summary.result == "succeeded"
    changes = result.summary.resource_changes or {}
    assert not changes.get("replace"), changes  # nothing of A's reporter is re-created
    (dep,) = _reporter_deployments(apps, [a, b])
    assert dep.metadata.name == a.names.reporter
    assert dep.metadata.uid == before["deployment"]
    assert _uid(core.read_namespaced_service_account, a.names.reporter, a.namespace) == before["sa"]
    assert _uid(apps.read_namespaced_deployment, b.names.reporter, b.namespace) is None
    # No gap: the stack reporter's Deployment update was done (and awaited) before B's old
    # reporter Deployment's deletion started.
    order = []
    for e in events:
        if e.res_outputs_event is not None:  # a step done
            order.append(
                (
                    "done " + str(e.res_outputs_event.metadata.op.value),
                    e.res_outputs_event.metadata.urn,
                )
            )
        elif e.resource_pre_event is not None:  # a step starting
            order.append(
                (
                    "start " + str(e.resource_pre_event.metadata.op.value),
                    e.resource_pre_event.metadata.urn,
                )
            )
    updated = next(
        i
        for i, (op, urn) in enumerate(order)
        if urn.endswith(f"apps/v1:Deployment::{a.namespace}/{a.names.reporter}")
        and op == "done update"
    )
    deleted = next(
        i
        for i, (op, urn) in enumerate(order)
        if urn.endswith(f"apps/v1:Deployment::{b.namespace}/{b.names.reporter}")
        and op == "start delete"
    )
    assert updated < deleted, order
    # The RBAC (review of issue 16): the new grants existed before the Deployment rolled to
    # serve B's namespace too, and the old grants -- what A's old pods watch with (pods
    # cluster-wide...) -- were deleted only after it had rolled out.
    created_role = next(
        i
        for i, (op, urn) in enumerate(order)
        if urn.endswith(f"Role::{b.namespace}/{a.names.reporter}-stack") and op == "done create"
    )
    update_started = next(
        i
        for i, (op, urn) in enumerate(order)
        if urn.endswith(f"apps/v1:Deployment::{a.namespace}/{a.names.reporter}")
        and op.startswith("start ")
    )
    assert created_role < update_started, order
    old_grant_deleted = next(
        i
        for i, (op, urn) in enumerate(order)
        if urn.endswith(f"ClusterRole::{a.names.reporter}") and op == "start delete"
    )
    assert updated < old_grant_deleted, order
    rbac = client.RbacAuthorizationV1Api(api_client)
    assert _uid(rbac.read_cluster_role, a.names.reporter) is None
    assert _uid(rbac.read_cluster_role, f"{a.names.reporter}-stack")
    assert _uid(rbac.read_namespaced_role, f"{a.names.reporter}-stack", b.namespace)
