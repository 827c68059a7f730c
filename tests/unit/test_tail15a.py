"""Issue 15 tail, part A: the preflight's volume and device-mode guards at their edges.

* The node DaemonSet's flags are read as Go's flag package reads them (``-f X``, ``--f X``,
  ``-f=X``, the last occurrence wins, parsing stops at the first non-flag), and its driver
  name as the kubelet resolves it (the last ``env`` entry of a name wins; ``valueFrom`` is
  not readable here).
* Removal and rename of a deployment whose CR (or the CRD) was deleted by hand: the stack's
  state still says which deployments it has.
* Pods with inline CSI ephemeral volumes of a driver that would be removed or renamed.
* Released PersistentVolumes (no claim to delete): the message says what to do with them.
* A namespace this stack stops registering while another stack's deployment (or another
  driver) lives in it, and namespaces from before the stack annotation.
"""

from __future__ import annotations

from typing import Any

from pmem_components import identity, names, preflight
from pmem_components.config import load_config
from pmem_components.preflight import Observed, ObservedObject, Previous, plan

ME = identity.identity("organization", "pmem-csi-pulumi", "prod")
CR_API = f"{names.CRD_GROUP}/{names.CRD_STORAGE_VERSION}"
DRIVER = names.DEFAULT_DRIVER_NAME


def stack(*deps: dict[str, Any], **top: Any) -> Any:
    return load_config({"deployments": list(deps), **top}, check_certificates=False)


def node_ds(
    driver: str = DRIVER,
    namespace: str = "pmem-csi",
    command: list[str] | None = None,
    args: list[str] | None = None,
    env: list[dict[str, Any]] | None = None,
    uid: str = "ds-uid",
) -> ObservedObject:
    container: dict[str, Any] = {
        "name": "pmem-driver",
        "command": command
        if command is not None
        else ["/usr/local/bin/pmem-csi-driver", "-deviceManager=lvm", "-mode=node"],
        "env": env if env is not None else [{"name": "PMEM_CSI_DRIVER_NAME", "value": driver}],
    }
    if args is not None:
        container["args"] = args
    return ObservedObject(
        "DaemonSet",
        names.DeploymentNames(driver).node_driver,
        namespace,
        labels={names.LABEL_MANAGED_BY: names.MANAGED_BY},
        spec={"template": {"spec": {"containers": [container]}}},
        uid=uid,
        api_version="apps/v1",
    )


def cr(name: str, namespace: str = "pmem-csi", owner: str | None = ME) -> ObservedObject:
    return ObservedObject(
        names.CRD_KIND,
        name,
        labels={names.LABEL_MANAGED_BY: names.MANAGED_BY},
        annotations={names.STACK_ANNOTATION: owner} if owner else {},
        spec={"namespace": namespace, "deviceMode": "lvm"},
        uid=f"cr-{name}",
        api_version=CR_API,
    )


def ns(name: str, owner: str | None = ME) -> ObservedObject:
    return ObservedObject(
        "Namespace",
        name,
        labels={names.LABEL_MANAGED_BY: names.MANAGED_BY},
        annotations={names.STACK_ANNOTATION: owner} if owner else {},
        uid=f"ns-{name}",
        api_version="v1",
    )


def pv(
    name: str, driver: str, phase: str = "Bound", claim: tuple[str, str] | None = ("app", "data")
) -> ObservedObject:
    spec: dict[str, Any] = {"csi": {"driver": driver}}
    if claim is not None:
        spec["claimRef"] = {"namespace": claim[0], "name": claim[1]}
    return ObservedObject("PersistentVolume", name, spec=spec, phase=phase)


def state_of(*objs: ObservedObject, urns: dict[str, str] | None = None) -> identity.StackState:
    return identity.StackState(
        {
            o.key: identity.Held(o.uid, "pulumi-kubernetes-1", (urns or {}).get(o.name, ""))
            for o in objs
        }
    )


def deployment_of(driver: str, namespace: str = "pmem-csi") -> list[ObservedObject]:
    """What the state of a stack that deployed ``driver`` holds: its CR and node DaemonSet."""
    return [cr(driver, namespace), node_ds(driver, namespace)]


