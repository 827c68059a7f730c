"""The Pulumi program end to end: the real engine and provider against the local cluster.

What the unit tests under Pulumi mocks cannot show is shown here: that the API server accepts
every object as built, that the provider's await logic finishes on the kwok nodes, that
transforms (patches) reach the cluster, that the dynamic certificate provider keeps its keys
stable and encrypted in the state, and that ``destroy`` leaves nothing behind.

Sharing the cluster: other test modules (the reporter's) run on the same cluster, possibly at
the same time. Every stack here therefore uses its own driver name ``e2e-<random>.pmem-csi.
intel.com`` and namespace, and ``manageCrd: false``: the CRD is cluster-wide, and a stack that
owned it would delete it on ``destroy`` -- and with it every other test's ``Deployment`` CRs.
The CRD is installed by a module fixture with the Kubernetes client instead (left in place
afterwards). Only :func:`test_manage_crd_installs_crd_and_orders_the_cr_after_it` runs with
``manageCrd: true``; see there how it avoids deleting the shared CRD.

Speed: a ``pulumi up`` of one deployment takes tens of seconds on a small machine, so the
read-only checks share one deployed stack (module fixture ``deployed``); the tests that change
that stack (refresh, patches, destroy) come last, in file order, which pytest keeps.
"""

from __future__ import annotations

import base64
import json
import re
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import NotFoundError
from pulumi import automation as auto

from pmem_components import certs as certlib
from pmem_components import names
from pmem_components.config import DeploymentConfig, load_config
from pmem_components.manifests import bundle
from pmem_components.manifests.crd import load_crd
from pmem_components.manifests.deployment_cr import build_spec
from pmem_components.program import main as program
from tests.e2e.waiting import wait_for
from tools import cluster, localenv
from tools import pulumi_stack as ps

# A whole deployment (with rollouts on kwok) plus slack for a busy 2-core machine.
pytestmark = pytest.mark.timeout(900)

CRD_TYPE = "kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition"
CR_TYPE = "kubernetes:pmem-csi.intel.com/v1beta1:Deployment"
# Pulumi's marker of an encrypted value in an exported state.
SECRET_SIG = "4dabf18193072939515e22adb298388d"


# --------------------------------------------------------------------------------------------
# helpers


def unique_deployment(**extra: Any) -> dict[str, Any]:
    """Raw config of one deployment with a name no other test (or engineer) uses."""
    suffix = uuid.uuid4().hex[:6]
    return {"name": f"e2e-{suffix}.pmem-csi.intel.com", "namespace": f"e2e-{suffix}", **extra}


def stack_config(*deployments: dict[str, Any], manage_crd: bool = False) -> dict[str, Any]:
    # Namespaces are kept on destroy by default (tests/e2e/test_day2.py); these stacks each
    # have a namespace of their own, and destroy is expected to leave nothing behind.
    return {
        "pmem-csi:manageCrd": manage_crd,
        "pmem-csi:retainNamespaces": False,
        "pmem-csi:deployments": list(deployments),
    }


def parsed(raw_deployment: dict[str, Any], secrets: dict[str, str] | None = None) -> Any:
    """The validated DeploymentConfig the program will see for ``raw_deployment``."""
    dep = json.loads(json.dumps(raw_deployment))
    if secrets:
        dep.setdefault("certificates", {}).update(secrets)
    return load_config({"deployments": [dep]}).deployments[0]


def is_subset(expected: Any, actual: Any, path: str = "") -> list[str]:
    """Where ``actual`` (a live object) lacks or contradicts ``expected`` (builder output).

    The API server adds defaults (protocols, termination policies, nodePorts...), so equality
    is too strict; every field the builder set must be present with the same value. Lists
    must match element for element.
    """
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            return [f"{path}: expected an object, got {actual!r}"]
        out: list[str] = []
        for key, value in expected.items():
            if key not in actual:
                out.append(f"{path}.{key}: missing")
            else:
                out += is_subset(value, actual[key], f"{path}.{key}")
        return out
    if isinstance(expected, list):
        if not isinstance(actual, list) or len(actual) != len(expected):
            return [f"{path}: expected {expected!r}, got {actual!r}"]
        return [p for i, e in enumerate(expected) for p in is_subset(e, actual[i], f"{path}[{i}]")]
    if expected != actual:
        return [f"{path}: expected {expected!r}, got {actual!r}"]
    return []


