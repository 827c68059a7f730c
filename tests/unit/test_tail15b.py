"""Issue 15 tail, part B: dry-run answers that are not verdicts, changes of immutable fields
that no patch makes (a removed patch, a config change), and the unawaited move's message."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from pmem_components import preflight
from pmem_components.config import load_config
from pmem_components.manifests import bundle
from pmem_components.preflight import Observed, ObservedObject, Previous, plan

ME = "pmem-csi-pulumi/prod"
MANAGER = "pulumi-kubernetes-abc123"
STS = "pmem-csi-intel-com-controller"
STS_PATH = f"/apis/apps/v1/namespaces/pmem-csi/statefulsets/{STS}"
POLICY = {"kind": "StatefulSet", "mergePatch": {"spec": {"podManagementPolicy": "Parallel"}}}
LABEL = "pmem-csi:deployments[0].patches[0]"


def stack(*deps: dict[str, Any]) -> Any:
    return load_config({"deployments": list(deps)}, check_certificates=False)


def _owned(obj: Any) -> Any:
    """A fieldsV1 owning every field of ``obj`` (lists as a whole, as list entries)."""
    if isinstance(obj, dict):
        return {f"f:{k}": _owned(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return {f"i:{n}": {} for n in range(len(obj))} if obj else {}
    return {}


def lives(cfg: Any, applied: Any = None) -> dict[str, Any]:
    """Live objects as the provider left them: ``applied`` (kind -> merge) as last applied,
    owned by the provider's manager; the API server's defaults are not modelled."""
    from pmem_components.patches import merge_patch

    out = {}
    for obj in bundle.build_deployment_objects(cfg, create_namespace=False).all():
        last = merge_patch(obj, (applied or {}).get(obj["kind"], {}))
        meta = last["metadata"]
        entry = {"manager": MANAGER, "operation": "Apply", "fieldsV1": _owned(last)}
        live = {**copy.deepcopy(last), "metadata": {**meta, "managedFields": [entry]}}
        path = preflight._path(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])
        out[path] = live
    return out


class SsaApi:
    """A StatefulSet whose live podManagementPolicy is ``live_policy``: a dry-run apply
    that leaves the field out gets the default (OrderedReady), as server-side apply removes
    a field its manager no longer sets; any change is refused (immutable). Every other
    object is accepted. ``status``: answer every patched StatefulSet dry run with it."""

    def __init__(self, live_policy: str = "OrderedReady", status: int | None = None) -> None:
        self.live_policy, self.status = live_policy, status
        self.calls: list[str] = []

    def dry_apply(self, path: str, obj: Any, manager: str) -> tuple[int, dict[str, Any]]:
        self.calls.append(path)
        if obj["kind"] != "StatefulSet":
            return 200, obj
        if self.status is not None:
            return self.status, {"kind": "Status", "message": "try later", "reason": "x"}
        policy = (obj.get("spec") or {}).get("podManagementPolicy") or "OrderedReady"
        if policy == self.live_policy:
            return 200, obj
        cause = {"reason": "FieldValueForbidden", "field": "spec", "message": "forbidden"}
        return 422, {"kind": "Status", "reason": "Invalid", "details": {"causes": [cause]}}


class Scripted:
    """Answers the patched StatefulSet dry run with ``patched`` and the unpatched one with
    ``plain``; a status of 0 raises (no answer: a timeout)."""

    def __init__(self, patched: int, plain: int = 200) -> None:
        self.patched, self.plain = patched, plain

    def dry_apply(self, path: str, obj: Any, manager: str) -> tuple[int, dict[str, Any]]:
        if obj["kind"] != "StatefulSet":
            return 200, obj
        status = self.patched if obj["spec"].get("podManagementPolicy") else self.plain
        if status == 0:
            raise TimeoutError("read timed out")
        if status == 422:
            cause = {"reason": "FieldValueForbidden", "field": "spec", "message": "no"}
            return 422, {"kind": "Status", "details": {"causes": [cause]}}
        return status, {"kind": "Status", "message": f"said {status}", "reason": "R"}


# ------------------------------------------------------------------ item 1: not a verdict


@pytest.mark.parametrize("status", [400, 403, 409, 500, 503, 0])
def test_a_dry_run_answered_without_a_verdict_stops_naming_the_patch_and_the_object(
    status: int,
) -> None:
    """400, 403, 409, 5xx or no answer at all: the check was not done. The update stops
    with the patch's key, the object, what came back and the ways forward (not a traceback,
    not "cannot read the cluster", not an acceptance)."""
    s = stack({"patches": [POLICY]})
    with pytest.raises(preflight.DryRunError) as raised:
        preflight.patch_rejections(Scripted(status), s, lives(s.deployments[0]))
    text = str(raised.value)
    assert text.startswith(f"pmem-csi:preflight: {LABEL}: the server-side dry run of "
                           f"StatefulSet pmem-csi/{STS}")
    assert ("no answer (TimeoutError: read timed out)" if status == 0 else f"HTTP {status}") in text
    assert "so that is not checked" in text and "Nothing was changed" in text
    assert "pmem-csi:preflight: false" in text


def test_the_unpatched_dry_run_without_a_verdict_is_not_taken_for_the_patchs_innocence() -> None:
    """The patched object is refused, the unpatched dry run gets a 500: on main the refusal
    was dropped as "refused without the patches too", and the replacing patch went through."""
    s = stack({"patches": [POLICY]})
    with pytest.raises(preflight.DryRunError) as raised:
        preflight.patch_rejections(Scripted(422, plain=500), s, lives(s.deployments[0]))
    assert f"{LABEL}: the server-side dry run of StatefulSet pmem-csi/{STS}" in str(raised.value)
    assert "HTTP 500 (said 500)" in str(raised.value)


def test_a_404_from_the_dry_run_means_gone_since_read_so_nothing_to_replace() -> None:
    s = stack({"patches": [POLICY]})
    assert preflight.patch_rejections(Scripted(404), s, lives(s.deployments[0])) == []


def test_run_passes_the_dry_run_error_through_unwrapped(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not turned into "cannot read the cluster ... get/list": the message names the patch."""

    def observe(*_: Any) -> Any:
        raise preflight.DryRunError("pmem-csi:preflight: the patch's own words")

    monkeypatch.setattr(preflight, "observe", observe)
    with pytest.raises(preflight.DryRunError) as raised:
        preflight.run(stack({}), ME, object())
    assert str(raised.value) == "pmem-csi:preflight: the patch's own words"


