"""The preflight's plan (:func:`pmem_components.preflight.plan`): every problem's whole text,
and the decisions that mutation testing showed the table tests in test_preflight.py leave open.

Why whole texts: each problem is what an administrator reads before anything changes in the
cluster; it names the config key to set and the next step. test_preflight.py checks a key
phrase of each; a message with the wrong key path or a lost sentence passed it.
"""

from __future__ import annotations

from typing import Any

import pytest
from test_preflight import ME, DryRunApi, _lives, cr, ns, stack

from pmem_components import names, preflight
from pmem_components.preflight import Observed, ObservedObject, Previous, plan

RUNBOOK = "see docs/day2.md: migrate from the PMEM-CSI operator"
OURS = {names.LABEL_MANAGED_BY: names.MANAGED_BY}
DRIVER = "pmem-csi.intel.com"


def problems(config: Any, observed: Observed) -> list[str]:
    return plan(config, observed, ME).problems


def node_driver(name: str, namespace: str, driver: str = DRIVER, **extra: Any) -> ObservedObject:
    """A DaemonSet whose pods run the CSI driver ``driver`` (another variable comes first)."""
    env = [{"name": "OTHER", "value": "x"}, {"name": "PMEM_CSI_DRIVER_NAME", "value": driver}]
    spec = {"template": {"spec": {"containers": [{"name": "c", "env": env}]}}}
    return ObservedObject("DaemonSet", name, namespace, spec=spec, **extra)


# --------------------------------------------------------------------------- namespaces


def test_a_namespace_of_another_stack() -> None:
    observed = Observed(namespaces={"pmem-csi": ns("pmem-csi", owner="x/other")})
    assert problems(stack({"adoptNamespace": True}), observed) == [
        "pmem-csi:deployments[0].createNamespace: namespace 'pmem-csi' is managed by stack "
        "'x/other'; set createNamespace: false to deploy into it without managing it"
    ]


def test_a_foreign_namespace_is_named_at_the_deployment_that_creates_it() -> None:
    config = stack(
        {"name": "a.example", "namespace": "x", "createNamespace": False},
        {"name": "b.example", "namespace": "x"},
    )
    assert problems(config, Observed(namespaces={"x": ns("x")})) == [
        "pmem-csi:deployments[1].createNamespace: namespace 'x' already exists and was not "
        "created by this stack; set pmem-csi:deployments[1].adoptNamespace: true to manage it "
        "from now on (it is kept on destroy unless pmem-csi:retainNamespaces is false), or "
        "createNamespace: false to use it as it is"
    ]


def test_every_namespace_is_checked_after_a_new_or_own_one() -> None:
    config = stack(
        {"name": "a.example", "namespace": "new"},
        {"name": "b.example", "namespace": "mine"},
        {"name": "c.example", "namespace": "legacy"},
        {"name": "d.example", "namespace": "foreign"},
    )
    observed = Observed(
        namespaces={
            "mine": ns("mine", owner=ME),
            # Created by this program before it annotated namespaces with the stack.
            "legacy": ns("legacy", ours=True),
            "foreign": ns("foreign"),
        }
    )
    (problem,) = problems(config, observed)
    assert problem.startswith("pmem-csi:deployments[3].createNamespace: namespace 'foreign' ")


# --------------------------------------------------------------------------- the CRs


def test_a_cr_of_another_stack() -> None:
    observed = Observed(crs={DRIVER: cr(DRIVER, "elsewhere", owner="x/other")})
    # Only the ownership: its namespace is not this stack's business.
    assert problems(stack({}), observed) == [
        "pmem-csi:deployments[0].name: the Deployment CR 'pmem-csi.intel.com' belongs to stack "
        "'x/other'; one driver name is managed by one stack"
    ]


def test_a_cr_of_the_operator() -> None:
    observed = Observed(crs={DRIVER: cr(DRIVER, owner=None)})
    assert problems(stack({}), observed) == [
        "pmem-csi:deployments[0].name: a Deployment CR 'pmem-csi.intel.com' exists that this "
        "stack did not create (the PMEM-CSI operator's?); to take the deployment over, stop the "
        "operator, remove the old CR with `kubectl delete deployments.pmem-csi.intel.com "
        "pmem-csi.intel.com --cascade=orphan` (the driver keeps running) and set "
        f"pmem-csi:deployments[0].adoptExisting: true; {RUNBOOK}"
    ]


def test_a_namespace_change() -> None:
    observed = Observed(crs={DRIVER: cr(DRIVER, "old")})
    assert problems(stack({}), observed) == [
        "pmem-csi:deployments[0].namespace: changing it from 'old' to 'pmem-csi' reinstalls the "
        "driver (every object is deleted and created anew; the driver is down meanwhile, "
        "volumes stay); set pmem-csi:deployments[0].allowReinstall: true to do it"
    ]


def test_a_cr_without_a_recorded_namespace_is_no_move() -> None:
    observed = Observed(crs={DRIVER: cr(DRIVER, "")})
    result = plan(stack({"allowReinstall": True}), observed, ME)
    assert result.problems == []
    assert result.previous == {}


def test_a_device_mode_change() -> None:
    observed = Observed(crs={DRIVER: cr(DRIVER, mode="lvm")})
    assert problems(stack({"deviceMode": "direct"}), observed) == [
        "pmem-csi:deployments[0].deviceMode: changing it from 'lvm' to 'direct' makes the "
        "existing volumes unusable (their PMEM is managed the other way; the Deployment CR); "
        "delete or back up the "
        "volumes first, then set pmem-csi:deployments[0].allowDeviceModeChange: true"
    ]


def test_new_names_while_old_ones_are_gone() -> None:
    observed = Observed(
        crs={"old.example": cr("old.example"), "older.example": cr("older.example")}
    )
    assert problems(stack({"name": "new.example"}), observed) == [
        "pmem-csi:deployments[0].name: 'new.example' is new while 'old.example', "
        "'older.example' (deployed by this stack) is no longer configured. If it replaces it, "
        "set pmem-csi:deployments[0].renamedFrom: 'old.example' (the old driver is removed "
        "before the new one starts); if not, remove the old deployment in one pulumi up and add "
        "the new one in the next, so that two node drivers never run on the same nodes"
    ]


