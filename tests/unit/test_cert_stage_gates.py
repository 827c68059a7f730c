"""What moves a CA change from one stage to the next, and what the administrator is told.

The review of the staged CA change (issue 15, item 6) found gates that could hold a change
forever (preflight off, a pod stuck Terminating), a gate that opened on nothing (an empty pod
list), a rotation that let due leaves run out, and a pod read that fetched every pod in full.
Each test here is one of those, against the pure rules (``cert_resource.next_step`` /
``apply_step``, ``certrollout``) or a fake API client.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
import tlspeers
from certutil import FIRST_SETTINGS, pem_certs
from tlspeers import Generation

from pmem_components import cert_resource, certrollout
from pmem_components.cert_resource import apply_step, fingerprint_of, next_step
from pmem_components.config import ConfigError, load_config
from pmem_components.manifests.bundle import CERTIFICATES_HASH_ANNOTATION

SETTINGS = FIRST_SETTINGS
# Leaves (10 days) due within 20 days, the CA (30 days) not.
DUE = {"rotation": "", "renewWithinDays": 20, "validityDays": 10}


@pytest.fixture(scope="module")
def stage1(gen0: dict[str, Any]) -> dict[str, Any]:
    news = {**SETTINGS, "rotation": "r2"}
    return apply_step("begin", gen0, news)


# --- (1) preflight off: the administrator's confirmation moves the stage --------------------


def test_without_the_pods_a_stage_advances_on_the_administrators_confirmation_only(
    gen0: dict[str, Any], stage1: dict[str, Any]
) -> None:
    now = dt.datetime.now(dt.UTC)
    news = {**SETTINGS, "rotation": "r2", "runningFingerprints": None}
    assert next_step(stage1, news, now) is None  # unknown and unconfirmed: waits
    confirmed = {**news, "confirmedFingerprint": fingerprint_of(stage1)}
    assert next_step(stage1, confirmed, now) == "switch"
    # A stale confirmation (the previous stage's, left in the config) moves nothing.
    stale = {**news, "confirmedFingerprint": fingerprint_of(gen0)}
    assert next_step(stage1, stale, now) is None
    # When the pods were read, they decide: a confirmation does not override them.
    seen = {**confirmed, "runningFingerprints": [fingerprint_of(gen0)]}
    assert next_step(stage1, seen, now) is None
    stage2 = apply_step("switch", stage1, confirmed)
    assert next_step(
        stage2, {**confirmed, "confirmedFingerprint": fingerprint_of(stage2)}, now
    ) == ("settle")
    assert next_step(stage2, confirmed, now) is None  # stage 1's confirmation: stays


def test_the_stage_warning_without_the_pods_names_the_setting_the_hash_and_the_way_on() -> None:
    text = cert_resource.stage_message(
        "r.pmem-csi.example",
        cert_resource.TRUST,
        fingerprint="0123456789abcdef0123456789abcdef",
        observed=False,
        config_key="pmem-csi:deployments[2].certificates",
        namespace="pmem-csi",
    )
    assert "pmem-csi:preflight" in text
    assert "0123456789abcdef0123456789abcdef" in text
    assert "pmem-csi:deployments[2].certificates.rolledOut" in text
    assert CERTIFICATES_HASH_ANNOTATION in text and "-n pmem-csi" in text
    assert "expire" in text  # what waiting costs


def test_rolled_out_is_a_certificates_hash_or_a_config_error_naming_it() -> None:
    fp = "0123456789abcdef0123456789abcdef"
    stack = load_config({"deployments": [{"certificates": {"rolledOut": fp}}]})
    assert stack.deployments[0].certificates.rolled_out == fp
    with pytest.raises(ConfigError) as err:
        load_config({"deployments": [{"certificates": {"rolledOut": "yes"}}]})
    assert "deployments[0].certificates.rolledOut" in str(err.value)


# --- (2) a rotation started while the leaves are due renews them ----------------------------


def test_a_rotation_begun_while_the_leaves_are_due_renews_them_under_the_old_ca(
    gen0: dict[str, Any], tmp_path: Path
) -> None:
    news = {**DUE, "rotation": "r2"}
    now = dt.datetime.now(dt.UTC)
    assert next_step(gen0, news, now) == "begin"
    begun = apply_step("begin", gen0, news)
    assert begun["phase"] == cert_resource.TRUST
    old_ca = pem_certs(gen0["ca_cert"])[0]
    assert pem_certs(begun["ca_cert"])[0] == old_ca and len(pem_certs(begun["ca_cert"])) == 2
    for key in ("registry_cert", "node_controller_cert"):
        assert begun[key] != gen0[key]
        leaf = pem_certs(begun[key])[0]
        leaf.verify_directly_issued_by(old_ca)  # every pod of either stage trusts it
        assert leaf.not_valid_after_utc > pem_certs(gen0[key])[0].not_valid_after_utc
    # Pods of stage 0 and stage 1 accept each other.
    assert tlspeers.links(Generation.of(gen0), Generation.of(begun), tmp_path) == []
    # Leaves not due: stage 1 keeps them, as before.
    calm = apply_step("begin", gen0, {**SETTINGS, "rotation": "r2"})
    assert calm["registry_cert"] == gen0["registry_cert"]


# --- (3) the pods that hold a stage back are named ------------------------------------------


def _pod(name: str, fp: str | None, kind: str = "DaemonSet", deleting: str | None = None) -> dict:
    cfg = load_config({"deployments": [{}]}).deployments[0]
    owner = cfg.names.node_driver if kind == "DaemonSet" else cfg.names.controller_driver
    meta: dict[str, Any] = {"name": name, "ownerReferences": [{"kind": kind, "name": owner}]}
    if fp is not None:
        meta["annotations"] = {CERTIFICATES_HASH_ANNOTATION: fp}
    if deleting:
        meta["deletionTimestamp"] = deleting
    return {"metadata": meta}


def test_the_pods_holding_a_stage_back_are_named_bounded_with_what_to_do() -> None:
    cfg = load_config({"deployments": [{}]}).deployments[0]
    pods = [
        _pod("ctl-0", "new", kind="StatefulSet"),
        _pod("node-a", "new"),
        _pod("node-stuck", "old", deleting="2026-11-30T10:00:00Z"),
        _pod("node-nohash", None),
        *(_pod(f"node-old-{i}", "old") for i in range(10)),
    ]
    rollout = certrollout.rollout_of(pods, cfg, desired={"DaemonSet": 13, "StatefulSet": 1})
    lines = certrollout.holding_back(rollout, "new", cfg.namespace)
    text = "\n".join(lines)
    assert "node-stuck" in text and "Terminating since 2026-11-30T10:00:00Z" in text
    assert "--grace-period=0 --force" in text and f"-n {cfg.namespace}" in text
    assert "node-nohash" in text
    assert "ctl-0" not in text and "node-a" not in text
    assert len(lines) <= certrollout.HOLDING_BACK_LIMIT + 1
    assert "and 7 more" in lines[-1]  # 12 hold back, 5 named
    # The stage message carries them.
    msg = cert_resource.stage_message(
        cfg.name,
        cert_resource.TRUST,
        fingerprint="new",
        observed=True,
        config_key="pmem-csi:deployments[0].certificates",
        namespace=cfg.namespace,
        holding_back=lines,
    )
    assert "node-stuck" in msg


# --- (9) an empty pod list is not "every pod runs the new certificates" ---------------------


def test_an_empty_pod_list_counts_only_when_no_pod_is_wanted() -> None:
    cfg = load_config({"deployments": [{}]}).deployments[0]
    # Library use: a plain empty list says nothing about the workloads: unknown.
    assert certrollout.as_fingerprints([]) is None
    assert certrollout.as_fingerprints(None) is None
    assert certrollout.as_fingerprints(["b", "a"]) == ["b", "a"]
    # Read from the cluster: no pods and none wanted (no workloads yet): every pod is on it.
    none_wanted = certrollout.rollout_of([], cfg, desired={"DaemonSet": 0, "StatefulSet": 0})
    assert certrollout.as_fingerprints(none_wanted) == []
    # Pods wanted but none listed: a pod of unknown material, so no stage advances.
    wanted = certrollout.rollout_of([], cfg, desired={"DaemonSet": 3, "StatefulSet": 1})
    assert certrollout.as_fingerprints(wanted) == ["", ""]
    lines = certrollout.holding_back(wanted, "new", cfg.namespace)
    assert any(cfg.names.node_driver in line and "3" in line for line in lines)


# --- (8) the pod read pages and reads metadata only -----------------------------------------


class _Resp:
    def __init__(self, status: int, body: Any) -> None:
        self.status, self.reason, self._body = status, "OK", json.dumps(body).encode()

    def read(self) -> bytes:
        return self._body


class PagingApi:
    """Answers pod lists page by page (``limit``/``continue``) and the two workloads."""

    def __init__(self, pods: list[dict[str, Any]], desired: int) -> None:
        self.pods, self.desired = pods, desired
        self.calls: list[tuple[str, dict[str, str], dict[str, str]]] = []

    def param_serialize(self, *, method, resource_path, query_params, header_params, **_):
        return (method, resource_path, dict(query_params), dict(header_params))

    def call_api(self, method, path, query, headers, _request_timeout=None):
        self.calls.append((path, query, headers))
        if path.endswith("/pods"):
            limit = int(query.get("limit", len(self.pods) or 1))
            start = int(query.get("continue") or 0)
            page = self.pods[start : start + limit]
            rest = start + limit < len(self.pods)
            meta = {"continue": str(start + limit)} if rest else {}
            return _Resp(
                200, {"kind": "PartialObjectMetadataList", "items": page, "metadata": meta}
            )
        if "/daemonsets/" in path:
            return _Resp(200, {"status": {"desiredNumberScheduled": self.desired}})
        if "/statefulsets/" in path:
            return _Resp(200, {"spec": {"replicas": 1}})
        return _Resp(404, {})


def test_the_pod_read_pages_and_asks_for_metadata_only() -> None:
    stack = load_config({"deployments": [{}]})
    pods = [_pod(f"node-{i}", "fp") for i in range(1200)] + [_pod("ctl-0", "fp", "StatefulSet")]
    api = PagingApi(pods, desired=1200)
    (rollout,) = certrollout.running_fingerprints(api, stack).values()
    assert len(rollout.pods) == 1201
    pod_calls = [(q, h) for p, q, h in api.calls if p.endswith("/pods")]
    assert len(pod_calls) >= 3  # paged
    assert all(int(q["limit"]) <= certrollout.PAGE_SIZE for q, _ in pod_calls)
    assert all("PartialObjectMetadataList" in h["Accept"] for _, h in pod_calls)
    assert [q.get("continue") for q, _ in pod_calls][1:] == [
        str(certrollout.PAGE_SIZE * i) for i in range(1, len(pod_calls))
    ]


def test_only_deployments_with_a_ca_change_under_way_have_their_pods_read() -> None:
    stack = load_config({"deployments": [{"name": "a.example"}, {"name": "b.example"}]})
    a, b = (d.names.hyphened for d in stack.deployments)
    phases = {f"{a}-certificates-generated": "stable", f"{b}-certificates-generated": "trust"}
    api = PagingApi([], desired=0)
    got = certrollout.running_fingerprints(api, stack, phases=phases)
    assert set(got) == {1}
    assert all(stack.deployments[1].namespace in p for p, _, _ in api.calls)
    # Nothing under way anywhere: no read at all.
    api = PagingApi([], desired=0)
    assert (
        certrollout.running_fingerprints(
            api, stack, phases={f"{a}-certificates-generated": "stable"}
        )
        == {}
    )
    assert api.calls == []
    # A staged set the program cannot match to a deployment (a rename): read them all.
    api = PagingApi([], desired=0)
    got = certrollout.running_fingerprints(
        api, stack, phases={"old-certificates-generated": "switch"}
    )
    assert set(got) == {0, 1}


# --- (4) a renewal lead time as long as the validity is a config error ----------------------


@pytest.mark.parametrize(
    "certificates",
    [
        {"validityDays": 10, "renewBeforeDays": 10},
        {"validityDays": "10", "renewBeforeDays": "20"},  # quoted in YAML: pydantic reads ints
        {"validityDays": 10.0, "renewBeforeDays": 20},
        {"validityDays": 30, "renewBeforeDays": "30"},
        {"renewBeforeDays": 365},  # the default validity
    ],
)
def test_renew_before_days_not_below_validity_days_is_refused_naming_both(
    certificates: dict[str, Any],
) -> None:
    with pytest.raises(ConfigError) as err:
        load_config({"deployments": [{"certificates": certificates}]})
    (problem,) = err.value.problems
    assert problem.startswith("pmem-csi:deployments[0].certificates.renewBeforeDays: ")
    assert "validityDays" in problem


def test_the_state_read_gives_each_certificate_sets_stored_stage() -> None:
    from pmem_components import identity

    sig = "4dabf18193072939515e22adb298388d"
    urn = "urn:pulumi:s::p::pmem-csi:index:PmemCsiDeployment$pmem-csi:index:DriverCertificates"
    answer = {
        "outputs": {
            f"{urn}$pulumi-python:dynamic/pmem-csi:Certificates::a-certificates-generated": {
                "type": identity.CERTIFICATES_TYPE,
                "outputs": {
                    "phase": "trust",
                    "issuer_key": {sig: "1b47061264138c4ac30d75fd1eb44270", "value": "x"},
                },
            },
            f"{urn}$pulumi-python:dynamic/pmem-csi:Certificates::b-certificates-generated": {
                "type": identity.CERTIFICATES_TYPE,
                "outputs": {"phase": "stable"},
            },
        }
    }
    state = identity.state_from_outputs(answer)
    assert state.certificate_phases == {
        "a-certificates-generated": "trust",
        "b-certificates-generated": "stable",
    }
    assert dict(state.objects) == {}


# --- (5) an expired old CA left in a stage-2 bundle is not a failure ------------------------


def _stage2_with_expired_old_ca() -> dict[str, str]:
    from pmem_components import certs

    now = dt.datetime.now(dt.UTC)
    old = certs.generate_ca(now=now - dt.timedelta(days=40), validity=dt.timedelta(days=30))
    new = certs.generate_ca(now=now, validity=dt.timedelta(days=90))
    reg = certs.generate_leaf(new, certs.REGISTRY_NAME, validity=dt.timedelta(days=60))
    node = certs.generate_leaf(new, certs.NODE_CONTROLLER_NAME, validity=dt.timedelta(days=60))
    # Hand-made: a leaf of the expired CA that claims to outlive it (Go rejects its chain).
    stray = certs.generate_leaf(
        old,
        certs.REGISTRY_NAME,
        not_before=now - dt.timedelta(days=1),
        not_after=now + dt.timedelta(days=30),
    )
    return {
        "stray_cert": stray.cert_pem,
        "stray_key": stray.key_pem,
        "bundle": old.cert_pem + new.cert_pem,
        "old": old.cert_pem,
        "registry_cert": reg.cert_pem,
        "registry_key": reg.key_pem,
        "node_controller_cert": node.cert_pem,
        "node_controller_key": node.key_pem,
    }


def test_an_expired_old_ca_beside_a_valid_one_is_a_warning_and_the_reporter_verifies() -> None:
    from pmem_components import certs
    from reporter.certcheck import CertVerifier

    m = _stage2_with_expired_old_ca()
    args = (
        m["bundle"],
        m["registry_cert"],
        m["registry_key"],
        m["node_controller_cert"],
        m["node_controller_key"],
    )
    now = dt.datetime.now(dt.UTC)
    problems = CertVerifier()(*args, now=now, node_ca_cert=m["bundle"])
    assert [p for p in problems if p.severity == "error"] == []
    (stale,) = [p for p in problems if p.reason == "ExpiredInBundle"]
    assert stale.severity == "warning" and stale.field == "caCert"
    # Still an error: the only CA expired, or a leaf signed only by the expired CA.
    alone = certs.validate_driver_certificates(m["old"], *args[1:], handshake=False)
    assert "Expired" in {p.reason for p in alone if p.severity == "error"}
    stray = certs.validate_driver_certificates(
        m["bundle"], m["stray_cert"], m["stray_key"], *args[3:], node_ca_cert=m["bundle"]
    )
    assert "WrongCA" in {p.reason for p in stray if p.severity == "error"}


# --- (7) the enableSecretMutable refusal gives the advice that fits where the value comes from


def test_the_secret_mutable_refusal_advises_what_fits_where_the_value_comes_from() -> None:
    from pmem_components import secretmutable

    stack = load_config({"deployments": [{}]})
    key, env = secretmutable.KEY, secretmutable.ENV

    def one(setting: str | None, environ: dict[str, str]) -> str:
        (problem,) = secretmutable.problems(stack.deployments, setting, environ)
        assert problem.startswith(f"{key}: ")
        return problem

    unset = one(None, {})
    assert "is not set" in unset and f"pulumi config set {key} true" in unset
    assert "config rm" not in unset and env in unset  # the other way to set it
    from_env = one(None, {env: "false"})
    assert f"{env}" in from_env and "'false'" in from_env and f"unset {env}" in from_env
    assert "config rm" not in from_env
    in_config = one("false", {})
    assert f"pulumi config rm {key}" in in_config and f"pulumi config set {key} true" in in_config
    overridden = one("false", {env: "true"})
    assert f"{env}" in overridden and "does not count" in overridden


# --- (6) each side's own certificate need not chain to its own ca.crt -----------------------


def test_the_per_side_check_asks_only_what_the_driver_asks_of_hand_edited_secrets() -> None:
    """The driver checks a peer's certificate against its own ca.crt and nothing else: the
    registry's certificate must chain to the node Secret's ca.crt, the node controller's to
    the registry Secret's. Secrets edited by hand so that each side trusts the *other*
    side's CA only are a working driver."""
    from pmem_components import certs

    ca_a, ca_b = certs.generate_ca(), certs.generate_ca()
    reg = certs.generate_leaf(ca_a, certs.REGISTRY_NAME)
    node = certs.generate_leaf(ca_b, certs.NODE_CONTROLLER_NAME)
    args = (reg.cert_pem, reg.key_pem, node.cert_pem, node.key_pem)
    works = certs.validate_driver_certificates(ca_b.cert_pem, *args, node_ca_cert=ca_a.cert_pem)
    assert [p for p in works if p.severity == "error"] == []
    # The node side not trusting the registry's CA is still caught.
    errors = lambda found: {p.reason for p in found if p.severity == "error"}  # noqa: E731
    same = certs.validate_driver_certificates(ca_b.cert_pem, *args)
    assert "WrongCA" in errors(same)
    other = certs.generate_ca().cert_pem
    apart = certs.validate_driver_certificates(ca_b.cert_pem, *args, node_ca_cert=other)
    assert "CAMismatch" in errors(apart)


