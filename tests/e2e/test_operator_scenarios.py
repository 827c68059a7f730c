"""The PMEM-CSI operator's own e2e suite, mirrored (issue 10, items 8 and 6).

intel/pmem-csi at d01bc59, ``test/e2e/operator/deployment_api.go``, creates ``Deployment`` CRs
and checks what the operator made of them. Here the stack config takes the CR's place, ``pulumi
up`` the operator's reconcile, and the reporter the operator's status writes: one reporter
process per deployment here (a stand-in for the stack's one reporter, so that A's can be
stopped while B's runs), with the administrator's credentials, because the stack reporter's
RBAC grants exactly one Lease. Where the operator
restored state by itself, the Pulumi way is ``pulumi up --refresh`` after the reporter has made
the drift visible in the CR. "The operator's e2e scenarios, mirrored" in docs/faults.md maps every
scenario to a test, here or in the other e2e modules.

Item 6 (least privilege) is shown here too, with the stack reporter's own token (the
ServiceAccount named after A, the stack's first deployment) against the same stack: what it
cannot read or change, by real API calls and by the API server's own account of its rules
(SelfSubjectRulesReview). The checks are about behaviour, not the rule list. It serves A and
B, so it reads both drivers' objects (by label, cluster-wide: RBAC cannot limit a watch to
labels), but no Secret but their certificate Secrets, no CR it does not serve, and it writes
nothing but the served CRs' status, Events and its Lease.

Economy: the operator created one CR per scenario; here one stack serves every scenario, in
file order (pytest keeps it): deployment A with defaults and deployment B with explicit values
and its own CA, both with dotted names, each in its own namespace, both served by the stack's
reporter; a
third deployment C comes and goes for the conflict and removal scenarios.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from pulumi import automation as auto

from pmem_components import certs as certlib
from pmem_components import names
from pmem_components.config import DeploymentConfig
from pmem_components.manifests import bundle
from pmem_components.manifests.deployment_cr import build_spec
from reporter.kubeapi import RawApi
from tests.e2e.reporter_helpers import (
    REPORTER_IMAGE,
    ReporterProcess,
    condition,
    ensure_crd,
    token_kubeconfig,
)
from tests.e2e.test_program import (
    Cluster,
    dispose,
    is_subset,
    leftovers,
    make_stack,
    parsed,
    resource_changes,
    secret_data,
    stack_config,
)
from tests.e2e.waiting import wait_for
from tools import cluster
from tools import pulumi_stack as ps

pytestmark = pytest.mark.timeout(900)

STATUS_TIMEOUT = 90.0
CONDITIONS = ("CertsReady", "CertsVerified", "DriverDeployed")


# --------------------------------------------------------------------------------------------
# the shared stack


def _public(certs: certlib.DriverCertificates) -> dict[str, str]:
    return {
        "caCert": certs.ca_cert,
        "registryCert": certs.registry_cert,
        "nodeControllerCert": certs.node_controller_cert,
    }


def _keys(certs: certlib.DriverCertificates) -> dict[str, str]:
    return {"registryKey": certs.registry_key, "nodeControllerKey": certs.node_controller_key}


@dataclass
class Ops:
    """The stack, the raw deployments as configured now, their CA sets and reporters."""

    stack: auto.Stack
    api_client: Any
    kubeconfig: Path
    tmp: Path
    raws: dict[str, dict[str, Any]]
    certs: dict[str, certlib.DriverCertificates]  # provided sets by deployment key
    reporters: dict[str, ReporterProcess] = field(default_factory=dict)
    stopped: list[ReporterProcess] = field(default_factory=list)
    extra_namespaces: list[str] = field(default_factory=list)
    first_up: auto.UpResult | None = None

    def cfg(self, key: str) -> DeploymentConfig:
        certs = self.certs.get(key)
        return parsed(self.raws[key], _keys(certs) if certs else None)

    def write(self, *keys: str) -> None:
        """Write the stack config with deployments ``keys`` (their keys set as secrets)."""
        work = Path(self.stack.workspace.work_dir)
        ps.write_stack_config(work, self.stack.name, stack_config(*(self.raws[k] for k in keys)))
        for i, key in enumerate(keys):
            if key in self.certs:
                for setting, value in _keys(self.certs[key]).items():
                    path = f"pmem-csi:deployments[{i}].certificates.{setting}"
                    self.stack.set_config(path, auto.ConfigValue(value, secret=True), path=True)

    def token_client(self, key: str) -> Any:
        """An API client authenticated as the stack reporter's ServiceAccount only (named
        after ``key``, the stack's first deployment with the reporter)."""
        cfg = self.cfg(key)
        out = self.tmp / f"kubeconfig-{key}-{uuid.uuid4().hex[:4]}"
        token_kubeconfig(self.api_client, self.kubeconfig, cfg.names.reporter, cfg.namespace, out)
        return config.new_client_from_config(config_file=str(out))

    def start_reporter(self, key: str) -> ReporterProcess:
        cfg = self.cfg(key)
        n = len(self.stopped) + len(self.reporters)
        proc = ReporterProcess(
            self.kubeconfig,
            cfg.name,
            cfg.namespace,
            f"ops-{key}-{n}",
            self.tmp / f"reporter-{key}-{n}.log",
            resync_seconds=2.0,
        )
        self.reporters[key] = proc
        return proc

    def stop_reporter(self, key: str) -> None:
        proc = self.reporters.pop(key)
        proc.stop()
        self.stopped.append(proc)

    def cr(self, key: str) -> dict[str, Any]:
        return client.CustomObjectsApi(self.api_client).get_cluster_custom_object(
            names.CRD_GROUP, names.CRD_STORAGE_VERSION, names.CRD_PLURAL, self.cfg(key).name
        )

    def wait_running(self, key: str) -> dict[str, Any]:
        def running() -> dict[str, Any]:
            cr = self.cr(key)
            status = cr.get("status") or {}
            fresh = status.get("observedGeneration") == cr["metadata"]["generation"]
            return status if status.get("phase") == "Running" and fresh else {}

        return wait_for(running, STATUS_TIMEOUT, f"{key}: phase Running")

    def wait_modified(self, key: str, *named: str) -> dict[str, Any]:
        """``DriverDeployed`` False ``ObjectsModified`` naming each of ``named``
        (``Kind/name by manager``): the drift the reporter shows before ``up --refresh``."""

        def shown() -> dict[str, Any]:
            cond = condition(self.cr(key).get("status") or {}, "DriverDeployed")
            text = str(cond.get("message"))
            ok = cond.get("reason") == "ObjectsModified" and all(n in text for n in named)
            return cond if ok else {}

        return wait_for(shown, STATUS_TIMEOUT, f"{key}: DriverDeployed naming {named}")