def test_adding_a_deployment_next_to_a_configured_one_is_no_rename() -> None:
    observed = Observed(crs={"a.example": cr("a.example")})
    assert problems(stack({"name": "a.example"}, {"name": "b.example"}), observed) == []


def test_renamed_from_a_name_that_is_not_there_moves_nothing() -> None:
    result = plan(stack({"name": "new.example", "renamedFrom": "old.example"}), Observed(), ME)
    assert result.problems == []
    assert result.previous == {}


def test_a_rename_from_a_cr_without_a_recorded_namespace() -> None:
    observed = Observed(crs={"old.example": cr("old.example", "")})
    result = plan(stack({"name": "new.example", "renamedFrom": "old.example"}), observed, ME)
    assert result.problems == []
    assert result.previous == {0: Previous("old.example", "")}


# --------------------------------------------------------------------------- same-named objects

KINDS = [
    "Service",
    "ServiceAccount",
    "Secret",
    "StatefulSet",
    "DaemonSet",
    "ConfigMap",
    "Deployment",
]


def test_foreign_objects_are_listed_workloads_first_and_at_most_five() -> None:
    objs = [ObservedObject(k, f"o{i}", "pmem-csi") for i, k in enumerate(KINDS)]
    assert problems(stack({}), Observed(same_named={0: objs})) == [
        "pmem-csi:deployments[0]: DaemonSet pmem-csi/o4, StatefulSet pmem-csi/o3, Deployment "
        "pmem-csi/o6, Service pmem-csi/o0, ServiceAccount pmem-csi/o1 and 2 more already exist "
        "and were not created by pmem-csi-pulumi; set pmem-csi:deployments[0].adoptExisting: "
        "true to take them over (server-side apply with force), or remove them"
    ]


def test_operator_objects_name_the_cr_and_the_next_step() -> None:
    owner = ((f"{names.CRD_GROUP}/v1beta1", "Deployment", "old-cr"),)
    objs = [ObservedObject(k, f"o{i}", "pmem-csi", owners=owner) for i, k in enumerate(KINDS[:5])]
    assert problems(stack({}), Observed(same_named={0: objs})) == [
        "pmem-csi:deployments[0]: DaemonSet pmem-csi/o4, StatefulSet pmem-csi/o3, Service "
        "pmem-csi/o0, ServiceAccount pmem-csi/o1, Secret pmem-csi/o2 belong to the PMEM-CSI "
        "operator (ownerReference to Deployment 'old-cr'); deleting that CR would "
        "garbage-collect them even after Pulumi took them over. Next step: stop the operator, "
        "run `kubectl delete deployments.pmem-csi.intel.com old-cr --cascade=orphan` (Kubernetes "
        "removes the ownerReferences, the driver keeps running), then set "
        "pmem-csi:deployments[0].adoptExisting: true and run pulumi up again; "
        f"{RUNBOOK}"
    ]


# --------------------------------------------------------------------------- node drivers


def test_node_drivers_of_the_same_name_elsewhere_each_get_a_problem() -> None:
    observed = Observed(
        daemon_sets=[
            node_driver("other-driver", "elsewhere", driver="other.example"),  # not ours to judge
            node_driver("here", "pmem-csi"),  # the deployment's own namespace
            node_driver("d1", "other"),
            node_driver("d2", "other2", labels=OURS),
        ]
    )
    assert problems(stack({}), observed) == [
        "pmem-csi:deployments[0].namespace: DaemonSet other/d1 runs node drivers for "
        "'pmem-csi.intel.com' in another namespace; a second node driver of the same name would "
        f"run on the same nodes. Remove it first ({RUNBOOK})",
        # Made by pmem-csi-pulumi (another stack's): no operator runbook.
        "pmem-csi:deployments[0].namespace: DaemonSet other2/d2 runs node drivers for "
        "'pmem-csi.intel.com' in another namespace; a second node driver of the same name would "
        "run on the same nodes. Remove it first",
    ]


def test_an_operator_node_driver_made_by_this_program_still_names_the_runbook() -> None:
    owner = ((f"{names.CRD_GROUP}/v1beta1", "Deployment", "old-cr"),)
    observed = Observed(daemon_sets=[node_driver("d", "other", labels=OURS, owners=owner)])
    (problem,) = problems(stack({}), observed)
    assert problem.endswith(f"Remove it first ({RUNBOOK})")


def test_this_stacks_own_node_driver_elsewhere_is_left_to_the_move_checks() -> None:
    """Its CR records the namespace, so the namespace-change problem covers it, once."""
    observed = Observed(
        crs={DRIVER: cr(DRIVER, "old")},
        daemon_sets=[node_driver("mine", "old", labels=OURS), node_driver("d", "other")],
    )
    found = problems(stack({}), observed)
    assert [p.split(":", 2)[1] for p in found] == [
        "deployments[0].namespace",
        "deployments[0].namespace",
    ]
    assert found[0].startswith("pmem-csi:deployments[0].namespace: changing it from 'old'")
    assert found[1].startswith("pmem-csi:deployments[0].namespace: DaemonSet other/d runs")


def test_a_node_driver_in_the_reinstalls_old_namespace_is_replaced_not_refused() -> None:
    observed = Observed(
        crs={DRIVER: cr(DRIVER, "old")},
        daemon_sets=[node_driver("old-driver", "old"), node_driver("d", "other")],
    )
    (problem,) = problems(stack({"allowReinstall": True}), observed)
    assert problem.startswith("pmem-csi:deployments[0].namespace: DaemonSet other/d runs")


# --------------------------------------------------------------------------- API paths


def test_api_paths_of_core_and_group_kinds() -> None:
    assert preflight._path("v1", "Namespace", None, "x") == "/api/v1/namespaces/x"
    assert preflight._path("v1", "Secret", "ns", None) == "/api/v1/namespaces/ns/secrets"
    assert (
        preflight._path("apps/v1", "DaemonSet", "ns", "d")
        == "/apis/apps/v1/namespaces/ns/daemonsets/d"
    )
    # A kind without a listed plural: lower case plus "s".
    widget = preflight._path("example.com/v1", "Widget", None, "w")
    assert widget == "/apis/example.com/v1/widgets/w"


