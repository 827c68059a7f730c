"""Review of the merged issue-15 branches (tail A): the preflight's guards at their edges.

Each test names the review item it covers; each failed on ``merge29`` before its fix.
"""

from __future__ import annotations

from typing import Any

import pytest

from pmem_components import identity, names, preflight
from pmem_components.preflight import Observed, ObservedObject, plan
from tests.unit.test_tail15a import (
    DRIVER,
    ME,
    cr,
    deployment_of,
    node_ds,
    ns,
    pv,
    stack,
    state_of,
)

BINARY = "/usr/local/bin/pmem-csi-driver"
DIRECT = {"deviceMode": "direct"}


def refused_for_direct(ds: ObservedObject) -> list[str]:
    return plan(stack(DIRECT), Observed(daemon_sets=[ds]), ME).problems


# --------------------------------------------------------------------------------------------
# item 1: the kept-namespace warning is true with retainNamespaces either way


def _warnings(monkeypatch: pytest.MonkeyPatch, cfg: Any) -> list[str]:
    """program.preflight's warnings for a plan that keeps namespace 'shared'."""
    import pulumi

    from pmem_components import components, kubetarget, program
    from pmem_components import preflight as pf

    class Target:
        makes_requests = True

    class Client:
        def close(self) -> None:
            pass

    result = pf.Plan(
        keep_namespaces={"shared"},
        kept_namespaces={"shared": pf.KeptNamespace("Deployment x.example")},
    )
    monkeypatch.setattr(program, "cluster_target", lambda: Target())
    monkeypatch.setattr(kubetarget, "api_client", lambda target: Client())
    monkeypatch.setattr(components, "stack_id", lambda: ME)
    monkeypatch.setattr(identity, "read_state", lambda name: identity.StackState())
    monkeypatch.setattr(pf, "run", lambda *a: result)
    monkeypatch.setattr(program, "certificate_rollout", lambda *a: None)
    said: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda message, *a, **k: said.append(message))
    program.preflight(cfg)
    return said


