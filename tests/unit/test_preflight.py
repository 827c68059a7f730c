"""The preflight's decisions (pure): adoption, moves, renames, operator objects."""

from __future__ import annotations

from typing import Any

from pmem_components import names
from pmem_components.config import load_config
from pmem_components.preflight import Observed, ObservedObject, Previous, plan

ME = "pmem-csi-pulumi/prod"


def stack(*deps: dict[str, Any]) -> Any:
    return load_config({"deployments": list(deps)}, check_certificates=False)


def cr(name: str, namespace: str = "pmem-csi", mode: str = "lvm", owner: str | None = ME) -> Any:
    annotations = {names.STACK_ANNOTATION: owner} if owner else {}
    labels = {names.LABEL_MANAGED_BY: names.MANAGED_BY} if owner else {}
    return ObservedObject(
        names.CRD_KIND,
        name,
        labels=labels,
        annotations=annotations,
        spec={"namespace": namespace, "deviceMode": mode},
    )


def ns(name: str, owner: str | None = None, ours: bool = False) -> ObservedObject:
    return ObservedObject(
        "Namespace",
        name,
        labels={names.LABEL_MANAGED_BY: names.MANAGED_BY} if ours else {},
        annotations={names.STACK_ANNOTATION: owner} if owner else {},
    )


def test_nothing_in_the_cluster_is_fine() -> None:
    assert plan(stack({}), Observed(), ME).problems == []


def test_existing_namespace_needs_explicit_adoption() -> None:
    observed = Observed(namespaces={"pmem-csi": ns("pmem-csi")})
    (problem,) = plan(stack({}), observed, ME).problems
    assert problem.startswith("pmem-csi:deployments[0].createNamespace: namespace 'pmem-csi'")
    assert "pmem-csi:deployments[0].adoptNamespace: true" in problem
    assert plan(stack({"adoptNamespace": True}), observed, ME).problems == []
    assert plan(stack({"createNamespace": False}), observed, ME).problems == []
    mine = Observed(namespaces={"pmem-csi": ns("pmem-csi", owner=ME)})
    assert plan(stack({}), mine, ME).problems == []
    other = Observed(namespaces={"pmem-csi": ns("pmem-csi", owner="x/other")})
    (problem,) = plan(stack({"adoptNamespace": True}), other, ME).problems
    assert "managed by stack 'x/other'" in problem


def test_namespace_move_is_refused_unless_allowed() -> None:
    observed = Observed(crs={"pmem-csi.intel.com": cr("pmem-csi.intel.com", "old")})
    (problem,) = plan(stack({}), observed, ME).problems
    assert problem.startswith("pmem-csi:deployments[0].namespace: changing it from 'old'")
    assert "allowReinstall: true" in problem
    result = plan(stack({"allowReinstall": True}), observed, ME)
    assert result.problems == []
    assert result.previous == {0: Previous("pmem-csi.intel.com", "old")}


def test_device_mode_change_is_refused_unless_allowed() -> None:
    observed = Observed(crs={"pmem-csi.intel.com": cr("pmem-csi.intel.com", mode="lvm")})
    (problem,) = plan(stack({"deviceMode": "direct"}), observed, ME).problems
    assert problem.startswith("pmem-csi:deployments[0].deviceMode: changing it from 'lvm'")
    assert "allowDeviceModeChange: true" in problem
    ok = stack({"deviceMode": "direct", "allowDeviceModeChange": True})
    assert plan(ok, observed, ME).problems == []


def test_a_rename_needs_renamed_from() -> None:
    observed = Observed(crs={"old.example": cr("old.example")})
    (problem,) = plan(stack({"name": "new.example"}), observed, ME).problems
    assert "pmem-csi:deployments[0].renamedFrom: 'old.example'" in problem
    result = plan(stack({"name": "new.example", "renamedFrom": "old.example"}), observed, ME)
    assert result.problems == []
    assert result.previous == {0: Previous("old.example", "pmem-csi")}
    # Removing a deployment alone is no rename.
    two = Observed(crs={"a.example": cr("a.example"), "b.example": cr("b.example")})
    assert plan(stack({"name": "b.example"}), two, ME).problems == []