def test_an_unawaited_move_names_rename_or_reinstall_and_the_two_node_drivers() -> None:
    from test_preflight import node_ds

    moving = {DRIVER: cr(DRIVER, "old")}
    renamed = stack({"name": "new.example", "renamedFrom": DRIVER, "await": {"enabled": False}})
    (problem,) = problems(renamed, Observed(crs=moving, daemon_sets=[node_ds(namespace="old")]))
    assert "the old node DaemonSet of this rename would still run its pods" in problem
    skipping = node_ds(namespace="old", annotations={"pulumi.com/skipAwait": "true"})
    (problem,) = problems(
        stack({"allowReinstall": True}), Observed(crs=moving, daemon_sets=[skipping])
    )
    assert (
        "so the move would not wait for the old node driver's pods to go: two node drivers on "
        "the same nodes; first run pulumi up" in problem
    )


def test_an_object_of_another_kind_is_bound_to_no_driver() -> None:
    pod = ObservedObject(kind="Pod", name="p", spec={"csi": {"driver": DRIVER}})
    assert preflight.volume_driver(pod) is None


def test_a_volume_of_another_provisioner_type_is_bound_to_no_driver() -> None:
    """A PersistentVolume without ``csi`` (a hostPath one) or with ``csi: null``."""
    for spec in ({"hostPath": {"path": "/mnt"}}, {"csi": None}):
        pv = ObservedObject(kind="PersistentVolume", name="pv", spec=spec)
        assert preflight.volume_driver(pv) is None


def test_a_refusal_without_causes_gives_the_status_message_or_for_a_secret_its_reason() -> None:
    status = {"reason": "Invalid", "message": "Secret x is invalid: value 's3cr3t'"}
    assert preflight._refusal(status, secret=False) == ([], status["message"])
    assert preflight._refusal(status, secret=True) == ([], "Invalid")
    assert preflight._refusal({"reason": "Invalid"}, secret=False) == ([], "Invalid")


class RefusesServiceAccounts:
    """The test_preflight API, refusing every ServiceAccount with or without the patches."""

    def __init__(self) -> None:
        self.api = DryRunApi()

    def dry_apply(self, path: str, obj: Any, manager: str) -> tuple[int, dict[str, Any]]:
        if obj["kind"] == "ServiceAccount":
            return 422, {"kind": "Status", "reason": "Invalid"}
        return self.api.dry_apply(path, obj, manager)


def test_objects_after_an_accepted_or_refused_anyway_one_are_still_dry_run() -> None:
    # The ServiceAccount comes before the StatefulSet: accepted with the annotation, then
    # refused whatever the patches say; neither ends the look at the StatefulSet.
    annotate = {"kind": "ServiceAccount", "mergePatch": {"metadata": {"annotations": {"a": "b"}}}}
    policy = {"kind": "StatefulSet", "mergePatch": {"spec": {"podManagementPolicy": "Parallel"}}}
    s = stack({"patches": [annotate, policy]})
    (rejection,) = preflight.patch_rejections(DryRunApi(), s, _lives(s.deployments[0]))
    assert rejection.ref == "StatefulSet pmem-csi/pmem-csi-intel-com-controller"
    # Refused with and without the patches: the update's, not the patch's, and said too
    # (tail of issue 15: the provider would replace it either way).
    found = preflight.patch_rejections(RefusesServiceAccounts(), s, _lives(s.deployments[0]))
    assert [(r.ref, r.labels != ()) for r in found] == [
        ("ServiceAccount pmem-csi/pmem-csi-intel-com-controller", False),
        ("StatefulSet pmem-csi/pmem-csi-intel-com-controller", True),
    ]


# --------------------------------------------------------------------------- with the state


def _identity_case() -> tuple[Any, Any, Any]:
    from test_preflight_identity import ME as STACK_ME
    from test_preflight_identity import cr as held_cr
    from test_preflight_identity import ns as held_ns

    return STACK_ME, held_cr, held_ns


def test_unheld_namespaces_are_each_refused_at_the_deployment_that_creates_them() -> None:
    """Two retained namespaces: each refusal names its own createNamespace key and the way
    to use it unmanaged; the first refusal does not end the look at the second."""
    from pmem_components import identity

    me, _, held_ns = _identity_case()
    config = stack({"name": "a.example", "namespace": "a"}, {"name": "b.example", "namespace": "b"})
    observed = Observed(namespaces={"a": held_ns("a"), "b": held_ns("b")})
    found = plan(config, observed, me, identity.StackState()).problems
    assert [p.split(": ", 1)[0] for p in found] == [
        "pmem-csi:deployments[0].createNamespace",
        "pmem-csi:deployments[1].createNamespace",
    ]
    for name, problem in zip("ab", found, strict=True):
        assert problem.startswith(
            f"pmem-csi:deployments[{'ab'.index(name)}].createNamespace: "
            f"namespace {name!r} carries this stack's identity {me!r}"
        )
        assert problem.endswith(
            f'set pmem-csi:adopt: ["Namespace {name}"] (or true) to take it over (its fields '
            "and field managers become this stack's); otherwise use createNamespace: false"
        )


def test_a_cr_the_state_holds_with_another_uid_is_refused_as_not_this_stacks() -> None:
    """A CR of the name deleted and made anew since (another uid) is not the one this stack
    recorded: refused at the deployment's name, naming the adopt entry."""
    from pmem_components import identity

    me, held_cr, _ = _identity_case()
    live = held_cr(DRIVER)
    state = identity.StackState({live.key: identity.Held("older-uid", "pulumi-kubernetes-1")})
    (problem,) = plan(stack({}), Observed(crs={DRIVER: live}), me, state).problems
    assert problem.startswith(f"pmem-csi:deployments[0].name: the Deployment CR {DRIVER!r} ")
    assert f'pmem-csi:adopt: ["Deployment {DRIVER}"]' in problem
    assert problem.endswith(
        "otherwise use another driver name (one driver name is managed by one stack)"
    )


