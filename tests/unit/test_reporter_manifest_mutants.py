"""The reporter's Deployment (:func:`pmem_components.manifests.reporter.build_reporter_objects`):
what mutation testing found unpinned in test_reporter_rbac.py -- the arguments the reporter is
started with, its probes, resources, security settings and spreading.
"""

from __future__ import annotations

import copy
import json

import pytest
from test_reporter_rbac import NAMES, OTHER, all_objects, objects

from pmem_components.fieldowners import ALLOWED_ENV, Allowance
from pmem_components.manifests.reporter import (
    METRICS_PORT,
    REPORTER_UID,
    build_reporter_objects,
    reporter_selector,
    with_allowed_field_owners,
)
from reporter.__main__ import parse_args


def test_the_reporter_understands_its_arguments_as_the_deployment_means_them() -> None:
    (container,) = objects()["Deployment"]["spec"]["template"]["spec"]["containers"]
    args = parse_args(container["args"])
    assert args.deployment == ["pmem-csi.intel.com"]
    assert args.namespace == "drv"
    assert args.lease_name == "pmem-csi-intel-com-reporter"
    assert args.log_level == parse_args(["--log-level", "4"]).log_level
    assert args.metrics_port == METRICS_PORT
    assert container["ports"] == [
        {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}
    ]


def test_the_reporter_container_is_probed_limited_and_locked_down() -> None:
    (container,) = objects()["Deployment"]["spec"]["template"]["spec"]["containers"]
    assert container["name"] == "reporter"
    assert container["livenessProbe"] == {
        "httpGet": {"path": "/healthz", "port": "metrics"},
        "periodSeconds": 10,
        "timeoutSeconds": 3,
        "failureThreshold": 3,
    }
    assert container["readinessProbe"] == {
        "httpGet": {"path": "/readyz", "port": "metrics"},
        "periodSeconds": 5,
        "timeoutSeconds": 3,
        "failureThreshold": 1,
    }
    assert container["resources"] == {
        "requests": {"cpu": "100m", "memory": "128Mi"},
        "limits": {"memory": "384Mi"},
    }
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def test_the_reporter_pods_run_as_the_images_user_and_spread_over_nodes() -> None:
    dep = objects()["Deployment"]
    assert dep["apiVersion"] == "apps/v1"
    assert dep["metadata"]["name"] == "pmem-csi-intel-com-reporter"
    assert dep["metadata"]["namespace"] == "drv"
    assert dep["metadata"]["labels"] == dep["spec"]["template"]["metadata"]["labels"]
    assert dep["metadata"]["labels"]["team"] == "storage"
    pod = dep["spec"]["template"]["spec"]
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": REPORTER_UID,
        "runAsGroup": REPORTER_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert pod["affinity"] == {
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 100,
                    "podAffinityTerm": {
                        "labelSelector": {"matchLabels": reporter_selector(NAMES)},
                        "topologyKey": "kubernetes.io/hostname",
                    },
                }
            ]
        }
    }
    assert pod["terminationGracePeriodSeconds"] == 10
    assert dep["spec"]["selector"] == {"matchLabels": reporter_selector(NAMES)}


def test_every_reporter_object_carries_its_api_version() -> None:
    assert {(o["kind"], o.get("apiVersion")) for o in all_objects()} == {
        ("ClusterRole", "rbac.authorization.k8s.io/v1"),
        ("ClusterRoleBinding", "rbac.authorization.k8s.io/v1"),
        ("Deployment", "apps/v1"),
        ("Role", "rbac.authorization.k8s.io/v1"),
        ("RoleBinding", "rbac.authorization.k8s.io/v1"),
        ("ServiceAccount", "v1"),
    }


def test_the_reporter_image_is_pulled_only_when_missing_unless_configured() -> None:
    (deployment,) = [
        o for o in build_reporter_objects([(NAMES, "drv")], "drv", "reg/r:1")
        if o["kind"] == "Deployment"
    ]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["imagePullPolicy"] == "IfNotPresent"


def test_the_field_ownership_policy_reaches_every_reporter_container_once() -> None:
    """``with_allowed_field_owners``: the policy entries, each with its manager, paths and
    reason, in the environment of each container of the reporter's Deployment, replacing an
    entry of that name there before and keeping the others; the builder's output untouched."""
    deployment = objects()["Deployment"]
    containers = deployment["spec"]["template"]["spec"]["containers"]
    containers[0]["env"] = [
        {"name": "KEEP", "value": "1"},
        {"name": ALLOWED_ENV, "value": "[]"},
    ]
    containers.append({"name": "second", "image": "reg/other:1"})
    before = copy.deepcopy(deployment)
    allowed = (
        Allowance("team-labeller", ("metadata.labels.team", "metadata.labels.tier"), "ours"),
        Allowance("hpa", ("spec.replicas",), "scaling"),
    )
    out = with_allowed_field_owners(deployment, allowed)
    assert deployment == before
    expected = [
        {
            "manager": "team-labeller",
            "paths": ["metadata.labels.team", "metadata.labels.tier"],
            "reason": "ours",
        },
        {"manager": "hpa", "paths": ["spec.replicas"], "reason": "scaling"},
    ]
    first, second = out["spec"]["template"]["spec"]["containers"]
    assert [e["name"] for e in first["env"]] == ["KEEP", ALLOWED_ENV]
    assert first["env"][0] == {"name": "KEEP", "value": "1"}
    assert [e["name"] for e in second["env"]] == [ALLOWED_ENV]
    for container in (first, second):
        assert json.loads(container["env"][-1]["value"]) == expected
    assert with_allowed_field_owners(deployment, []) is deployment


