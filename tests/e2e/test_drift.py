"""Objects changed behind Pulumi's back are restored by ``pulumi up --refresh`` (issue 10, 3).

Every kind the program creates for a deployment (Secrets, ServiceAccounts, Roles,
RoleBindings, ClusterRoles, ClusterRoleBindings, Services, the CSIDriver, the StatefulSet, the
DaemonSet, the CR and the reporter's Deployment and RBAC) is changed at once, three times, each
time the way another kind of client does it:

* ``kubectl-edit``: a PUT of the whole object read back (what ``kubectl edit``/``replace`` and
  the operator's e2e test's ``client.Update`` do), field manager ``kubectl-edit``;
* ``kubectl-patch``: the real ``kubectl patch --type=json`` (field manager ``kubectl-patch``);
* ``go-client``: a PUT under a manager name the provider knows nothing about (a controller
  written with client-go), the case that made the provider fail with a server-side-apply
  conflict (pulumi/pulumi-kubernetes#2404).

What changes: the kind's own fields (container commands and args, Service ports with an
added port, RBAC rules with a changed and an added rule, binding subjects, the CR spec, an
added Secret key, an added imagePullSecret, an annotation), a declared label changed, another
declared label removed and a label added. Which client makes which change rotates over the
objects, so every kind sees every client and every client makes every kind of change.

Then: a ``pulumi preview --refresh`` changes nothing in the cluster; one ``pulumi up
--refresh`` restores exactly the declared state, without a conflict, and leaves no field owned
by a manager other than Pulumi's and Kubernetes' own; the next ``pulumi up`` changes nothing.
One stack, one deployment, one restoring update: about a minute on the local cluster.
"""

from __future__ import annotations

import base64
import copy
import json
import re
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
from kubernetes.dynamic.exceptions import ConflictError
from pulumi import automation as auto

from pmem_components.config import DeploymentConfig
from pmem_components.manifests import bundle
from pmem_components.takeover_transform import TAKEN_OVER_ANNOTATION
from reporter.kubeapi import RawApi
from tests.e2e.reporter_helpers import ensure_crd
from tests.e2e.test_program import (
    Cluster,
    dispose,
    is_subset,
    make_stack,
    parsed,
    resource_changes,
    stack_config,
)
from tests.e2e.waiting import wait_for
from tools import pulumi_stack as ps

pytestmark = pytest.mark.timeout(900)

CLIENTS = ("kubectl-edit", "kubectl-patch", "go-client")
# Kubernetes' own controllers may own fields of our objects (e.g. the DaemonSet's
# deprecated.daemonset.template.generation annotation); nobody else may, after the update.
KUBERNETES_MANAGERS = {"kube-controller-manager", "kube-apiserver", "kube-scheduler", "kubelet"}
SUITE, TIER, EXTRA = "e2e.example.com/suite", "e2e.example.com/tier", "drift.example.com/added"
NOTE = "drift.example.com/note"
MALFORMED = ["malformed", "options"]  # the operator's e2e test's command


# --------------------------------------------------------------------------------------------
# the changes, as functions of a live object (dict) that change it in place


def _containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return obj["spec"]["template"]["spec"]["containers"]