def test_a_cr_another_stack_took_over_is_refused_at_the_deployments_name() -> None:
    """The take-away refusal of a configured deployment's CR names the key
    ``deployments[i].name`` of that deployment (the second one here)."""
    from pmem_components import identity

    me, held_cr, _ = _identity_case()
    other = held_cr("other.example", namespace="other", uid="other-uid")
    live = ObservedObject(
        **{**held_cr(DRIVER).__dict__, "pulumi_managers": ("pulumi-kubernetes-b",)}
    )
    state = identity.StackState(
        {o.key: identity.Held(o.uid, "pulumi-kubernetes-1") for o in (other, live)}
    )
    config = stack({"name": "other.example", "namespace": "other"}, {})
    observed = Observed(crs={"other.example": other, DRIVER: live})
    (problem,) = plan(config, observed, me, state).problems
    assert problem.startswith(
        f"pmem-csi:deployments[1].name: the Deployment CR {DRIVER!r} is in this stack's state, "
        "but another stack has taken it over since: its field manager is pulumi-kubernetes-b"
    )


def test_a_held_namespace_name_made_anew_by_someone_else_is_not_this_stacks_to_refuse() -> None:
    """The state holds a namespace no deployment creates any more, but the live one of that
    name has another uid (deleted and made anew): not this stack's object, so no refusal
    about dropping it; one the state holds that is gone from the cluster likewise."""
    from pmem_components import identity

    me, _, held_ns = _identity_case()
    recorded = held_ns("old-ns")
    gone = held_ns("gone-ns")
    state = identity.StackState(
        {
            recorded.key: identity.Held("older-uid", "pulumi-kubernetes-1"),
            gone.key: identity.Held("gone-uid", "pulumi-kubernetes-1"),
        }
    )
    live = ObservedObject(**{**recorded.__dict__, "pulumi_managers": ("pulumi-kubernetes-b",)})
    assert plan(stack({}), Observed(namespaces={"old-ns": live}), me, state).problems == []


# --------------------------------------------------------------------------- node drivers, moves


def test_a_move_still_refuses_a_node_driver_of_the_name_in_a_third_namespace() -> None:
    """An allowed reinstall from 'old' replaces the node driver there only: one of the same
    CSI driver name in yet another namespace is still refused; without a move, one in
    another namespace is refused and the own namespace's is not."""
    observed = Observed(
        crs={DRIVER: cr(DRIVER, "old")},
        daemon_sets=[node_driver("old-driver", "old"), node_driver("d", "third")],
    )
    assert problems(stack({"allowReinstall": True}), observed) == [
        "pmem-csi:deployments[0].namespace: DaemonSet third/d runs node drivers for "
        f"{DRIVER!r} in another namespace; a second node driver of the same name would run on "
        f"the same nodes. Remove it first ({RUNBOOK})"
    ]
    alone = Observed(daemon_sets=[node_driver("here", "pmem-csi"), node_driver("d", "third")])
    (problem,) = problems(stack({}), alone)
    assert problem.startswith("pmem-csi:deployments[0].namespace: DaemonSet third/d runs")


def test_the_running_device_mode_is_read_from_the_containers_args_too() -> None:
    """A node DaemonSet that passes -deviceManager= in ``args`` (not ``command``) still
    tells the running mode: a change from it is refused, naming the DaemonSet."""
    container = {
        "name": "pmem-driver",
        "command": ["/usr/local/bin/pmem-csi-driver"],
        "args": ["-deviceManager=lvm", "-mode=node"],
        "env": [{"name": "PMEM_CSI_DRIVER_NAME", "value": DRIVER}],
    }
    ds = ObservedObject(
        "DaemonSet",
        "pmem-csi-intel-com-node",
        "pmem-csi",
        labels=OURS,
        spec={"template": {"spec": {"containers": [container]}}},
    )
    assert problems(stack({"deviceMode": "direct"}), Observed(daemon_sets=[ds])) == [
        "pmem-csi:deployments[0].deviceMode: changing it from 'lvm' to 'direct' makes the "
        "existing volumes unusable (their PMEM is managed the other way; DaemonSet "
        "pmem-csi/pmem-csi-intel-com-node runs -deviceManager=lvm); delete or back up the "
        "volumes first, then set pmem-csi:deployments[0].allowDeviceModeChange: true"
    ]


def test_an_unawaited_reinstall_is_refused_with_the_whole_text() -> None:
    """await.enabled: false during a move: the refusal names the key, the annotation, the
    overlap and the setting for the moving update."""
    from test_preflight import node_ds

    observed = Observed(crs={DRIVER: cr(DRIVER, "old")}, daemon_sets=[node_ds(namespace="old")])
    config = stack({"allowReinstall": True, "await": {"enabled": False}})
    assert problems(config, observed) == [
        "pmem-csi:deployments[0].await.enabled: false sets pulumi.com/skipAwait, with which "
        "the provider does not wait for a delete either: the old node DaemonSet of this "
        "reinstall would still run its pods when the new one starts, two node drivers on the "
        "same nodes. Set await.enabled: true for the update that moves the deployment"
    ]


# --------------------------------------------------------------------------- patch dry runs


class RefusesEverything:
    """An API server that refuses every patched object, naming one field, and accepts the
    unpatched ones."""

    def __init__(self, field: str) -> None:
        self.field = field
        self.calls: list[str] = []

    def dry_apply(self, path: str, obj: Any, manager: str) -> tuple[int, dict[str, Any]]:
        self.calls.append(path)
        if obj.get("metadata", {}).get("annotations", {}).get("patched") or obj.get("spec", {}).get(
            "minReadySeconds"
        ):
            cause = {"reason": "FieldValueForbidden", "field": self.field, "message": "no"}
            return 422, {"kind": "Status", "reason": "Invalid", "details": {"causes": [cause]}}
        return 200, obj


def test_a_refusal_names_only_the_changed_fields_the_api_server_names() -> None:
    """A patch changing two fields, one of which is refused: the rejection names that one."""
    both = {"podManagementPolicy": "Parallel", "minReadySeconds": 5}
    s = stack({"patches": [{"kind": "StatefulSet", "mergePatch": {"spec": both}}]})
    api = RefusesEverything("spec.podManagementPolicy")
    (rejection,) = preflight.patch_rejections(api, s, _lives(s.deployments[0]))
    assert rejection.fields == ("spec.podManagementPolicy",)


class RefusesTwoFields(RefusesEverything):
    """Refuses the patched object naming a scalar field and a field inside a list entry."""

    def dry_apply(self, path: str, obj: Any, manager: str) -> tuple[int, dict[str, Any]]:
        self.calls.append(path)
        if obj.get("spec", {}).get("minReadySeconds"):
            causes = [
                {"reason": "FieldValueForbidden", "field": f, "message": "no"}
                for f in ("spec.minReadySeconds", "spec.template.spec.containers[0].image")
            ]
            return 422, {"kind": "Status", "reason": "Invalid", "details": {"causes": causes}}
        return 200, obj