def test_other_stacks_and_operator_crs_are_not_taken_silently() -> None:
    other = Observed(crs={"pmem-csi.intel.com": cr("pmem-csi.intel.com", owner="x/other")})
    (problem,) = plan(stack({}), other, ME).problems
    assert "belongs to stack 'x/other'" in problem
    operator = Observed(crs={"pmem-csi.intel.com": cr("pmem-csi.intel.com", owner=None)})
    (problem,) = plan(stack({}), operator, ME).problems
    assert "--cascade=orphan" in problem and "adoptExisting: true" in problem


def test_operator_owned_objects_name_the_next_step() -> None:
    owned = ObservedObject(
        "DaemonSet",
        "pmem-csi-intel-com-node",
        "pmem-csi",
        owners=((f"{names.CRD_GROUP}/v1beta1", "Deployment", "pmem-csi.intel.com"),),
    )
    observed = Observed(same_named={0: [owned]})
    for adopt in (False, True):  # adoption cannot help while the CR can still collect them
        (problem,) = plan(stack({"adoptExisting": adopt}), observed, ME).problems
        assert "DaemonSet pmem-csi/pmem-csi-intel-com-node belong to the PMEM-CSI operator" in (
            problem
        )
        assert "kubectl delete deployments.pmem-csi.intel.com pmem-csi.intel.com" in problem
    orphaned = ObservedObject("DaemonSet", "pmem-csi-intel-com-node", "pmem-csi")
    observed = Observed(same_named={0: [orphaned]})
    (problem,) = plan(stack({}), observed, ME).problems
    assert "pmem-csi:deployments[0].adoptExisting: true" in problem
    assert plan(stack({"adoptExisting": True}), observed, ME).problems == []


def test_a_node_driver_of_the_same_name_elsewhere_is_refused() -> None:
    env = [{"name": "PMEM_CSI_DRIVER_NAME", "value": "pmem-csi.intel.com"}]
    ds = ObservedObject(
        "DaemonSet",
        "pmem-csi-node",
        "operator-ns",
        spec={"template": {"spec": {"containers": [{"name": "pmem-driver", "env": env}]}}},
    )
    (problem,) = plan(stack({}), Observed(daemon_sets=[ds]), ME).problems
    assert problem.startswith("pmem-csi:deployments[0].namespace: DaemonSet operator-ns/")
    # During an allowed move the old namespace's driver is the one being replaced.
    moving = Observed(
        crs={"pmem-csi.intel.com": cr("pmem-csi.intel.com", "operator-ns")}, daemon_sets=[ds]
    )
    assert plan(stack({"allowReinstall": True}), moving, ME).problems == []


def test_crs_made_before_the_stack_annotation_count_as_this_stacks() -> None:
    legacy = ObservedObject(
        names.CRD_KIND,
        "pmem-csi.intel.com",
        labels={names.LABEL_MANAGED_BY: names.MANAGED_BY},
        spec={"namespace": "old", "deviceMode": "lvm"},
    )
    observed = Observed(crs={"pmem-csi.intel.com": legacy})
    (problem,) = plan(stack({}), observed, ME).problems
    assert "namespace: changing it from 'old'" in problem
    assert plan(stack({"namespace": "old"}), observed, ME).problems == []


# --------------------------------------------------------------------------------------------
# volumes, the running device mode, awaited deletes, namespaces in use (issue 15)


def pv(name: str, driver: str) -> ObservedObject:
    return ObservedObject("PersistentVolume", name, spec={"csi": {"driver": driver}})


def attachment(name: str, driver: str) -> ObservedObject:
    return ObservedObject("VolumeAttachment", name, spec={"attacher": driver})