# --------------------------------------------------------------------------------------------
# item 1: flags as Go's flag package reads them, the driver name as the kubelet resolves it

DIRECT = {"deviceMode": "direct"}


def refused_for_direct(ds: ObservedObject) -> list[str]:
    return plan(stack(DIRECT), Observed(daemon_sets=[ds]), ME).problems


def test_a_two_word_device_manager_flag_is_read_in_command_and_args() -> None:
    binary = "/usr/local/bin/pmem-csi-driver"
    for ds in (
        node_ds(command=[binary, "-deviceManager", "lvm", "-mode=node"]),
        node_ds(command=[binary, "--deviceManager", "lvm"]),
        node_ds(command=[binary, "--deviceManager=lvm"]),
        node_ds(command=[binary], args=["-mode=node", "-deviceManager", "lvm"]),
        node_ds(command=[], args=["-deviceManager", "lvm"]),  # the image's entrypoint
    ):
        (problem,) = refused_for_direct(ds)
        assert "changing it from 'lvm' to 'direct'" in problem, ds
        assert "runs -deviceManager=lvm" in problem


def test_the_last_device_manager_flag_wins_as_in_go() -> None:
    binary = "/usr/local/bin/pmem-csi-driver"
    (problem,) = refused_for_direct(
        node_ds(command=[binary, "-deviceManager=direct"], args=["-deviceManager", "lvm"])
    )
    assert "changing it from 'lvm' to 'direct'" in problem
    assert refused_for_direct(node_ds(command=[binary, "-deviceManager=lvm",
                                               "-deviceManager=direct"])) == []  # fmt: skip
    # Go stops at the first argument that is not a flag: what follows is not a flag.
    assert refused_for_direct(node_ds(command=[binary, "-deviceManager=direct", "x",
                                               "-deviceManager=lvm"])) == []  # fmt: skip
    assert refused_for_direct(node_ds(command=[binary, "-deviceManager=direct", "--",
                                               "-deviceManager=lvm"])) == []  # fmt: skip


def test_the_driver_name_is_the_last_env_entry_and_the_drivername_flag() -> None:
    duplicated = [
        {"name": "PMEM_CSI_DRIVER_NAME", "value": "other.example"},
        {"name": "PMEM_CSI_DRIVER_NAME", "value": DRIVER},
    ]
    (problem,) = refused_for_direct(node_ds(env=duplicated))
    assert "runs -deviceManager=lvm" in problem
    # -drivername=$(PMEM_CSI_DRIVER_NAME) is what the driver registers as.
    flagged = node_ds(
        command=["/bin/driver", "-deviceManager=lvm", "-drivername=$(PMEM_CSI_DRIVER_NAME)"],
        env=duplicated,
    )
    assert len(refused_for_direct(flagged)) == 1
    literal = node_ds(
        command=["/bin/driver", "-deviceManager=lvm", "-drivername", "other.example"],
        env=duplicated,
    )
    assert refused_for_direct(literal) == []  # another driver's, whatever its env says


def test_a_driver_name_set_through_value_from_counts_for_the_same_named_daemon_set() -> None:
    from_config_map = [
        {
            "name": "PMEM_CSI_DRIVER_NAME",
            "valueFrom": {"configMapKeyRef": {"name": "driver", "key": "name"}},
        }
    ]
    (problem,) = refused_for_direct(node_ds(env=from_config_map))
    assert "runs -deviceManager=lvm" in problem
    # The same in another namespace is a second node driver of that name, unless it is known
    # to run another one.
    (problem,) = plan(
        stack({}), Observed(daemon_sets=[node_ds(namespace="elsewhere", env=from_config_map)]), ME
    ).problems
    assert "DaemonSet elsewhere/pmem-csi-intel-com-node runs node drivers" in problem


# --------------------------------------------------------------------------------------------
# item 2: removal and rename with the CR (or the CRD) deleted by hand