def test_a_refused_field_inside_a_changed_list_is_named_with_the_others() -> None:
    """The API server names a list entry's field with ``[``; the changed list counts as
    refused too, so the administrator learns of both changes in one run, not one per run."""
    ops = [
        {"op": "add", "path": "/spec/minReadySeconds", "value": 5},
        {"op": "replace", "path": "/spec/template/spec/containers/0/image", "value": "x:1"},
    ]
    s = stack({"patches": [{"kind": "StatefulSet", "jsonPatch": ops}]})
    (rejection,) = preflight.patch_rejections(
        RefusesTwoFields(""), s, _lives(s.deployments[0])
    )
    assert set(rejection.fields) == {"spec.minReadySeconds", "spec.template.spec.containers"}


def test_the_namespace_is_not_dry_run_with_the_deployments_patches() -> None:
    """The namespace is registered apart from the deployment's objects (and may not be this
    stack's): a patch selecting a Namespace never dry-runs the live namespace."""
    from pmem_components.preflight import _path

    s = stack({"patches": [{"kind": "Namespace", "mergePatch": {"metadata": {"annotations": {
        "patched": "yes"}}}}]})  # fmt: skip
    lives = {_path("v1", "Namespace", None, "pmem-csi"): {
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "pmem-csi"}}}  # fmt: skip
    api = RefusesEverything("metadata.annotations")
    assert preflight.patch_rejections(api, s, lives) == []
    assert api.calls == []


def test_a_dropped_object_another_stack_took_names_the_state_delete_whole() -> None:
    """The whole refusal for a dropped CR and a dropped namespace another stack took over:
    what would be deleted, both managers, and the state delete (by URN when the state has
    one, else where to find it) that forgets it without deleting anything."""
    from test_preflight_identity import COMPONENT_URN, NS_URN, cr, ns, state_with_urns, taken

    from pmem_components import identity

    live_cr = taken(cr(), ("pulumi-kubernetes-bbbb",))
    live_ns = taken(ns(), ("pulumi-kubernetes-bbbb",))
    common = (
        "but another stack has taken it over since (field manager pulumi-kubernetes-bbbb, not "
        "this stack's pulumi-kubernetes-aaaa): dropping it would delete {objects}, which that "
        "stack manages now, by name. To leave it to that stack, make this one forget it "
        "without deleting anything: {command}, then pulumi up; or, if this stack is to manage "
        'it again, configure it and set pmem-csi:adopt: ["{ref}"]'
    )
    cr_head = f"pmem-csi:deployments: {DRIVER!r} (in this stack's state) is no longer configured, "
    ns_head = (
        "pmem-csi:deployments: namespace 'pmem-csi' (in this stack's state) is created by no "
        "deployment, "
    )
    cr_objects = "the driver's objects"
    ns_objects = "the namespace (unless kept on delete: retainNamespaces) and all in it"
    no_urns = identity.StackState(
        {o.key: identity.Held(o.uid, "pulumi-kubernetes-aaaa") for o in (live_cr, live_ns)}
    )
    cases = [
        (
            live_cr,
            state_with_urns(),
            cr_head,
            cr_objects,
            f"pulumi state delete --target-dependents --yes '{COMPONENT_URN}'",
        ),
        (
            live_cr,
            no_urns,
            cr_head,
            cr_objects,
            "pulumi state delete --target-dependents --yes <the URN of its PmemCsiDeployment "
            "component (pulumi stack --show-urns)>",
        ),
        (live_ns, state_with_urns(), ns_head, ns_objects, f"pulumi state delete --yes '{NS_URN}'"),
        (
            live_ns,
            no_urns,
            ns_head,
            ns_objects,
            "pulumi state delete --yes '<its URN (pulumi stack --show-urns)>'",
        ),
    ]
    for live, state, head, objects, command in cases:
        ref = preflight.adopt_ref(live)
        assert preflight._dropped_taken(live, state) == head + common.format(
            objects=objects, command=command, ref=ref
        )


def test_a_move_from_a_skip_await_node_driver_is_refused_with_the_whole_text() -> None:
    """The old node DaemonSet still carries skipAwait: the refusal names it, the annotation,
    and the update to run first with the deployment where it is."""
    from test_preflight import node_ds

    skipping = node_ds(namespace="old", annotations={"pulumi.com/skipAwait": "TRUE"})
    observed = Observed(crs={DRIVER: cr(DRIVER, "old")}, daemon_sets=[skipping])
    assert problems(stack({"allowReinstall": True}), observed) == [
        "pmem-csi:deployments[0].await.enabled: DaemonSet old/pmem-csi-intel-com-node carries "
        "pulumi.com/skipAwait (from await.enabled: false), which the provider reads when it "
        "deletes it, so the move would not wait for the old node driver's pods to go: two "
        "node drivers on the same nodes; first run pulumi up with await.enabled: true and the "
        f"deployment where it is (name {DRIVER!r}, namespace 'old'), then move it"
    ]


def test_the_running_mode_is_read_past_other_drivers_and_either_dash_form() -> None:
    """Another driver's DaemonSet listed first does not end the look; ``--deviceManager=``
    (two dashes) in ``args`` is read like ``-deviceManager=``."""
    from test_preflight import node_ds

    other = node_ds(driver="other.example", mode="direct")
    mine = node_ds(mode="direct")
    container = mine.spec["template"]["spec"]["containers"][0]
    container = {**container, "command": ["/bin/driver"], "args": ["--deviceManager=direct"]}
    mine = ObservedObject(
        **{**mine.__dict__, "spec": {"template": {"spec": {"containers": [container]}}}}
    )
    assert preflight._running_modes(Observed(daemon_sets=[other, mine]), DRIVER) == [
        (mine, "direct")
    ]
    (problem,) = problems(stack({"deviceMode": "lvm"}), Observed(daemon_sets=[other, mine]))
    assert "changing it from 'direct' to 'lvm'" in problem
    assert "DaemonSet pmem-csi/pmem-csi-intel-com-node runs -deviceManager=direct" in problem