# test_a_dry_run_error_fails_the_program_with_its_message (it asserted issubclass only) is
# now test_program_main_fails_the_update_with_the_dry_run_errors_message in
# tests/unit/test_tail15b_review.py, which runs program.main.


# --------------------------------------------------- item 2: immutable change without a patch


def test_removing_a_patch_that_set_an_immutable_field_is_refused_naming_the_field() -> None:
    """The StatefulSet was applied with the patch (Parallel, owned by the provider); the
    patch is gone from the config. Applying the object as built drops the field, the API
    server defaults it to OrderedReady: immutable, so the provider would replace it."""
    cfg = stack({})
    live = lives(cfg.deployments[0], {"StatefulSet": POLICY["mergePatch"]})
    api = SsaApi(live_policy="Parallel")
    (rejection,) = preflight.patch_rejections(api, cfg, live)
    assert rejection.labels == ()
    assert rejection.ref == f"StatefulSet pmem-csi/{STS}"
    assert rejection.fields == ("spec.podManagementPolicy",)
    assert api.calls == [STS_PATH]  # the other objects are as last applied: no dry run
    (problem,) = plan(cfg, Observed(patch_rejections=[rejection]), ME).problems
    assert problem.startswith(
        "pmem-csi:deployments[0]: this update changes spec.podManagementPolicy of "
        f"StatefulSet pmem-csi/{STS}, and the API server refuses this change: spec: forbidden"
    )
    # Without the state no replacement is judged (tests/unit/test_tail15b_review.py: with it
    # this is the provider's replacement): the dry run's refusal is a failed update.
    assert "the update would fail" in problem
    assert "for a removed patch, the patch" in problem


def test_an_immutable_change_refused_with_and_without_the_remaining_patches_is_reported() -> None:
    """Another patch still selects the StatefulSet: on main a refusal of both the patched and
    the unpatched object was "not the patches'" and nothing was said."""
    annotate = {"kind": "StatefulSet", "mergePatch": {"metadata": {"annotations": {"a": "b"}}}}
    cfg = stack({"patches": [annotate]})
    live = lives(cfg.deployments[0], {"StatefulSet": POLICY["mergePatch"]})
    (rejection,) = preflight.patch_rejections(SsaApi(live_policy="Parallel"), cfg, live)
    assert (rejection.labels, rejection.fields) == ((), ("spec.podManagementPolicy",))