def _up(stack: auto.Stack, what: str, **kwargs: Any) -> auto.UpResult:
    return stack.up(on_output=ps.printer(f"[{what}] "), **kwargs)


@pytest.fixture(scope="module")
def ops(
    pulumi_ready: dict[str, str],
    api_client: Any,
    local_cluster: Path,
    stacks_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Ops]:
    ensure_crd(RawApi(api_client))
    sfx = uuid.uuid4().hex[:6]
    reporter = {"image": REPORTER_IMAGE}
    raws = {
        # "with defaults": nothing but the name (dotted), the namespace and the reporter image.
        "a": {
            "name": f"a-{sfx}.test.deployment.example.org",
            "namespace": f"ops-a-{sfx}",
            "reporter": reporter,
        },
        # "with explicit values" (the operator's values) and "custom CA certificates".
        "b": {
            "name": f"b-{sfx}.test.deployment.example.org",
            "namespace": f"ops-b-{sfx}",
            "deviceMode": "direct",
            "imagePullPolicy": "Never",
            "image": "unexisting/pmem-csi-driver",
            "controllerResources": {"limits": {"cpu": "200m", "memory": "100Mi"}},
            "nodeResources": {"limits": {"cpu": "500m", "memory": "500Mi"}},
            "reporter": reporter,
        },
        # Comes with a conflicting object and goes again (no reporter: kept short).
        "c": {
            "name": f"c-{sfx}.test.deployment.example.org",
            "namespace": f"ops-c-{sfx}",
            "adoptNamespace": True,
            "reporter": {"enabled": False},
        },
    }
    certs = {"b": certlib.generate_driver_certificates()}
    raws["b"]["certificates"] = _public(certs["b"])
    stack = make_stack(stacks_dir, stack_config(raws["a"], raws["b"]))
    state = Ops(stack, api_client, local_cluster, tmp_path_factory.mktemp("ops"), raws, certs)
    try:
        state.write("a", "b")
        state.first_up = _up(stack, "ops up")
        for key in ("a", "b"):
            state.start_reporter(key)
        yield state
    finally:
        for proc in list(state.reporters.values()) + state.stopped:
            proc.stop()
            print(f"===== reporter {proc.identity} log (tail) =====")
            print(proc.log()[-4000:])
        dispose(stack)
        core = client.CoreV1Api(api_client)
        for ns in state.extra_namespaces:
            with contextlib.suppress(ApiException):
                core.delete_namespace(ns)
        for raw in raws.values():
            with contextlib.suppress(ApiException):
                core.delete_collection_namespaced_event(
                    names.CLUSTER_EVENT_NAMESPACE,
                    field_selector=f"involvedObject.name={raw['name']}",
                )


@pytest.fixture(scope="module")
def stacks_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ops-stacks")


@pytest.fixture(scope="module")
def kube(api_client: Any) -> Cluster:
    return Cluster(api_client)


def _as_built_problems(kube: Cluster, cfg: DeploymentConfig) -> list[str]:
    """Where the live objects of ``cfg`` differ from the builders' (Secrets, Lease aside; the
    reporter is the stack's, serving A and B: ``tests/e2e/test_reporter_stack.py``)."""
    problems: list[str] = []
    objs = bundle.build_deployment_objects(cfg)
    for obj in objs.all():
        if obj["kind"] in ("Secret", "Lease") or any(obj is r for r in objs.reporter):
            continue
        live = kube.get(obj)
        key = f"{obj['kind']}/{obj['metadata']['name']}"
        if live is None:
            problems.append(f"{key}: missing")
        else:
            problems += is_subset(obj, live, key)
    return problems