def test_a_rename_stranding_volumes_and_a_removal_with_volumes_whole_texts() -> None:
    """Both volume refusals in full: the objects, the CSI driver name, the node state
    directory, and the way out (keep the name, or delete the claims first)."""
    from test_preflight import pv, storage_class

    volumes = [pv("pvc-1", "old.example"), storage_class("sc", "old.example")]
    observed = Observed(crs={"old.example": cr("old.example")}, volumes=volumes)
    renamed = stack({"name": "new.example", "renamedFrom": "old.example"})
    assert problems(renamed, observed) == [
        "pmem-csi:deployments[0].renamedFrom: renaming 'old.example' to 'new.example' would "
        "strand its volumes: PersistentVolume pvc-1, StorageClass sc name the CSI driver "
        "'old.example', and Kubernetes finds a volume's driver by that name only (the node "
        "state directory /var/lib/old.example would be left behind too). A rename is refused "
        "while the old driver has volumes: keep the name 'old.example' (a namespace change "
        "with allowReinstall keeps the volumes), or first, while it runs: delete the "
        "PersistentVolumeClaims (the running driver deletes their volumes); delete the "
        "StorageClasses that name it; then rename"
    ]
    two = {**observed.crs, DRIVER: cr(DRIVER)}
    assert problems(stack({}), Observed(crs=two, volumes=volumes)) == [
        "pmem-csi:deployments: 'old.example' (deployed by this stack) is no longer configured "
        "but still has volumes: PersistentVolume pvc-1, StorageClass sc name the CSI driver "
        "'old.example', and Kubernetes finds a volume's driver by that name only; removing it "
        "would leave them without a driver (they could no longer be mounted, unmounted or "
        "deleted). Keep it configured and first, while it runs: delete the "
        "PersistentVolumeClaims (the running driver deletes their volumes); delete the "
        "StorageClasses that name it; then remove it"
    ]


def test_a_patch_rejection_problem_names_every_entry_and_field() -> None:
    """The refusal of a patch the API server would not apply in place, in full."""
    rejection = preflight.Rejection(
        0,
        ("pmem-csi:deployments[0].patches[0]", "pmem-csi:deployments[0].patches[2]"),
        "StatefulSet pmem-csi/c",
        ("spec.podManagementPolicy", "spec.selector"),
        "the Kubernetes provider replaces the object when it changes",
        replace=True,
    )
    assert problems(stack({}), Observed(patch_rejections=[rejection])) == [
        "pmem-csi:deployments[0].patches[0], pmem-csi:deployments[0].patches[2]: changes "
        "spec.podManagementPolicy, spec.selector of StatefulSet pmem-csi/c, which the "
        "Kubernetes provider does not update in place: it would delete the object and create "
        "it anew. Leave that field out of the patch (to change it anyway, delete the object "
        "first and run pulumi up again)"
    ]


def test_adopting_two_objects_without_taking_over_fields_whole_text() -> None:
    """Adoption needs takeOverFields: the refusal names every adopted object and both keys."""
    from test_preflight_identity import ME as STACK_ME
    from test_preflight_identity import cr as held_cr
    from test_preflight_identity import ns as held_ns

    from pmem_components import identity

    observed = Observed(namespaces={"pmem-csi": held_ns()}, crs={DRIVER: held_cr()})
    config = load({"deployments": [{}], "adopt": True, "takeOverFields": False})
    assert plan(config, observed, STACK_ME, identity.StackState()).problems == [
        f"pmem-csi:adopt: adopting Namespace pmem-csi, Deployment {DRIVER} with "
        "pmem-csi:takeOverFields: false would leave the field manager the earlier owner left "
        "on them next to this stack's: two stacks managing one object (and a later update "
        "that changes a field both set fails with a server-side apply conflict). Set "
        "pmem-csi:takeOverFields: true (the default) for the pulumi up that adopts them (it "
        "may be false again afterwards)"
    ]


def load(raw: dict[str, Any]) -> Any:
    from pmem_components.config import load_config

    return load_config(raw, check_certificates=False)


def test_a_device_mode_change_names_every_source_that_differs() -> None:
    """The CR (with the old name ``ndctl`` of direct) and the running DaemonSet both say
    another mode: the refusal names both, and an alias equal to the new mode is none."""
    from test_preflight import node_ds

    observed = Observed(
        crs={DRIVER: cr(DRIVER, mode="ndctl")}, daemon_sets=[node_ds(mode="direct")]
    )
    assert problems(stack({"deviceMode": "direct"}), observed) == []
    (problem,) = problems(stack({"deviceMode": "lvm"}), observed)
    assert (
        "changing it from 'direct' to 'lvm' makes the existing volumes unusable (their PMEM is "
        "managed the other way; the Deployment CR; DaemonSet pmem-csi/pmem-csi-intel-com-node "
        "runs -deviceManager=direct); delete"
    ) in problem


def test_a_held_namespace_does_not_end_the_check_of_the_next_one() -> None:
    """The first deployment's namespace is this stack's (held); the second's is foreign and
    still refused."""
    from test_preflight_identity import ME as STACK_ME
    from test_preflight_identity import held
    from test_preflight_identity import ns as held_ns

    config = stack({"name": "a.example", "namespace": "a"}, {"name": "b.example", "namespace": "b"})
    observed = Observed(namespaces={"a": held_ns("a"), "b": held_ns("b", uid="b-uid")})
    (problem,) = plan(config, observed, STACK_ME, held(held_ns("a"))).problems
    assert problem.startswith("pmem-csi:deployments[1].createNamespace: namespace 'b' ")


def test_a_refusals_reason_is_each_causes_message_or_nothing_never_a_placeholder() -> None:
    """Outside Secrets the reason quotes each cause's message (not its reason word); a cause
    without one, or a Status with nothing at all, gives an empty reason."""
    status = {
        "details": {
            "causes": [
                {"field": "spec.a", "reason": "FieldValueForbidden", "message": "a is immutable"},
                {"field": "spec.b", "reason": "FieldValueInvalid"},
            ]
        }
    }
    assert preflight._refusal(status, secret=False) == (
        ["spec.a", "spec.b"],
        "spec.a: a is immutable; spec.b: ",
    )
    assert preflight._refusal({}, secret=False) == ([], "")
    assert preflight._refusal({}, secret=True) == ([], "")


