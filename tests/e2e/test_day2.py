"""Day-2 operations end to end: what an administrator does to a running stack, and that
nothing is lost (the real engine and provider against the local cluster).

Each scenario is one stack that the tests of a section change step by step, in file order
(pytest keeps it), as docs/day2.md describes:

* Namespaces and the CRD belong to the stack: an existing namespace is adopted only when
  asked; removing the deployment that named a shared namespace first leaves the namespace
  and the other deployment untouched (same uids, resourceVersions and pods); a device mode
  or namespace change is refused until allowed, and the allowed reinstall never runs two
  node drivers at once; ``manageCrd: false`` and ``destroy`` keep the CRD and other CRs.
* Certificates: renewal before expiry, rotation, provided <-> generated, and pods that roll
  whenever the material changes (on the issue-15 section's stack, see there).
* Two instances of the component through two explicit providers in one program.
* Migration from the operator: objects as the operator creates them are refused with the
  next step, the old CR is removed with ``--cascade=orphan``, and ``pulumi up`` adopts them.
* Issue 15 (one stack for the section's guards): patches that would replace an object,
  rename/removal with volumes, a move without await, a namespace still used, the
  certificate test above, then the device-mode guard with the CR and the CRD gone.

Every driver name here is unique to the run and the reporter is disabled (it is tested in
test_reporter.py), which keeps each ``pulumi up`` short.
"""

from __future__ import annotations

import datetime as dt
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import pytest
from cryptography import x509
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException
from pulumi import automation as auto

from pmem_components import certs as certlib
from pmem_components import names
from pmem_components.config import DeploymentConfig, load_config
from pmem_components.manifests import bundle
from tests.e2e.test_program import (
    Cluster,
    _write_config,
    dispose,
    make_stack,
    resource_changes,
    secret_data,
    up,
)
from tests.e2e.waiting import wait_for

pytestmark = pytest.mark.timeout(900)

CR_API = f"{names.CRD_GROUP}/{names.CRD_STORAGE_VERSION}"
NO_REPORTER = {"enabled": False}


def suffix() -> str:
    return uuid.uuid4().hex[:6]


def cfg_of(raw: dict[str, Any]) -> DeploymentConfig:
    return load_config({"deployments": [raw]}, check_certificates=False).deployments[0]


def snapshot(kube: Cluster, core: client.CoreV1Api, cfg: DeploymentConfig) -> dict[str, Any]:
    """uid and resourceVersion of every object of ``cfg``, plus its pods' uids."""
    out: dict[str, Any] = {}
    for obj in bundle.build_deployment_objects(cfg, create_namespace=False).all():
        live = kube.get(obj)
        assert live is not None, f"{obj['kind']} {obj['metadata']['name']} missing"
        out[f"{obj['kind']}/{obj['metadata']['name']}"] = (
            live["metadata"]["uid"],
            live["metadata"]["resourceVersion"],
        )
    out["pods"] = pod_uids(core, cfg)  # those not going away
    assert out["pods"], "the deployment has pods"
    return out


def settled_snapshot(kube: Cluster, core: client.CoreV1Api, cfg: DeploymentConfig) -> Any:
    """:func:`snapshot` once ``cfg`` is rolled out and two snapshots a second apart agree
    (after an update that rolled the pods, status writes and pod deletions trail it)."""
    last: list[Any] = [None]

    def steady() -> Any:
        if not _rolled_out(kube, cfg):
            return None
        now = snapshot(kube, core, cfg)
        same, last[0] = now == last[0], now
        return now if same else None

    return wait_for(steady, 120, f"{cfg.name} settled", interval=1.0)


def pod_uids(core: client.CoreV1Api, cfg: DeploymentConfig) -> list[str]:
    selector = ",".join(f"{k}={v}" for k, v in cfg.names.selector_labels().items())
    return sorted(
        p.metadata.uid
        for p in core.list_namespaced_pod(cfg.namespace, label_selector=selector).items
        if p.metadata.deletion_timestamp is None
    )


def failed_up(stack: auto.Stack) -> str:
    with pytest.raises(auto.CommandError) as err:
        stack.up()
    return str(err.value)


def create_cr(custom: client.CustomObjectsApi, name: str, annotations: dict[str, str]) -> Any:
    body = {
        "apiVersion": CR_API,
        "kind": names.CRD_KIND,
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"deviceMode": "lvm", "nodeSelector": {"storage": "pmem"}},
    }
    return custom.create_cluster_custom_object(
        names.CRD_GROUP, names.CRD_STORAGE_VERSION, names.CRD_PLURAL, body
    )


def get_cr(custom: client.CustomObjectsApi, name: str) -> dict[str, Any] | None:
    try:
        return custom.get_cluster_custom_object(
            names.CRD_GROUP, names.CRD_STORAGE_VERSION, names.CRD_PLURAL, name
        )
    except ApiException as err:
        if err.status == 404:
            return None
        raise


def delete_quietly(fn: Callable[..., Any], *args: Any) -> None:
    try:
        fn(*args)
    except ApiException as err:
        if err.status != 404:
            raise


class NodeDriverWatch:
    """Counts, from a watch, how many node DaemonSets of one driver exist at any moment.

    Watch events come in the API server's order (resourceVersion), so the maximum is exact,
    not sampled: if the old DaemonSet were deleted after the new one was created, the count
    would reach 2.
    """

    def __init__(self, api_client: Any, *instances: str) -> None:
        self.apps = client.AppsV1Api(api_client)
        self.selector = (
            f"{names.LABEL_INSTANCE} in ({','.join(instances)}),{names.LABEL_COMPONENT}=node"
        )
        self.live: set[str] = set()
        self.max_live = 0
        self.events: list[str] = []
        self.stopped = False
        self.error: Exception | None = None
        self._watch = watch.Watch()
        listed = self.apps.list_daemon_set_for_all_namespaces(label_selector=self.selector)
        self.live = {f"{d.metadata.namespace}/{d.metadata.name}" for d in listed.items}
        self.max_live = len(self.live)
        self._rv = listed.metadata.resource_version
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for event in self._watch.stream(
                self.apps.list_daemon_set_for_all_namespaces,
                label_selector=self.selector,
                resource_version=self._rv,
                timeout_seconds=600,
            ):
                obj = event["object"]
                key = f"{obj.metadata.namespace}/{obj.metadata.name}"
                self.events.append(f"{event['type']} {key}")
                if event["type"] == "ADDED":
                    self.live.add(key)
                elif event["type"] == "DELETED":
                    self.live.discard(key)
                self.max_live = max(self.max_live, len(self.live))
        except Exception as err:  # a watch that broke early would hide events
            if not self.stopped:
                self.error = err

    def stop(self) -> None:
        self.stopped = True
        self._watch.stop()


