"""Issue 15 tail, part B, end to end (the real engine and provider on the local cluster):
removing a patch that set an immutable field is refused before anything changes, instead of
the provider deleting and re-creating the object; the steady state is never refused."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from pmem_components.manifests import bundle
from tests.e2e.test_day2 import NO_REPORTER, cfg_of, delete_quietly, failed_up, suffix
from tests.e2e.test_program import Cluster, _write_config, dispose, make_stack, up

pytestmark = pytest.mark.timeout(900)

PARALLEL = {"kind": "StatefulSet", "mergePatch": {"spec": {"podManagementPolicy": "Parallel"}}}


def _config(dep: dict[str, Any]) -> dict[str, Any]:
    return {"pmem-csi:manageCrd": False, "pmem-csi:deployments": [dep]}


@pytest.fixture
def started(
    pulumi_ready: dict[str, str], tmp_path: Path, api_client: Any
) -> Iterator[tuple[Any, dict[str, Any]]]:
    """A stack whose controller StatefulSet was created with the Parallel patch."""
    from reporter.kubeapi import RawApi
    from tests.e2e.reporter_helpers import ensure_crd

    ensure_crd(RawApi(api_client))
    sfx = suffix()
    dep = {
        "name": f"t-{sfx}.pmem-csi.example",
        "namespace": f"tail15b-{sfx}",
        "reporter": NO_REPORTER,
        "patches": [PARALLEL],
    }
    stack = make_stack(tmp_path, _config(dep))
    try:
        assert up(stack, "tail15b: with the patch").summary.result == "succeeded"
        yield stack, dep
    finally:
        try:
            dispose(stack)
        finally:
            delete_quietly(client.CoreV1Api(api_client).delete_namespace, dep["namespace"])


def test_removing_a_patch_that_set_an_immutable_field_is_refused_before_anything_changes(
    started: tuple[Any, dict[str, Any]], api_client: Any
) -> None:
    stack, dep = started
    kube = Cluster(api_client)
    cfg = cfg_of(dep)
    sts = next(o for o in bundle.build_deployment_objects(cfg).all() if o["kind"] == "StatefulSet")
    live = kube.get(sts)
    assert live is not None and live["spec"]["podManagementPolicy"] == "Parallel"
    uid = live["metadata"]["uid"]

    # Unchanged config: the steady state passes (every other object dry-run or skipped).
    assert up(stack, "tail15b: unchanged").summary.result == "succeeded"

    without = {k: v for k, v in dep.items() if k != "patches"}
    _write_config(stack, _config(without))
    text = failed_up(stack)
    assert (
        "pmem-csi:deployments[0]: this update changes spec.podManagementPolicy of "
        f"StatefulSet {cfg.namespace}/{cfg.names.controller_driver}"
    ) in text, text[-3000:]
    assert "for a removed patch, the patch" in text
    after = kube.get(sts)
    assert after is not None and after["metadata"]["uid"] == uid  # not replaced
    assert after["spec"]["podManagementPolicy"] == "Parallel"

    # The way forward given: the patch back, and the update goes through in place.
    _write_config(stack, _config(dep))
    assert up(stack, "tail15b: patch back").summary.result == "succeeded"
    again = kube.get(sts)
    assert again is not None and again["metadata"]["uid"] == uid


def test_a_released_namespace_keeps_the_labels_its_namespace_patch_added(
    pulumi_ready: dict[str, str], tmp_path: Path, api_client: Any
) -> None:
    """Created by the stack with a ``kind: Namespace`` patch (PSA enforce: privileged), then
    ``createNamespace: false`` (the patch has to go: it would select nothing): the namespace
    is kept, and kept as it is, through the update that releases it and the one that drops
    it from the state."""
    from reporter.kubeapi import RawApi
    from tests.e2e.reporter_helpers import ensure_crd

    ensure_crd(RawApi(api_client))
    core = client.CoreV1Api(api_client)
    sfx = suffix()
    ns = f"tail15b-{sfx}-kept"
    enforce = {"pod-security.kubernetes.io/enforce": "privileged"}
    patch = {"kind": "Namespace", "mergePatch": {"metadata": {"labels": enforce}}}
    dep = {"name": f"k-{sfx}.pmem-csi.example", "namespace": ns, "reporter": NO_REPORTER}
    config = {**_config({**dep, "patches": [patch]}), "pmem-csi:retainNamespaces": False}
    stack = make_stack(tmp_path, config)
    try:
        assert up(stack, "kept: patched namespace").summary.result == "succeeded"
        live = core.read_namespace(ns)
        assert live.metadata.labels["pod-security.kubernetes.io/enforce"] == "privileged"
        uid = live.metadata.uid
        # Another actor's label (a platform stack's NamespacePatch, kubectl apply): not this
        # stack's to co-own (test_tail15_review, item 2).
        _platform_apply(api_client, ns, {"team": "a"})

        released = {**_config({**dep, "createNamespace": False}),
                    "pmem-csi:retainNamespaces": False}
        _write_config(stack, released)
        for step in ("kept: released", "kept: out of the state"):
            assert up(stack, step).summary.result == "succeeded"
            live = core.read_namespace(ns)
            assert live.metadata.uid == uid and live.status.phase == "Active"
            labels = live.metadata.labels or {}
            assert labels.get("pod-security.kubernetes.io/enforce") == "privileged", (step, labels)
            assert labels.get("team") == "a", (step, labels)
        resources = stack.export_stack().deployment["resources"]
        assert not [r for r in resources if r["type"] == "kubernetes:core/v1:Namespace"]
        owners = [
            e.manager
            for e in core.read_namespace(ns).metadata.managed_fields or []
            if "f:team" in ((e.fields_v1 or {}).get("f:metadata") or {}).get("f:labels", {})
        ]
        assert owners == [PLATFORM], owners
        # ... so its owner can still remove it.
        _platform_apply(api_client, ns, {})
        assert "team" not in (core.read_namespace(ns).metadata.labels or {})
    finally:
        try:
            dispose(stack)
        finally:
            delete_quietly(core.delete_namespace, ns)


PLATFORM = "platform-stack"


def _platform_apply(api_client: Any, ns: str, labels: dict[str, str]) -> None:
    """Server-side apply of the namespace's ``labels`` by another field manager."""
    from pmem_components import kubecall

    resp = kubecall.request(
        api_client,
        "PATCH",
        f"/api/v1/namespaces/{ns}",
        timeout=30,
        body={"apiVersion": "v1", "kind": "Namespace",
              "metadata": {"name": ns, "labels": labels}},
        content_type="application/apply-patch+yaml",
        query=[("fieldManager", PLATFORM)],
    )  # fmt: skip
    assert 200 <= resp.status <= 299, (resp.status, resp.body)