def _uids(kube: Cluster, cfg: DeploymentConfig) -> dict[str, str]:
    out = {}
    for obj in bundle.build_deployment_objects(cfg).all():
        live = kube.get(obj)
        out[f"{obj['kind']}/{obj['metadata']['name']}"] = live["metadata"]["uid"] if live else ""
    return out


def _container(workload: Any, name: str) -> Any:
    return next(c for c in workload.spec.template.spec.containers if c.name == name)


# --------------------------------------------------------------------------------------------
# Context("deployment")


def test_defaults_explicit_values_several_dotted_deployments_and_custom_ca(
    ops: Ops, kube: Cluster, api_client: Any
) -> None:
    """ "with defaults", "with explicit values", "shall allow multiple deployments", "shall
    support dots in the name", "shall be able to use custom CA certificates"."""
    assert ops.first_up is not None and ops.first_up.summary.result == "succeeded"
    apps = client.AppsV1Api(api_client)
    for key in ("a", "b"):
        cfg = ops.cfg(key)
        assert "." in cfg.name
        assert _as_built_problems(kube, cfg) == [], key
        status = ops.wait_running(key)
        assert [condition(status, c).get("status") for c in CONDITIONS] == ["True"] * 3, status
        ds = apps.read_namespaced_daemon_set_status(cfg.names.node_driver, cfg.namespace)
        assert ds.status.number_ready == cluster.DEFAULT_PMEM_NODES

    a, b = ops.cfg("a"), ops.cfg("b")
    # Defaults: the reference's images, lvm, 100 %, the default node selector.
    sts_a = apps.read_namespaced_stateful_set(a.names.controller_driver, a.namespace)
    driver_a = _container(sts_a, "pmem-driver")
    assert driver_a.image == "intel/pmem-csi-driver:canary"
    assert driver_a.image_pull_policy == "IfNotPresent"
    assert driver_a.resources.limits == {"cpu": "100m", "memory": "250Mi"}
    ds_a = apps.read_namespaced_daemon_set(a.names.node_driver, a.namespace)
    node_a = _container(ds_a, "pmem-driver").command
    assert "-deviceManager=lvm" in node_a and "-pmemPercentage=100" in node_a
    assert ds_a.spec.template.spec.node_selector == {"storage": "pmem"}

    # Explicit values reach the workloads.
    sts_b = apps.read_namespaced_stateful_set(b.names.controller_driver, b.namespace)
    ds_b = apps.read_namespaced_daemon_set(b.names.node_driver, b.namespace)
    assert _container(sts_b, "pmem-driver").resources.limits == {"cpu": "200m", "memory": "100Mi"}
    node_b = _container(ds_b, "pmem-driver")
    assert node_b.resources.limits == {"cpu": "500m", "memory": "500Mi"}
    assert node_b.image == "unexisting/pmem-csi-driver" and node_b.image_pull_policy == "Never"
    assert "-deviceManager=direct" in node_b.command

    # Custom CA: B's Secrets hold exactly the provided set, A's a generated one of its own.
    core = client.CoreV1Api(api_client)
    provided = ops.certs["b"]
    assert secret_data(core, b.names.registry_secret, b.namespace) == {
        "ca.crt": provided.ca_cert,
        "tls.crt": provided.registry_cert,
        "tls.key": provided.registry_key,
    }
    assert secret_data(core, a.names.registry_secret, a.namespace)["ca.crt"] != provided.ca_cert


def test_kubectl_get_lists_the_expected_fields(ops: Ops, kubectl: Callable[..., Any]) -> None:
    """ "get deployment shall list expected fields", with the phase the reporter wrote."""
    for key in ("a", "b"):
        ops.wait_running(key)
    rows = kubectl("get", "deployments.pmem-csi.intel.com", "--no-headers").stdout.splitlines()
    for key, mode, image in (
        ("a", "lvm", "intel/pmem-csi-driver:canary"),
        ("b", "direct", "unexisting/pmem-csi-driver"),
    ):
        cfg = ops.cfg(key)
        row = next(r for r in rows if r.split()[0] == cfg.name)
        pattern = rf"{re.escape(cfg.name)}\s+{mode}\s+.*\"storage\":\"pmem\".*\s+{re.escape(image)}"
        assert re.match(pattern + r"\s+Running\s+[0-9]+(s|m)", row), row


# --------------------------------------------------------------------------------------------
# item 6: the reporter's own credentials (A's reporter), against A and the other driver B

WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection", "*"}


def _status_of(call: Callable[[], Any]) -> int:
    try:
        call()
    except ApiException as exc:
        return int(exc.status)
    return 200