def test_removing_a_deployment_whose_cr_was_deleted_by_hand_is_refused_while_it_has_volumes() -> (
    None
):
    held = state_of(*deployment_of("a.example"), *deployment_of("b.example"))
    live = [node_ds("a.example"), node_ds("b.example")]
    volumes = [pv("pvc-1", "a.example")]
    for crs in ({"b.example": cr("b.example")}, {}):  # the CR deleted; the CRD too
        observed = Observed(crs=crs, daemon_sets=live, volumes=volumes)
        (problem,) = plan(stack({"name": "b.example"}), observed, ME, held).problems
        assert problem.startswith("pmem-csi:deployments: 'a.example' (deployed by this stack)")
        assert "PersistentVolume pvc-1" in problem
    # Without volumes it is removed as before; a configured deployment whose CR is gone is
    # not new (no rename is suspected).
    assert plan(stack({"name": "b.example"}), Observed(daemon_sets=live), ME, held).problems == []


def test_renaming_a_deployment_whose_cr_was_deleted_by_hand() -> None:
    held = state_of(*deployment_of("old.example", "old-ns"))
    live = [node_ds("old.example", "old-ns")]
    renamed = stack({"name": "new.example", "renamedFrom": "old.example", "namespace": "new-ns"})
    observed = Observed(daemon_sets=live, volumes=[pv("pvc-1", "old.example")])
    (problem,) = plan(renamed, observed, ME, held).problems
    assert problem.startswith("pmem-csi:deployments[0].renamedFrom: renaming 'old.example'")
    assert "PersistentVolume pvc-1" in problem
    # Without volumes the rename replaces the old objects (old first), found by the state.
    result = plan(renamed, Observed(daemon_sets=live), ME, held)
    assert result.problems == []
    assert result.previous == {0: Previous("old.example", "old-ns")}
    # Removing it and adding another without renamedFrom looks like a rename, as with the CR.
    (problem,) = plan(stack({"name": "new.example"}), Observed(daemon_sets=live), ME, held).problems
    assert "pmem-csi:deployments[0].renamedFrom: 'old.example'" in problem


def test_a_driver_known_only_by_its_daemon_set_in_the_state_is_guarded_too() -> None:
    # The CR never reached the state (an interrupted run), the DaemonSet did.
    ds = node_ds("a.example")
    observed = Observed(daemon_sets=[ds], volumes=[pv("pvc-1", "a.example")])
    volumes, new = plan(stack({"name": "b.example"}), observed, ME, state_of(ds)).problems
    assert "'a.example' (deployed by this stack) is no longer configured" in volumes
    assert "PersistentVolume pvc-1" in volumes
    assert "pmem-csi:deployments[0].renamedFrom: 'a.example'" in new  # b.example is new


def test_another_stacks_driver_without_a_cr_is_not_this_stacks_to_guard() -> None:
    observed = Observed(daemon_sets=[node_ds("a.example")], volumes=[pv("pvc-1", "a.example")])
    held = state_of(*deployment_of("b.example"))
    assert plan(stack({"name": "b.example"}), observed, ME, held).problems == []


# --------------------------------------------------------------------------------------------
# item 4: PersistentVolumes whose claim is gone


def test_the_refusal_says_what_to_do_with_volumes_that_have_no_claim() -> None:
    volumes = [
        pv("pv-bound", "a.example", "Bound", ("app", "data")),
        pv("pv-released", "a.example", "Released", ("app", "gone")),
        pv("pv-free", "a.example", "Available", None),
        pv("pv-failed", "a.example", "Failed", None),
    ]
    two = {"a.example": cr("a.example"), "b.example": cr("b.example")}
    observed = Observed(crs=two, volumes=volumes)
    (problem,) = plan(stack({"name": "b.example"}), observed, ME).problems
    assert "delete the PersistentVolumeClaims app/data" in problem
    assert "app/gone" not in problem.split("PersistentVolumeClaims", 1)[1].split(";")[0]
    unclaimed = problem.split("no claim", 1)[1]
    for name in ("pv-released", "pv-free", "pv-failed"):
        assert f"PersistentVolume {name}" in unclaimed
    # None was made by the provisioner: no reclaim policy patch (test_tail15_review, item 7).
    assert "persistentVolumeReclaimPolicy" not in problem and "kubectl delete pv" in problem
    # Only unclaimed ones: no claim to delete is suggested.
    only = Observed(crs=two, volumes=volumes[1:2])
    (problem,) = plan(stack({"name": "b.example"}), only, ME).problems
    assert "PersistentVolumeClaims" not in problem
    assert "PersistentVolume pv-released" in problem
    # A rename says the same.
    renamed = stack({"name": "c.example", "renamedFrom": "a.example"}, {"name": "b.example"})
    (problem,) = plan(renamed, observed, ME).problems
    assert "renamedFrom" in problem and "delete the PersistentVolumeClaims app/data" in problem
    assert "kubectl delete pv" in problem