def up_with_one_node_driver(
    stack: auto.Stack, what: str, api_client: Any, *hyphened: str
) -> NodeDriverWatch:
    """``up`` of ``stack`` under a :class:`NodeDriverWatch` of the drivers ``hyphened``: the
    update succeeded, the watch saw it, and never more than one node driver ran."""
    watcher = NodeDriverWatch(api_client, *hyphened)
    try:
        result = up(stack, what)
    finally:
        watcher.stop()
    assert result.summary.result == "succeeded"
    assert watcher.error is None, watcher.error
    assert watcher.events, "the watch saw the update"
    assert watcher.max_live == 1, watcher.events
    return watcher


# --------------------------------------------------------------------------------------------
# fixtures


@pytest.fixture(scope="module")
def kube(api_client: Any) -> Cluster:
    return Cluster(api_client)


@pytest.fixture(scope="module")
def stacks_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("day2")


@dataclass
class Shared:
    """The namespace scenario: one stack, two deployments in a namespace an admin made."""

    stack: auto.Stack
    namespace: str
    other_namespace: str
    a: dict[str, Any]
    b: dict[str, Any]
    other_cr: str
    notes: dict[str, Any] = field(default_factory=dict)

    def config(self, *deps: dict[str, Any], **top: Any) -> dict[str, Any]:
        out = {"pmem-csi:manageCrd": True, "pmem-csi:deployments": list(deps)}
        out.update({f"pmem-csi:{k}": v for k, v in top.items()})
        return out


@pytest.fixture(scope="module")
def shared(
    pulumi_ready: dict[str, str], stacks_dir: Path, api_client: Any
) -> Iterator[Shared]:
    core = client.CoreV1Api(api_client)
    custom = client.CustomObjectsApi(api_client)
    sfx = suffix()
    ns, other_ns = f"day2-{sfx}", f"day2-{sfx}-moved"
    # The second deployment's name is as long as validation allows (41 characters): its
    # controller pod's controller-revision-hash label is then exactly 63 characters.
    b_name = f"b-{sfx}.{'x' * (41 - len(sfx) - 3 - 17)}.pmem-csi.example"
    assert len(b_name) == 41
    a = {"name": f"a-{sfx}.pmem-csi.example", "namespace": ns, "reporter": NO_REPORTER}
    # A patch selecting the CR by apiVersion and kind (the reporter's apps/v1 Deployment has
    # the same kind).
    cr_patch = {
        "kind": "Deployment",
        "apiVersion": CR_API,
        "mergePatch": {"metadata": {"annotations": {"e2e.example.com/patched": "cr"}}},
    }
    b = {"name": b_name, "namespace": ns, "reporter": NO_REPORTER, "patches": [cr_patch]}
    # The administrator's namespace, with a quota the stack must not lose.
    core.create_namespace({"metadata": {"name": ns}})
    core.create_namespaced_resource_quota(
        ns, {"metadata": {"name": "admin-quota"}, "spec": {"hard": {"pods": "50"}}}
    )
    stack = make_stack(stacks_dir, {"pmem-csi:deployments": [a, b]})
    state = Shared(stack, ns, other_ns, a, b, f"other-{sfx}.pmem-csi.example")
    try:
        yield state
    finally:
        try:
            dispose(stack)
        finally:
            for name in (ns, other_ns):
                delete_quietly(core.delete_namespace, name)
            delete_quietly(
                custom.delete_cluster_custom_object,
                names.CRD_GROUP,
                names.CRD_STORAGE_VERSION,
                names.CRD_PLURAL,
                state.other_cr,
            )


def _write(shared: Shared, *deps: dict[str, Any], **top: Any) -> None:
    _write_config(shared.stack, shared.config(*deps, **top))


# --------------------------------------------------------------------------------------------
# namespaces and the CRD belong to the stack


def test_existing_namespace_is_adopted_only_when_asked(
    shared: Shared, kube: Cluster, api_client: Any
) -> None:
    core = client.CoreV1Api(api_client)
    ns_uid = core.read_namespace(shared.namespace).metadata.uid
    _write(shared, shared.a, shared.b)
    text = failed_up(shared.stack)
    assert f"pmem-csi:deployments[0].createNamespace: namespace '{shared.namespace}'" in text
    assert "pmem-csi:deployments[0].adoptNamespace: true" in text
    assert get_cr(client.CustomObjectsApi(api_client), shared.a["name"]) is None
    assert kube.get(bundle.build_deployment_objects(cfg_of(shared.a)).node[0]) is None

    shared.a = {**shared.a, "adoptNamespace": True}
    _write(shared, shared.a, shared.b)
    assert up(shared.stack, "adopt namespace").summary.result == "succeeded"
    live = core.read_namespace(shared.namespace)
    assert live.metadata.uid == ns_uid
    assert live.metadata.annotations[names.STACK_ANNOTATION].endswith(f"/{shared.stack.name}")
    assert core.read_namespaced_resource_quota("admin-quota", shared.namespace)
    # Port names are unique in every pod the API server accepted (no duplicate warnings).
    b = cfg_of(shared.b)
    pod = core.read_namespaced_pod(f"{b.names.controller_driver}-0", b.namespace)
    ports = [p.name for c in pod.spec.containers for p in c.ports or []]
    assert sorted(ports) == ["metrics", "prov-metrics"]
    assert len(pod.metadata.labels["controller-revision-hash"]) <= 63
    cr = get_cr(client.CustomObjectsApi(api_client), b.name)
    assert cr is not None and cr["metadata"]["annotations"]["e2e.example.com/patched"] == "cr"


