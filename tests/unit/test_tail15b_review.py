"""Issue 15 item 5, review of the replacement check: the provider's own forceNew rules, judged
from the stack's state; refusals worded by case; DryRunError through program.main."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pulumi
import pytest

from pmem_components import identity, preflight
from pmem_components.config import load_config
from pmem_components.manifests import bundle
from pmem_components.preflight import Observed, plan

ME = "pmem-csi-pulumi/prod"
MANAGER = "pulumi-kubernetes-abc123"
STS = "pmem-csi-intel-com-controller"
STS_PATH = f"/apis/apps/v1/namespaces/pmem-csi/statefulsets/{STS}"
LABEL = "pmem-csi:deployments[0].patches[0]"
HISTORY = {"kind": "StatefulSet", "mergePatch": {"spec": {"revisionHistoryLimit": 3}}}
ORDERED = {"kind": "StatefulSet", "mergePatch": {"spec": {"podManagementPolicy": "OrderedReady"}}}
# What the API server adds to the StatefulSet (defaults): in the live object and the outputs.
STS_DEFAULTS = {"spec": {"podManagementPolicy": "OrderedReady", "revisionHistoryLimit": 10}}
SIG = "4dabf18193072939515e22adb298388d"


def stack(*deps: dict[str, Any]) -> Any:
    return load_config({"deployments": list(deps)}, check_certificates=False)


def _owned(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {f"f:{k}": _owned(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return {f"i:{n}": {} for n in range(len(obj))} if obj else {}
    return {}


def _floats(value: Any) -> Any:
    """Numbers as the state keeps them (JSON numbers of the checkpoint: floats)."""
    if isinstance(value, dict):
        return {k: _floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_floats(v) for v in value]
    if isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def applied(cfg: Any, patches: list[dict[str, Any]] | None = None) -> tuple[dict, dict]:
    """(live objects by path, the stack's state) after an update with ``patches``: the
    provider recorded the inputs it applied and the object the API server returned (with
    its defaults); the live objects are those, owned by the provider's manager."""
    from pmem_components.patches import PatchSet

    pset = PatchSet.for_deployment(0, patches) if patches else None
    lives, outputs = {}, {}
    for obj in bundle.build_deployment_objects(cfg, create_namespace=False).all():
        kind, api_version = obj["kind"], obj["apiVersion"]
        inputs = (pset.apply(f"kubernetes:{api_version}:{kind}", obj) if pset else None) or obj
        inputs = copy.deepcopy(inputs)
        live = copy.deepcopy(inputs)
        if kind == "StatefulSet":
            for k, v in STS_DEFAULTS["spec"].items():
                live["spec"].setdefault(k, v)
        meta = live["metadata"]
        uid = f"uid-{kind}-{meta['name']}"
        entry = {"manager": MANAGER, "operation": "Apply", "fieldsV1": _owned(inputs)}
        lives[preflight._path(api_version, kind, meta.get("namespace"), meta["name"])] = {
            **live,
            "metadata": {**meta, "uid": uid, "managedFields": [entry]},
        }
        urn = f"urn:pulumi:prod::pmem-csi-pulumi::kubernetes:{api_version}:{kind}::{meta['name']}"
        outputs[urn] = {
            "type": f"kubernetes:{api_version}:{kind}",
            "outputs": {
                **_floats(live),
                "metadata": {**_floats(meta), "uid": uid},
                "__inputs": _floats(inputs),
                "__fieldManager": MANAGER,
            },
        }
    return lives, identity.state_from_outputs({"outputs": outputs})


class Accepts:
    """An API server that accepts every dry run (as for the reviewer's StatefulSet cases)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def dry_apply(self, path: str, obj: Any, manager: str) -> tuple[int, dict[str, Any]]:
        self.calls.append(path)
        return 200, obj


class Refuses:
    """Refuses the dry run of ``kind`` with ``status``/``cause`` when ``when(obj)``."""

    def __init__(self, kind: str, cause: dict[str, str], when: Any, reason: str = "Invalid"):
        self.kind, self.cause, self.when, self.reason = kind, cause, when, reason
        self.calls: list[str] = []

    def dry_apply(self, path: str, obj: Any, manager: str) -> tuple[int, dict[str, Any]]:
        self.calls.append(path)
        if obj["kind"] == self.kind and self.when(obj):
            body = {"kind": "Status", "reason": self.reason, "message": self.cause["message"],
                    "details": {"causes": [self.cause] if self.cause.get("field") else []}}
            return 422, body
        return 200, obj


def problem_of(cfg: Any, rejection: preflight.Rejection) -> str:
    (problem,) = plan(cfg, Observed(patch_rejections=[rejection]), ME).problems
    return problem


# ------------------------------------------------ item 1: the provider's forceNew rules


def test_a_revision_history_limit_patch_is_a_replacement_though_the_dry_run_accepts_it() -> None:
    """The reviewer's first case: the dry run answers 200, the provider replaces."""
    before = stack({})
    lives, state = applied(before.deployments[0])
    cfg = stack({"patches": [HISTORY]})
    (rejection,) = preflight.patch_rejections(Accepts(), cfg, lives, state)
    assert (rejection.labels, rejection.ref) == ((LABEL,), f"StatefulSet pmem-csi/{STS}")
    assert rejection.fields == ("spec.revisionHistoryLimit",)
    assert rejection.replace
    problem = problem_of(cfg, rejection)
    assert problem.startswith(
        f"{LABEL}: changes spec.revisionHistoryLimit of StatefulSet pmem-csi/{STS}, which the "
        "Kubernetes provider does not update in place: it would delete the object and create "
        "it anew. Leave that field out of the patch"
    )


def test_adding_a_patch_of_the_live_value_is_a_replacement_without_any_request() -> None:
    """``podManagementPolicy: OrderedReady`` is what the object has (the default), so the
    live comparison sees no change and nothing is dry-run; the provider compares with the
    inputs it recorded, which did not set it, and replaces."""
    lives, state = applied(stack({}).deployments[0])
    cfg = stack({"patches": [ORDERED]})
    api = Accepts()
    (rejection,) = preflight.patch_rejections(api, cfg, lives, state)
    assert (rejection.labels, rejection.fields) == ((LABEL,), ("spec.podManagementPolicy",))
    assert rejection.replace
    assert STS_PATH not in api.calls  # judged from the state alone


def test_removing_that_patch_again_is_a_replacement_though_the_server_defaults_it_back() -> None:
    """The dry run of the object without the field is accepted (the API server defaults it
    to the same value); the provider's inputs had it, the new ones do not: replaced."""
    before = stack({"patches": [ORDERED]})
    lives, state = applied(before.deployments[0], [ORDERED])
    cfg = stack({})
    (rejection,) = preflight.patch_rejections(Accepts(), cfg, lives, state)
    assert (rejection.labels, rejection.fields) == ((), ("spec.podManagementPolicy",))
    assert rejection.replace
    problem = problem_of(cfg, rejection)
    assert problem.startswith(
        f"pmem-csi:deployments[0]: this update changes spec.podManagementPolicy of "
        f"StatefulSet pmem-csi/{STS}, which the Kubernetes provider does not update in place"
    )
    assert "for a removed patch, the patch" in problem


def test_an_unchanged_stack_is_neither_replaced_nor_dry_run() -> None:
    """The recorded numbers are floats, the built ones ints; the outputs carry the API
    server's defaults: none of it is a change (else every update would be refused)."""
    cfg = stack({"patches": [HISTORY]})
    lives, state = applied(cfg.deployments[0], [HISTORY])
    api = Accepts()
    assert preflight.patch_rejections(api, cfg, lives, state) == []
    assert api.calls == []


def test_a_mutable_change_of_a_replaced_kind_is_dry_run_not_replaced() -> None:
    """``replicas`` is not on the provider's list: updated in place (the dry run judges)."""
    lives, state = applied(stack({}).deployments[0])
    cfg = stack({"patches": [{"kind": "StatefulSet", "mergePatch": {"spec": {"replicas": 2}}}]})
    api = Accepts()
    assert preflight.patch_rejections(api, cfg, lives, state) == []
    assert STS_PATH in api.calls


def test_the_state_keeps_the_recorded_inputs_and_outputs_without_secret_wrappers() -> None:
    """``readStackResourceOutputs`` answers each resource's outputs, ``__inputs`` among
    them; a Secret's values come wrapped as secrets."""
    urn = "urn:pulumi:s::p::kubernetes:core/v1:Secret::s"
    secret = {SIG: "1b47061264138c4ac30d75fd1eb44270", "value": "c2VjcmV0"}
    outs = {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": "s", "namespace": "n", "uid": "u"},
        "data": {"k": secret},
        "__inputs": {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                     "metadata": {"name": "s", "namespace": "n"}, "data": {"k": secret}},
        "__fieldManager": MANAGER,
    }
    state = identity.state_from_outputs({"outputs": {urn: {"type": "kubernetes:core/v1:Secret",
                                                           "outputs": outs}}})
    recorded = state.recorded(("", "Secret", "n", "s"))
    assert recorded is not None
    inputs, outputs = recorded
    assert inputs["data"] == {"k": "c2VjcmV0"} and inputs["type"] == "Opaque"
    assert "__inputs" not in outputs and outputs["metadata"]["uid"] == "u"
    assert state.recorded(("", "Secret", "n", "other")) is None


def test_every_kind_the_bundle_builds_is_covered_by_the_provider_rules() -> None:
    """Each (apiVersion, kind) the program builds is either on the list taken from the
    pinned provider's diff.go or known to have no replacing field there."""
    cfg = stack({})
    built = {
        (o["apiVersion"], o["kind"])
        for o in bundle.build_deployment_objects(cfg.deployments[0], create_namespace=True).all()
    }
    rules = set(preflight.PROVIDER_FORCE_NEW)
    assert not rules & preflight.PROVIDER_NEVER_REPLACES
    assert built <= rules | preflight.PROVIDER_NEVER_REPLACES, built - rules


def test_the_provider_rules_name_the_pinned_provider_version() -> None:
    """The list is the pinned provider's: the comment names the version requirements.txt
    pins and the source file and commit it was read from."""
    root = Path(__file__).resolve().parents[2]
    (pin,) = re.findall(r"^pulumi-kubernetes==(\S+)$", (root / "requirements.txt").read_text(),
                        re.M)
    source = Path(preflight.__file__).read_text()
    assert f"pulumi-kubernetes v{pin} (requirements.txt)" in source
    assert "provider/pkg/provider/diff.go" in source
    assert f"v{pin} =\n# commit f47bc2d6f1996444d11c12b4ef083b82585f7c07" in source


def test_the_provider_rules_match_by_path_prefix_numbers_by_value() -> None:
    recorded = ({"spec": {"selector": {"matchLabels": {"a": "b"}}, "revisionHistoryLimit": 3.0}},
                {"spec": {"selector": {"matchLabels": {"a": "b"}}, "revisionHistoryLimit": 3.0,
                          "replicas": 1.0}})
    new = {"spec": {"selector": {"matchLabels": {"a": "c"}}, "revisionHistoryLimit": 3}}
    assert preflight.forced_new("apps/v1", "StatefulSet", new, recorded) == [
        "spec.selector.matchLabels.a"
    ]
    assert preflight.forced_new("storage.k8s.io/v1", "CSIDriver", new, recorded) == []


# --------------------------------------------- item 3: a refusal is not always a replacement


def test_an_invalid_value_refused_by_the_dry_run_says_the_update_would_fail() -> None:
    """``replicas: -1``: the API server refuses the value; the provider updates in place
    and fails, it deletes nothing."""
    lives, state = applied(stack({}).deployments[0])
    cfg = stack({"patches": [{"kind": "StatefulSet", "mergePatch": {"spec": {"replicas": -1}}}]})
    cause = {"reason": "FieldValueInvalid", "field": "spec.replicas",
             "message": "must be greater than or equal to 0"}
    api = Refuses("StatefulSet", cause, lambda o: o["spec"].get("replicas") == -1)
    (rejection,) = preflight.patch_rejections(api, cfg, lives, state)
    assert not rejection.replace and rejection.fields == ("spec.replicas",)
    problem = problem_of(cfg, rejection)
    assert problem == (
        f"{LABEL}: changes spec.replicas of StatefulSet pmem-csi/{STS}, and the API server "
        "refuses this change: spec.replicas: must be greater than or equal to 0; the update "
        "would fail. Correct or leave out that part of the patch"
    )
    assert "create it anew" not in problem


def test_an_admission_denial_is_worded_as_a_failed_update() -> None:
    """A ValidatingAdmissionPolicy denial (422 Invalid, no field causes) of a config change."""
    lives, state = applied(stack({}).deployments[0])
    cfg = stack({"patches": [{"kind": "StatefulSet", "mergePatch": {"spec": {"replicas": 3}}}]})
    cause = {"message": "ValidatingAdmissionPolicy 'max-replicas' denied request"}
    api = Refuses("StatefulSet", cause, lambda o: True)
    (rejection,) = preflight.patch_rejections(api, cfg, lives, state)
    assert not rejection.replace
    problem = problem_of(cfg, rejection)
    assert ("the API server refuses this change: ValidatingAdmissionPolicy 'max-replicas' "
            "denied request; the update would fail") in problem
    assert "create it anew" not in problem


def test_an_immutable_field_the_provider_does_not_list_makes_the_update_fail() -> None:
    """A CSIDriver's ``attachRequired`` cannot change, but the provider has no replacing
    field for CSIDriver: it tries the update, which fails."""
    lives, state = applied(stack({}).deployments[0])
    patch = {"kind": "CSIDriver", "mergePatch": {"spec": {"attachRequired": True}}}
    cfg = stack({"patches": [patch]})
    cause = {"reason": "FieldValueInvalid", "field": "spec.attachRequired",
             "message": "field is immutable"}
    api = Refuses("CSIDriver", cause, lambda o: o["spec"].get("attachRequired") is True)
    (rejection,) = preflight.patch_rejections(api, cfg, lives, state)
    assert not rejection.replace and rejection.fields == ("spec.attachRequired",)
    problem = problem_of(cfg, rejection)
    assert "the API server refuses this change: spec.attachRequired: field is immutable; " \
        "the update would fail" in problem
    assert "create it anew" not in problem


# ----------------------------------------------- item 4: DryRunError through program.main


def test_program_main_fails_the_update_with_the_dry_run_errors_message(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """program.main runs the preflight (state read, client made, observe) and a DryRunError
    from it becomes the update's RunError with its words, and nothing is deployed."""
    from pmem_components import components, kubetarget, program

    words = "pmem-csi:preflight: pmem-csi:deployments[0].patches[0]: the server-side dry run"
    config = {"pmem-csi:deployments": json.dumps([{}]), "kubernetes:enableSecretMutable": "true"}
    monkeypatch.setattr(program.runtime_config, "get_config", config.get)
    monkeypatch.setattr(program, "_unknown_keys", lambda: [])
    monkeypatch.setattr(program, "cluster_target",
                        lambda: SimpleNamespace(makes_requests=True, description="test"))
    monkeypatch.setattr(components, "stack_id", lambda: "org/pmem-csi-pulumi/prod")
    monkeypatch.setattr(identity, "read_state", lambda _: identity.StackState())
    closed: list[bool] = []
    monkeypatch.setattr(kubetarget, "api_client",
                        lambda _: SimpleNamespace(close=lambda: closed.append(True)))

    def observe(*_: Any) -> Any:
        raise preflight.DryRunError(words)

    def deploy(*_: Any, **__: Any) -> Any:
        raise AssertionError("deployed although the preflight failed")

    monkeypatch.setattr(preflight, "observe", observe)
    monkeypatch.setattr(program, "deploy", deploy)
    with pytest.raises(pulumi.RunError) as raised:
        program.main()
    assert str(raised.value) == words
    assert closed == [True]


# ------------------- found while checking: a dry run beside fields the update takes over


def _edited_by_hand(lives: dict[str, Any]) -> dict[str, Any]:
    """The StatefulSet with a ``kubectl edit`` entry (a foreign manager) beside the
    provider's, as tests/e2e/test_drift.py leaves every object."""
    out = copy.deepcopy(lives)
    meta = out[STS_PATH]["metadata"]
    meta["managedFields"].append({"manager": "kubectl-edit", "operation": "Update",
                                  "fieldsV1": {"f:spec": {"f:replicas": {}}}})
    return out


def test_a_refusal_beside_fields_the_update_takes_over_first_is_no_verdict() -> None:
    """tests/e2e/test_drift.py on merge29: a Service edited by hand (an added port) was
    refused (``spec.ports[2].name: Required value``) although the take-over makes the
    provider own every field before it applies, and the update restores it."""
    lives, state = applied(stack({}).deployments[0])
    cfg = stack({"patches": [{"kind": "StatefulSet", "mergePatch": {"spec": {"replicas": 2}}}]})
    cause = {"reason": "FieldValueRequired", "field": "spec.x", "message": "Required value"}
    api = Refuses("StatefulSet", cause, lambda o: True)
    assert preflight.patch_rejections(api, cfg, _edited_by_hand(lives), state) == []
    # Without the take-over the dry run is what the provider will apply: refused.
    raw = {"deployments": [{"patches": cfg.deployments[0].patches}], "takeOverFields": False}
    off = load_config(raw, check_certificates=False)
    (rejection,) = preflight.patch_rejections(api, off, _edited_by_hand(lives), state)
    assert not rejection.replace