def test_the_kept_namespace_warning_says_deleted_only_with_retain_namespaces_false(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the default retainNamespaces: true the engine keeps the namespace anyway (as the
    state recorded it, unless an earlier update had false): "would be deleted with it" was
    false there."""
    (retained,) = _warnings(monkeypatch, stack({}))
    assert "namespace 'shared' is used by no deployment" in retained
    assert "Deployment x.example live in it" in retained
    assert "would be deleted" not in retained
    assert "retainNamespaces: true it is released as any namespace" in retained
    (deleted,) = _warnings(monkeypatch, stack({}, retainNamespaces=False))
    assert "retainNamespaces: false, would be deleted with it" in deleted


# --------------------------------------------------------------------------------------------
# item 2: a released namespace is registered with this stack's own labels only

OWN = "pulumi-kubernetes-0123abcd"


def _namespace_item() -> dict[str, Any]:
    """A namespace as the API server returns it: this stack's provider applied the
    managed-by label, the stack annotation and a namespace patch's PSA label; a platform
    stack's NamespacePatch applied ``team`` (another Pulumi manager), kubectl ``owner`` (an
    entry the provider absorbs into its own manager before it applies)."""
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": "shared",
            "uid": "ns-shared",
            "labels": {
                names.LABEL_MANAGED_BY: names.MANAGED_BY,
                "pod-security.kubernetes.io/enforce": "privileged",
                "team": "a",
                "owner": "ops",
                "kubernetes.io/metadata.name": "shared",
            },
            "annotations": {names.STACK_ANNOTATION: ME, "note": "platform"},
            "managedFields": [
                {
                    "manager": OWN,
                    "operation": "Apply",
                    "apiVersion": "v1",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {
                        "f:metadata": {
                            "f:annotations": {f"f:{names.STACK_ANNOTATION}": {}},
                            "f:labels": {
                                f"f:{names.LABEL_MANAGED_BY}": {},
                                "f:pod-security.kubernetes.io/enforce": {},
                            },
                        }
                    },
                },
                {
                    "manager": "pulumi-kubernetes-99999999",
                    "operation": "Apply",
                    "apiVersion": "v1",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {
                        "f:metadata": {
                            "f:annotations": {"f:note": {}},
                            "f:labels": {"f:team": {}},
                        }
                    },
                },
                {
                    "manager": "kubectl",
                    "operation": "Apply",
                    "apiVersion": "v1",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:metadata": {"f:labels": {"f:owner": {}}}},
                },
                {
                    "manager": "kube-apiserver",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {
                        "f:metadata": {"f:labels": {"f:kubernetes.io/metadata.name": {}}}
                    },
                },
            ],
        },
    }


def test_a_released_namespace_keeps_only_the_labels_this_stacks_manager_applied(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    live = preflight._observed(_namespace_item(), "Namespace")
    held = identity.StackState({live.key: identity.Held(live.uid, OWN, "")})
    monkeypatch.setattr(preflight, "observe", lambda *_: Observed(namespaces={"shared": live}))
    cfg = stack({"namespace": "shared", "createNamespace": False})
    result = preflight.run(cfg, ME, object(), held)
    assert result.keep_namespaces == {"shared"}
    assert result.kept_metadata == {
        "shared": {
            "labels": {
                names.LABEL_MANAGED_BY: names.MANAGED_BY,
                "pod-security.kubernetes.io/enforce": "privileged",
                "owner": "ops",  # kubectl's: the provider makes it this stack's anyway
            },
            "annotations": {names.STACK_ANNOTATION: ME},
        }
    }


@pytest.mark.parametrize(
    ("manager", "operation", "kept"),
    [
        ("kubectl-label", "Update", True),  # kubectl label ns ... enforce=privileged
        ("kubectl-client-side-apply", "Update", True),
        ("kubectl-edit", "Update", True),
        ("kubectl", "Apply", True),
        ("before-first-apply", "Update", True),
        ("pulumi-kubernetes", "Update", True),  # this stack's provider before server-side apply
        ("pulumi-resource-kubernetes", "Update", True),
        ("platform-stack", "Apply", False),  # left to its owner, not co-owned
        ("kube-controller-manager", "Update", False),
        ("kubectl-label", "Update-subresource", False),
    ],
)
def test_labels_of_entries_the_provider_absorbs_are_sent_with_the_release(
    manager: str, operation: str, kept: bool
) -> None:
    # pulumi-kubernetes v4.25.0 renames these entries to its own manager before it applies
    # (await.fixCSAFieldManagers): a key of theirs not sent would be removed by that apply.
    item = _namespace_item()
    entry = {
        "manager": manager,
        "operation": operation.removesuffix("-subresource"),
        "apiVersion": "v1",
        "fieldsType": "FieldsV1",
        "fieldsV1": {"f:metadata": {"f:labels": {"f:pod-security.kubernetes.io/audit": {}}}},
    }
    if operation.endswith("-subresource"):
        entry["subresource"] = "status"
    item["metadata"]["labels"]["pod-security.kubernetes.io/audit"] = "privileged"
    item["metadata"]["managedFields"].append(entry)
    live = preflight._observed(item, "Namespace")
    held = identity.StackState({live.key: identity.Held(live.uid, OWN, "")})
    labels = preflight.own_metadata(live, held)["labels"]
    assert ("pod-security.kubernetes.io/audit" in labels) is kept


def test_without_a_recorded_manager_the_one_pulumi_manager_counts_else_none() -> None:
    live = preflight._observed(_namespace_item(), "Namespace")
    # Two Pulumi managers, none recorded: none of them is known to be this stack's (kubectl's
    # label is sent all the same: the provider absorbs that entry).
    assert preflight.own_metadata(live, None) == {"labels": {"owner": "ops"}, "annotations": {}}
    item = _namespace_item()
    del item["metadata"]["managedFields"][1]
    only = preflight._observed(item, "Namespace")
    assert preflight.own_metadata(only, None)["labels"] == {
        names.LABEL_MANAGED_BY: names.MANAGED_BY,
        "pod-security.kubernetes.io/enforce": "privileged",
        "owner": "ops",
    }


# --------------------------------------------------------------------------------------------
# item 3: boolean Go flags take no value


@pytest.mark.parametrize(
    "flag",
    ["-testEndpoint", "-version", "-logtostderr", "-alsologtostderr", "-skip_headers",
     "-skip_log_headers", "-add_dir_header", "-one_output", "--logtostderr"],
)  # fmt: skip
def test_a_boolean_flag_followed_by_a_word_ends_the_flags_as_in_go(flag: str) -> None:
    """Go stops at ``x``: the driver runs lvm; read as ``flag=x``, the last
    ``-deviceManager=direct`` hid it and the change to direct was not refused."""
    ds = node_ds(command=[BINARY, "-deviceManager=lvm", flag, "x", "-deviceManager=direct"])
    (problem,) = refused_for_direct(ds)
    assert "changing it from 'lvm' to 'direct'" in problem


def test_a_string_flag_takes_the_next_word_even_with_a_dash() -> None:
    assert preflight._go_flags(["-drivername", "-x", "-deviceManager=direct"]) == {
        "drivername": "-x",
        "deviceManager": "direct",
    }


# --------------------------------------------------------------------------------------------
# item 4: Go's defaults


def test_a_node_driver_without_device_manager_runs_lvm() -> None:
    by_flag = node_ds(command=[BINARY, "-mode=node", f"-drivername={DRIVER}"], env=[])
    by_env = node_ds(command=[BINARY, "-mode=node"])  # PMEM_CSI_DRIVER_NAME in env
    for ds in (by_flag, by_env):
        (problem,) = refused_for_direct(ds)
        assert "changing it from 'lvm' to 'direct'" in problem
        assert "runs -deviceManager=lvm" in problem


def test_the_driver_program_without_either_setting_runs_the_default_driver_name() -> None:
    bare = node_ds(command=[BINARY, "-mode=node", "-deviceManager=lvm"], env=[])
    assert preflight._driver_name_of(bare) == names.DEFAULT_DRIVER_NAME
    (problem,) = refused_for_direct(bare)
    assert "changing it from 'lvm' to 'direct'" in problem
    # Run by the image's entrypoint (no command), nothing tells it apart: not counted.
    entry = node_ds(command=[], args=["-mode=node"], env=[])
    assert preflight._driver_name_of(entry) is None


# --------------------------------------------------------------------------------------------
# item 5: envFrom


def test_a_driver_name_from_env_from_is_unreadable() -> None:
    ds = node_ds("a.example", command=[BINARY, "-drivername=$(NAME)"], env=[])
    container = ds.spec["template"]["spec"]["containers"][0]
    container["envFrom"] = [{"configMapRef": {"name": "driver"}}]
    assert preflight._driver_name_of(ds) == preflight.UNREADABLE
    # ... so it counts by its DaemonSet's name, as for valueFrom.
    assert preflight._runs(ds, "a.example")
    # An env entry resolves it whatever envFrom has (env wins).
    container["env"] = [{"name": "NAME", "value": "b.example"}]
    assert preflight._driver_name_of(ds) == "b.example"
    # Without envFrom an unknown $(NAME) stays as written, as the kubelet leaves it.
    del container["envFrom"]
    container["env"] = []
    assert preflight._driver_name_of(ds) == "$(NAME)"


# --------------------------------------------------------------------------------------------
# item 6: an expired continue token restarts the pod list


class ExpiringPods:
    """Pages of pods; the continue token expires (410) the first ``expiries`` times."""

    def __init__(self, pods: list[dict[str, Any]], expiries: int) -> None:
        self.pods, self.expiries, self.calls = pods, expiries, 0

    def get(self, path: str, query: list[tuple[str, str]] | None = None) -> Any:
        from kubernetes.client.exceptions import ApiException

        self.calls += 1
        q = dict(query or [])
        start = int(q.get("continue") or 0)
        if start and self.expiries:
            self.expiries -= 1
            raise ApiException(status=410, reason="Gone")
        end = start + int(q["limit"])
        more = {"continue": str(end)} if end < len(self.pods) else {}
        return {"items": self.pods[start:end], "metadata": more}


PODS = [
    {"metadata": {"name": f"p{i}", "namespace": "app"},
     "spec": {"volumes": [{"name": "v", "csi": {"driver": "a.example"}}]}}
    for i in range(1001)
]  # fmt: skip


def test_an_expired_continue_token_restarts_the_pod_list() -> None:
    api = ExpiringPods(PODS, expiries=2)
    found = preflight._inline_volume_pods(api, {"a.example"})  # type: ignore[arg-type]
    assert sorted(p.name for p in found) == sorted(p["metadata"]["name"] for p in PODS)


def test_a_continue_token_expiring_again_and_again_stops_after_three_restarts() -> None:
    from kubernetes.client.exceptions import ApiException

    api = ExpiringPods(PODS, expiries=4)
    with pytest.raises(ApiException) as err:
        preflight._inline_volume_pods(api, {"a.example"})  # type: ignore[arg-type]
    assert err.value.status == 410
    assert api.calls == 8  # 4 lists of a first page and an expired second one


# --------------------------------------------------------------------------------------------
# item 7: the volume messages


def _refusal(*volumes: ObservedObject) -> str:
    two = {"a.example": cr("a.example"), "b.example": cr("b.example")}
    (problem,) = plan(stack({"name": "b.example"}), Observed(crs=two, volumes=list(volumes)),
                      ME).problems  # fmt: skip
    return problem


def _with(volume: ObservedObject, policy: str = "", provisioned: bool = False) -> ObservedObject:
    spec = dict(volume.spec)
    if policy:
        spec["persistentVolumeReclaimPolicy"] = policy
    annotations = {preflight.PROVISIONED_BY: "a.example"} if provisioned else {}
    return ObservedObject(volume.kind, volume.name, spec=spec, phase=volume.phase,
                          annotations=annotations)  # fmt: skip


def test_a_bound_retain_volume_is_to_be_deleted_after_its_claim() -> None:
    problem = _refusal(_with(pv("pv-keep", "a.example", "Bound", ("app", "keep")), "Retain"))
    assert "delete the PersistentVolumeClaims app/keep" in problem
    assert "running driver deletes their volumes" not in problem
    assert "reclaim policy Retain" in problem and "stays, Released" in problem
    assert "delete the PV after its claim" in problem
    assert "persistentVolumeReclaimPolicy" not in problem  # not made by the provisioner
    made = _with(pv("pv-made", "a.example", "Bound", ("app", "made")), "Retain", True)
    assert "persistentVolumeReclaimPolicy" in _refusal(made)
    # Reclaim policy Delete: deleting the claim is enough.
    gone = _refusal(_with(pv("pv-del", "a.example", "Bound", ("app", "del")), "Delete"))
    assert "delete the PersistentVolumeClaims app/del (the running driver deletes" in gone


def test_an_available_pre_bound_volume_is_unclaimed() -> None:
    problem = _refusal(pv("pv-pre", "a.example", "Available", ("app", "future")))
    assert "PersistentVolumeClaims" not in problem  # no claim to delete: it does not bind
    assert "pre-bound" in problem and "PersistentVolume pv-pre" in problem
    assert "kubectl delete pv" in problem


def test_the_reclaim_policy_advice_is_for_provisioned_volumes_only() -> None:
    static = _refusal(pv("pv-static", "a.example", "Released", ("app", "gone")))
    assert "persistentVolumeReclaimPolicy" not in static and "kubectl delete pv" in static
    made = _with(pv("pv-made", "a.example", "Released", ("app", "gone")), provisioned=True)
    problem = _refusal(made)
    assert "for PersistentVolume pv-made (made by the provisioner)" in problem
    assert "persistentVolumeReclaimPolicy" in problem


# --------------------------------------------------------------------------------------------
# item 8: completed pods do not block


def _pod(name: str, phase: str) -> ObservedObject:
    return ObservedObject(
        "Pod", name, "app", spec={"volumes": [{"csi": {"driver": "a.example"}}]}, phase=phase
    )


def test_completed_pods_with_inline_volumes_do_not_block_a_removal() -> None:
    two = {"a.example": cr("a.example"), "b.example": cr("b.example")}
    done = [_pod("job-1", "Succeeded"), _pod("job-2", "Failed")]
    assert plan(stack({"name": "b.example"}), Observed(crs=two, pods=done), ME).problems == []
    running = [*done, _pod("web", "Running"), _pod("new", "Pending")]
    (problem,) = plan(stack({"name": "b.example"}), Observed(crs=two, pods=running), ME).problems
    assert "Pod app/web" in problem and "Pod app/new" in problem
    assert "job-1" not in problem and "job-2" not in problem


# --------------------------------------------------------------------------------------------
# item 9: this stack's own DaemonSet re-created by hand


def test_this_stacks_daemon_set_made_anew_by_hand_is_not_another() -> None:
    shared = ns("shared")
    held = state_of(
        shared, *deployment_of("a.example", "shared"), *deployment_of("b.example", "other")
    )
    cfg = stack({"name": "b.example", "namespace": "other"}, retainNamespaces=False)
    anew = node_ds("a.example", "shared", uid="made-by-hand")
    observed = Observed(crs={"a.example": cr("a.example", "shared")},
                        namespaces={"shared": shared}, daemon_sets=[anew])  # fmt: skip
    result = plan(cfg, observed, ME, held)
    assert result.problems == []
    assert result.keep_namespaces == set() and result.kept_namespaces == {}


# --------------------------------------------------------------------------------------------
# item 10: a rename from a deployment whose CR is gone and whose namespace the state knows


def test_a_rename_without_cr_or_node_daemon_set_takes_the_namespace_from_the_state() -> None:
    old = "old.example"
    n = names.DeploymentNames(old)
    sts = ObservedObject("StatefulSet", n.controller_driver, "legacy", uid="sts",
                         api_version="apps/v1")  # fmt: skip
    secret = ObservedObject("Secret", n.node_secret, "legacy", uid="s", api_version="v1")
    cfg = stack({"name": "new.example", "namespace": "legacy", "renamedFrom": old})
    for objs in ((cr(old, "legacy"), sts, secret), (cr(old, "legacy"), secret)):
        result = plan(cfg, Observed(), ME, state_of(*objs))
        assert result.problems == []
        assert result.previous == {0: preflight.Previous(old, "legacy")}


def test_a_rename_whose_old_namespace_is_unknown_is_refused_naming_why() -> None:
    old = "old.example"
    cfg = stack({"name": "new.example", "renamedFrom": old})
    result = plan(cfg, Observed(), ME, state_of(cr(old, "legacy")))
    (problem,) = result.problems
    assert problem.startswith("pmem-csi:deployments[0].renamedFrom: 'old.example' is in")
    assert "Deployment CR is gone" in problem and "two pulumi ups" in problem
    assert result.previous == {}


def test_every_flag_but_the_booleans_takes_the_next_word_even_a_dashed_one() -> None:
    # Go's flag.StringVar: `-nodeid -deviceManager=direct` sets nodeid to that word; the
    # driver then runs the default device manager, lvm.
    assert preflight._go_flags(["-nodeid", "-deviceManager=direct"]) == {
        "nodeid": "-deviceManager=direct"
    }


def test_a_device_manager_set_from_env_from_is_not_taken_for_a_mode() -> None:
    # `-deviceManager=$(MODE)` with MODE from a ConfigMap (envFrom): the literal "$(MODE)" is
    # not a mode; taking it for one refused every update of the driver.
    from test_tail15a import node_ds

    ds = node_ds(command=["/usr/local/bin/pmem-csi-driver", "-deviceManager=$(MODE)"])
    container = ds.spec["template"]["spec"]["containers"][0]
    container["envFrom"] = [{"configMapRef": {"name": "modes"}}]
    observed = Observed(daemon_sets=[ds])
    assert preflight._running_modes(observed, names.DEFAULT_DRIVER_NAME) == []
