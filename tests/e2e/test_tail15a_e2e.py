"""Issue 15 tail, part A, end to end: the volume guard without the CR, and a namespace that
another stack's deployment lives in (the real engine and provider on the local cluster).

One stack (``retainNamespaces: false``, ``manageCrd: false``) with two deployments: ``v``
in a namespace of its own (``ns_v``, created by the stack) and ``d`` in another. In file order:

1. ``v`` gets volumes, then its ``Deployment`` CR is deleted by hand (the case the README
   documents: the driver keeps running). A rename of ``v`` and its removal are refused,
   listing the volumes, and again once the CRD is gone too; nothing changed.
2. The volumes deleted (the way forward), another stack's CR naming ``ns_v`` as its
   namespace: removing ``v`` deletes ``v``'s objects but keeps ``ns_v`` (a warning says why),
   and the other CR is untouched; the next ``pulumi up`` drops ``ns_v`` from the stack,
   leaving it in the cluster.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from pulumi import automation as auto

from pmem_components import names
from pmem_components.manifests import bundle
from tests.e2e.test_day2 import (
    CR_API,
    NO_REPORTER,
    _create_volumes,
    _delete_volumes,
    cfg_of,
    delete_quietly,
    failed_up,
    get_cr,
    kube,  # noqa: F401 (a module fixture)
    snapshot_without_cr,
    stacks_dir,  # noqa: F401 (a module fixture)
    suffix,
)
from tests.e2e.test_program import Cluster, _write_config, dispose, make_stack, up

pytestmark = pytest.mark.timeout(900)


@dataclass
class Tail:
    stack: auto.Stack
    sfx: str
    v: dict[str, Any]
    d: dict[str, Any]

    @staticmethod
    def config(*deps: dict[str, Any]) -> dict[str, Any]:
        return {
            "pmem-csi:manageCrd": False,
            "pmem-csi:retainNamespaces": False,
            "pmem-csi:deployments": list(deps),
        }

    def write(self, *deps: dict[str, Any]) -> None:
        _write_config(self.stack, self.config(*deps))


@pytest.fixture(scope="module")
def tail(
    pulumi_ready: dict[str, str],
    stacks_dir: Path,  # noqa: F811
    api_client: Any,
    kube: Cluster,  # noqa: F811
) -> Iterator[Tail]:
    from reporter.kubeapi import RawApi
    from tests.e2e.reporter_helpers import ensure_crd

    core = client.CoreV1Api(api_client)
    sfx = suffix()
    v = {"name": f"v-{sfx}.pmem-csi.example", "namespace": f"t15a-{sfx}-v",
         "reporter": NO_REPORTER}  # fmt: skip
    d = {"name": f"d-{sfx}.pmem-csi.example", "namespace": f"t15a-{sfx}-d",
         "reporter": NO_REPORTER}  # fmt: skip
    ensure_crd(RawApi(api_client))
    state = Tail(make_stack(stacks_dir, Tail.config(v, d)), sfx, v, d)
    try:
        assert up(state.stack, "tail15a: first").summary.result == "succeeded"
        yield state
    finally:
        try:
            _delete_volumes(kube, sfx)
        finally:
            ensure_crd(RawApi(api_client))  # the first test deletes it
            custom = client.CustomObjectsApi(api_client)
            delete_quietly(
                custom.delete_cluster_custom_object,
                names.CRD_GROUP,
                names.CRD_STORAGE_VERSION,
                names.CRD_PLURAL,
                f"x-{sfx}.pmem-csi.example",
            )
            try:
                dispose(state.stack)
            finally:
                for raw in (v, d):
                    delete_quietly(core.delete_namespace, raw["namespace"])


def test_removal_and_rename_are_refused_with_volumes_when_the_cr_and_the_crd_are_gone(
    tail: Tail, api_client: Any, kube: Cluster, kubectl: Callable[..., Any]  # noqa: F811
) -> None:
    from reporter.kubeapi import RawApi
    from tests.e2e.reporter_helpers import ensure_crd

    core = client.CoreV1Api(api_client)
    cfg = cfg_of(tail.v)
    refs = _create_volumes(kube, cfg.name, tail.sfx)
    pod_ns = cfg_of(tail.d).namespace
    inline = _inline_volume_pod(core, pod_ns, f"inline-{tail.sfx}", cfg.name)
    refs.append(f"Pod {pod_ns}/{inline}")
    try:
        kubectl("delete", f"deployments.{names.CRD_GROUP}", cfg.name, "--wait=true")
        before = snapshot_without_cr(kube, core, cfg)
        renamed = {**tail.v, "name": f"w-{tail.sfx}.pmem-csi.example", "renamedFrom": cfg.name}
        tail.write(renamed, tail.d)
        text = failed_up(tail.stack)
        assert f"pmem-csi:deployments[0].renamedFrom: renaming '{cfg.name}'" in text
        for ref in refs:
            assert ref in text, ref

        tail.write(tail.d)  # remove v
        text = failed_up(tail.stack)
        assert f"pmem-csi:deployments: '{cfg.name}' (deployed by this stack)" in text
        for ref in refs:
            assert ref in text, ref

        kubectl("delete", "crd", names.CRD_NAME, "--wait=true", "--timeout=60s")
        text = failed_up(tail.stack)
        assert f"pmem-csi:deployments: '{cfg.name}' (deployed by this stack)" in text
        for ref in refs:
            assert ref in text, ref
        assert snapshot_without_cr(kube, core, cfg) == before  # refused before any change
    finally:
        ensure_crd(RawApi(api_client))  # the next test and the other modules need it
        delete_quietly(core.delete_namespaced_pod, inline, pod_ns)


def _inline_volume_pod(core: client.CoreV1Api, namespace: str, name: str, driver: str) -> str:
    """A pod with an inline CSI ephemeral volume of ``driver`` (kwok runs it on paper)."""
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "containers": [{"name": "app", "image": "registry.invalid/app:1",
                            "volumeMounts": [{"name": "scratch", "mountPath": "/data"}]}],
            "volumes": [{"name": "scratch", "csi": {"driver": driver}}],
        },
    }  # fmt: skip
    core.create_namespaced_pod(namespace, body)
    return name


def test_removing_the_last_deployment_of_a_namespace_keeps_it_for_another_stacks_deployment(
    tail: Tail, api_client: Any, kube: Cluster  # noqa: F811
) -> None:
    """``v`` (CR deleted by the test before, volumes still there) ends removed."""
    core = client.CoreV1Api(api_client)
    custom = client.CustomObjectsApi(api_client)
    cfg = cfg_of(tail.v)
    ns_v = cfg.namespace
    _delete_volumes(kube, tail.sfx)  # the way forward
    other = f"x-{tail.sfx}.pmem-csi.example"
    body = {
        "apiVersion": CR_API,
        "kind": names.CRD_KIND,
        "metadata": {"name": other,
                     "annotations": {names.STACK_ANNOTATION: "organization/other/prod"}},
        "spec": {"deviceMode": "lvm", "namespace": ns_v},
    }  # fmt: skip
    theirs = custom.create_cluster_custom_object(
        names.CRD_GROUP, names.CRD_STORAGE_VERSION, names.CRD_PLURAL, body
    )
    ns_uid = core.read_namespace(ns_v).metadata.uid

    tail.write(tail.d)
    result = up(tail.stack, "tail15a: v removed")
    assert result.summary.result == "succeeded"
    assert f"namespace '{ns_v}' is used by no deployment of this stack any more" in result.stdout
    assert f"Deployment {other}" in result.stdout
    # retainNamespaces: false (test_tail15_review, item 1: said only then).
    assert "retainNamespaces: false, would be deleted with it" in result.stdout
    for obj in bundle.build_deployment_objects(cfg, create_namespace=False).all():
        if obj["kind"] == names.CRD_KIND and obj["apiVersion"] == CR_API:
            continue
        assert kube.get(obj) is None, f"{obj['kind']} {obj['metadata']['name']} left"
    live = core.read_namespace(ns_v)
    assert live.metadata.uid == ns_uid and live.status.phase == "Active"
    after = get_cr(custom, other)
    assert after is not None
    assert after["metadata"]["uid"] == theirs["metadata"]["uid"]

    # The next update drops it from the stack (kept on delete): it stays in the cluster.
    result = up(tail.stack, "tail15a: namespace released")
    assert result.summary.result == "succeeded"
    assert "is used by no deployment of this stack" not in result.stdout
    assert core.read_namespace(ns_v).metadata.uid == ns_uid
    exported = tail.stack.export_stack().deployment["resources"]
    assert not [r for r in exported if r.get("type") == "kubernetes:core/v1:Namespace"
                and r.get("outputs", {}).get("metadata", {}).get("name") == ns_v]  # fmt: skip