def test_only_the_old_node_daemon_sets_own_skip_await_blocks_a_move() -> None:
    """Of the DaemonSets in the old namespace only the moving driver's node DaemonSet is
    read: another one's skipAwait blocks nothing, and another listed first does not hide
    the node DaemonSet's."""
    from test_preflight import node_ds

    skip = {"pulumi.com/skipAwait": "true"}
    other = ObservedObject("DaemonSet", "unrelated", "old", annotations=skip)
    plain_other = ObservedObject("DaemonSet", "unrelated", "old")
    moving = {DRIVER: cr(DRIVER, "old")}
    ok = Observed(crs=moving, daemon_sets=[other, node_ds(namespace="old")])
    assert problems(stack({"allowReinstall": True}), ok) == []
    hidden = Observed(
        crs=moving, daemon_sets=[plain_other, node_ds(namespace="old", annotations=skip)]
    )
    (problem,) = problems(stack({"allowReinstall": True}), hidden)
    assert problem.startswith(
        "pmem-csi:deployments[0].await.enabled: DaemonSet old/pmem-csi-intel-com-node carries"
    )


def test_the_listed_plurals_are_used_where_lower_case_plus_s_would_be_wrong() -> None:
    """StorageClasses are listed at .../storageclasses (not "storageclasss"): the volume
    check reads them there."""
    assert preflight._path("storage.k8s.io/v1", "StorageClass", None) == (
        "/apis/storage.k8s.io/v1/storageclasses"
    )


def test_an_annotated_object_without_the_label_is_judged_by_the_state() -> None:
    """A namespace and a CR that carry another stack's identity but not the managed-by label
    (edited by hand) are refused as objects this stack's state does not hold."""
    from test_preflight_identity import ME as STACK_ME
    from test_preflight_identity import cr as held_cr
    from test_preflight_identity import ns as held_ns

    from pmem_components import identity

    def unlabelled(o: ObservedObject) -> ObservedObject:
        return ObservedObject(**{**o.__dict__, "labels": {}})

    observed = Observed(
        namespaces={"pmem-csi": unlabelled(held_ns(owner="org/other/prod"))},
        crs={DRIVER: unlabelled(held_cr(owner="org/other/prod"))},
    )
    found = plan(stack({}), observed, STACK_ME, identity.StackState()).problems
    assert [p.split(" is managed by stack ", 1)[0] for p in found] == [
        "pmem-csi:deployments[0].createNamespace: namespace 'pmem-csi'",
        f"pmem-csi:deployments[0].name: the Deployment CR {DRIVER!r}",
    ]
    assert all(
        f"'org/other/prod' ({names.STACK_ANNOTATION}), and this stack's state does not hold it" in p
        for p in found
    )


def test_namespaces_kept_are_the_held_ones_in_use_past_an_absent_one() -> None:
    """Deployments that no longer create their namespaces: one not in the cluster is skipped,
    the next one the state holds is kept, and one made anew (another uid) is not."""
    from test_preflight_identity import ME as STACK_ME
    from test_preflight_identity import ns as held_ns

    from pmem_components import identity

    config = stack(
        {"name": "a.example", "namespace": "absent", "createNamespace": False},
        {"name": "b.example", "namespace": "kept", "createNamespace": False},
        {"name": "c.example", "namespace": "anew", "createNamespace": False},
    )
    kept, anew = held_ns("kept", uid="kept-uid"), held_ns("anew", uid="new-uid")
    state = identity.StackState(
        {
            kept.key: identity.Held("kept-uid", "pulumi-kubernetes-1"),
            anew.key: identity.Held("old-uid", "pulumi-kubernetes-1"),
        }
    )
    result = plan(config, Observed(namespaces={"kept": kept, "anew": anew}), STACK_ME, state)
    assert result.keep_namespaces == {"kept"}


# --------------------------------------------------------------------------- survivors, 2 December


def test_a_running_mode_with_a_second_equals_sign_is_read_whole() -> None:
    """``-deviceManager=lvm=x`` runs the mode ``lvm=x`` (everything after the first ``=``),
    which is not the configured ``lvm``: refused, naming that mode, never taken for lvm."""
    from test_preflight import node_ds

    running = node_ds(mode="lvm=x")
    assert preflight._running_modes(Observed(daemon_sets=[running]), DRIVER) == [
        (running, "lvm=x")
    ]
    (problem,) = problems(stack({"deviceMode": "lvm"}), Observed(daemon_sets=[running]))
    assert problem.startswith(
        "pmem-csi:deployments[0].deviceMode: changing it from 'lvm=x' to 'lvm' makes the "
        "existing volumes unusable (their PMEM is managed the other way; DaemonSet "
        "pmem-csi/pmem-csi-intel-com-node runs -deviceManager=lvm=x)"
    )


def test_a_refusals_reason_is_cut_at_300_characters() -> None:
    """The API server's words are quoted in the problem, at most 300 characters of them."""
    assert preflight._refusal({"message": "m" * 400}, secret=False) == ([], "m" * 300)
    assert preflight._refusal({"message": "m" * 300}, secret=False) == ([], "m" * 300)


def test_a_dropped_object_taken_by_two_other_managers_names_both() -> None:
    """Two other stacks' Pulumi managers on the dropped CR: both are named, comma-separated."""
    from test_preflight_identity import cr as held_cr
    from test_preflight_identity import state_with_urns, taken

    live = taken(held_cr(), ("pulumi-kubernetes-bbbb", "pulumi-kubernetes-cccc"))
    text = preflight._dropped_taken(live, state_with_urns())
    assert text is not None
    assert (
        "(field manager pulumi-kubernetes-bbbb, pulumi-kubernetes-cccc, not this stack's "
        "pulumi-kubernetes-aaaa)"
    ) in text


def test_the_dry_run_applies_as_the_providers_apply_entry_only() -> None:
    """The dry run's field manager is the first Pulumi manager's *apply* entry: neither
    another manager's apply (kubectl) nor a Pulumi manager's update entry listed before it;
    with none, the preflight's own."""
    live = {
        "metadata": {
            "managedFields": [
                {"manager": "kubectl", "operation": "Apply"},
                {"manager": "pulumi-kubernetes-old", "operation": "Update"},
                {"operation": "Apply"},
                {"manager": "pulumi-kubernetes-abc", "operation": "Apply"},
            ]
        }
    }
    assert preflight._provider_manager(live) == "pulumi-kubernetes-abc"
    only_others = {"metadata": {"managedFields": live["metadata"]["managedFields"][:3]}}
    assert preflight._provider_manager(only_others) == preflight.DRY_RUN_MANAGER