def test_reporter_credentials_cannot_read_other_secrets_or_change_any_spec(
    ops: Ops, api_client: Any
) -> None:
    a = ops.cfg("a")
    token = ops.token_client("a")
    core, apps = client.CoreV1Api(token), client.AppsV1Api(token)
    custom = client.CustomObjectsApi(token)
    admin_core = client.CoreV1Api(api_client)
    other = f"unrelated-{uuid.uuid4().hex[:4]}"
    admin_core.create_namespaced_secret(
        a.namespace, {"metadata": {"name": other}, "stringData": {"password": "hunter2"}}
    )
    try:
        # What it needs works (so the 403s below are about permissions, not a broken token).
        assert (
            # It watches the Secrets of its deployments' namespaces by label (list/watch).
            _status_of(
                lambda: core.list_namespaced_secret(
                    a.namespace, label_selector="app.kubernetes.io/part-of=pmem-csi"
                )
            )
            == 200
        )
        cr_args = (names.CRD_GROUP, names.CRD_STORAGE_VERSION, names.CRD_PLURAL, a.name)
        assert _status_of(lambda: custom.patch_cluster_custom_object_status(*cr_args, {})) == 200

        # Secrets: never a GET, and no list outside its deployments' namespaces (RBAC cannot
        # limit a list to labels: the driver namespaces' Secrets are the price of one label
        # watch per namespace, review of issue 16).
        assert _status_of(lambda: core.read_namespaced_secret(other, a.namespace)) == 403
        assert _status_of(lambda: core.list_namespaced_secret("kube-system")) == 403
        assert _status_of(lambda: core.list_secret_for_all_namespaces()) == 403
        assert _status_of(lambda: core.list_pod_for_all_namespaces()) == 403

        # No spec can be changed: the CR, the DaemonSet, the StatefulSet, a Service.
        spec_patch = {"spec": {"logLevel": 9}}
        assert _status_of(lambda: custom.patch_cluster_custom_object(*cr_args, spec_patch)) == 403
        cr = ops.cr("a")
        assert _status_of(lambda: custom.replace_cluster_custom_object(*cr_args, cr)) == 403
        template = {"spec": {"template": {"metadata": {"annotations": {"x": "y"}}}}}
        for patch in (
            lambda: apps.patch_namespaced_daemon_set(a.names.node_driver, a.namespace, template),
            lambda: apps.patch_namespaced_stateful_set(
                a.names.controller_driver, a.namespace, template
            ),
            lambda: apps.patch_namespaced_daemon_set_status(
                a.names.node_driver, a.namespace, {"status": {"numberReady": 0}}
            ),
            lambda: core.patch_namespaced_service(
                a.names.controller_service, a.namespace, {"spec": {"ports": []}}
            ),
            lambda: apps.delete_namespaced_daemon_set(a.names.node_driver, a.namespace),
        ):
            assert _status_of(patch) == 403
        # The objects to PUT back are read as the administrator: the reporter only lists and
        # watches workloads.
        admin_apps = client.AppsV1Api(api_client)
        ds = admin_apps.read_namespaced_daemon_set(a.names.node_driver, a.namespace)
        assert (
            _status_of(
                lambda: apps.replace_namespaced_daemon_set(a.names.node_driver, a.namespace, ds)
            )
            == 403
        )
        sts = admin_apps.read_namespaced_stateful_set(a.names.controller_driver, a.namespace)
        assert (
            _status_of(
                lambda: apps.replace_namespaced_stateful_set(
                    a.names.controller_driver, a.namespace, sts
                )
            )
            == 403
        )
        assert ops.cr("a")["spec"] == build_spec(a)  # nothing got through
    finally:
        admin_core.delete_namespaced_secret(other, a.namespace)


def test_reporter_credentials_cannot_read_secrets_or_crs_it_does_not_serve(ops: Ops) -> None:
    """The stack reporter serves A and B: B's namespace's Secrets only by list/watch (never a
    GET), no CR but the served ones, no other driver's status."""
    b = ops.cfg("b")
    token = ops.token_client("a")
    core = client.CoreV1Api(token)
    custom = client.CustomObjectsApi(token)
    stranger = f"not-served-{uuid.uuid4().hex[:4]}.example.org"
    cr_args = (names.CRD_GROUP, names.CRD_STORAGE_VERSION, names.CRD_PLURAL)
    calls = {
        "get B's registry Secret": lambda: core.read_namespaced_secret(
            b.names.registry_secret, b.namespace
        ),
        "get a CR it does not serve": lambda: custom.get_cluster_custom_object(*cr_args, stranger),
        "patch the status of a CR it does not serve": lambda: (
            custom.patch_cluster_custom_object_status(*cr_args, stranger, {})
        ),
    }
    assert {what: _status_of(call) for what, call in calls.items()} == {what: 403 for what in calls}
    # What it needs for B works: B's namespace's Secrets by label, B's CR status.
    assert (
        _status_of(
            lambda: core.list_namespaced_secret(
                b.namespace, label_selector="app.kubernetes.io/part-of=pmem-csi"
            )
        )
        == 200
    )
    assert (
        _status_of(lambda: custom.patch_cluster_custom_object_status(*cr_args, b.name, {})) == 200
    )
    # The API server's own answer agrees (SelfSubjectAccessReview as the reporter).
    authz = client.AuthorizationV1Api(token)
    for verb, group, resource, ns in (
        ("get", "", "secrets", b.namespace),
        ("update", "apps", "daemonsets", b.namespace),
        ("update", "apps", "daemonsets", ops.cfg("a").namespace),
    ):
        review = authz.create_self_subject_access_review(
            {
                "spec": {
                    "resourceAttributes": {
                        "verb": verb,
                        "group": group,
                        "resource": resource,
                        "namespace": ns,
                    }
                }
            }
        )
        assert review.status.allowed is False, (verb, resource, ns)


