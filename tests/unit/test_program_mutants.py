"""What ``retainCrd`` and ``retainNamespaces`` do to the stack's resources
(:func:`pmem_components.program.deploy`).

Why: deleting the CRD deletes every ``Deployment`` CR in the cluster, and deleting a namespace
everything in it; so both are kept on destroy unless the stack config says otherwise. No
unit test looked at the resource options, and ``retainCrd: false`` being ignored passed the
suite (mutation testing found it). Pulumi's mocks do not report resource options, so these
tests record the options each Kubernetes resource is created with.
"""

from __future__ import annotations

from typing import Any

import pulumi
import pytest
from pulumi_mocks import RecordingMocks, project_config

from pmem_components.config import load_config

CRD_TYPE = "kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition"
NAMESPACE_TYPE = "kubernetes:core/v1:Namespace"
DAEMONSET_TYPE = "kubernetes:apps/v1:DaemonSet"

CERTIFICATE_OUTPUTS = {
    "ca_cert": "CA",
    "registry_cert": "RC",
    "registry_key": "RK",
    "node_controller_cert": "NC",
    "node_controller_key": "NK",
}


def retained(monkeypatch: pytest.MonkeyPatch, config: dict[str, Any]) -> dict[str, list[bool]]:
    """``retain_on_delete`` of every CRD, Namespace and DaemonSet the program registers."""
    from pmem_components.program import deploy

    seen: dict[str, list[bool]] = {}
    original = pulumi.CustomResource.__init__

    def spy(self: Any, t: str, name: str, props: Any = None, opts: Any = None, *a: Any, **k: Any):
        if t in (CRD_TYPE, NAMESPACE_TYPE, DAEMONSET_TYPE):
            seen.setdefault(t, []).append(bool(opts is not None and opts.retain_on_delete))
        original(self, t, name, props, opts, *a, **k)

    monkeypatch.setattr(pulumi.CustomResource, "__init__", spy)
    pulumi.runtime.set_mocks(
        RecordingMocks(CERTIFICATE_OUTPUTS), project="pmem-csi-pulumi", stack="unit", preview=False
    )
    stack = load_config({"deployments": [{"reporter": {"enabled": False}}], **config})

    @pulumi.runtime.test
    def body() -> None:
        deploy(stack)

    with project_config():
        body()
    return seen


def test_the_crd_and_namespaces_are_kept_on_delete_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen = retained(monkeypatch, {})
    assert seen[CRD_TYPE] == [True]
    assert seen[NAMESPACE_TYPE] == [True]
    assert seen[DAEMONSET_TYPE] == [False]  # the driver's own objects go with the stack


def test_retain_crd_false_lets_destroy_delete_the_crd(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = retained(monkeypatch, {"retainCrd": False})
    assert seen[CRD_TYPE] == [False]
    assert seen[NAMESPACE_TYPE] == [True]  # the other setting is untouched


def test_retain_namespaces_false_lets_destroy_delete_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen = retained(monkeypatch, {"retainNamespaces": False})
    assert seen[NAMESPACE_TYPE] == [False]
    assert seen[CRD_TYPE] == [True]