def test_a_cr_nested_below_two_components_names_no_component_urn() -> None:
    """A CR whose parent is itself some component's child (two ``$`` in its type chain) is
    not a top-level PmemCsiDeployment's: no URN is made up for the state delete, which then
    says where to find it."""
    from test_preflight_identity import CR_URN

    nested = CR_URN.replace("pmem-csi:index:PmemCsiDeployment$", "my:index:Outer$pmem-csi:index:"
                            "PmemCsiDeployment$")
    assert nested.count("$") == 2
    assert preflight._component_urn(nested) is None


def test_a_held_namespace_still_created_does_not_end_the_check_of_dropped_ones() -> None:
    """The state holds two namespaces: the first is still created by a deployment (skipped),
    the second, no longer created, another stack took over: still refused."""
    from test_preflight_identity import ME as STACK_ME
    from test_preflight_identity import ns as held_ns
    from test_preflight_identity import taken

    from pmem_components import identity

    kept, dropped = held_ns("a"), taken(held_ns("b"), ("pulumi-kubernetes-bbbb",))
    state = identity.StackState(
        {o.key: identity.Held("ns-uid", "pulumi-kubernetes-aaaa") for o in (kept, dropped)}
    )
    config = stack({"name": "a.example", "namespace": "a"})
    observed = Observed(namespaces={"a": kept, "b": dropped})
    (problem,) = plan(config, observed, STACK_ME, state).problems
    assert problem.startswith(
        "pmem-csi:deployments: namespace 'b' (in this stack's state) is created by no "
        "deployment, but another stack has taken it over since"
    )


STS = "pmem-csi-intel-com-controller"
STS_PATH = f"/apis/apps/v1/namespaces/pmem-csi/statefulsets/{STS}"
POLICY = {"kind": "StatefulSet", "mergePatch": {"spec": {"podManagementPolicy": "Parallel"}}}


class Answers:
    """An API server answering every patched dry run with ``patched`` and every unpatched
    one with ``plain`` (HTTP statuses); a 422 names ``spec`` as refused."""

    def __init__(self, patched: int, plain: int = 200) -> None:
        self.patched, self.plain = patched, plain

    def dry_apply(self, path: str, obj: Any, manager: str) -> tuple[int, dict[str, Any]]:
        status = self.patched if obj["spec"].get("podManagementPolicy") else self.plain
        cause = {"reason": "FieldValueForbidden", "field": "spec", "message": "no"}
        return status, {"kind": "Status", "details": {"causes": [cause]}} if status == 422 else obj


def test_a_deployment_without_patches_does_not_end_the_dry_runs_of_the_next() -> None:
    """The first deployment has no patches (nothing to dry-run); the second's refused patch
    is still found, at its own index."""
    s = stack(
        {"name": "a.example", "namespace": "a"}, {"namespace": "pmem-csi", "patches": [POLICY]}
    )
    lives = {**_lives(s.deployments[0]), **_lives(s.deployments[1])}
    (rejection,) = preflight.patch_rejections(DryRunApi(), s, lives)
    assert (rejection.index, rejection.ref) == (1, f"StatefulSet pmem-csi/{STS}")


def test_both_dry_runs_are_made_at_the_objects_own_path() -> None:
    """The patched and the unpatched dry run go to the live object's path."""
    s = stack({"patches": [POLICY]})
    api = DryRunApi()
    (rejection,) = preflight.patch_rejections(api, s, _lives(s.deployments[0]))
    assert rejection.ref == f"StatefulSet pmem-csi/{STS}"
    assert [path for path, _ in api.calls] == [STS_PATH, STS_PATH]


def test_every_2xx_answer_accepts_and_any_other_but_422_stops_naming_path_and_status() -> None:
    """A dry run answered 2xx (299 the last) is accepted; 300 or a 500 is no refusal the
    preflight can judge: it stops naming the patch, the object and the HTTP status."""
    s = stack({"patches": [POLICY]})
    lives = _lives(s.deployments[0])
    assert preflight.patch_rejections(Answers(299), s, lives) == []
    for status in (300, 500):
        with pytest.raises(preflight.DryRunError) as raised:
            preflight.patch_rejections(Answers(status), s, lives)
        assert str(raised.value).startswith(
            "pmem-csi:preflight: pmem-csi:deployments[0].patches[0]: the server-side dry run "
            f"of StatefulSet pmem-csi/{STS} (which tells whether the update would change a "
            f"field Kubernetes cannot change in place) got HTTP {status}, so that is not checked"
        )


def test_a_refusal_counts_when_the_unpatched_dry_run_is_answered_201() -> None:
    """201 (the dry run of an apply that would create) is an acceptance of the unpatched
    object like 200, as is any 2xx: the refusal is the patch's."""
    s = stack({"patches": [POLICY]})
    lives = _lives(s.deployments[0])
    for plain in (201, 202, 299):
        (rejection,) = preflight.patch_rejections(Answers(422, plain=plain), s, lives)
        assert rejection.fields == ("spec.podManagementPolicy",)
        assert rejection.labels == ("pmem-csi:deployments[0].patches[0]",)


def test_a_secrets_rejection_gives_the_reason_words_and_others_the_messages() -> None:
    """The refused Secret's rejection names its fields with the reason words only (the
    message may quote a key); the StatefulSet's quotes the API server's message."""
    annotate = {"metadata": {"annotations": {"patched": "yes"}}}
    s = stack(
        {
            "patches": [
                {"kind": "Secret", "name": "pmem-csi-intel-com-node-secrets",
                 "mergePatch": annotate},
                {"kind": "StatefulSet", "mergePatch": annotate},
            ]
        }
    )
    api = RefusesEverything("metadata.annotations")
    found = preflight.patch_rejections(api, s, _lives(s.deployments[0]))
    assert [(r.ref, r.reason) for r in found] == [
        ("Secret pmem-csi/pmem-csi-intel-com-node-secrets",
         "metadata.annotations: FieldValueForbidden"),
        (f"StatefulSet pmem-csi/{STS}", "metadata.annotations: no"),
    ]