def test_a_changed_value_of_an_immutable_field_is_named() -> None:
    """Live Parallel, declared (by a patch now) OrderedReady: the patch's change."""
    ordered = {"kind": "StatefulSet",
               "mergePatch": {"spec": {"podManagementPolicy": "OrderedReady"}}}
    cfg = stack({"patches": [ordered]})
    live = lives(cfg.deployments[0], {"StatefulSet": POLICY["mergePatch"]})
    (rejection,) = preflight.patch_rejections(SsaApi(live_policy="Parallel"), cfg, live)
    assert rejection.fields == ("spec.podManagementPolicy",)


def test_nothing_changed_means_no_dry_run_at_all() -> None:
    """The steady state of every pulumi up: each object as last applied, so no request."""
    cfg = stack({"patches": [POLICY]})
    live = lives(cfg.deployments[0], {"StatefulSet": POLICY["mergePatch"]})
    api = SsaApi(live_policy="Parallel")
    assert preflight.patch_rejections(api, cfg, live) == []
    assert api.calls == []


def test_a_mutable_change_is_dry_run_and_accepted() -> None:
    ready = {"kind": "StatefulSet", "mergePatch": {"spec": {"minReadySeconds": 5}}}
    cfg = stack({"patches": [ready]})
    api = SsaApi()
    assert preflight.patch_rejections(api, cfg, lives(cfg.deployments[0])) == []
    assert api.calls == [STS_PATH]


def test_defaults_the_api_server_added_do_not_count_as_changes() -> None:
    """Live objects carry defaults (and status) the config never set: contained, unchanged."""
    cfg = stack({})
    live = lives(cfg.deployments[0])
    for obj in live.values():
        obj["status"] = {"observedGeneration": 3}
        obj["metadata"]["uid"] = "u-1"
        if obj["kind"] == "StatefulSet":
            obj["spec"]["revisionHistoryLimit"] = 10
    api = SsaApi()
    assert preflight.patch_rejections(api, cfg, live) == []
    assert api.calls == []


def test_owned_paths_stop_at_list_entries() -> None:
    fields = {"f:spec": {"f:a": {}, "f:list": {"k:{\"name\":\"x\"}": {".": {}, "f:name": {}}}},
              "f:metadata": {".": {}, "f:labels": {"f:x": {}}}}
    assert preflight._owned_paths(fields) == [
        ("spec", "a"), ("spec", "list"), ("metadata", "labels", "x")
    ]


# ------------------------------------------------------- item 6: the unawaited move's message


def _ds(annotated: bool) -> ObservedObject:
    return ObservedObject(
        "DaemonSet",
        "pmem-csi-intel-com-node",
        namespace="old",
        annotations={"pulumi.com/skipAwait": "true"} if annotated else {},
    )


def test_await_off_and_an_old_daemonset_that_skips_the_wait_gives_both_steps_at_once() -> None:
    """Await off now and the old DaemonSet deployed with it: on main the message said to set
    await.enabled: true "for the update that moves" -- done, that update is refused again
    (the annotation on the old DaemonSet). The first message now tells the two ups."""
    d = stack({"namespace": "new", "allowReinstall": True, "await": {"enabled": False}})
    prev = Previous("pmem-csi.intel.com", "old")
    text = preflight._unawaited_move_problem(
        0, d.deployments[0], prev, Observed(daemon_sets=[_ds(True)])
    )
    assert text is not None
    assert text.startswith("pmem-csi:deployments[0].await.enabled: false sets pulumi.com/skipAwait")
    assert "DaemonSet old/pmem-csi-intel-com-node carries pulumi.com/skipAwait" in text
    assert (
        "first run pulumi up with await.enabled: true and the deployment where it is "
        "(name 'pmem-csi.intel.com', namespace 'old'), then move it"
    ) in text


def test_await_off_only_now_needs_await_on_in_the_moving_update() -> None:
    d = stack({"namespace": "new", "allowReinstall": True, "await": {"enabled": False}})
    prev = Previous("pmem-csi.intel.com", "old")
    text = preflight._unawaited_move_problem(
        0, d.deployments[0], prev, Observed(daemon_sets=[_ds(False)])
    )
    assert text is not None and "Set await.enabled: true for the update that moves" in text
    assert "first run pulumi up" not in text


# ------------------------------------------------- item 3: a kept namespace keeps its labels

ENFORCE = {"pod-security.kubernetes.io/enforce": "privileged"}