def test_the_observed_persistent_volume_keeps_its_phase() -> None:
    item = {"metadata": {"name": "pv-1"}, "spec": {"csi": {"driver": DRIVER}},
            "status": {"phase": "Released"}}  # fmt: skip
    assert preflight._observed(item, "PersistentVolume").phase == "Released"


# --------------------------------------------------------------------------------------------
# item 3: inline CSI ephemeral volumes


def pod(name: str, driver: str, namespace: str = "app") -> ObservedObject:
    return ObservedObject(
        "Pod",
        name,
        namespace,
        spec={"volumes": [{"name": "scratch", "csi": {"driver": driver}}]},
    )


def test_pods_with_inline_volumes_of_a_driver_that_would_go_are_named() -> None:
    two = {"a.example": cr("a.example"), "b.example": cr("b.example")}
    observed = Observed(crs=two, pods=[pod("web-0", "a.example"), pod("db-0", "b.example")])
    (problem,) = plan(stack({"name": "b.example"}), observed, ME).problems
    assert "Pod app/web-0" in problem and "db-0" not in problem
    assert "inline" in problem
    renamed = stack({"name": "c.example", "renamedFrom": "a.example"}, {"name": "b.example"})
    (problem,) = plan(renamed, observed, ME).problems
    assert "renamedFrom" in problem and "Pod app/web-0" in problem


class PodApi:
    """Answers the preflight's reads: the CRs, and pods in pages of ``limit``."""

    def __init__(self, crs: list[dict[str, Any]], pods: list[dict[str, Any]]) -> None:
        self.crs, self.pods = crs, pods
        self.pod_queries: list[dict[str, str]] = []

    def get(self, path: str, query: list[tuple[str, str]] | None = None) -> Any:
        if path.endswith("/deployments"):
            return {"items": self.crs}
        if path == "/api/v1/pods":
            q = dict(query or [])
            self.pod_queries.append(q)
            start = int(q.get("continue") or 0)
            end = start + int(q["limit"])
            more = {"continue": str(end)} if end < len(self.pods) else {}
            return {"items": self.pods[start:end], "metadata": more}
        return None


def test_pods_are_listed_in_pages_only_when_a_driver_would_go(monkeypatch: Any) -> None:
    crs = [{"metadata": {"name": n}, "spec": {"namespace": "pmem-csi"}}
           for n in ("a.example", "b.example")]  # fmt: skip
    pods = [
        {"metadata": {"name": f"p{i}", "namespace": "app"},
         "spec": {"volumes": [{"name": "v", "csi": {"driver": "a.example"}}]}}
        for i in range(1203)
    ]  # fmt: skip
    api = PodApi(crs, pods)
    monkeypatch.setattr(
        preflight._Reader, "get", lambda self, path, query=None: api.get(path, query)
    )
    monkeypatch.setattr(preflight, "patch_rejections", lambda *a: [])
    held = state_of(cr("a.example"), cr("b.example"))
    both = stack({"name": "a.example"}, {"name": "b.example"})
    assert preflight.observe(object(), both, held).pods == []
    assert api.pod_queries == []  # nothing goes: no pod is read
    observed = preflight.observe(object(), stack({"name": "b.example"}), held)
    assert len(observed.pods) == 1203
    assert [q["limit"] for q in api.pod_queries] == ["500"] * 3


# --------------------------------------------------------------------------------------------
# items 5 and 6: namespaces that other deployments live in; namespaces from before annotations