def storage_class(name: str, driver: str) -> ObservedObject:
    return ObservedObject("StorageClass", name, spec={"provisioner": driver})


def node_ds(
    driver: str = "pmem-csi.intel.com",
    namespace: str = "pmem-csi",
    mode: str = "lvm",
    annotations: dict[str, str] | None = None,
) -> ObservedObject:
    env = [{"name": "PMEM_CSI_DRIVER_NAME", "value": driver}]
    container = {
        "name": "pmem-driver",
        "command": ["/usr/local/bin/pmem-csi-driver", f"-deviceManager={mode}", "-mode=node"],
        "env": env,
    }
    return ObservedObject(
        "DaemonSet",
        f"{names.DeploymentNames(driver).node_driver}",
        namespace,
        labels={names.LABEL_MANAGED_BY: names.MANAGED_BY},
        annotations=annotations or {},
        spec={"template": {"spec": {"containers": [container]}}},
    )


def test_a_rename_is_refused_while_the_old_driver_has_volumes() -> None:
    volumes = [
        pv("pvc-1", "old.example"),
        attachment("csi-abc", "old.example"),
        storage_class("pmem-lvm", "old.example"),
        pv("pvc-other", "other.example"),
    ]
    observed = Observed(crs={"old.example": cr("old.example")}, volumes=volumes)
    renamed = stack({"name": "new.example", "renamedFrom": "old.example"})
    (problem,) = plan(renamed, observed, ME).problems
    assert problem.startswith("pmem-csi:deployments[0].renamedFrom: ")
    for ref in ("PersistentVolume pvc-1", "VolumeAttachment csi-abc", "StorageClass pmem-lvm"):
        assert ref in problem
    assert "pvc-other" not in problem
    assert "/var/lib/old.example" in problem  # the node state directory that is left behind
    assert "keep the name 'old.example'" in problem
    # Without volumes of the old driver the rename is allowed as before.
    free = Observed(crs={"old.example": cr("old.example")}, volumes=volumes[3:])
    assert plan(renamed, free, ME).problems == []


def test_removing_a_driver_that_has_volumes_is_refused() -> None:
    two = {"a.example": cr("a.example"), "b.example": cr("b.example")}
    observed = Observed(
        crs=two, volumes=[pv("pvc-1", "a.example"), storage_class("sc", "a.example")]
    )
    (problem,) = plan(stack({"name": "b.example"}), observed, ME).problems
    assert problem.startswith("pmem-csi:deployments: 'a.example' (deployed by this stack)")
    assert "PersistentVolume pvc-1" in problem and "StorageClass sc" in problem
    assert "delete the PersistentVolumeClaims" in problem
    # Another stack's driver with volumes is none of this stack's business.
    theirs = {**two, "a.example": cr("a.example", owner="x/other")}
    assert (
        plan(
            stack({"name": "b.example"}), Observed(crs=theirs, volumes=observed.volumes), ME
        ).problems
        == []
    )


def test_a_namespace_move_keeps_the_volumes_usable() -> None:
    observed = Observed(
        crs={"pmem-csi.intel.com": cr("pmem-csi.intel.com", "old")},
        volumes=[pv("pvc-1", "pmem-csi.intel.com")],
    )
    assert plan(stack({"allowReinstall": True}), observed, ME).problems == []