def change_kind_fields(obj: dict[str, Any]) -> None:
    """The kind's own fields: what the issue names (command, ports, RBAC rules) and more."""
    kind = obj["kind"]
    if kind in ("DaemonSet", "StatefulSet", "Deployment") and "template" in obj.get("spec", {}):
        # The first container's command (the drivers declare one) or args (the reporter),
        # and an argument added to the second's (the sidecars).
        first, *others = _containers(obj)
        first["command" if "command" in first else "args"] = MALFORMED
        for container in others:
            container["args"] = [*container.get("args", []), "--added"]
    elif kind == "Service":
        obj["spec"]["ports"][0]["port"] = 1111
        obj["spec"]["ports"][0].setdefault("name", "main")  # required with a second port
        obj["spec"]["ports"].append({"name": "added", "port": 2222, "protocol": "TCP"})
    elif kind in ("Role", "ClusterRole"):
        obj["rules"][0]["verbs"] = ["*"]
        obj["rules"].append({"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]})
    elif kind in ("RoleBinding", "ClusterRoleBinding"):
        obj["subjects"].append({"kind": "ServiceAccount", "name": "intruder", "namespace": "x"})
    elif kind == "Secret":
        obj.setdefault("data", {})["added"] = base64.b64encode(b"added").decode()
    elif kind == "ServiceAccount":
        obj["imagePullSecrets"] = [{"name": "added"}]
    elif kind == "Deployment":  # the CR (the reporter's Deployment has a template)
        obj["spec"]["logLevel"] = 9
        obj["spec"]["pmemPercentage"] = 50
    else:  # CSIDriver: its spec is immutable
        obj["metadata"].setdefault("annotations", {})[NOTE] = "added"


def change_declared_label(obj: dict[str, Any]) -> None:
    obj["metadata"]["labels"][SUITE] = "changed"


def remove_and_add_labels(obj: dict[str, Any]) -> None:
    del obj["metadata"]["labels"][TIER]
    obj["metadata"]["labels"][EXTRA] = "yes"


CHANGES = (change_kind_fields, change_declared_label, remove_and_add_labels)


# --------------------------------------------------------------------------------------------
# the clients


@dataclass
class Clients:
    kube: Cluster
    kubectl: Callable[..., Any]

    def live(self, obj: dict[str, Any]) -> dict[str, Any]:
        got = self.kube.get(obj)
        assert got is not None, obj["metadata"]
        return got

    def change(self, client_name: str, obj: dict[str, Any], change: Callable[..., None]) -> None:
        """Make ``change`` as ``client_name`` does. A PUT that lost a race with a controller
        (409, the StatefulSet's status) reads again and retries, as such clients do."""
        for _ in range(10):
            try:
                self._change_once(client_name, obj, change)
                return
            except ConflictError:
                continue
        raise AssertionError(f"{described(obj)}: 10 conflicts in a row")

    def _change_once(
        self, client_name: str, obj: dict[str, Any], change: Callable[..., None]
    ) -> None:
        live = self.live(obj)
        changed = copy.deepcopy(live)
        change(changed)
        assert changed != live
        meta = obj["metadata"]
        if client_name == "kubectl-patch":
            ops = jsonpatch.make_patch(live, changed).patch
            kind = f"{obj['kind'].lower()}.{obj['apiVersion'].split('/')[0]}"
            if "/" not in obj["apiVersion"]:
                kind = obj["kind"].lower()
            where = ["-n", meta["namespace"]] if meta.get("namespace") else []
            self.kubectl("patch", kind, meta["name"], *where, "--type=json", "-p", json.dumps(ops))
            return
        manager = client_name
        if client_name == "go-client":  # a name the provider cannot know
            manager = f"drift-{uuid.uuid4().hex[:4]}"
        self.kube.resource(obj["apiVersion"], obj["kind"]).replace(
            body=changed, namespace=meta.get("namespace"), field_manager=manager
        )


def _crd_established(api_client: Any) -> bool:
    from kubernetes import client

    obj = client.ApiextensionsV1Api(api_client).read_custom_resource_definition(
        "deployments.pmem-csi.intel.com"
    )
    return any(c.type == "Established" and c.status == "True" for c in obj.status.conditions or [])


def foreign_managers(live: dict[str, Any]) -> list[str]:
    """Managers of the main resource that are neither Pulumi's nor Kubernetes' own."""
    return [
        e["manager"]
        for e in live["metadata"].get("managedFields") or []
        if not e.get("subresource")
        and not e["manager"].startswith("pulumi-kubernetes")
        and e["manager"] not in KUBERNETES_MANAGERS
    ]


# Annotations the controllers write (a rollout counts up).
CONTROLLER_ANNOTATIONS = {
    "deprecated.daemonset.template.generation",
    "deployment.kubernetes.io/revision",
    # Not a controller's: the take-over's stamp, the new input that makes the engine update
    # an object whose declared fields someone else owned (pmem_components.takeover_transform).
    TAKEN_OVER_ANNOTATION,
}


def _annotations(live: dict[str, Any]) -> dict[str, str]:
    found = live["metadata"].get("annotations") or {}
    return {k: v for k, v in found.items() if k not in CONTROLLER_ANNOTATIONS}


def _service_spec(live: dict[str, Any]) -> dict[str, Any]:
    spec = copy.deepcopy(live["spec"])
    for port in spec.get("ports") or []:
        port.pop("nodePort", None)
    return spec


def described(obj: dict[str, Any]) -> str:
    ns = obj["metadata"].get("namespace")
    return f"{obj['kind']} {ns + '/' if ns else ''}{obj['metadata']['name']}"


# --------------------------------------------------------------------------------------------
# the stack


@dataclass
class Drifted:
    stack: auto.Stack
    cfg: DeploymentConfig
    objects: list[dict[str, Any]]  # the builders' objects, Namespace aside
    declared: dict[str, dict[str, Any]]  # live objects after the first up, by described()
    output: list[str]
    raw: dict[str, Any]


@pytest.fixture(scope="module")
def drifted(
    pulumi_ready: dict[str, str],
    api_client: Any,
    kubectl: Callable[..., Any],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Drifted]:
    ensure_crd(RawApi(api_client))  # shared, left in place
    wait_for(lambda: _crd_established(api_client), 30, "CRD Established")
    suffix = uuid.uuid4().hex[:6]
    raw = {
        "name": f"drift-{suffix}.pmem-csi.intel.com",
        "namespace": f"drift-{suffix}",
        "labels": {SUITE: "drift", TIER: "storage"},
        "reporter": {"image": "registry.example/pmem-csi-reporter:e2e"},
    }
    cfg = parsed(raw)
    stack = make_stack(tmp_path_factory.mktemp("drift"), stack_config(raw))
    kube = Cluster(api_client)
    try:
        first = stack.up(on_output=ps.printer("[drift first up] "))
        assert first.summary.result == "succeeded"
        built = bundle.build_deployment_objects(cfg).all()
        objects = [o for o in built if o["kind"] != "Namespace"]
        clients = Clients(kube, kubectl)
        declared = {described(o): clients.live(o) for o in objects}
        for i, obj in enumerate(objects):
            for j, change in enumerate(CHANGES):
                clients.change(CLIENTS[(i + j) % len(CLIENTS)], obj, change)
        yield Drifted(stack, cfg, objects, declared, [], raw)
    finally:
        dispose(stack)


def _versions(kube: Cluster, objects: list[dict[str, Any]]) -> dict[str, str]:
    return {
        described(o): ((kube.get(o) or {}).get("metadata") or {}).get("resourceVersion", "")
        for o in objects
    }


def test_every_object_was_changed_by_every_client(drifted: Drifted, api_client: Any) -> None:
    """The premise: every object differs from what Pulumi applied, and each of the three
    clients (by its field manager) owns fields of it."""
    kube = Cluster(api_client)
    for obj in drifted.objects:
        live = kube.get(obj)
        assert live is not None
        managers = foreign_managers(live)
        assert {"kubectl-edit", "kubectl-patch"} <= set(managers), (described(obj), managers)
        assert any(m.startswith("drift-") for m in managers), (described(obj), managers)
        assert live["metadata"]["labels"].get(EXTRA) == "yes"
        assert TIER not in live["metadata"]["labels"]


def test_preview_changes_nothing_in_the_cluster(drifted: Drifted, api_client: Any) -> None:
    kube = Cluster(api_client)
    before = _versions(kube, drifted.objects)
    lines: list[str] = []
    drifted.stack.preview(refresh=True, on_output=lines.append)
    assert _versions(kube, drifted.objects) == before
    text = "".join(lines)
    for obj in drifted.objects:
        assert f"pulumi up would take over fields of {described(obj)} (" in text, described(obj)


def test_up_refresh_restores_the_declared_state_and_owns_every_field(
    drifted: Drifted, api_client: Any
) -> None:
    kube = Cluster(api_client)
    lines: list[str] = []

    def out(line: str) -> None:
        lines.append(line)
        ps.printer("[drift up --refresh] ")(line)

    start = time.monotonic()
    result = drifted.stack.up(refresh=True, on_output=out)
    # A figure for docs/faults.md (not asserted: timing depends on the machine).
    print(f"\nrestoring pulumi up --refresh: {time.monotonic() - start:.1f} s")
    text = "".join(lines)
    assert result.summary.result == "succeeded"
    assert "conflict" not in text.lower()
    diagnostics = text.split("Diagnostics:", 1)[-1]
    problems: list[str] = []
    for obj in drifted.objects:
        key = described(obj)
        live = kube.get(obj)
        assert live is not None, key
        # One line per object taken over, naming it (counted in the summary of diagnostics;
        # the progress display repeats lines).
        line = f"took over fields of {re.escape(key)} and applied it "
        if len(re.findall(line, diagnostics)) != 1:
            problems.append(f"{key}: not named once in the output")
        if foreign_managers(live):
            problems.append(f"{key}: still owned by {foreign_managers(live)}")
        declared = drifted.declared[key]
        if live["metadata"]["uid"] != declared["metadata"]["uid"]:
            problems.append(f"{key}: re-created")  # restored in place, never replaced
        # Exactly the declared state: the labels, the kind's fields (lists element for
        # element), no added key, annotation or list item.
        if live["metadata"]["labels"] != declared["metadata"]["labels"]:
            problems.append(f"{key}: labels {live['metadata']['labels']}")
        if _annotations(live) != _annotations(declared):
            problems.append(f"{key}: annotations {live['metadata'].get('annotations')}")
        for field in ("spec", "rules", "subjects", "data", "imagePullSecrets"):
            if field == "spec" and obj["kind"] in ("DaemonSet", "StatefulSet", "Deployment"):
                # Controllers write defaults into a spec (e.g. revisionHistoryLimit); the
                # builders' fields must be there, element for element, and nothing of ours.
                problems += is_subset(obj.get("spec"), live.get("spec"), f"{key}.spec")
                if "template" in live.get("spec", {}):
                    got = [(c.get("command"), c.get("args")) for c in _containers(live)]
                    want = [(c.get("command"), c.get("args")) for c in _containers(declared)]
                    if got != want:
                        problems.append(f"{key}: command and args {got}")
                continue
            if obj["kind"] == "Service" and field == "spec":
                # A port re-created by the restore gets a new nodePort; the rest is equal.
                if _service_spec(live) != _service_spec(declared):
                    problems.append(f"{key}.spec: {live['spec']}")
                continue
            if live.get(field) != declared.get(field):
                problems.append(f"{key}.{field}: {live.get(field)!r}")
    assert not problems, "\n".join(problems)
    drifted.output.append(text)


def test_next_up_changes_nothing(drifted: Drifted, api_client: Any) -> None:
    kube = Cluster(api_client)
    before = _versions(kube, drifted.objects)
    result = drifted.stack.up(on_output=ps.printer("[drift second up] "))
    changes = resource_changes(result.summary)
    assert set(changes) == {"same"}, changes
    assert _versions(kube, drifted.objects) == before


def test_take_over_fields_false_leaves_fields_to_their_owners(
    drifted: Drifted, api_client: Any, kubectl: Callable[..., Any]
) -> None:
    """``pmem-csi:takeOverFields: false``: nothing is taken over, and a field someone else
    changed makes ``pulumi up --refresh`` fail on the conflict, as the provider alone does."""
    work = Path(drifted.stack.workspace.work_dir)
    config = {**stack_config(drifted.raw), "pmem-csi:takeOverFields": False}
    ps.write_stack_config(work, drifted.stack.name, config)
    # Without the setting the objects are no longer applied with force.
    switched = drifted.stack.up(on_output=ps.printer("[drift takeOverFields false] "))
    assert switched.summary.result == "succeeded"
    ds = next(o for o in drifted.objects if o["kind"] == "DaemonSet")
    clients = Clients(Cluster(api_client), kubectl)
    clients.change("go-client", ds, change_kind_fields)
    lines: list[str] = []
    with pytest.raises(auto.CommandError) as err:
        drifted.stack.up(refresh=True, on_output=lines.append)
    assert "Server-Side Apply field conflict" in str(err.value), str(err.value)[-2000:]
    assert "took over" not in "".join(lines)
    live = clients.live(ds)
    assert any(m.startswith("drift-") for m in foreign_managers(live)), live["metadata"]
    assert _containers(live)[0]["command"] == MALFORMED