def test_removing_the_first_deployment_keeps_the_namespace_and_the_other_deployment(
    shared: Shared, kube: Cluster, api_client: Any
) -> None:
    core = client.CoreV1Api(api_client)
    custom = client.CustomObjectsApi(api_client)
    a, b = cfg_of(shared.a), cfg_of(shared.b)
    ns_uid = core.read_namespace(shared.namespace).metadata.uid
    before = snapshot(kube, core, b)
    # Another stack's CR, to show later that nothing here touches it.
    create_cr(custom, shared.other_cr, {names.STACK_ANNOTATION: "pmem-csi-pulumi/other"})

    _write(shared, shared.b)
    result = up(shared.stack, "remove first deployment")
    assert result.summary.result == "succeeded"
    assert resource_changes(result.summary).get("delete", 0) > 0
    assert snapshot(kube, core, b) == before
    assert core.read_namespace(shared.namespace).metadata.uid == ns_uid
    assert core.read_namespaced_resource_quota("admin-quota", shared.namespace)
    gone = [
        o for o in bundle.build_deployment_objects(a).all() if o["kind"] != "Namespace"
    ]
    assert [o["metadata"]["name"] for o in gone if kube.get(o) is not None] == []


def test_device_mode_and_namespace_changes_are_refused_until_allowed(
    shared: Shared, kube: Cluster, api_client: Any
) -> None:
    core = client.CoreV1Api(api_client)
    b = cfg_of(shared.b)
    before = snapshot(kube, core, b)

    _write(shared, {**shared.b, "deviceMode": "direct"})
    text = failed_up(shared.stack)
    assert "pmem-csi:deployments[0].deviceMode: changing it from 'lvm' to 'direct'" in text
    assert "allowDeviceModeChange: true" in text

    _write(shared, {**shared.b, "namespace": shared.other_namespace})
    text = failed_up(shared.stack)
    assert f"pmem-csi:deployments[0].namespace: changing it from '{shared.namespace}'" in text
    assert "pmem-csi:deployments[0].allowReinstall: true" in text

    # With the reporter on, `kind: Deployment` alone would select its Deployment and the CR.
    ambiguous = {
        **shared.b,
        "reporter": {"image": "registry.example/pmem-csi-reporter:e2e"},
        "patches": [{"kind": "Deployment", "mergePatch": {"metadata": {"labels": {"x": "y"}}}}],
    }
    _write(shared, ambiguous)
    text = failed_up(shared.stack)
    assert "pmem-csi:deployments[0].patches[0]: kind 'Deployment' selects objects of several" in (
        text
    )
    assert "add apiVersion to choose" in text

    renamed = {**shared.b, "name": f"r{shared.b['name'][1:]}"}
    _write(shared, renamed)
    text = failed_up(shared.stack)
    assert f"pmem-csi:deployments[0].renamedFrom: '{b.name}'" in text
    assert snapshot(kube, core, b) == before  # refused before anything changed


def test_allowed_reinstall_never_runs_two_node_drivers(
    shared: Shared, kube: Cluster, api_client: Any
) -> None:
    core = client.CoreV1Api(api_client)
    b = cfg_of(shared.b)
    ca_before = secret_data(core, b.names.registry_secret, b.namespace)["ca.crt"]
    csi_uid = kube.get(bundle.build_deployment_objects(b).csi_driver)["metadata"]["uid"]
    moved = {**shared.b, "namespace": shared.other_namespace, "allowReinstall": True}
    _write(shared, moved)
    watcher = up_with_one_node_driver(
        shared.stack, "reinstall in another namespace", api_client, b.names.hyphened
    )
    new = cfg_of(moved)
    assert f"ADDED {new.namespace}/{new.names.node_driver}" in watcher.events
    assert kube.get(bundle.build_deployment_objects(b).node[0]) is None
    assert kube.get(bundle.build_deployment_objects(new).node[0]) is not None
    # The same certificates moved along (the generated set is kept), the CSIDriver too.
    assert secret_data(core, new.names.registry_secret, new.namespace)["ca.crt"] == ca_before
    assert kube.get(bundle.build_deployment_objects(new).csi_driver)["metadata"]["uid"] == (
        csi_uid
    )
    # The old namespace stays (kept on delete), with the administrator's quota.
    assert core.read_namespaced_resource_quota("admin-quota", shared.namespace)
    shared.b = {k: v for k, v in moved.items() if k != "allowReinstall"}


def test_allowed_rename_replaces_the_driver_without_overlap(
    shared: Shared, kube: Cluster, api_client: Any
) -> None:
    core = client.CoreV1Api(api_client)
    custom = client.CustomObjectsApi(api_client)
    old = cfg_of(shared.b)
    renamed = {**shared.b, "name": f"r{shared.b['name'][1:]}", "renamedFrom": old.name}
    new = cfg_of(renamed)
    ca_before = secret_data(core, old.names.registry_secret, old.namespace)["ca.crt"]
    _write(shared, renamed)
    watcher = up_with_one_node_driver(
        shared.stack, "rename", api_client, old.names.hyphened, new.names.hyphened
    )
    assert f"ADDED {new.namespace}/{new.names.node_driver}" in watcher.events
    assert get_cr(custom, old.name) is None and get_cr(custom, new.name) is not None
    for obj in bundle.build_deployment_objects(old, create_namespace=False).all():
        assert kube.get(obj) is None, f"{obj['kind']} {obj['metadata']['name']} left behind"
    # The generated certificate set moved along with the deployment.
    assert secret_data(core, new.names.registry_secret, new.namespace)["ca.crt"] == ca_before
    shared.b = {k: v for k, v in renamed.items() if k != "renamedFrom"}


def test_upgrade_manage_crd_false_and_destroy_keep_the_crd_and_other_crs(
    shared: Shared, kube: Cluster, api_client: Any
) -> None:
    ext = client.ApiextensionsV1Api(api_client)
    custom = client.CustomObjectsApi(api_client)
    core = client.CoreV1Api(api_client)
    b = cfg_of(shared.b)
    crd_uid = ext.read_custom_resource_definition(names.CRD_NAME).metadata.uid

    ds_obj = bundle.build_deployment_objects(b).node[0]
    ds_uid = kube.get(ds_obj)["metadata"]["uid"]
    pods_before = pod_uids(core, b)
    # An upgrade (new driver image) and an allowed device mode change in the same update:
    # the DaemonSet rolls in place (one pod per node at a time), nothing is re-created.
    upgraded = {
        **shared.b,
        "image": "intel/pmem-csi-driver:v1.0.0",
        "deviceMode": "direct",
        "allowDeviceModeChange": True,
    }
    _write(shared, upgraded, manageCrd=False)
    assert up(shared.stack, "manageCrd false + upgrade").summary.result == "succeeded"
    ds = kube.get(ds_obj)
    assert ds["metadata"]["uid"] == ds_uid
    images = {c["image"] for c in ds["spec"]["template"]["spec"]["containers"]}
    assert "intel/pmem-csi-driver:v1.0.0" in images
    driver = ds["spec"]["template"]["spec"]["containers"][0]
    assert "-deviceManager=direct" in driver["command"]
    assert not set(pod_uids(core, b)) & set(pods_before), "the driver pods rolled"
    assert ext.read_custom_resource_definition(names.CRD_NAME).metadata.uid == crd_uid
    assert get_cr(custom, b.name) is not None
    assert get_cr(custom, shared.other_cr) is not None

    result = shared.stack.destroy()
    assert result.summary.result == "succeeded"
    assert ext.read_custom_resource_definition(names.CRD_NAME).metadata.uid == crd_uid
    assert get_cr(custom, shared.other_cr) is not None
    assert get_cr(custom, b.name) is None
    for ns in (shared.namespace, shared.other_namespace):
        assert core.read_namespace(ns).status.phase == "Active"
    assert core.read_namespaced_resource_quota("admin-quota", shared.namespace)