def test_reporter_credentials_cannot_change_cluster_scoped_objects(ops: Ops) -> None:
    """It reads CSIDrivers and cluster RBAC objects (by label, cluster-wide), changes none."""
    b = ops.cfg("b")
    token = ops.token_client("a")
    storage, rbac = client.StorageV1Api(token), client.RbacAuthorizationV1Api(token)
    calls = {
        "patch B's CSIDriver": lambda: storage.patch_csi_driver(
            b.name, {"metadata": {"labels": {"x": "y"}}}
        ),
        "delete B's ClusterRole": lambda: rbac.delete_cluster_role(
            b.names.provisioner_cluster_role
        ),
    }
    assert {what: _status_of(call) for what, call in calls.items()} == {what: 403 for what in calls}


def test_reporter_rules_write_nothing_but_its_status_events_and_lease(ops: Ops) -> None:
    """SelfSubjectRulesReview as A's reporter: every write it may make, in any namespace."""
    a, b = ops.cfg("a"), ops.cfg("b")
    authz = client.AuthorizationV1Api(ops.token_client("a"))
    allowed_writes = {"deployments/status", "events", "leases"}
    checked: set[str] = set()  # the rules the checks under the ifs below ran on
    namespaced = {"pods", "secrets", "services", "serviceaccounts", "daemonsets"}
    namespaced |= {"statefulsets", "roles", "rolebindings"}
    for ns in (a.namespace, b.namespace, names.CLUSTER_EVENT_NAMESPACE, "kube-system"):
        review = authz.create_self_subject_rules_review({"spec": {"namespace": ns}})
        for rule in review.status.resource_rules:
            groups = set(rule.api_groups or [])
            if groups <= {"authorization.k8s.io", "authentication.k8s.io"}:
                continue  # self-reviews, granted to every authenticated user
            assert "*" not in (rule.resources or []), rule
            if set(rule.verbs) & WRITE_VERBS:
                assert set(rule.resources) <= allowed_writes, (ns, rule)
                assert not set(rule.verbs) & {"delete", "deletecollection", "*"}, (ns, rule)
            if set(rule.resources) & namespaced:
                # Only in the served deployments' namespaces (a Role there, no ClusterRole:
                # review of issue 16), and reads only.
                assert ns in (a.namespace, b.namespace), (ns, rule)
                assert not set(rule.verbs) & WRITE_VERBS, (ns, rule)
            if "secrets" in rule.resources:
                checked.add("secrets")
                # By label: list/watch of the namespace's Secrets, never a GET.
                assert set(rule.verbs) == {"list", "watch"}, rule
            if "deployments/status" in rule.resources:
                checked.add("deployments/status")
                assert sorted(rule.resource_names) == sorted([a.name, b.name]), rule
            if "leases" in rule.resources and set(rule.verbs) & {"update"}:
                assert ns == a.namespace and rule.resource_names == [a.names.reporter], rule
    # The reporter needs both (its Secrets to check the certificates, its CRs' status).
    assert checked == {"secrets", "deployments/status"}, checked


# --------------------------------------------------------------------------------------------
# "driver deployment shall be running even after operator exit"


def test_driver_keeps_running_while_the_reporter_is_down(
    ops: Ops, kube: Cluster, api_client: Any
) -> None:
    a = ops.cfg("a")
    core, apps = client.CoreV1Api(api_client), client.AppsV1Api(api_client)

    def state() -> tuple[Any, ...]:
        pods = core.list_namespaced_pod(a.namespace).items
        ds = apps.read_namespaced_daemon_set(a.names.node_driver, a.namespace)
        sts = apps.read_namespaced_stateful_set(a.names.controller_driver, a.namespace)
        return (
            sorted((p.metadata.uid, p.status.phase) for p in pods),
            ds.metadata.generation,
            ds.status.number_ready,
            sts.metadata.generation,
            sts.status.ready_replicas,
        )

    ops.wait_running("a")
    before, uids = state(), _uids(kube, a)
    # It wrote (Running): counted just after the PATCH returned, so waited for.
    wait_for(
        lambda: ops.reporters["a"].metric("pmem_csi_reporter_status_writes_total") >= 1,
        30,
        "reporter a's status write counted",
    )
    ops.stop_reporter("a")
    # Several of the stopped reporter's resync periods (2 s) go by.
    time.sleep(8)
    assert state() == before
    assert before[2] == cluster.DEFAULT_PMEM_NODES and before[4] == 1
    assert _uids(kube, a) == uids
    assert ops.cr("a")["status"]["phase"] == "Running"  # nobody else rewrote it


# --------------------------------------------------------------------------------------------
# "shall recover from conflicts"


