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


# ------------------------------------------------------------------ certificates in the bundle

FP = "fingerprint-of-the-material"
REPORTER = {"enabled": True, "image": "registry.example/reporter:1"}


def _bundle(fingerprint: str | None) -> bundle.DeploymentObjects:
    cfg = load_config({"deployments": [{"name": "a.b", "reporter": REPORTER}]}).deployments[0]
    values = bundle.CertificateValues(
        "ca", "registry-cert", "registry-key", "node-cert", "node-key", fingerprint=fingerprint
    )
    return bundle.build_deployment_objects(cfg, values)


def _annotations(objects: list[dict]) -> dict[str, dict]:
    """Pod template annotations of every workload, by kind."""
    return {
        o["kind"]: o["spec"]["template"]["metadata"].get("annotations", {})
        for o in objects
        if "template" in o.get("spec", {})
    }


def test_the_fingerprint_goes_into_the_driver_pod_templates_next_to_the_scrape_annotation() -> None:
    """New certificates must roll the controller and node pods (they read them only at start):
    the fingerprint annotation changes their pod templates. It is added to the scrape
    annotation, not instead of it, and only to the driver's two workloads: the reporter reads
    no certificate, rolling it would only move its Lease."""
    scrape = {"pmem-csi.intel.com/scrape": "containers"}
    got = _annotations(_bundle(FP).all())
    assert got == {
        "StatefulSet": {**scrape, bundle.CERTIFICATES_HASH_ANNOTATION: FP},
        "DaemonSet": {**scrape, bundle.CERTIFICATES_HASH_ANNOTATION: FP},
        "Deployment": {},
    }
    # Without a fingerprint (the preview's placeholders) the templates carry none.
    assert _annotations(_bundle(None).all()) == {
        "StatefulSet": scrape,
        "DaemonSet": scrape,
        "Deployment": {},
    }


def test_the_fingerprint_annotation_is_added_to_a_template_without_annotations() -> None:
    """A patched or future workload whose pod template has no annotations yet still gets the
    fingerprint (and the same dict back, which the bundle keeps)."""
    workload: dict = {"spec": {"template": {"metadata": {"labels": {"app": "x"}}}}}
    out = bundle._with_fingerprint(workload, FP)
    assert out is workload
    assert workload["spec"]["template"]["metadata"] == {
        "labels": {"app": "x"},
        "annotations": {bundle.CERTIFICATES_HASH_ANNOTATION: FP},
    }


def test_each_secret_holds_the_ca_and_its_own_certificate_and_key() -> None:
    """The registry's Secret is mounted by the controller, the node Secret by the node pods;
    each needs the CA and its own key pair (a swapped or missing value fails the mutual TLS)."""
    objs = _bundle(FP)
    registry, node = objs.secrets
    assert registry["metadata"]["name"] == "a-b-registry-secrets"
    assert registry["stringData"] == {
        "ca.crt": "ca",
        "tls.crt": "registry-cert",
        "tls.key": "registry-key",
    }
    assert node["metadata"]["name"] == "a-b-node-secrets"
    assert node["stringData"] == {"ca.crt": "ca", "tls.crt": "node-cert", "tls.key": "node-key"}


def test_every_object_of_the_bundle_has_the_api_version_its_kind_is_served_at() -> None:
    """The API server refuses an object whose ``apiVersion`` it does not serve for its kind."""
    served = {
        "Namespace": "v1",
        "Secret": "v1",
        "ServiceAccount": "v1",
        "Service": "v1",
        "CSIDriver": "storage.k8s.io/v1",
        "Role": "rbac.authorization.k8s.io/v1",
        "RoleBinding": "rbac.authorization.k8s.io/v1",
        "ClusterRole": "rbac.authorization.k8s.io/v1",
        "ClusterRoleBinding": "rbac.authorization.k8s.io/v1",
        "StatefulSet": "apps/v1",
        "DaemonSet": "apps/v1",
    }
    objs = _bundle(FP)
    for o in [o for o in objs.all() if o is not objs.deployment_cr and o not in objs.reporter]:
        assert o["apiVersion"] == served[o["kind"]], o["kind"]
    assert objs.deployment_cr["apiVersion"] == "pmem-csi.intel.com/v1beta1"


def test_a_deployments_own_reporter_follows_its_reporter_settings() -> None:
    """``reporter_objects``: the reporter of one deployment runs in that deployment's namespace
    with the replicas, log level, labels and pull policy configured for it (defaults other
    than the builder's own, so a setting dropped on the way shows)."""
    reporter = {**REPORTER, "replicas": 3, "logLevel": 5}
    d = load_config(
        {
            "deployments": [
                {
                    "name": "a.b",
                    "namespace": "storage",
                    "labels": {"team": "t"},
                    "imagePullPolicy": "Always",
                    "reporter": reporter,
                }
            ]
        }
    ).deployments[0]
    objs = bundle.reporter_objects(d)
    assert {o["metadata"].get("namespace") for o in objs} == {None, "storage", "default"}
    (sa,) = [o for o in objs if o["kind"] == "ServiceAccount"]
    assert sa["metadata"]["namespace"] == "storage"
    (dep,) = [o for o in objs if o["kind"] == "Deployment"]
    assert dep["metadata"]["namespace"] == "storage"
    assert dep["spec"]["replicas"] == 3
    assert dep["metadata"]["labels"]["team"] == "t"
    assert dep["spec"]["template"]["metadata"]["labels"]["team"] == "t"
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert c["image"] == REPORTER["image"]
    assert c["imagePullPolicy"] == "Always"
    args = c["args"]
    assert args[args.index("--log-level") + 1] == "5"
    assert args[args.index("--namespace") + 1] == "storage"
    assert args[: args.index("--shared-watches")] == ["--deployment", "a.b"]