def test_run_hands_the_kept_namespaces_live_labels_and_annotations_to_the_program(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pmem_components import names

    live = ObservedObject(
        "Namespace",
        "pmem-csi",
        labels={**ENFORCE, "team": "storage"},
        annotations={names.STACK_ANNOTATION: ME, "owner": "ops"},
        pulumi_managers=("pulumi-kubernetes-1",),
        # Only those this stack's manager applied (test_tail15_review, item 2): "team" is
        # kubectl's.
        applied_metadata={
            "pulumi-kubernetes-1": {
                "labels": frozenset(ENFORCE),
                "annotations": frozenset({names.STACK_ANNOTATION, "owner"}),
            },
            "kubectl": {"labels": frozenset({"team"}), "annotations": frozenset()},
        },
    )
    monkeypatch.setattr(preflight, "observe", lambda *_: Observed(namespaces={"pmem-csi": live}))
    result = preflight.run(stack({"createNamespace": False}), ME, object())
    assert result.keep_namespaces == {"pmem-csi"}
    assert result.kept_metadata == {
        "pmem-csi": {
            "labels": {**ENFORCE},
            "annotations": {names.STACK_ANNOTATION: ME, "owner": "ops"},
        }
    }


def test_a_released_namespace_is_registered_with_the_labels_a_namespace_patch_had_added(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The namespace was created with a ``kind: Namespace`` patch (PSA enforce: privileged,
    which the privileged driver pods need); the deployment switches to createNamespace: false
    and the patch has to go with it (it would select nothing). The release registers the
    namespace once more: on main without that label, so server-side apply removed it (the
    stack's field manager had set it) -- silently, until the next driver pod is refused."""
    import pulumi

    from pmem_components import names, registry
    from pmem_components.program import deploy as program_deploy
    from tests.unit.pulumi_mocks import RecordingMocks, project_config

    seen: list[dict[str, Any]] = []
    real = registry.register

    def spy(obj: dict[str, Any], opts: pulumi.ResourceOptions, **kw: Any) -> Any:
        if obj.get("kind") == "Namespace":  # the others hold Outputs
            seen.append(copy.deepcopy(obj))
        return real(obj, opts, **kw)

    monkeypatch.setattr(registry, "register", spy)
    s = load_config(
        {"deployments": [{"createNamespace": False}], "retainNamespaces": False},
        check_certificates=False,
    )
    kept = {
        "pmem-csi": {
            "labels": {**ENFORCE},
            "annotations": {names.STACK_ANNOTATION: ME, "owner": "ops",
                            "pulumi.com/patchForce": "true"},
        }
    }
    mocks = RecordingMocks({"ca_cert": "CA", "registry_cert": "RC", "registry_key": "RK",
                            "node_controller_cert": "NC", "node_controller_key": "NK"})
    pulumi.runtime.set_mocks(mocks, project="pmem-csi-pulumi", stack="unit", preview=False)

    @pulumi.runtime.test
    def program() -> Any:
        return pulumi.Output.all(
            program_deploy(s, keep_namespaces={"pmem-csi"}, kept_metadata=kept)
        )

    with project_config():
        program()
    (ns,) = [o for o in seen if o["kind"] == "Namespace"]
    meta = ns["metadata"]
    assert meta["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    assert meta["annotations"] == {"owner": "ops"}  # not the stack's, no provider directive


def test_the_components_annotations_and_generated_secret_data_are_no_change_to_judge() -> None:
    """The component stamps annotations (spec digest, certificate hash, deletion policy) and
    the Secrets carry generated data the built objects do not have: no dry run for them,
    and never named as a refused field (seen with the real engine: the certificate hash
    was named next to podManagementPolicy)."""
    from pmem_components.patches import merge_patch

    cfg = stack({})
    live = lives(cfg.deployments[0], {"StatefulSet": POLICY["mergePatch"]})
    for obj in live.values():
        extra: dict[str, Any] = {"metadata": {"annotations": {"pmem-csi.intel.com/d": "d"}}}
        if obj["kind"] in ("StatefulSet", "DaemonSet"):
            extra["spec"] = {"template": {"metadata": {"annotations": {"h": "1"}}}}
        if obj["kind"] == "Secret":
            extra["data"] = {"ca.crt": "Q0E="}
        merged = merge_patch(obj, extra)
        meta = {k: v for k, v in merged["metadata"].items() if k != "managedFields"}
        merged["metadata"]["managedFields"][0]["fieldsV1"] = _owned({**merged, "metadata": meta})
        obj.clear()
        obj.update(merged)
    api = SsaApi(live_policy="Parallel")
    (rejection,) = preflight.patch_rejections(api, cfg, live)
    assert rejection.fields == ("spec.podManagementPolicy",)
    assert api.calls == [STS_PATH]