def test_a_conflicting_object_refuses_up_until_it_is_removed(
    ops: Ops, kube: Cluster, api_client: Any
) -> None:
    core = client.CoreV1Api(api_client)
    c = ops.cfg("c")
    core.create_namespace({"metadata": {"name": c.namespace}})
    ops.extra_namespaces.append(c.namespace)
    fake = {
        "metadata": {"name": c.names.registry_secret},
        "type": "kubernetes.io/tls",
        "stringData": {"ca.crt": "fake ca", "tls.key": "fake key", "tls.crt": "fake crt"},
    }
    core.create_namespaced_secret(c.namespace, fake)
    ops.write("a", "b", "c")
    with pytest.raises(auto.CommandError) as err:
        _up(ops.stack, "conflict up")
    text = str(err.value)
    assert f"Secret {c.namespace}/{c.names.registry_secret}" in text, text
    assert "pmem-csi:deployments[2].adoptExisting: true" in text, text
    assert kube.get(bundle.build_deployment_objects(c).deployment_cr) is None
    assert secret_data(core, c.names.registry_secret, c.namespace)["tls.key"] == "fake key"

    core.delete_namespaced_secret(c.names.registry_secret, c.namespace)
    result = _up(ops.stack, "after conflict up")
    assert result.summary.result == "succeeded"
    assert _as_built_problems(kube, c) == []
    data = secret_data(core, c.names.registry_secret, c.namespace)
    assert "BEGIN CERTIFICATE" in data["tls.crt"]


# --------------------------------------------------------------------------------------------
# "shall be able to edit running deployment" and Context("updating"): every field


def test_editing_every_field_with_and_without_the_reporter_running(
    ops: Ops, kube: Cluster, api_client: Any
) -> None:
    """All of ``testcases.UpdateTests``' mutators at once, on A (its reporter stopped since
    the previous test: "while stopped") and on B (its reporter running: "while running"),
    plus B's device mode switched back to lvm ("switch device mode", direct-to-lvm)."""
    assert "a" not in ops.reporters and "b" in ops.reporters
    new_certs = certlib.generate_driver_certificates()
    edits = {
        "logLevel": 6,
        "image": "test-driver-image",
        "imagePullPolicy": "Never",
        "provisionerImage": "test-provisioner",
        "nodeRegistrarImage": "still-no-such-registrar-image",
        "controllerResources": {"limits": {"cpu": "201m", "memory": "101Mi"}},
        "nodeResources": {"limits": {"cpu": "501m", "memory": "501Mi"}},
        # Still the three PMEM nodes (kwok labels them type=kwok), so pods keep running.
        "nodeSelector": {"storage": "pmem", "type": "kwok"},
        "pmemPercentage": 50,
        "labels": {"foo": "bar"},
        "kubeletDir": "/foo/bar",
    }
    ops.raws["a"] = {**ops.raws["a"], **edits, "certificates": _public(new_certs)}
    ops.certs["a"] = new_certs  # "TLS": A from generated to provided certificates
    ops.raws["b"] = {
        **{k: v for k, v in ops.raws["b"].items() if k != "certificates"},  # B: to generated
        **edits,
        "deviceMode": "lvm",
        "allowDeviceModeChange": True,
    }
    del ops.certs["b"]
    before = {k: _uids(kube, ops.cfg(k)) for k in ("a", "b")}
    ops.write("a", "b", "c")
    result = _up(ops.stack, "edit every field")
    assert result.summary.result == "succeeded"
    # Edited in place, the four Secrets too (new certificate material, Secrets mutable: issue
    # 15 item 6): nothing replaced; A's generated set gives way to the provided one while B
    # gets a generated one.
    changes = resource_changes(result.summary)
    assert (changes.get("replace"), changes.get("delete"), changes.get("create")) == (
        None,
        1,
        1,
    ), changes
    for key in ("a", "b"):
        after = _uids(kube, ops.cfg(key))
        assert {k: after[k] for k in before[key]} == before[key], key

    core, apps = client.CoreV1Api(api_client), client.AppsV1Api(api_client)
    for key in ("a", "b"):
        cfg = ops.cfg(key)
        assert _as_built_problems(kube, cfg) == [], key
        assert ops.cr(key)["spec"] == build_spec(cfg)
        ds = apps.read_namespaced_daemon_set(cfg.names.node_driver, cfg.namespace)
        node = _container(ds, "pmem-driver")
        assert (node.image, node.image_pull_policy) == ("test-driver-image", "Never")
        assert "-v=6" in node.command and "-pmemPercentage=50" in node.command
        assert "-deviceManager=lvm" in node.command
        assert node.resources.limits == {"cpu": "501m", "memory": "501Mi"}
        assert ds.spec.template.spec.node_selector == edits["nodeSelector"]
        assert ds.metadata.labels["foo"] == "bar"
        assert any(
            v.host_path and v.host_path.path.startswith("/foo/bar/")
            for v in ds.spec.template.spec.volumes
        )
        sts = apps.read_namespaced_stateful_set(cfg.names.controller_driver, cfg.namespace)
        assert _container(sts, "pmem-driver").resources.limits == {"cpu": "201m", "memory": "101Mi"}
        assert _container(sts, "external-provisioner").image == "test-provisioner"
        assert _container(ds, "driver-registrar").image == "still-no-such-registrar-image"
    assert secret_data(core, ops.cfg("a").names.node_secret, ops.cfg("a").namespace) == {
        "ca.crt": new_certs.ca_cert,
        "tls.crt": new_certs.node_controller_cert,
        "tls.key": new_certs.node_controller_key,
    }
    b = ops.cfg("b")
    assert secret_data(core, b.names.registry_secret, b.namespace)["ca.crt"] != (new_certs.ca_cert)
    # B's reporter followed while running; A's, started now, finds the edited driver healthy.
    ops.wait_running("b")
    ops.start_reporter("a")
    status = ops.wait_running("a")
    assert [condition(status, c).get("status") for c in CONDITIONS] == ["True"] * 3, status
    ops.raws["b"].pop("allowDeviceModeChange")
    ops.write("a", "b", "c")