def test_the_device_mode_guard_reads_the_running_daemon_set() -> None:
    # The CR (or the whole CRD) deleted by hand: the DaemonSet still says lvm.
    observed = Observed(daemon_sets=[node_ds(mode="lvm")])
    (problem,) = plan(stack({"deviceMode": "direct"}), observed, ME).problems
    assert problem.startswith("pmem-csi:deployments[0].deviceMode: changing it from 'lvm'")
    assert "DaemonSet pmem-csi/pmem-csi-intel-com-node runs -deviceManager=lvm" in problem
    ok = stack({"deviceMode": "direct", "allowDeviceModeChange": True})
    assert plan(ok, observed, ME).problems == []
    # The CR and the DaemonSet disagree (the CR edited by hand): what runs counts too.
    both = Observed(
        crs={"pmem-csi.intel.com": cr("pmem-csi.intel.com", mode="direct")},
        daemon_sets=[node_ds(mode="lvm")],
    )
    (problem,) = plan(stack({"deviceMode": "direct"}), both, ME).problems
    assert "changing it from 'lvm' to 'direct'" in problem
    # "ndctl" is the reference's old name of direct.
    assert (
        plan(
            stack({"deviceMode": "direct"}), Observed(daemon_sets=[node_ds(mode="ndctl")]), ME
        ).problems
        == []
    )


def test_the_device_mode_guard_lists_the_volumes_it_protects() -> None:
    observed = Observed(
        daemon_sets=[node_ds(mode="lvm")], volumes=[pv("pvc-1", "pmem-csi.intel.com")]
    )
    (problem,) = plan(stack({"deviceMode": "direct"}), observed, ME).problems
    assert "PersistentVolume pvc-1" in problem


def test_a_move_is_refused_when_the_delete_would_not_be_awaited() -> None:
    moving = {"pmem-csi.intel.com": cr("pmem-csi.intel.com", "old")}
    live = node_ds(namespace="old")
    unawaited = stack({"allowReinstall": True, "await": {"enabled": False}})
    (problem,) = plan(unawaited, Observed(crs=moving, daemon_sets=[live]), ME).problems
    assert problem.startswith("pmem-csi:deployments[0].await.enabled: ")
    assert "pulumi.com/skipAwait" in problem and "two node drivers" in problem
    # Awaited now, but the running DaemonSet still carries skipAwait from before: the provider
    # reads the old object's annotation when it deletes it.
    skipping = node_ds(namespace="old", annotations={"pulumi.com/skipAwait": "true"})
    observed = Observed(crs=moving, daemon_sets=[skipping])
    (problem,) = plan(stack({"allowReinstall": True}), observed, ME).problems
    assert "DaemonSet old/pmem-csi-intel-com-node carries pulumi.com/skipAwait" in problem
    assert "first run pulumi up with await.enabled: true" in problem
    # Renames likewise.
    renamed = stack(
        {"name": "new.example", "renamedFrom": "pmem-csi.intel.com", "await": {"enabled": False}}
    )
    (problem,) = plan(renamed, Observed(crs=moving, daemon_sets=[live]), ME).problems
    assert "await.enabled" in problem
    # Without a move await.enabled: false is fine.
    assert (
        plan(stack({"await": {"enabled": False}}), Observed(daemon_sets=[node_ds()]), ME).problems
        == []
    )


def test_a_namespace_the_stack_created_is_kept_while_a_deployment_uses_it() -> None:
    mine = Observed(namespaces={"pmem-csi": ns("pmem-csi", owner=ME)})
    result = plan(stack({"createNamespace": False}), mine, ME)
    assert result.problems == [] and result.keep_namespaces == {"pmem-csi"}
    # Still created by a deployment: registered as usual, nothing extra to keep.
    assert plan(stack({}), mine, ME).keep_namespaces == set()
    # Not this stack's, or no configured deployment uses it: not ours to keep.
    theirs = Observed(namespaces={"pmem-csi": ns("pmem-csi", owner="x/other")})
    assert plan(stack({"createNamespace": False}), theirs, ME).keep_namespaces == set()
    assert (
        plan(stack({"namespace": "elsewhere", "createNamespace": False}), mine, ME).keep_namespaces
        == set()
    )