def test_the_stage_warning_is_given_for_every_kind_of_pod_knowledge(
    stage1: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``_report_stage`` as the component calls it: a read Rollout, one not read (no change
    was under way when the preflight ran), a plain list (library use), nothing known."""
    import pulumi

    cfg = load_config({"deployments": [{}]}).deployments[0]
    said: list[str] = []
    monkeypatch.setattr(pulumi.runtime, "is_dry_run", lambda: False)
    monkeypatch.setattr(pulumi.log, "warn", lambda msg, *a, **k: said.append(msg))
    values = [stage1[k] for k in ("phase", "ca_cert", "registry_cert", "node_controller_cert")]
    fp = fingerprint_of(stage1)
    stuck = certrollout.rollout_of([_pod("node-x", "old", deleting="2026-11-30T10:00:00Z")], cfg)
    for running in (stuck, certrollout.UNREAD, ["old", fp], [fp], None):
        cert_resource._report_stage("d", values, running, "k", cfg.namespace)
    assert len(said) == 5
    assert "node-x" in said[0] and "Terminating" in said[0]
    assert f"runs certificates {fp}" in said[1] and "not known" not in said[1]
    assert "1 pod(s) on other certificates" in said[2]
    assert "pulumi up` again" in said[3]
    assert "k.rolledOut" in said[4] and "not known" in said[4]


# --- review 15: a failed pod read holds the stage, whatever rolledOut says -------------------


class _DenyingApi(PagingApi):
    """Answers the workloads, refuses the pod list (403), as an RBAC gap or an expired page."""

    def call_api(self, method, path, query, headers, _request_timeout=None):
        if path.endswith("/pods"):
            self.calls.append((path, query, headers))
            resp = _Resp(403, {})
            resp.reason = "Forbidden"
            return resp
        return super().call_api(method, path, query, headers, _request_timeout)


def test_a_failed_pod_read_holds_the_stage_even_with_rolled_out_set(
    stage1: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    import pulumi

    from pmem_components import program

    said: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda msg, *a, **k: said.append(msg))
    monkeypatch.setattr(pulumi.runtime, "is_dry_run", lambda: False)
    fp = fingerprint_of(stage1)
    stack = load_config({"deployments": [{"certificates": {"rolledOut": fp}}]})
    cfg = stack.deployments[0]
    phases = {f"{cfg.names.hyphened}-certificates-generated": "trust"}
    got = program.certificate_rollout(stack, _DenyingApi([], desired=3), phases)
    assert got is not None  # not "the pods were deliberately not read"
    running = got[0]
    news = {
        **SETTINGS,
        "rotation": "r2",
        "runningFingerprints": certrollout.as_fingerprints(running),
        "confirmedFingerprint": cfg.certificates.rolled_out,
    }
    # The administrator's confirmation counts only when the pods were not read on purpose.
    assert next_step(stage1, news, dt.datetime.now(dt.UTC)) is None
    said.clear()
    values = [stage1[k] for k in ("phase", "ca_cert", "registry_cert", "node_controller_cert")]
    cert_resource._report_stage("d", values, running, "k", cfg.namespace)
    (text,) = said
    assert "403" in text and "could not be read" in text and "waits" in text
    assert "rolledOut" not in text  # setting it would not help


# --- review 15: the pair rule reads the values as the model holds them ----------------------


@pytest.mark.parametrize(
    "certificates",
    [
        {"validityDays": "10.0", "renewBeforeDays": 20},  # pydantic reads "10.0" as 10
        {"validityDays": 10, "renewBeforeDays": "1_0"},  # and "1_0" as 10
    ],
)
def test_the_renewal_pair_rule_sees_what_pydantic_parses(certificates: dict[str, Any]) -> None:
    with pytest.raises(ConfigError) as err:
        load_config({"deployments": [{"certificates": certificates}]})
    (problem,) = err.value.problems
    assert problem.startswith("pmem-csi:deployments[0].certificates.renewBeforeDays: ")
    assert "validityDays" in problem


# --- review 15: a workload without current status, and orphaned pods, hold the gate ---------


class _WorkloadApi(PagingApi):
    """Pods as given; the DaemonSet and StatefulSet objects as given (None: 404)."""

    def __init__(self, pods: list[dict[str, Any]], ds: Any, sts: Any) -> None:
        super().__init__(pods, desired=0)
        self.ds, self.sts = ds, sts

    def call_api(self, method, path, query, headers, _request_timeout=None):
        for kind, obj in (("/daemonsets/", self.ds), ("/statefulsets/", self.sts)):
            if kind in path:
                return _Resp(404, {}) if obj is None else _Resp(200, obj)
        return super().call_api(method, path, query, headers, _request_timeout)


_STS_OK = {
    "metadata": {"generation": 1},
    "spec": {"replicas": 1},
    "status": {"observedGeneration": 1},
}


@pytest.mark.parametrize(
    "ds",
    [
        {"metadata": {"generation": 1}},  # just (re)created: no status yet
        {
            "metadata": {"generation": 3},
            "status": {"observedGeneration": 2, "desiredNumberScheduled": 0},
        },
    ],
)
def test_a_workload_without_current_status_holds_the_stage(
    stage1: dict[str, Any], ds: dict[str, Any]
) -> None:
    cfg = load_config({"deployments": [{}]}).deployments[0]
    fp = fingerprint_of(stage1)
    api = _WorkloadApi([_pod("ctl-0", fp, "StatefulSet")], ds, _STS_OK)
    rollout = certrollout.read_rollout(api, cfg)
    fps = certrollout.as_fingerprints(rollout)
    news = {**SETTINGS, "rotation": "r2", "runningFingerprints": fps}
    assert next_step(stage1, news, dt.datetime.now(dt.UTC)) is None
    lines = certrollout.holding_back(rollout, fp, cfg.namespace)
    assert any(f"DaemonSet {cfg.names.node_driver}" in line for line in lines)


def test_orphaned_driver_pods_count_and_the_reporters_do_not(
    gen0: dict[str, Any], stage1: dict[str, Any]
) -> None:
    from pmem_components.manifests import labels as lbl

    cfg = load_config({"deployments": [{}]}).deployments[0]
    fp = fingerprint_of(stage1)

    def bare(name: str, component: str, fingerprint: str) -> dict[str, Any]:
        meta = {
            "name": name,
            "labels": {**cfg.names.selector_labels(), "app.kubernetes.io/component": component},
            "annotations": {CERTIFICATES_HASH_ANNOTATION: fingerprint},
        }
        return {"metadata": meta}

    # `kubectl delete ds --cascade=orphan`: the DaemonSet is gone, its stage-0 pods run on.
    orphans = [bare(f"node-{i}", lbl.COMPONENT_NODE, fingerprint_of(gen0)) for i in range(3)]
    api = _WorkloadApi([_pod("ctl-0", fp, "StatefulSet"), *orphans], None, _STS_OK)
    rollout = certrollout.read_rollout(api, cfg)
    assert {p.name for p in rollout.pods} == {"ctl-0", "node-0", "node-1", "node-2"}
    fps = certrollout.as_fingerprints(rollout)
    news = {**SETTINGS, "rotation": "r2", "runningFingerprints": fps}
    assert next_step(stage1, news, dt.datetime.now(dt.UTC)) is None
    # A reporter pod carries the selector labels too, but no certificates: not a driver pod.
    reporter = bare("reporter-0", "reporter", "")
    only = certrollout.rollout_of([_pod("ctl-0", fp, "StatefulSet"), reporter], cfg)
    assert [p.name for p in only.pods] == ["ctl-0"]


# --- review 15: the preflight-off warning's kubectl selects this deployment's pods ----------


def test_the_unread_stage_warning_lists_only_this_deployments_pods() -> None:
    cfg = load_config({"deployments": [{"name": "b.example"}]}).deployments[0]
    text = cert_resource.stage_message(
        "d",
        cert_resource.TRUST,
        fingerprint="0123456789abcdef0123456789abcdef",
        observed=False,
        config_key="k",
        namespace=cfg.namespace,
        selector=cfg.names.label_selector(),
    )
    assert (
        f"kubectl get pods -n {cfg.namespace} -l app.kubernetes.io/part-of=pmem-csi,"
        f"app.kubernetes.io/instance={cfg.names.hyphened} "
    ) in text


# --- review 15: the run that takes a stage says so, instead of listing every pod ------------


def test_the_run_that_takes_a_stage_says_the_pods_roll_now(
    stage1: dict[str, Any], gen0: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    import dataclasses

    import pulumi

    cfg = load_config({"deployments": [{}]}).deployments[0]
    said: list[str] = []
    monkeypatch.setattr(pulumi.runtime, "is_dry_run", lambda: False)
    monkeypatch.setattr(pulumi.log, "warn", lambda msg, *a, **k: said.append(msg))
    stage2 = apply_step("switch", stage1, {**SETTINGS, "rotation": "r2"})
    values = [stage2[k] for k in ("phase", "ca_cert", "registry_cert", "node_controller_cert")]
    # Read before the update, when the stored stage was 1 and every pod ran it.
    pods = [_pod(f"node-{i}", fingerprint_of(stage1)) for i in range(3)]
    read = dataclasses.replace(
        certrollout.rollout_of(pods, cfg, {"DaemonSet": 3}), phase=cert_resource.TRUST
    )
    cert_resource._report_stage("d", values, read, "k", cfg.namespace)
    (text,) = said
    assert "stage 2 taken; the pods roll now" in text
    assert "node-0" not in text and "held back" not in text
    # A later run that still finds them there, at the stage read, names them.
    said.clear()
    later = dataclasses.replace(read, phase=cert_resource.SWITCH)
    cert_resource._report_stage("d", values, later, "k", cfg.namespace)
    assert "node-0" in said[0] and "taken" not in said[0]