# --------------------------------------------------------------------------------------------
# Context("recover"): "deleted sub-resources", all twelve of them


def test_deleted_sub_objects_show_in_the_cr_and_up_refresh_recreates_them(
    ops: Ops, kube: Cluster, api_client: Any
) -> None:
    a = ops.cfg("a")
    objs = bundle.build_deployment_objects(a)
    targets = [*objs.secrets, objs.csi_driver, *objs.controller, *objs.node]
    assert len(targets) == 12  # the operator's twelve scenarios
    ops.wait_running("a")
    for obj in targets:
        res = kube.resource(obj["apiVersion"], obj["kind"])
        res.delete(
            name=obj["metadata"]["name"],
            namespace=obj["metadata"].get("namespace"),
            body={"propagationPolicy": "Background"},
        )

    def all_named() -> dict[str, Any]:
        cond = condition(ops.cr("a").get("status") or {}, "DriverDeployed")
        message = cond.get("message", "")
        named = all(f"{o['kind']}/{o['metadata']['name']}" in message for o in targets)
        return cond if cond.get("status") == "False" and named else {}

    cond = wait_for(all_named, STATUS_TIMEOUT, "DriverDeployed False naming all twelve")
    assert "pulumi up --refresh" in cond["message"]
    assert ops.cr("a")["status"]["phase"] == "Failed"
    wait_for(lambda: all(kube.get(o) is None for o in targets), 60, "deletions done")

    result = _up(ops.stack, "up --refresh after deletions", refresh=True)
    assert result.summary.result == "succeeded"
    assert resource_changes(result.summary).get("create") == len(targets), result.summary
    assert _as_built_problems(kube, a) == []
    core = client.CoreV1Api(api_client)
    assert secret_data(core, a.names.registry_secret, a.namespace)["tls.key"] == (
        ops.certs["a"].registry_key
    )
    status = ops.wait_running("a")
    assert condition(status, "DriverDeployed")["status"] == "True"


# --------------------------------------------------------------------------------------------
# Context("recover"): "conflicting update" (modified by another field manager)


def _service_ports(core: client.CoreV1Api, name: str, ns: str) -> list[tuple[int, Any]]:
    svc = core.read_namespaced_service(name, ns)
    return [(p.port, p.target_port) for p in svc.spec.ports]


MALFORMED = ["malformed", "options"]
WORKLOADS = ("stateful_set", "daemon_set")


def _workload_name(cfg: DeploymentConfig, kind: str) -> str:
    return cfg.names.controller_driver if kind == "stateful_set" else cfg.names.node_driver


def _commands(apps: client.AppsV1Api, cfg: DeploymentConfig) -> dict[str, list[str]]:
    read = {k: getattr(apps, f"read_namespaced_{k}") for k in WORKLOADS}
    return {
        k: _container(read[k](_workload_name(cfg, k), cfg.namespace), "pmem-driver").command
        for k in WORKLOADS
    }


def _edit_command(
    how: str,
    kind: str,
    cfg: DeploymentConfig,
    apps: client.AppsV1Api,
    kubectl: Callable[..., Any],
    command: list[str],
) -> None:
    """Set the pmem-driver container's command of a workload, the way ``how`` names."""
    name, ns = _workload_name(cfg, kind), cfg.namespace
    obj = getattr(apps, f"read_namespaced_{kind}")(name, ns)
    if how == "update":  # the operator's test: client.Update, a PUT of the whole object
        _container(obj, "pmem-driver").command = command
        getattr(apps, f"replace_namespaced_{kind}")(name, ns, obj)
    elif how == "kubectl-json-patch":
        i = [c.name for c in obj.spec.template.spec.containers].index("pmem-driver")
        path = f"/spec/template/spec/containers/{i}/command"
        op = json.dumps([{"op": "replace", "path": path, "value": command}])
        kubectl("patch", kind.replace("_", ""), name, "-n", ns, "--type=json", "-p", op)
    else:  # kubectl patch (strategic merge: the container is merged by name)
        patch = {
            "spec": {
                "template": {"spec": {"containers": [{"name": "pmem-driver", "command": command}]}}
            }
        }
        kubectl(
            "patch",
            kind.replace("_", ""),
            name,
            "-n",
            ns,
            "--type=strategic",
            "-p",
            json.dumps(patch),
        )