# --------------------------------------------------------------------------------------------
# certificates (the test runs on the issue-15 section's stack, below, before its last test)


def _cert(pem: str) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem.encode())


def _fingerprint(kube: Cluster, cfg: DeploymentConfig) -> str:
    ds = kube.get(bundle.build_deployment_objects(cfg).node[0])
    assert ds is not None
    return ds["spec"]["template"]["metadata"]["annotations"][bundle.CERTIFICATES_HASH_ANNOTATION]


# --------------------------------------------------------------------------------------------
# the component as a library: two instances, two providers


def test_two_instances_through_two_providers_in_one_program(
    pulumi_ready: dict[str, str],
    pulumi_stack: Callable[..., auto.Stack],
    local_cluster: Path,
    kube: Cluster,
) -> None:
    import pulumi_kubernetes as k8s

    from pmem_components import PmemCsiDeployment
    from pmem_components.components import PmemCsiDeploymentArgs

    sfx = suffix()
    configs = {
        label: DeploymentConfig(
            name=f"{label}-{sfx}.pmem-csi.example",
            namespace=f"day2-{sfx}-{label}",
            reporter={"enabled": False},
        )
        for label in ("east", "west")
    }

    def program() -> None:
        for label, cfg in configs.items():
            provider = k8s.Provider(f"cluster-{label}", kubeconfig=str(local_cluster))
            PmemCsiDeployment(
                f"pmem-{label}",
                PmemCsiDeploymentArgs(cfg, retain_namespace=False),
                pulumi.ResourceOptions(provider=provider),
            )

    stack = pulumi_stack(program)
    assert up(stack, "two providers").summary.result == "succeeded"
    resources = stack.export_stack().deployment["resources"]
    for label, cfg in configs.items():
        for obj in bundle.build_deployment_objects(cfg).all():
            assert kube.get(obj) is not None, (label, obj["kind"], obj["metadata"]["name"])
        ds_urn_end = f"::pmem-{label}:{cfg.namespace}/{cfg.names.node_driver}"
        (ds,) = [r for r in resources if r["urn"].endswith(ds_urn_end)]
        assert f"::cluster-{label}::" in ds["provider"]


# --------------------------------------------------------------------------------------------
# migration from the operator