def test_a_reporter_namespace_serving_no_driver_gets_only_its_lease_rules() -> None:
    """A reporter installed in a namespace of its own needs its leader-election Lease there and
    nothing else; a driver namespace it also runs in gets the lease rules on top of the
    driver rules."""
    from pmem_components import names as n
    from pmem_components.manifests.reporter import (
        EVENT_RULE,
        driver_namespace_rules,
        lease_rules,
        namespace_rules,
    )

    served = [(NAMES, "pmem-csi"), (OTHER, "other-ns")]
    assert namespace_rules(served, "pmem-reporter") == {
        "pmem-csi": driver_namespace_rules(),
        "other-ns": driver_namespace_rules(),
        "pmem-reporter": lease_rules(NAMES),
        n.CLUSTER_EVENT_NAMESPACE: [EVENT_RULE],
    }
    shared = namespace_rules(served, "other-ns")
    assert shared["other-ns"] == [*driver_namespace_rules(), *lease_rules(NAMES)]
    assert "pmem-reporter" not in shared


# ------------------------------------------------------------------ bindings, names, defaults

TWO = [(NAMES, "drv"), (OTHER, "drv2")]
SUBJECT = {"kind": "ServiceAccount", "name": "pmem-csi-intel-com-reporter", "namespace": "drv"}


def test_every_binding_grants_its_own_role_to_the_reporters_service_account() -> None:
    """A binding whose ``subjects`` or ``roleRef`` is misspelt grants nothing (the API server
    refuses it, or binds a role of another kind): the ClusterRoleBinding names the
    ClusterRole, each RoleBinding the Role of its namespace, and all of them the reporter's
    ServiceAccount where the reporter runs."""
    objs = all_objects(TWO)
    (crb,) = [o for o in objs if o["kind"] == "ClusterRoleBinding"]
    assert crb["subjects"] == [SUBJECT]
    assert crb["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "pmem-csi-intel-com-reporter-stack",
    }
    roles = {o["metadata"]["namespace"]: o for o in objs if o["kind"] == "Role"}
    bindings = {o["metadata"]["namespace"]: o for o in objs if o["kind"] == "RoleBinding"}
    assert set(bindings) == set(roles) == {"drv", "drv2", "default"}
    for ns, binding in bindings.items():
        assert binding["subjects"] == [SUBJECT]
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": roles[ns]["metadata"]["name"],
        }
        assert binding["metadata"] == roles[ns]["metadata"]


def test_only_the_events_role_in_default_keeps_its_old_name() -> None:
    """The Events Role in ``default`` is the per-deployment layout's, updated in place under
    its old name; every other Role (a second driver namespace included) is new, under
    ``rbac_name``, so that moving to the stack's reporter only adds grants first."""
    roles = {o["metadata"]["namespace"]: o for o in all_objects(TWO) if o["kind"] == "Role"}
    assert {ns: r["metadata"]["name"] for ns, r in roles.items()} == {
        "drv": "pmem-csi-intel-com-reporter-stack",
        "drv2": "pmem-csi-intel-com-reporter-stack",
        "default": "pmem-csi-intel-com-reporter-events",
    }


def test_the_reporter_objects_carry_the_recommended_labels() -> None:
    """``app.kubernetes.io/name`` is ``pmem-csi`` as on every driver object (dashboards and
    ``kubectl get -l`` select the application by it), the component is ``reporter``."""
    for o in all_objects(TWO):
        labels = o["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "pmem-csi", o["kind"]
        assert labels["app.kubernetes.io/component"] == "reporter"
        assert labels["app.kubernetes.io/managed-by"] == "pmem-csi-pulumi"


def test_the_builders_defaults_are_the_configs_reporter_defaults() -> None:
    """Called without them, the builder uses the documented defaults of ``reporter.replicas``
    (2: one standby to take over the Lease) and ``reporter.logLevel`` (3)."""
    from pmem_components.config import Reporter

    defaults = Reporter()
    (dep,) = [
        o
        for o in build_reporter_objects([(NAMES, "drv")], "drv", "reg/r:1")
        if o["kind"] == "Deployment"
    ]
    assert dep["spec"]["replicas"] == defaults.replicas == 2
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--log-level") + 1] == str(defaults.log_level) == "3"


def test_a_reporter_serving_nothing_is_refused_saying_so() -> None:
    """A stack with no reporter-enabled deployment must deploy no reporter: the caller is told
    why rather than getting objects named after no deployment."""
    with pytest.raises(ValueError, match=r"^a reporter serves at least one deployment$"):
        build_reporter_objects([], "drv", "reg/r:1")
