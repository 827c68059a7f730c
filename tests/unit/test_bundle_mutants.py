"""The certificates' fingerprint
(:func:`pmem_components.manifests.bundle.certificates_fingerprint`).

Why: it goes into the driver's pod templates so that new certificates roll the pods. The
component test compares it with the function's own result, so a fingerprint of the CA alone
passed the unit suite (mutation testing found it): then renewing the registry's or the node
controller's certificate under the same CA would leave the pods running with the old one.
"""

from __future__ import annotations

import pytest

from pmem_components.config import load_config
from pmem_components.manifests import bundle, namespace

CA, REGISTRY, NODE = "ca-pem", "registry-pem", "node-pem"


@pytest.mark.parametrize("which", [0, 1, 2], ids=["ca", "registry", "node-controller"])
def test_the_fingerprint_changes_when_any_one_certificate_does(which: int) -> None:
    pems = [CA, REGISTRY, NODE]
    before = bundle.certificates_fingerprint(*pems)
    pems[which] = pems[which] + "-renewed"
    assert bundle.certificates_fingerprint(*pems) != before


def test_the_fingerprint_tells_which_certificate_holds_which_text() -> None:
    """The parts are separated: moving text from one certificate to the next changes it."""
    assert bundle.certificates_fingerprint("ab", "c", NODE) != bundle.certificates_fingerprint(
        "a", "bc", NODE
    )
    assert bundle.certificates_fingerprint(CA, REGISTRY, NODE) != bundle.certificates_fingerprint(
        REGISTRY, CA, NODE
    )


def test_the_fingerprint_ignores_surrounding_whitespace_and_is_stable() -> None:
    """A PEM read from a file with a trailing newline is the same certificate."""
    one = bundle.certificates_fingerprint(CA, REGISTRY, NODE)
    assert bundle.certificates_fingerprint(f"{CA}\n", f" {REGISTRY}", f"{NODE}\n\n") == one
    assert len(one) == 32 and int(one, 16) >= 0


def test_a_shared_namespace_is_labelled_as_its_first_deployment_labels_it() -> None:
    """``build_shared_namespace``: the stack's Namespace of that name, with the labels of the
    first deployment in it (not of a deployment in another namespace, not of a later one)."""
    stack = load_config(
        {
            "deployments": [
                {"name": "a.example.org", "namespace": "elsewhere", "labels": {"team": "a"}},
                {"name": "b.example.org", "namespace": "shared", "labels": {"team": "b"}},
                {"name": "c.example.org", "namespace": "shared", "labels": {"team": "c"}},
            ]
        }
    )
    first = stack.deployments[1]
    for build in (bundle.build_shared_namespace, namespace.build_shared_namespace):
        ns = build("shared", stack.deployments)
        assert ns == namespace.build_namespace(first)
        assert ns["kind"] == "Namespace"
        assert ns["metadata"]["name"] == "shared"
        assert ns["metadata"]["labels"]["team"] == "b"


def test_the_stack_output_names_every_object_by_its_documented_role() -> None:
    """Administrators and scripts read ``objectNames.<role>`` from the stack outputs: every
    role key is spelled as documented and names that object."""
    reporter = {"enabled": True, "image": "registry.example/reporter:1"}
    cfg = load_config({"deployments": [{"name": "a.b", "reporter": reporter}]})
    d = cfg.deployments[0]
    names = d.names
    assert bundle.object_names(d) == {
        "deployment": "a.b",
        "csiDriver": names.csi_driver,
        "registrySecret": names.registry_secret,
        "nodeSecret": names.node_secret,
        "serviceAccount": names.service_account,
        "provisionerRole": "a-b-external-provisioner-cfg",
        "provisionerRoleBinding": "a-b-csi-provisioner-role-cfg",
        "provisionerClusterRole": "a-b-external-provisioner-runner",
        "provisionerClusterRoleBinding": "a-b-csi-provisioner-role",
        "controllerService": "a-b-controller",
        "metricsService": "a-b-metrics",
        "controllerStatefulSet": "a-b-controller",
        "nodeDaemonSet": "a-b-node",
        "reporter": "a-b-reporter",
    }


def test_the_namespace_is_a_core_v1_namespace_object() -> None:
    """The API server accepts only the exact ``v1`` group-version for a Namespace."""
    d = load_config({"deployments": [{"name": "a.b", "namespace": "storage"}]}).deployments[0]
    ns = namespace.build_namespace(d)
    assert (ns["apiVersion"], ns["kind"], ns["metadata"]["name"]) == ("v1", "Namespace", "storage")