def test_a_namespace_no_deployment_of_the_stack_uses_is_kept_while_another_lives_in_it() -> None:
    shared = ns("shared")
    held = state_of(
        shared, *deployment_of("a.example", "shared"), *deployment_of("b.example", "other")
    )
    cfg = stack({"name": "b.example", "namespace": "other"}, retainNamespaces=False)
    theirs = cr("x.example", "shared", owner="organization/other/prod")
    observed = Observed(crs={"x.example": theirs}, namespaces={"shared": shared})
    result = plan(cfg, observed, ME, held)
    assert result.problems == [] and result.keep_namespaces == {"shared"}
    assert "Deployment x.example" in result.kept_namespaces["shared"].reason
    # Another driver's DaemonSet (the operator's, made by hand) counts the same.
    foreign = node_ds("y.example", "shared", uid="theirs")
    observed = Observed(namespaces={"shared": shared}, daemon_sets=[foreign])
    result = plan(cfg, observed, ME, held)
    assert result.keep_namespaces == {"shared"}
    assert "DaemonSet shared/" in result.kept_namespaces["shared"].reason
    # Only this stack's own deployment (being removed) there: it goes, as asked.
    mine_only = Observed(
        namespaces={"shared": shared}, daemon_sets=[node_ds("a.example", "shared")]
    )
    assert plan(cfg, mine_only, ME, held).keep_namespaces == set()
    # Released by the update before (no stack annotation any more): not registered again.
    released = ns("shared", owner=None)
    observed = Observed(crs={"x.example": theirs}, namespaces={"shared": released})
    assert plan(cfg, observed, ME, state_of(released)).keep_namespaces == set()


OLD_NS_URN = (
    "urn:pulumi:prod::pmem-csi-pulumi::pmem-csi:index:PmemCsiDeployment$"
    "kubernetes:core/v1:Namespace::pmem-csi"
)


def test_a_namespace_from_before_the_stack_annotation_is_kept_while_used() -> None:
    old = ns("pmem-csi", owner=None)  # made by a version that registered it per deployment
    held = state_of(old, urns={"pmem-csi": OLD_NS_URN})
    observed = Observed(namespaces={"pmem-csi": old})
    result = plan(stack({"createNamespace": False}), observed, ME, held)
    assert result.problems == [] and result.keep_namespaces == {"pmem-csi"}
    # ... and while another stack's deployment lives in it.
    theirs = cr("x.example", "pmem-csi", owner="organization/other/prod")
    observed = Observed(crs={"x.example": theirs}, namespaces={"pmem-csi": old})
    cfg = stack({"name": "b.example", "namespace": "other"})
    held = state_of(old, *deployment_of("b.example", "other"), urns={"pmem-csi": OLD_NS_URN})
    assert plan(cfg, observed, ME, held).keep_namespaces == {"pmem-csi"}
    # A released one (registered at stack level, annotation dropped) is not.
    stack_level = "urn:pulumi:prod::pmem-csi-pulumi::kubernetes:core/v1:Namespace::pmem-csi"
    released = state_of(old, urns={"pmem-csi": stack_level})
    observed = Observed(namespaces={"pmem-csi": old})
    assert plan(stack({"createNamespace": False}), observed, ME, released).keep_namespaces == set()


def test_a_cr_from_before_the_stack_annotation_in_the_namespace_counts_as_another() -> None:
    shared = ns("shared")
    held = state_of(
        shared, *deployment_of("a.example", "shared"), *deployment_of("b.example", "other")
    )
    operators = cr("x.example", "shared", owner=None)  # not in this stack's state
    observed = Observed(crs={"x.example": operators}, namespaces={"shared": shared})
    cfg = stack({"name": "b.example", "namespace": "other"})
    assert plan(cfg, observed, ME, held).keep_namespaces == {"shared"}


def test_a_namespace_move_of_a_deployment_whose_cr_was_deleted_by_hand() -> None:
    held = state_of(*deployment_of(DRIVER, "old"))
    observed = Observed(daemon_sets=[node_ds(DRIVER, "old")])
    (problem,) = plan(stack({}), observed, ME, held).problems
    assert problem.startswith("pmem-csi:deployments[0].namespace: changing it from 'old'")
    result = plan(stack({"allowReinstall": True}), observed, ME, held)
    assert result.problems == []
    assert result.previous == {0: Previous(DRIVER, "old")}