class Cluster:
    """Generic read access to any kind by apiVersion/kind (dynamic client)."""

    def __init__(self, api_client: Any) -> None:
        self.dyn = DynamicClient(api_client)

    def resource(self, api_version: str, kind: str) -> Any:
        return self.dyn.resources.get(api_version=api_version, kind=kind)

    def get(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        res = self.resource(obj["apiVersion"], obj["kind"])
        meta = obj["metadata"]
        try:
            return res.get(name=meta["name"], namespace=meta.get("namespace")).to_dict()
        except NotFoundError:
            return None

    def by_label(self, api_version: str, kind: str, selector: str) -> list[tuple[str, str]]:
        """(namespace, name) of every object of a kind matching ``selector``, cluster-wide."""
        items = self.resource(api_version, kind).get(label_selector=selector).items
        return sorted((i.metadata.namespace or "", i.metadata.name) for i in items)


def selector(cfg: DeploymentConfig) -> str:
    return ",".join(f"{k}={v}" for k, v in cfg.names.selector_labels().items())


# Kinds that carry the selector labels when a deployment exists; checked after destroy too.
# Pods and ReplicaSets/ControllerRevisions are made by controllers from the templates.
LABELLED_KINDS = (
    ("v1", "Namespace"),
    ("v1", "Secret"),
    ("v1", "ServiceAccount"),
    ("v1", "Service"),
    ("v1", "Pod"),
    ("apps/v1", "DaemonSet"),
    ("apps/v1", "StatefulSet"),
    ("apps/v1", "Deployment"),
    ("rbac.authorization.k8s.io/v1", "Role"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    ("rbac.authorization.k8s.io/v1", "ClusterRole"),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"),
    ("storage.k8s.io/v1", "CSIDriver"),
    ("coordination.k8s.io/v1", "Lease"),
    (f"{names.CRD_GROUP}/{names.CRD_STORAGE_VERSION}", names.CRD_KIND),
)


def expected_objects(cfg: DeploymentConfig) -> list[dict[str, Any]]:
    return bundle.build_deployment_objects(cfg).all()


def leftovers(kube: Cluster, cfg: DeploymentConfig) -> list[str]:
    """Objects of ``cfg``'s deployment still in the cluster, by name and by label.

    A namespace in phase Terminating still counts: ``destroy`` waits for deletions.
    """
    found = [
        f"{o['kind']} {o['metadata'].get('namespace', '')}/{o['metadata']['name']}"
        for o in expected_objects(cfg)
        if kube.get(o) is not None
    ]
    for api_version, kind in LABELLED_KINDS:
        found += [
            f"{kind} {ns}/{n} (by label)"
            for ns, n in kube.by_label(api_version, kind, selector(cfg))
        ]
    return found


def up(stack: auto.Stack, what: str, timings: dict[str, float] | None = None) -> auto.UpResult:
    start = time.monotonic()
    result = stack.up(on_output=ps.printer(f"[{what}] "))
    if timings is not None:
        timings[what] = time.monotonic() - start
    return result


def resource_changes(changes: auto.UpdateSummary | dict[str, int] | None) -> dict[str, int]:
    """Non-zero counts by operation, from an update summary or a preview's change summary."""
    if isinstance(changes, auto.UpdateSummary):
        changes = changes.resource_changes
    return {k: v for k, v in (changes or {}).items() if v}


def secret_data(core: client.CoreV1Api, name: str, namespace: str) -> dict[str, str]:
    secret = core.read_namespaced_secret(name, namespace)
    return {k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()}


def pem_body(pem: str) -> str:
    """The base64 lines of a PEM block joined: what an encoding-agnostic leak search needs."""
    return "".join(line for line in pem.strip().splitlines() if not line.startswith("-----"))


def make_stack(
    base_dir: Path,
    config: dict[str, Any],
    secret_config: dict[str, str] | None = None,
) -> auto.Stack:
    name = f"p{uuid.uuid4().hex[:8]}"
    return ps.select_stack(name, program, base_dir / name, config, secret_config)


def dispose(stack: auto.Stack) -> None:
    try:
        stack.destroy(on_output=ps.printer("[cleanup] "))
    finally:
        stack.workspace.remove_stack(stack.name)


# --------------------------------------------------------------------------------------------
# fixtures


@pytest.fixture(scope="module")
def kube(api_client: Any) -> Cluster:
    return Cluster(api_client)


@pytest.fixture(scope="module")
def crd(api_client: Any) -> None:
    """The shared CRD, applied from ``crd/`` unless present; never deleted (others use it)."""
    ext = client.ApiextensionsV1Api(api_client)
    body = load_crd()
    try:
        ext.create_custom_resource_definition(body)
    except ApiException as err:
        if err.status != 409:
            raise

    def established() -> bool:
        obj = ext.read_custom_resource_definition(body["metadata"]["name"])
        return any(
            c.type == "Established" and c.status == "True" for c in obj.status.conditions or []
        )

    wait_for(established, 30, "CRD Established")


@pytest.fixture(scope="module")
def stacks_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("stacks")


@dataclass
class Deployed:
    """The shared stack: its raw config, the validated model, timings of what ran on it."""

    stack: auto.Stack
    raw: dict[str, Any]
    cfg: DeploymentConfig
    first_up: auto.UpResult
    timings: dict[str, float] = field(default_factory=dict)


@pytest.fixture(scope="module")
def deployed(
    pulumi_ready: dict[str, str],
    crd: None,
    stacks_dir: Path,
    kube: Cluster,
    request: pytest.FixtureRequest,
) -> Iterator[Deployed]:
    """One deployment, ``pulumi up``-ed once for the tests of this module that share it.

    Configured with labels and a non-default log level so that the effect of config fields
    shows up in the cluster, not only defaults.
    """
    raw = unique_deployment(
        deviceMode="direct",
        logLevel=4,
        labels={"e2e.example.com/suite": "program"},
        # The reporter has no default image; kwok's pods run none, so any name does.
        reporter={"image": "registry.example/pmem-csi-reporter:e2e"},
    )
    stack = make_stack(stacks_dir, stack_config(raw))
    timings: dict[str, float] = {}
    try:
        result = up(stack, "first up", timings)
        yield Deployed(stack, raw, parsed(raw), result, timings)
    finally:
        dispose(stack)
        # The durations belong in the run's output (the issue asks for them), not only in -s.
        line = ", ".join(f"{k}: {v:.1f}s" for k, v in timings.items())
        capture = request.config.pluginmanager.get_plugin("capturemanager")
        if capture is not None:
            with capture.global_and_fixture_disabled():
                print(f"\npulumi timings (shared stack): {line}")


# --------------------------------------------------------------------------------------------
# the shared stack: read-only checks first


def test_up_creates_every_object_as_built(
    deployed: Deployed, kube: Cluster, api_client: Any
) -> None:
    cfg = deployed.cfg
    assert deployed.first_up.summary.result == "succeeded"
    expected = expected_objects(cfg)
    objs = bundle.build_deployment_objects(cfg)
    driver_kinds = sorted(
        o["kind"] for o in objs.all() if o not in objs.reporter and o is not objs.deployment_cr
    )
    assert driver_kinds == sorted(
        [
            "Namespace",
            "Secret",
            "Secret",
            "CSIDriver",
            "ServiceAccount",
            "Role",
            "RoleBinding",
            "ClusterRole",
            "ClusterRoleBinding",
            "Service",
            "Service",
            "StatefulSet",
            "DaemonSet",
        ]
    )
    assert objs.reporter, "the reporter is deployed too when its image is set"
    live: dict[tuple[str, str], dict[str, Any]] = {}
    problems: list[str] = []
    for obj in expected:
        key = (obj["kind"], obj["metadata"]["name"])
        got = kube.get(obj)
        if got is None:
            problems.append(f"{key}: not in the cluster")
            continue
        live[key] = got
        if obj["kind"] == "Secret":
            continue  # placeholders in the builder output; checked below
        if obj["kind"] == "Lease":
            # The reporter's election record: whoever holds it rewrites the spec.
            problems += is_subset(obj["metadata"], got["metadata"], f"{key}.metadata")
            continue
        problems += is_subset(obj, got, str(key))
    assert not problems, "\n".join(problems)

    # Nothing labelled as ours that the builders did not make (pods aside).
    expected_names = {(o["kind"], o["metadata"]["name"]) for o in expected}
    for api_version, kind in LABELLED_KINDS:
        if kind == "Pod":
            continue
        extra = [
            (kind, n)
            for _, n in kube.by_label(api_version, kind, selector(cfg))
            if (kind, n) not in expected_names
        ]
        assert not extra, f"unexpected objects with the deployment's labels: {extra}"

    n = cfg.names
    # The node DaemonSet: reference containers, privileged, host paths under kubeletDir.
    ds = live[("DaemonSet", n.node_driver)]
    pod = ds["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"storage": "pmem"}
    driver, registrar = pod["containers"]
    assert (driver["name"], registrar["name"]) == ("pmem-driver", "driver-registrar")
    assert "-deviceManager=direct" in driver["command"]
    assert "-v=4" in driver["command"]
    assert not any(a.startswith("-pmemPercentage") for a in driver["command"])
    assert driver["securityContext"]["privileged"] is True
    propagation = {m["name"]: m.get("mountPropagation") for m in driver["volumeMounts"]}
    assert propagation["mountpoint-dir"] == propagation["pods-dir"] == "Bidirectional"
    host_paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert host_paths["socket-dir"] == f"/var/lib/kubelet/plugins/{cfg.name}"
    assert host_paths["pods-dir"] == "/var/lib/kubelet/pods"
    assert host_paths["registration-dir"] == "/var/lib/kubelet/plugins_registry/"
    assert ds["metadata"]["labels"]["e2e.example.com/suite"] == "program"
    # kwok runs the pods on the three fake PMEM nodes only.
    apps = client.AppsV1Api(api_client)
    status = apps.read_namespaced_daemon_set_status(n.node_driver, cfg.namespace).status
    assert status.number_ready == cluster.DEFAULT_PMEM_NODES

    # The controller StatefulSet: one non-root replica with the provisioner.
    sts = live[("StatefulSet", n.controller_driver)]
    assert sts["spec"]["replicas"] == 1
    assert sts["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    assert [c["name"] for c in sts["spec"]["template"]["spec"]["containers"]] == [
        "pmem-driver",
        "external-provisioner",
    ]
    sts_status = apps.read_namespaced_stateful_set_status(n.controller_driver, cfg.namespace)
    assert sts_status.status.ready_replicas == 1

    # RBAC and Services.
    cluster_role = live[("ClusterRole", n.provisioner_cluster_role)]
    assert {
        "apiGroups": [""],
        "resources": ["persistentvolumes"],
        "verbs": ["get", "list", "watch", "create", "delete"],
    } in cluster_role["rules"]
    binding = live[("ClusterRoleBinding", n.provisioner_cluster_role_binding)]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": n.service_account, "namespace": cfg.namespace}
    ]
    assert live[("Service", n.controller_service)]["spec"]["type"] == "ClusterIP"
    assert live[("Service", n.metrics_service)]["spec"]["type"] == "NodePort"
    csi = live[("CSIDriver", cfg.name)]
    assert csi["spec"]["attachRequired"] is False
    assert csi["spec"]["podInfoOnMount"] is True

    # Both Secrets: CA, certificate and key, the leaves issued by that CA for the right names.
    core = client.CoreV1Api(api_client)
    sets = {}
    for secret_name in (n.registry_secret, n.node_secret):
        data = secret_data(core, secret_name, cfg.namespace)
        assert sorted(data) == ["ca.crt", "tls.crt", "tls.key"], secret_name
        assert live[("Secret", secret_name)]["type"] == "kubernetes.io/tls"
        sets[secret_name] = data
    reg, node = sets[n.registry_secret], sets[n.node_secret]
    assert reg["ca.crt"] == node["ca.crt"]
    problems_found = certlib.validate_driver_certificates(
        reg["ca.crt"], reg["tls.crt"], reg["tls.key"], node["tls.crt"], node["tls.key"]
    )
    assert [p for p in problems_found if p.severity != "warning"] == []

    # The Deployment CR: spec mirrors the config, no private keys, no status yet.
    cr = live[(names.CRD_KIND, cfg.name)]
    assert cr["spec"] == build_spec(cfg)
    assert cr["spec"]["deviceMode"] == "direct"
    assert "PRIVATE KEY" not in json.dumps(cr)
    assert "status" not in cr or not cr["status"]

    # Stack outputs: namespace, object names and the CA.
    outputs = deployed.stack.outputs()
    dep_out = outputs["deployments"].value[cfg.name]
    assert dep_out["namespace"] == cfg.namespace
    assert dep_out["objectNames"] == bundle.object_names(cfg)
    assert dep_out["caCert"] == reg["ca.crt"]
    assert "crd" not in outputs or outputs["crd"].value is None  # null outputs are dropped


def test_second_up_changes_nothing_and_keeps_the_certificates(
    deployed: Deployed, api_client: Any
) -> None:
    cfg = deployed.cfg
    core = client.CoreV1Api(api_client)
    before = {
        s: secret_data(core, s, cfg.namespace)
        for s in (cfg.names.registry_secret, cfg.names.node_secret)
    }
    preview = deployed.stack.preview()
    assert set(resource_changes(preview.change_summary)) == {"same"}, preview.change_summary
    result = up(deployed.stack, "no-change up", deployed.timings)
    assert set(resource_changes(result.summary)) == {"same"}, result.summary.resource_changes
    after = {s: secret_data(core, s, cfg.namespace) for s in before}
    assert after == before  # same CA, certificates and keys: no new keys on every run


def test_kubectl_get_prints_the_printer_columns(
    deployed: Deployed, kubectl: Callable[..., Any]
) -> None:
    cfg = deployed.cfg
    resource = "deployments.pmem-csi.intel.com"
    header, row = kubectl("get", resource, cfg.name).stdout.splitlines()
    columns = ["NAME", "DEVICEMODE", "NODESELECTOR", "IMAGE", "STATUS", "AGE"]
    assert header.split() == columns
    # Cells cut at the header's column starts: an empty Status cell is blank, not "<none>".
    starts = [m.start() for m in re.finditer(r"\S+", header)]  # ("AGE" is also in "IMAGE")
    cells = [row[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
    assert dict(zip(columns[:-1], cells[:-1], strict=True)) == {
        "NAME": cfg.name,
        "DEVICEMODE": "direct",
        "NODESELECTOR": '{"storage":"pmem"}',
        "IMAGE": cfg.image,
        "STATUS": "",  # no reporter has written a phase
    }
    age = cells[-1]
    assert re.fullmatch(r"\d+[smhd](\d+[smh])?", age), age
    # --no-headers prints the same cells (narrower columns; the blank Status leaves five).
    cells = kubectl("get", resource, cfg.name, "--no-headers").stdout.split()
    assert cells[:4] == [cfg.name, "direct", '{"storage":"pmem"}', cfg.image], cells
    assert len(cells) == 5 and re.fullmatch(r"\d+[smhd](\d+[smh])?", cells[4]), cells
    # And in the listing of all deployments (other tests' CRs may be there too).
    listing = kubectl("get", resource, "--no-headers").stdout.splitlines()
    assert [line.split()[0] for line in listing].count(cfg.name) == 1


def stored_state(stack: auto.Stack) -> str:
    """Every file the file backend keeps for ``stack`` (checkpoint, backups, history)."""
    backend = localenv.state_dir() / "pulumi-backend" / ".pulumi"
    files = [p for p in backend.rglob(f"{stack.name}*") if p.is_file()]
    assert files, f"no state files for {stack.name} under {backend}"
    return "\n".join(p.read_bytes().decode("utf-8", "replace") for p in files)


def unmarked_paths(value: Any, needle: str, path: str = "") -> list[str]:
    """Paths in an exported (decrypted) state where ``needle`` is not inside a secret."""
    if isinstance(value, dict):
        if value.get(SECRET_SIG) == "1b47061264138c4ac30d75fd1eb44270":
            return []  # a secret value: encrypted at rest, decrypted only by --show-secrets
        return [p for k, v in value.items() for p in unmarked_paths(v, needle, f"{path}.{k}")]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in unmarked_paths(v, needle, f"{path}[{i}]")]
    return [path] if isinstance(value, str) and needle in value else []


def assert_keys_not_in_plaintext(stack: auto.Stack, keys: list[str]) -> None:
    """No key in the stored state; in the decrypted export, only inside secret values."""
    stored = stored_state(stack)
    assert SECRET_SIG in stored
    exported = stack.export_stack().deployment
    for key in keys:
        body = pem_body(key)
        for needle in (body[:64], body[-64:], base64.b64encode(key.encode()).decode()[:64]):
            assert needle not in stored
        assert unmarked_paths(exported, body[:64]) == []
    assert "PRIVATE KEY" not in stored


def test_private_keys_are_encrypted_in_state_and_absent_from_outputs(
    deployed: Deployed, api_client: Any
) -> None:
    cfg = deployed.cfg
    core = client.CoreV1Api(api_client)
    keys = [
        secret_data(core, s, cfg.namespace)["tls.key"]
        for s in (cfg.names.registry_secret, cfg.names.node_secret)
    ]
    assert_keys_not_in_plaintext(deployed.stack, keys)
    # Nor in what the engine printed while deploying.
    assert not any(pem_body(k)[:64] in deployed.first_up.stdout for k in keys)
    assert "PRIVATE KEY" not in deployed.first_up.stdout

    outputs = {k: v.value for k, v in deployed.stack.outputs().items()}
    text = json.dumps(outputs)
    assert "PRIVATE KEY" not in text
    ca = secret_data(core, cfg.names.registry_secret, cfg.namespace)["ca.crt"]
    assert text.count("-----BEGIN CERTIFICATE-----") == 1  # the CA's certificate only
    assert outputs["deployments"][cfg.name]["caCert"] == ca


# --------------------------------------------------------------------------------------------
# the shared stack: tests that change it, in this order


def test_refresh_and_up_restore_a_deleted_daemonset(
    deployed: Deployed, kubectl: Callable[..., Any], api_client: Any
) -> None:
    cfg = deployed.cfg
    ds_name = cfg.names.node_driver
    kubectl("delete", "daemonset", ds_name, "-n", cfg.namespace, "--wait=true")
    refresh = deployed.stack.refresh(on_output=ps.printer("[refresh] "))
    assert refresh.summary.resource_changes.get("delete") == 1, refresh.summary.resource_changes
    result = up(deployed.stack, "restoring up", deployed.timings)
    changes = resource_changes(result.summary)
    assert changes.get("create") == 1, changes
    assert not {"delete", "replace", "update"} & set(changes), changes
    apps = client.AppsV1Api(api_client)
    status = apps.read_namespaced_daemon_set_status(ds_name, cfg.namespace).status
    assert status.number_ready == cluster.DEFAULT_PMEM_NODES


def test_config_patches_change_the_daemonset(deployed: Deployed, api_client: Any) -> None:
    cfg = deployed.cfg
    ds_name = cfg.names.node_driver
    patched_raw = {
        **deployed.raw,
        "patches": [
            {
                "kind": "DaemonSet",
                "mergePatch": {
                    "metadata": {"annotations": {"e2e.example.com/patched": "merge"}},
                    "spec": {"template": {"metadata": {"annotations": {"e2e/restart": "1"}}}},
                },
            },
            {
                "kind": "DaemonSet",
                "name": ds_name,
                "jsonPatch": [
                    {
                        "op": "test",
                        "path": "/spec/template/spec/containers/0/command/2",
                        "value": "-v=4",
                    },
                    {
                        "op": "replace",
                        "path": "/spec/template/spec/containers/0/command/2",
                        "value": "-v=3",
                    },
                    {
                        "op": "add",
                        "path": "/spec/template/spec/containers/0/env/-",
                        "value": {"name": "E2E_PATCHED", "value": "json"},
                    },
                ],
            },
        ],
    }
    _write_config(deployed.stack, stack_config(patched_raw))
    result = up(deployed.stack, "patching up", deployed.timings)
    changes = resource_changes(result.summary)
    # The DaemonSet, the CR whose spec records the patches, and the StatefulSet's digest of
    # that spec (names.SPEC_DIGEST_ANNOTATION, metadata only: no rollout); nothing else.
    assert changes.get("update") == 3, changes
    assert not {"create", "delete", "replace"} & set(changes), changes

    apps = client.AppsV1Api(api_client)
    ds = apps.read_namespaced_daemon_set(ds_name, cfg.namespace)
    assert ds.metadata.annotations["e2e.example.com/patched"] == "merge"
    assert ds.spec.template.metadata.annotations["e2e/restart"] == "1"
    driver = ds.spec.template.spec.containers[0]
    assert driver.command[2] == "-v=3"
    assert {"name": "E2E_PATCHED", "value": "json"} in [
        {"name": e.name, "value": e.value} for e in driver.env
    ]
    # Unpatched parts stay as built; the StatefulSet's pods are not touched.
    assert driver.command[1] == "-deviceManager=direct"
    sts = apps.read_namespaced_stateful_set(cfg.names.controller_driver, cfg.namespace)
    assert "-v=4" in sts.spec.template.spec.containers[0].command
    assert sts.metadata.generation == sts.status.observed_generation == 1
    custom = client.CustomObjectsApi(api_client)
    cr = custom.get_cluster_custom_object(
        names.CRD_GROUP, names.CRD_STORAGE_VERSION, names.CRD_PLURAL, cfg.name
    )
    assert len(cr["spec"]["patches"]) == 2
    deployed.raw = patched_raw
    deployed.cfg = parsed(patched_raw)


def test_destroy_leaves_nothing_behind(deployed: Deployed, kube: Cluster) -> None:
    cfg = deployed.cfg
    present = leftovers(kube, cfg)
    assert any(s.startswith("DaemonSet") for s in present)  # the helper does see objects
    start = time.monotonic()
    result = deployed.stack.destroy(on_output=ps.printer("[destroy] "))
    deployed.timings["destroy"] = time.monotonic() - start
    assert result.summary.result == "succeeded"
    assert leftovers(kube, cfg) == []
    assert deployed.stack.export_stack().deployment.get("resources") in (None, [])


def _write_config(stack: auto.Stack, config: dict[str, Any]) -> None:
    """Replace a stack's plain config (the ``Pulumi.<stack>.yaml`` an admin would edit)."""
    ps.write_stack_config(Path(stack.workspace.work_dir), stack.name, config)


# --------------------------------------------------------------------------------------------
# separate stacks


def test_invalid_config_fails_preview_and_up_with_one_message_and_creates_nothing(
    pulumi_ready: dict[str, str], crd: None, stacks_dir: Path, kube: Cluster
) -> None:
    raw = unique_deployment(deviceMode="foo", pmemPercentage=0)
    stack = make_stack(stacks_dir, stack_config(raw))
    try:
        for action in (stack.preview, stack.up):
            with pytest.raises(auto.CommandError) as err:
                action()
            text = str(err.value)
            assert "pmem-csi:deployments[0].deviceMode: must be one of lvm, direct" in text
            assert "pmem-csi:deployments[0].pmemPercentage: must be at least 1" in text
            # One message lists both problems. (The inline Automation API server logs a
            # program's RunError and also returns it, so the engine echoes it once more as
            # "an unhandled error occurred: <same message>"; the CLI host prints it once.)
            errors = [line for line in text.splitlines() if line.strip().startswith("error:")]
            assert errors and all(
                "invalid stack configuration (2 problem(s))" in line for line in errors
            ), text
        fake = DeploymentConfig(name=raw["name"], namespace=raw["namespace"])
        assert leftovers(kube, fake) == []
        resources = stack.export_stack().deployment.get("resources") or []
        assert [r["type"] for r in resources if r["type"] != "pulumi:pulumi:Stack"] == []
    finally:
        dispose(stack)


def _cert_secrets(index: int, certs: certlib.DriverCertificates) -> dict[str, str]:
    prefix = f"pmem-csi:deployments[{index}].certificates"
    return {
        f"{prefix}.registryKey": certs.registry_key,
        f"{prefix}.nodeControllerKey": certs.node_controller_key,
    }


def _cert_public(certs: certlib.DriverCertificates) -> dict[str, str]:
    return {
        "caCert": certs.ca_cert,
        "registryCert": certs.registry_cert,
        "nodeControllerCert": certs.node_controller_cert,
    }


def test_provided_certificates_are_used_as_is(
    pulumi_ready: dict[str, str], crd: None, stacks_dir: Path, api_client: Any, kube: Cluster
) -> None:
    certs = certlib.generate_driver_certificates()
    raw = unique_deployment(certificates=_cert_public(certs), reporter={"enabled": False})
    stack = make_stack(stacks_dir, stack_config(raw), _cert_secrets(0, certs))
    try:
        result = up(stack, "up with provided certificates")
        assert result.summary.result == "succeeded"
        cfg = parsed(
            raw, {"registryKey": certs.registry_key, "nodeControllerKey": certs.node_controller_key}
        )
        core = client.CoreV1Api(api_client)
        assert secret_data(core, cfg.names.registry_secret, cfg.namespace) == {
            "ca.crt": certs.ca_cert,
            "tls.crt": certs.registry_cert,
            "tls.key": certs.registry_key,
        }
        assert secret_data(core, cfg.names.node_secret, cfg.namespace) == {
            "ca.crt": certs.ca_cert,
            "tls.crt": certs.node_controller_cert,
            "tls.key": certs.node_controller_key,
        }
        assert_keys_not_in_plaintext(stack, [certs.registry_key, certs.node_controller_key])
        # No generated set: the provided CA is the one exported and recorded in the CR.
        assert "pulumi-python:dynamic/pmem-csi:Certificates" not in stored_state(stack)
        assert stack.outputs()["deployments"].value[cfg.name]["caCert"] == certs.ca_cert
        cr = kube.get(bundle.build_deployment_objects(cfg).deployment_cr)
        assert cr is not None
        assert base64.b64decode(cr["spec"]["caCert"]).decode() == certs.ca_cert
        assert "registryKey" not in cr["spec"] and "PRIVATE KEY" not in json.dumps(cr)
    finally:
        dispose(stack)


def test_certificates_from_another_ca_fail_before_anything_is_created(
    pulumi_ready: dict[str, str], crd: None, stacks_dir: Path, kube: Cluster
) -> None:
    good = certlib.generate_driver_certificates()
    other = certlib.generate_driver_certificates()
    public = {**_cert_public(good), "registryCert": other.registry_cert}
    secrets = {
        **_cert_secrets(0, good),
        # The registry pair comes from another CA; the node key belongs to another cert.
        "pmem-csi:deployments[0].certificates.registryKey": other.registry_key,
        "pmem-csi:deployments[0].certificates.nodeControllerKey": other.node_controller_key,
    }
    raw = unique_deployment(certificates=public)
    stack = make_stack(stacks_dir, stack_config(raw), secrets)
    try:
        with pytest.raises(auto.CommandError) as err:
            stack.up()
        text = str(err.value)
        assert "pmem-csi:deployments[0].certificates.registryCert" in text
        assert "not signed" in text
        assert "pmem-csi:deployments[0].certificates.nodeControllerKey" in text
        for key in (other.registry_key, other.node_controller_key, good.registry_key):
            assert pem_body(key)[:64] not in text
        fake = DeploymentConfig(name=raw["name"], namespace=raw["namespace"])
        assert leftovers(kube, fake) == []
    finally:
        dispose(stack)


def test_manage_crd_installs_crd_and_orders_the_cr_after_it(
    pulumi_ready: dict[str, str], crd: None, stacks_dir: Path, api_client: Any, kube: Cluster
) -> None:
    """``manageCrd: true``: the stack owns the CRD and registers the CR after it.

    Why it is special: the CRD is one cluster-wide object that the other tests (possibly
    running right now) need. The provider creates with server-side apply, so this stack
    adopts the CRD the fixture installed (same content, no conflict) instead of failing on
    "already exists". Before the stack is destroyed the CRD is dropped from its state, so
    ``destroy`` removes the driver but leaves the shared CRD (and everybody's CRs) alone.
    What this does not run is the CRD's own deletion; the CR's recorded dependency on it is
    what makes Pulumi delete the CR first, and that is checked.
    """
    raw = unique_deployment(reporter={"enabled": False})
    stack = make_stack(stacks_dir, stack_config(raw, manage_crd=True))
    cfg = parsed(raw)
    try:
        result = up(stack, "up with manageCrd")
        assert result.summary.result == "succeeded"
        assert stack.outputs()["crd"].value == names.CRD_NAME
        resources = stack.export_stack().deployment["resources"]
        crd_urns = [r["urn"] for r in resources if r["type"] == CRD_TYPE]
        assert len(crd_urns) == 1
        cr = [r for r in resources if r["type"] == CR_TYPE]
        assert len(cr) == 1 and crd_urns[0] in cr[0].get("dependencies", [])
        ext = client.ApiextensionsV1Api(api_client)
        live = ext.read_custom_resource_definition(names.CRD_NAME)
        managers = {m.manager for m in live.metadata.managed_fields or []}
        assert any(m.startswith("pulumi-kubernetes") for m in managers), managers
        _forget(stack, crd_urns)
        stack.destroy(on_output=ps.printer("[destroy] "))
        assert leftovers(kube, cfg) == []
        ext.read_custom_resource_definition(names.CRD_NAME)  # still there for the others
    finally:
        dispose(stack)


def _forget(stack: auto.Stack, urns: list[str]) -> None:
    """Drop resources from a stack's state (like ``pulumi state delete``), keeping them live."""
    state = stack.export_stack()
    dep = state.deployment
    dep["resources"] = [r for r in dep["resources"] if r["urn"] not in urns]
    for r in dep["resources"]:
        if r.get("dependencies"):
            r["dependencies"] = [d for d in r["dependencies"] if d not in urns]
        for prop, deps in (r.get("propertyDependencies") or {}).items():
            r["propertyDependencies"][prop] = [d for d in deps if d not in urns]
    stack.import_stack(state)