def _as_the_operator_creates(
    cfg: DeploymentConfig, owner: dict[str, Any]
) -> list[dict[str, Any]]:
    """The deployment's objects with the operator's names, without this project's
    managed-by label and owned by the operator's CR (ownerReferences, as it set them)."""
    reference = {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    objs = []
    for obj in bundle.build_deployment_objects(cfg, create_namespace=False).all():
        if obj["kind"] == names.CRD_KIND and obj["apiVersion"] == CR_API:
            continue
        meta = obj["metadata"]
        meta["labels"] = {
            k: v for k, v in meta.get("labels", {}).items() if k != names.LABEL_MANAGED_BY
        }
        meta["ownerReferences"] = [reference]
        objs.append(obj)
    return objs


def test_migration_from_the_operator(
    pulumi_ready: dict[str, str],
    stacks_dir: Path,
    api_client: Any,
    kube: Cluster,
    kubectl: Callable[..., Any],
) -> None:
    core = client.CoreV1Api(api_client)
    custom = client.CustomObjectsApi(api_client)
    sfx = suffix()
    raw = {"name": f"op-{sfx}.pmem-csi.example", "namespace": f"day2-{sfx}-op"}
    raw["reporter"] = NO_REPORTER
    cfg = cfg_of(raw)
    core.create_namespace({"metadata": {"name": cfg.namespace}})
    stack = make_stack(
        stacks_dir,
        {"pmem-csi:manageCrd": False, "pmem-csi:deployments": [raw]},
    )
    try:
        old_cr = create_cr(custom, cfg.name, {})
        for obj in _as_the_operator_creates(cfg, old_cr):
            kube.resource(obj["apiVersion"], obj["kind"]).create(
                body=obj, namespace=obj["metadata"].get("namespace"),
                field_manager="pmem-csi-operator",
            )  # fmt: skip
        node_ds = bundle.build_deployment_objects(cfg).node[0]
        ds_uid = kube.get(node_ds)["metadata"]["uid"]

        text = failed_up(stack)
        assert f"DaemonSet {cfg.namespace}/{cfg.names.node_driver}" in text
        assert "belong to the PMEM-CSI operator" in text
        command = f"kubectl delete deployments.pmem-csi.intel.com {cfg.name} --cascade=orphan"
        assert command in text
        assert kube.get(node_ds)["metadata"]["uid"] == ds_uid  # refused before any change

        # The runbook's step: remove the old CR, orphaning (not deleting) its objects.
        kubectl("delete", f"deployments.{names.CRD_GROUP}", cfg.name, "--cascade=orphan")
        wait_for(
            lambda: get_cr(custom, cfg.name) is None
            and not kube.get(node_ds)["metadata"].get("ownerReferences"),
            60,
            "old CR gone and ownerReferences removed by the garbage collector",
        )

        _write_config(
            stack,
            {
                "pmem-csi:manageCrd": False,
                "pmem-csi:retainNamespaces": False,
                "pmem-csi:deployments": [{**raw, "adoptExisting": True, "adoptNamespace": True}],
            },
        )
        assert up(stack, "adopt the operator's objects").summary.result == "succeeded"
        live_ds = kube.get(node_ds)
        assert live_ds["metadata"]["uid"] == ds_uid, "adopted, not re-created"
        assert live_ds["metadata"]["labels"][names.LABEL_MANAGED_BY] == names.MANAGED_BY
        for obj in bundle.build_deployment_objects(cfg, create_namespace=False).all():
            live = kube.get(obj)
            assert live is not None and not live["metadata"].get("ownerReferences"), obj
        cr = get_cr(custom, cfg.name)
        assert cr is not None and cr["metadata"]["annotations"][names.STACK_ANNOTATION]
    finally:
        dispose(stack)
        delete_quietly(core.delete_namespace, cfg.namespace)
        for obj in bundle.build_deployment_objects(cfg).all():
            if not obj["metadata"].get("namespace") and kube.get(obj) is not None:
                kube.resource(obj["apiVersion"], obj["kind"]).delete(name=obj["metadata"]["name"])


# --------------------------------------------------------------------------------------------
# stacks made before namespaces moved to stack level


def test_a_stack_from_before_keeps_its_namespace(
    pulumi_ready: dict[str, str], stacks_dir: Path, api_client: Any
) -> None:
    """The namespace used to be a child of the first deployment's component. The upgraded
    program registers it at stack level with an alias to that old URN, so the engine moves it
    in the state instead of creating one and deleting the old one (and with it everything in
    the namespace)."""
    import pulumi_kubernetes as k8s

    from pmem_components.components import COMPONENT_TYPE
    from pmem_components.manifests import namespace as ns_builder
    from pmem_components.program import main as program
    from tools import pulumi_stack as ps

    core = client.CoreV1Api(api_client)
    sfx = suffix()
    raw = {"name": f"old-{sfx}.pmem-csi.example", "namespace": f"day2-{sfx}-old"}
    raw["reporter"] = NO_REPORTER
    cfg = cfg_of(raw)

    def old_layout() -> None:
        parent = pulumi.ComponentResource(COMPONENT_TYPE, cfg.name, None, None)
        ns = ns_builder.build_namespace(cfg)
        k8s.core.v1.Namespace(
            cfg.namespace, metadata=ns["metadata"], opts=pulumi.ResourceOptions(parent=parent)
        )

    config = {
        "pmem-csi:manageCrd": False,
        "pmem-csi:retainNamespaces": False,
        "pmem-csi:deployments": [raw],
    }
    name = f"o{sfx}"
    old = ps.select_stack(name, old_layout, stacks_dir / name, config)
    try:
        assert up(old, "old layout").summary.result == "succeeded"
        uid = core.read_namespace(cfg.namespace).metadata.uid
        new = ps.select_stack(name, program, stacks_dir / name, config)
        result = up(new, "upgraded program")
        assert result.summary.result == "succeeded"
        assert "delete" not in resource_changes(result.summary)
        assert core.read_namespace(cfg.namespace).metadata.uid == uid
        resources = new.export_stack().deployment["resources"]
        (ns_state,) = [r for r in resources if r["type"] == "kubernetes:core/v1:Namespace"]
        assert ns_state["urn"].endswith(f"::kubernetes:core/v1:Namespace::{cfg.namespace}")
        assert COMPONENT_TYPE not in ns_state["urn"]
    finally:
        dispose(old)
        delete_quietly(core.delete_namespace, cfg.namespace)


# --------------------------------------------------------------------------------------------
# volumes, the running device mode, awaited deletes, namespaces in use, patches (issue 15)
#
# kwok nodes run no driver, so the volumes are created as a driver and the kubelet would
# leave them: a PersistentVolume and a VolumeAttachment naming the CSI driver, and a
# StorageClass whose provisioner it is.
#
# One stack (``lived``) serves the section's guards, in file order, as one administrator's
# stack over its life: each test starts from what the one before left (said in its docstring)
# and records in ``lived`` what it changed. Every guard is a preflight/validation of the next
# update against the live objects, so a driver deployed by an earlier update of the same stack
# exercises it exactly as a fresh stack's first update does; the test that deletes the CR and
# the CRD by hand comes last.


@pytest.fixture
def crd_present(api_client: Any) -> None:
    """The CRD, for stacks with ``manageCrd: false`` (created unless there; never deleted)."""
    from reporter.kubeapi import RawApi
    from tests.e2e.reporter_helpers import ensure_crd

    ensure_crd(RawApi(api_client))


@dataclass
class Lived:
    """The section's stack: deployment ``d`` throughout, ``v`` (the one given volumes) until
    the volumes test removes it; both start in namespace ``namespace``, which the stack
    creates (``retainNamespaces: false``, ``manageCrd: false``)."""

    stack: auto.Stack
    sfx: str
    namespace: str
    moved_namespace: str
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
def lived(
    pulumi_ready: dict[str, str], stacks_dir: Path, api_client: Any, kube: Cluster
) -> Iterator[Lived]:
    """The section's stack, deployed with both deployments (first update)."""
    from reporter.kubeapi import RawApi
    from tests.e2e.reporter_helpers import ensure_crd

    core = client.CoreV1Api(api_client)
    sfx = suffix()
    ns = f"day2-{sfx}-lived"
    v = {"name": f"v-{sfx}.pmem-csi.example", "namespace": ns, "reporter": NO_REPORTER}
    d = {"name": f"d-{sfx}.pmem-csi.example", "namespace": ns, "reporter": NO_REPORTER}
    # The certificate test's starting lifetime (a new one applies only from a renewal).
    d["certificates"] = {"validityDays": 20, "renewBeforeDays": 10}
    ensure_crd(RawApi(api_client))
    state = Lived(make_stack(stacks_dir, Lived.config(v, d)), sfx, ns, f"{ns}-moved", v, d)
    try:
        assert up(state.stack, "lived: first").summary.result == "succeeded"
        yield state
    finally:
        try:
            _delete_volumes(kube, sfx)
        finally:
            ensure_crd(RawApi(api_client))  # the device-mode test deletes it
            try:
                dispose(state.stack)
            finally:
                for name in (state.namespace, state.moved_namespace):
                    delete_quietly(core.delete_namespace, name)


def _volume_objects(driver: str, tag: str) -> list[tuple[str, str, dict[str, Any]]]:
    """(apiVersion, kind, body) of one PV, one VolumeAttachment and one StorageClass."""
    pv_name = f"pv-{tag}"
    return [
        (
            "v1",
            "PersistentVolume",
            {
                "metadata": {"name": pv_name},
                "spec": {
                    "capacity": {"storage": "1Gi"},
                    "accessModes": ["ReadWriteOnce"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "csi": {"driver": driver, "volumeHandle": f"pmem-{tag}"},
                },
            },
        ),
        (
            "storage.k8s.io/v1",
            "VolumeAttachment",
            {
                "metadata": {"name": f"csi-{tag}"},
                "spec": {
                    "attacher": driver,
                    "nodeName": "kwok-node-0",
                    "source": {"persistentVolumeName": pv_name},
                },
            },
        ),
        ("storage.k8s.io/v1", "StorageClass", {"metadata": {"name": f"sc-{tag}"},
                                               "provisioner": driver}),
    ]  # fmt: skip


def _create_volumes(kube: Cluster, driver: str, tag: str) -> list[str]:
    refs = []
    for api_version, kind, body in _volume_objects(driver, tag):
        kube.resource(api_version, kind).create(body={"apiVersion": api_version, "kind": kind,
                                                      **body})  # fmt: skip
        refs.append(f"{kind} {body['metadata']['name']}")
    return refs


def _delete_volumes(kube: Cluster, tag: str) -> None:
    for api_version, kind, body in reversed(_volume_objects("-", tag)):
        name = body["metadata"]["name"]
        try:
            kube.resource(api_version, kind).delete(name=name)
        except ApiException as err:
            if err.status != 404:
                raise
        wait_for(lambda k=kind, v=api_version, n=name: _absent(kube, v, k, n), 60, f"{kind} gone")


def _absent(kube: Cluster, api_version: str, kind: str, name: str) -> bool:
    try:
        kube.resource(api_version, kind).get(name=name)
    except ApiException as err:
        if err.status == 404:
            return True
        raise
    return False


def snapshot_without_cr(
    kube: Cluster, core: client.CoreV1Api, cfg: DeploymentConfig, *, by_generation: bool = False
) -> Any:
    """:func:`snapshot` of everything but the Deployment CR (deleted by the test).

    ``by_generation``: objects that have a generation by it, not by resourceVersion -- for an
    update that changes the CR spec, after which the program stamps the workloads with the
    spec's new digest (names.SPEC_DIGEST_ANNOTATION), a metadata write that changes nothing
    they run (their pods are compared too).
    """
    out: dict[str, Any] = {}
    for obj in bundle.build_deployment_objects(cfg, create_namespace=False).all():
        if obj["kind"] == names.CRD_KIND and obj["apiVersion"] == CR_API:
            continue
        live = kube.get(obj)
        assert live is not None, f"{obj['kind']} {obj['metadata']['name']} missing"
        meta = live["metadata"]
        version = meta.get("generation") if by_generation else None
        key = f"{obj['kind']}/{meta['name']}"
        out[key] = (meta["uid"], str(version or meta["resourceVersion"]))
    out["pods"] = pod_uids(core, cfg)
    return out


def uids(kube: Cluster, core: client.CoreV1Api, cfg: DeploymentConfig) -> dict[str, Any]:
    """The uids of :func:`snapshot` (nothing re-created), without resourceVersions, which
    controllers still change while a rollout that was not awaited goes on."""
    return {k: v[0] if isinstance(v, tuple) else v for k, v in snapshot(kube, core, cfg).items()}


def _rolled_out(kube: Cluster, cfg: DeploymentConfig) -> bool:
    objs = bundle.build_deployment_objects(cfg)
    ds = kube.get(objs.node[0]) or {}
    sts = kube.get(next(o for o in objs.controller if o["kind"] == "StatefulSet")) or {}
    ds_status, sts_status = ds.get("status") or {}, sts.get("status") or {}
    desired = ds_status.get("desiredNumberScheduled")
    return (
        bool(desired)
        and ds_status.get("numberReady") == desired
        and ds_status.get("updatedNumberScheduled") == desired
        and sts_status.get("readyReplicas") == 1
    )


def test_patches_that_would_replace_an_object_are_refused_naming_the_field(
    lived: Lived, api_client: Any, kube: Cluster
) -> None:
    """From the first update of ``lived``; leaves ``d`` with the accepted (mutable) patch."""
    core = client.CoreV1Api(api_client)
    cfg = cfg_of(lived.d)
    before = snapshot(kube, core, cfg)
    # Each of these is immutable in the API: the provider would delete and re-create.
    patches = [
        {"kind": "StatefulSet", "mergePatch": {"spec": {"podManagementPolicy": "Parallel"}}},
        {"kind": "Secret", "name": cfg.names.registry_secret, "mergePatch": {"type": "Opaque"}},
        {"kind": "RoleBinding", "mergePatch": {"roleRef": {"name": "another-role"}}},
        # Mutable: accepted.
        {"kind": "DaemonSet", "mergePatch": {"spec": {"minReadySeconds": 3}}},
    ]
    lived.write(lived.v, {**lived.d, "patches": patches})
    text = failed_up(lived.stack)
    prefix = "pmem-csi:deployments[1].patches"
    assert f"{prefix}[0]: changes spec.podManagementPolicy of StatefulSet" in text
    assert f"{prefix}[1]: changes type of Secret {cfg.namespace}/" in text
    assert f"{prefix}[2]: changes roleRef.name of RoleBinding" in text
    assert f"{prefix}[3]" not in text
    assert snapshot(kube, core, cfg) == before  # refused before anything changed

    lived.d = {**lived.d, "patches": patches[3:]}
    lived.write(lived.v, lived.d)
    assert up(lived.stack, "patches: mutable only").summary.result == "succeeded"
    ds = kube.get(bundle.build_deployment_objects(cfg).node[0])
    assert ds is not None and ds["spec"]["minReadySeconds"] == 3
    assert ds["metadata"]["uid"] == before[f"DaemonSet/{cfg.names.node_driver}"][0]


def test_rename_and_removal_are_refused_while_the_driver_has_volumes(
    lived: Lived, api_client: Any, kube: Cluster
) -> None:
    """``v`` gets volumes (``d`` is the deployment kept); ends with ``v`` removed."""
    core = client.CoreV1Api(api_client)
    sfx, vol, keep = lived.sfx, lived.v, lived.d
    cfg = cfg_of(vol)
    refs = _create_volumes(kube, cfg.name, sfx)
    try:
        before = snapshot(kube, core, cfg)

        renamed = {**vol, "name": f"w-{sfx}.pmem-csi.example", "renamedFrom": cfg.name}
        lived.write(renamed, keep)
        text = failed_up(lived.stack)
        assert "pmem-csi:deployments[0].renamedFrom: renaming" in text
        for ref in refs:
            assert ref in text, ref
        assert f"keep the name '{cfg.name}'" in text

        lived.write(keep)  # remove the deployment with volumes
        text = failed_up(lived.stack)
        assert f"pmem-csi:deployments: '{cfg.name}' (deployed by this stack)" in text
        for ref in refs:
            assert ref in text, ref
        assert snapshot(kube, core, cfg) == before  # refused before anything changed
    finally:
        # The way forward: the volumes go first (with the driver still running), then it.
        # Also when an assertion above failed: left, they would refuse the later tests' ups.
        _delete_volumes(kube, sfx)
    assert up(lived.stack, "volumes: removed").summary.result == "succeeded"
    for obj in bundle.build_deployment_objects(cfg, create_namespace=False).all():
        assert kube.get(obj) is None, f"{obj['kind']} {obj['metadata']['name']} left"


def test_a_move_without_await_is_refused_and_after_the_way_forward_never_overlaps(
    lived: Lived, api_client: Any, kube: Cluster
) -> None:
    """``d`` alone (after the volumes test) is switched to ``await.enabled: false`` -- the
    node DaemonSet then carries ``pulumi.com/skipAwait``, as when it was created so -- and
    drops the earlier test's patch; ends with ``d`` moved to ``moved_namespace``."""
    core = client.CoreV1Api(api_client)
    raw = {**{k: v for k, v in lived.d.items() if k != "patches"}, "await": {"enabled": False}}
    cfg = cfg_of(raw)
    moved_ns = lived.moved_namespace

    lived.write(raw)
    assert up(lived.stack, "skipAwait: on").summary.result == "succeeded"
    ds = kube.get(bundle.build_deployment_objects(cfg).node[0])
    assert ds is not None and "pulumi.com/skipAwait" in ds["metadata"]["annotations"]
    # Not awaited: a rollout may still go on after pulumi up returned.
    wait_for(lambda: _rolled_out(kube, cfg), 180, "driver pods ready")
    before = uids(kube, core, cfg)

    moving = {**raw, "namespace": moved_ns, "allowReinstall": True}
    lived.write(moving)
    text = failed_up(lived.stack)
    assert "pmem-csi:deployments[0].await.enabled: false sets pulumi.com/skipAwait" in text
    # Await on in the same update is not enough: the old DaemonSet still skips the wait.
    lived.write({**moving, "await": {"enabled": True}})
    text = failed_up(lived.stack)
    assert f"DaemonSet {cfg.namespace}/{cfg.names.node_driver} carries" in text
    assert uids(kube, core, cfg) == before  # refused before anything changed

    # The way forward: await on where it is, then the move.
    awaited = {**raw, "await": {"enabled": True}}
    lived.write(awaited)
    assert up(lived.stack, "skipAwait: await on").summary.result == "succeeded"
    lived.write({**awaited, "namespace": moved_ns, "allowReinstall": True})
    watcher = up_with_one_node_driver(
        lived.stack, "skipAwait: move", api_client, cfg.names.hyphened
    )
    assert f"ADDED {moved_ns}/{cfg.names.node_driver}" in watcher.events
    lived.d = {**awaited, "namespace": moved_ns}


def test_a_namespace_still_used_is_kept_when_its_creator_stops_creating_it(
    lived: Lived, api_client: Any, kube: Cluster
) -> None:
    """``d`` in the namespace the stack created for it by the move of the test before; ends
    with ``createNamespace: false`` and the namespace out of the stack."""
    core = client.CoreV1Api(api_client)
    raw = lived.d
    cfg = cfg_of(raw)

    # A patch of the namespace (registered at stack level, outside the deployment's
    # component) is applied to it.
    enforce = {"pod-security.kubernetes.io/enforce": "privileged"}
    ns_patch = {"kind": "Namespace", "mergePatch": {"metadata": {"labels": enforce}}}
    lived.write({**raw, "patches": [ns_patch]})
    assert up(lived.stack, "namespace: patched").summary.result == "succeeded"
    live = core.read_namespace(cfg.namespace)
    assert live.metadata.labels["pod-security.kubernetes.io/enforce"] == "privileged"
    ns_uid = live.metadata.uid
    # The CR records the config (createNamespace); everything else stays as it is.
    before = snapshot_without_cr(kube, core, cfg, by_generation=True)

    lived.d = {**raw, "createNamespace": False}
    lived.write(lived.d)
    result = up(lived.stack, "namespace: no longer created")
    assert result.summary.result == "succeeded"
    live = core.read_namespace(cfg.namespace)
    assert live.metadata.uid == ns_uid and live.status.phase == "Active"
    assert names.STACK_ANNOTATION not in (live.metadata.annotations or {})
    assert snapshot_without_cr(kube, core, cfg, by_generation=True) == before

    # The next update drops the released namespace from the state and leaves it.
    result = up(lived.stack, "namespace: released")
    assert result.summary.result == "succeeded"
    live = core.read_namespace(cfg.namespace)
    assert live.metadata.uid == ns_uid and live.status.phase == "Active"
    assert snapshot_without_cr(kube, core, cfg, by_generation=True) == before
    resources = lived.stack.export_stack().deployment["resources"]
    assert not [r for r in resources if r["type"] == "kubernetes:core/v1:Namespace"]


def test_certificate_renewal_rotation_and_provided_generated_switch_roll_the_pods(
    lived: Lived, api_client: Any, kube: Cluster
) -> None:
    """``d`` as the tests before left it, with the certificate lifetime the fixture deployed
    it with (``validityDays: 20``, ``renewBeforeDays: 10``, not renewed since); ends with
    generated certificates of the default lifetime."""
    core = client.CoreV1Api(api_client)
    base = {k: v for k, v in lived.d.items() if k != "certificates"}

    def config(certificates: dict[str, Any]) -> None:
        lived.d = {**base, "certificates": certificates}
        lived.write(lived.d)

    cfg = cfg_of(base)
    stack = lived.stack

    def state() -> tuple[str, str, list[str]]:
        # The node's leaf first (its lifetime is what _cert reads), then the trust bundle.
        data = secret_data(core, cfg.names.node_secret, cfg.namespace)
        return data["tls.crt"] + data["ca.crt"], _fingerprint(kube, cfg), pod_uids(core, cfg)

    def ca() -> str:
        return secret_data(core, cfg.names.node_secret, cfg.namespace)["ca.crt"]

    def changed_and_rolled(before: tuple[str, str, list[str]]) -> tuple[str, str, list[str]]:
        after = state()
        assert after[0] != before[0], "new certificate material"
        assert after[1] != before[1], "new fingerprint in the pod template"
        assert not set(after[2]) & set(before[2]), "every driver pod was replaced"
        return after

    first = state()
    first_ca = ca()
    assert (_cert(first[0]).not_valid_after_utc - dt.datetime.now(dt.UTC)).days in (19, 20)

    # Renewal: a lead time longer than what is left renews on this pulumi up, under the
    # same CA (it lives three leaf lifetimes).
    config({"validityDays": 40, "renewBeforeDays": 30})
    assert up(stack, "certs: renew").summary.result == "succeeded"
    renewed = changed_and_rolled(first)
    assert ca() == first_ca
    assert (_cert(renewed[0]).not_valid_after_utc - dt.datetime.now(dt.UTC)).days in (39, 40)
    again = up(stack, "certs: stable")
    assert set(resource_changes(again.summary)) == {"same"}
    assert state() == renewed

    # Rotation on request.
    config({"validityDays": 40, "renewBeforeDays": 30, "rotation": "2026-11"})
    assert up(stack, "certs: rotate").summary.result == "succeeded"
    rotated = changed_and_rolled(renewed)
    # Stage 1 of the CA change (tests/e2e/test_cert_rollover.py has all three).
    assert ca().startswith(first_ca.strip()) and ca().count("BEGIN CERTIFICATE") == 2

    # Provided certificates, then back to generated ones.
    provided = certlib.generate_driver_certificates()
    prefix = "pmem-csi:deployments[0].certificates"
    config(
        {
            "caCert": provided.ca_cert,
            "registryCert": provided.registry_cert,
            "nodeControllerCert": provided.node_controller_cert,
        }
    )
    for key, value in (
        ("registryKey", provided.registry_key),
        ("nodeControllerKey", provided.node_controller_key),
    ):
        stack.set_config(f"{prefix}.{key}", auto.ConfigValue(value, secret=True), path=True)
    assert up(stack, "certs: provided").summary.result == "succeeded"
    switched = changed_and_rolled(rotated)
    assert ca() == provided.ca_cert
    assert secret_data(core, cfg.names.node_secret, cfg.namespace)["tls.key"] == (
        provided.node_controller_key
    )

    config({})  # drops the secret keys too
    assert up(stack, "certs: generated again").summary.result == "succeeded"
    changed_and_rolled(switched)
    assert ca() != provided.ca_cert


def test_device_mode_guard_holds_when_the_cr_and_the_crd_are_gone(
    lived: Lived, api_client: Any, kube: Cluster, kubectl: Callable[..., Any]
) -> None:
    """``d`` in lvm mode as the tests before left it; last of the section (the CR stays
    deleted; the CRD is restored by the fixture)."""
    from reporter.kubeapi import RawApi
    from tests.e2e.reporter_helpers import ensure_crd

    core = client.CoreV1Api(api_client)
    raw = lived.d
    cfg = cfg_of(raw)
    try:
        # The certificate test before rolled every pod: what trails that is not a change.
        before = settled_snapshot(kube, core, cfg)
        # Deleted by hand: the driver keeps running in lvm mode.
        kubectl("delete", f"deployments.{names.CRD_GROUP}", cfg.name, "--wait=true")
        lived.write({**raw, "deviceMode": "direct"})
        text = failed_up(lived.stack)
        daemon_set = f"DaemonSet {cfg.namespace}/{cfg.names.node_driver} runs -deviceManager=lvm"
        assert "pmem-csi:deployments[0].deviceMode: changing it from 'lvm' to 'direct'" in text
        assert daemon_set in text

        kubectl("delete", "crd", names.CRD_NAME, "--wait=true", "--timeout=60s")
        text = failed_up(lived.stack)
        assert "pmem-csi:deployments[0].deviceMode: changing it from 'lvm' to 'direct'" in text
        assert daemon_set in text
        del before[f"{names.CRD_KIND}/{cfg.name}"]
        after = snapshot_without_cr(kube, core, cfg)
        assert after == before  # refused before anything changed
    finally:
        ensure_crd(RawApi(api_client))  # the next tests need it, whatever happened here


def test_switching_from_the_program_to_either_face_of_the_component_deletes_nothing(
    pulumi_ready: dict[str, str],
    stacks_dir: Path,
    api_client: Any,
    kube: Cluster,
    crd_present: None,
) -> None:
    """The program, then ``PmemCsiDeployment("pmem-east", args)``, then
    ``PmemCsiDeployment(config)`` with an alias of that name: the same stack, and every
    object (and the generated certificates) stays; the engine moves URNs, deletes nothing."""
    from pmem_components import PmemCsiDeployment
    from pmem_components.components import PmemCsiDeploymentArgs
    from pmem_components.program import main as program
    from tools import pulumi_stack as ps

    core = client.CoreV1Api(api_client)
    sfx = suffix()
    raw = {"name": f"f-{sfx}.pmem-csi.example", "namespace": f"day2-{sfx}-faces"}
    raw["reporter"] = NO_REPORTER
    cfg = cfg_of(raw)
    config = {"pmem-csi:manageCrd": False, "pmem-csi:deployments": [raw]}

    def named() -> None:
        PmemCsiDeployment("pmem-east", PmemCsiDeploymentArgs(cfg, retain_namespace=False))

    def config_face() -> None:
        opts = pulumi.ResourceOptions(aliases=[pulumi.Alias(name="pmem-east")])
        PmemCsiDeployment(cfg, opts, retain_namespace=False)

    name = f"f{sfx}"
    stack = ps.select_stack(name, program, stacks_dir / name, config)
    try:
        assert up(stack, "faces: program").summary.result == "succeeded"
        ns_uid = core.read_namespace(cfg.namespace).metadata.uid
        before = uids(kube, core, cfg)
        ca = secret_data(core, cfg.names.registry_secret, cfg.namespace)["ca.crt"]
        for what, face in (("faces: named", named), ("faces: config", config_face)):
            stack = ps.select_stack(name, face, stacks_dir / name, config)
            result = up(stack, what)
            assert result.summary.result == "succeeded"
            changes = resource_changes(result.summary)
            assert not {"create", "delete", "replace"} & set(changes), (what, changes)
            assert core.read_namespace(cfg.namespace).metadata.uid == ns_uid
            assert uids(kube, core, cfg) == before, what
            assert secret_data(core, cfg.names.registry_secret, cfg.namespace)["ca.crt"] == ca
    finally:
        dispose(stack)
        delete_quietly(core.delete_namespace, cfg.namespace)