def test_objects_modified_with_kubectl_patch_are_restored_by_up_refresh(
    ops: Ops, kubectl: Callable[..., Any], api_client: Any
) -> None:
    """ "controller", "node driver": the pmem-driver command made malformed (A: ``kubectl
    patch --type=json``, C: strategic merge); "metrics service", "controller service": ports
    replaced with 1111 (B). One ``pulumi up --refresh`` restores them all."""
    core, apps = client.CoreV1Api(api_client), client.AppsV1Api(api_client)
    a, b, c = ops.cfg("a"), ops.cfg("b"), ops.cfg("c")
    services = (b.names.controller_service, b.names.metrics_service)
    ports_before = {s: _service_ports(core, s, b.namespace) for s in services}
    commands_before = {k: _commands(apps, ops.cfg(k)) for k in ("a", "c")}
    ports = '{"spec":{"ports":[{"port":1111,"targetPort":1111}]}}'
    for svc in services:
        kubectl("patch", "service", svc, "-n", b.namespace, "--type=merge", "-p", ports)
        assert _service_ports(core, svc, b.namespace) == [(1111, 1111)]
    for cfg, how in ((a, "kubectl-json-patch"), (c, "kubectl-strategic-patch")):
        for kind in WORKLOADS:
            _edit_command(how, kind, cfg, apps, kubectl, MALFORMED)
        assert _commands(apps, cfg) == {k: MALFORMED for k in WORKLOADS}

    # The reporters (A, B; C has none) name each changed object and the client's manager.
    ops.wait_modified(
        "a",
        f"StatefulSet/{a.names.controller_driver} by kubectl-patch",
        f"DaemonSet/{a.names.node_driver} by kubectl-patch",
    )
    ops.wait_modified("b", *(f"Service/{svc} by kubectl-patch" for svc in services))
    assert ops.cr("b")["status"]["phase"] == "Failed"

    result = _up(ops.stack, "up --refresh after kubectl patches", refresh=True)
    assert result.summary.result == "succeeded"
    assert {s: _service_ports(core, s, b.namespace) for s in services} == ports_before
    assert {k: _commands(apps, ops.cfg(k)) for k in ("a", "c")} == commands_before
    for key in ("a", "b"):
        status = ops.wait_running(key)
        assert condition(status, "DriverDeployed")["reason"] == "AllObjectsExist"


def test_objects_modified_with_an_update_are_restored_by_up_refresh(
    ops: Ops, kubectl: Callable[..., Any], api_client: Any
) -> None:
    """ "controller", "node driver" exactly as the operator's test does it: a PUT of the
    whole object with the pmem-driver command made malformed (B), by a client whose field
    manager the Kubernetes provider does not know (the Python client's
    ``OpenAPI-Generator``). This used to fail with a server-side-apply conflict
    (pulumi/pulumi-kubernetes#2404); the program now takes those fields over before it
    applies (``takeOverFields``; every kind and client: ``tests/e2e/test_drift.py``).
    The original command is put back afterwards should the restore fail."""
    b = ops.cfg("b")
    apps = client.AppsV1Api(api_client)
    before = _commands(apps, b)
    try:
        for kind in WORKLOADS:
            _edit_command("update", kind, b, apps, kubectl, MALFORMED)
        assert _commands(apps, b) == {k: MALFORMED for k in WORKLOADS}
        ops.wait_modified(
            "b",
            f"StatefulSet/{b.names.controller_driver} by OpenAPI-Generator",
            f"DaemonSet/{b.names.node_driver} by OpenAPI-Generator",
        )
        lines: list[str] = []
        result = ops.stack.up(
            refresh=True,
            on_output=lambda line: (lines.append(line), ps.printer("[up --refresh] ")(line)),
        )
        assert result.summary.result == "succeeded"
        assert _commands(apps, b) == before
        text = "".join(lines)
        for kind in WORKLOADS:
            name = _workload_name(b, kind)
            kind_name = "StatefulSet" if kind == "stateful_set" else "DaemonSet"
            assert f"took over fields of {kind_name} {b.namespace}/{name} " in text
            live = getattr(apps, f"read_namespaced_{kind}")(name, b.namespace)
            managers = {e.manager for e in live.metadata.managed_fields if not e.subresource}
            assert not {m for m in managers if m.startswith("OpenAPI-Generator")}, managers
        status = ops.wait_running("b")
        assert condition(status, "DriverDeployed")["reason"] == "AllObjectsExist"
    finally:
        for kind in WORKLOADS:
            if _commands(apps, b)[kind] != before[kind]:
                _edit_command("update", kind, b, apps, kubectl, before[kind])


# --------------------------------------------------------------------------------------------
# removal (the operator's DeleteDeploymentCR after every scenario)


def test_removing_a_deployment_deletes_its_objects_only(ops: Ops, kube: Cluster) -> None:
    c = ops.cfg("c")
    others = {k: _uids(kube, ops.cfg(k)) for k in ("a", "b")}
    assert kube.get(bundle.build_deployment_objects(c).deployment_cr) is not None
    ops.write("a", "b")
    result = _up(ops.stack, "remove c")
    assert result.summary.result == "succeeded"
    assert leftovers(kube, c) == []
    assert {k: _uids(kube, ops.cfg(k)) for k in ("a", "b")} == others