class DryRunApi:
    """Answers dry-run applies as an API server would for a StatefulSet whose
    podManagementPolicy is immutable: 422 when the applied object changes it."""

    def __init__(self, live_policy: str = "OrderedReady") -> None:
        self.live_policy = live_policy
        self.calls: list[tuple[str, str]] = []

    def dry_apply(self, path: str, obj: Any, manager: str) -> tuple[int, dict[str, Any]]:
        self.calls.append((path, manager))
        policy = (obj.get("spec") or {}).get("podManagementPolicy", self.live_policy)
        if obj["kind"] == "StatefulSet" and policy != self.live_policy:
            cause = {
                "reason": "FieldValueForbidden",
                "field": "spec",
                "message": "Forbidden: updates to statefulset spec for fields other than "
                "'replicas', 'template' ... are forbidden",
            }
            return 422, {"kind": "Status", "reason": "Invalid", "details": {"causes": [cause]}}
        return 200, obj


def _lives(cfg: Any) -> dict[str, Any]:
    from pmem_components.manifests import bundle
    from pmem_components.preflight import _path

    out = {}
    for obj in bundle.build_deployment_objects(cfg, create_namespace=False).all():
        meta = obj["metadata"]
        live = {**obj, "metadata": {**meta, "managedFields": [
            {"manager": "pulumi-kubernetes-abc123", "operation": "Apply"}]}}  # fmt: skip
        out[_path(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])] = live
    return out


def test_a_patch_the_api_server_refuses_in_place_is_named_with_its_field() -> None:
    from pmem_components.preflight import patch_rejections

    patch = {"kind": "StatefulSet", "mergePatch": {"spec": {"podManagementPolicy": "Parallel"}}}
    s = stack({"patches": [patch]})
    api = DryRunApi()
    (rejection,) = patch_rejections(api, s, _lives(s.deployments[0]))
    assert rejection.labels == ("pmem-csi:deployments[0].patches[0]",)
    assert rejection.fields == ("spec.podManagementPolicy",)
    assert rejection.ref == "StatefulSet pmem-csi/pmem-csi-intel-com-controller"
    # Applied as the provider applies it, with and without the patch.
    assert {m for _, m in api.calls} == {"pulumi-kubernetes-abc123"}
    assert len(api.calls) == 2
    (problem,) = plan(s, Observed(patch_rejections=[rejection]), ME).problems
    assert problem.startswith(
        "pmem-csi:deployments[0].patches[0]: changes spec.podManagementPolicy of StatefulSet"
    )
    # Without the stack's state the provider's rule is not judged: what the dry run refuses
    # makes the update fail (tests/unit/test_tail15b_review.py has the replacements).
    assert "the API server refuses this change: spec: Forbidden" in problem
    assert "the update would fail" in problem


def test_patches_the_api_server_accepts_or_objects_not_there_yet_are_fine() -> None:
    from pmem_components.preflight import patch_rejections

    ok = {"kind": "StatefulSet", "mergePatch": {"spec": {"minReadySeconds": 5}}}
    s = stack({"patches": [ok]})
    assert patch_rejections(DryRunApi(), s, _lives(s.deployments[0])) == []
    # Not created yet: nothing can be replaced, and nothing is dry-run.
    bad = {"kind": "StatefulSet", "mergePatch": {"spec": {"podManagementPolicy": "Parallel"}}}
    api = DryRunApi()
    assert patch_rejections(api, stack({"patches": [bad]}), {}) == []
    assert api.calls == []
    # Live already Parallel (the patch was there before): no change, no replacement.
    s = stack({"patches": [bad]})
    assert patch_rejections(DryRunApi("Parallel"), s, _lives(s.deployments[0])) == []


def test_a_secret_refusal_never_quotes_the_api_servers_message() -> None:
    from pmem_components.preflight import _refusal

    status = {
        "details": {
            "causes": [
                {"field": "type", "reason": "FieldValueInvalid", "message": "Invalid: secret!"}
            ]
        }
    }
    fields, reason = _refusal(status, secret=True)
    assert fields == ["type"] and reason == "type: FieldValueInvalid"
