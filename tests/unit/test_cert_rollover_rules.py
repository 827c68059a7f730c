"""Renewal and CA change without an outage: the material rules, the diff rules, and mutual TLS
between pods of different generations with the real keys and certificates.

Each generation is what the dynamic provider stores after one step (``CertificateProvider``
driven directly, as the engine does); a "pod" of a generation is the material its containers
load from the two Secrets (``ca.crt``, ``tls.crt``, ``tls.key``). The handshakes run with
Python's ``ssl`` over a socket pair, one thread per side, as two driver processes would: each
side verifies its peer with its own ``ca.crt`` and checks the peer's name.
"""

from __future__ import annotations

import datetime as dt
import itertools
from pathlib import Path
from typing import Any

import pytest
import tlspeers
import yaml
from certutil import FIRST_SETTINGS, pem_certs
from tlspeers import Generation

from pmem_components import cert_resource, certrollout, certs
from pmem_components.cert_resource import CertificateProvider, fingerprint_of, next_step
from pmem_components.config import load_config

PROJECT_DIR = Path(__file__).resolve().parents[2]
# Created with 10-day leaves (a 30-day CA); then a 20-day window makes the leaves due, not
# the CA: what an administrator gets by raising renewBeforeDays with validityDays.
SETTINGS = FIRST_SETTINGS
RENEW = {"rotation": "", "renewWithinDays": 20, "validityDays": 40}


def links(first: dict[str, Any], second: dict[str, Any], tmp: Path) -> list[str]:
    """Every link between pods of the two stored generations (tlspeers.links)."""
    return tlspeers.links(Generation.of(first), Generation.of(second), tmp)


def step(olds: dict[str, Any], news: dict[str, Any]) -> dict[str, Any]:
    """One ``pulumi up`` of the resource as the engine drives it: diff, then update if any."""
    provider = CertificateProvider()
    diff = provider.diff("id", olds, news)
    assert not diff.replaces, "the set must never be replaced (the Secrets would be)"
    if not diff.changes:
        return olds
    updated = provider.update("id", olds, news)
    assert updated.outs is not None
    return {**updated.outs}


@pytest.fixture(scope="module")
def generations(gen0: dict[str, Any]) -> list[dict[str, Any]]:
    """gen0, a CA change's three stages (each after every pod runs the previous one)."""
    news = {**SETTINGS, "rotation": "r2"}
    out = [gen0]
    for _ in range(3):
        out.append(step(out[-1], {**news, "runningFingerprints": [fingerprint_of(out[-1])]}))
    return out


# --- material and diff rules -------------------------------------------------------------


def test_a_created_set_keeps_its_ca_key_as_a_secret_output(gen0: dict[str, Any]) -> None:
    assert gen0["phase"] == cert_resource.STABLE
    assert gen0["issuer_cert"] == gen0["ca_cert"]
    assert gen0[cert_resource.ISSUER_KEY].startswith("-----BEGIN RSA PRIVATE KEY")
    ca = pem_certs(gen0["ca_cert"])[0]
    leaf = pem_certs(gen0["registry_cert"])[0]
    # The CA outlives the leaves, so they can be renewed under it.
    assert ca.not_valid_after_utc - leaf.not_valid_after_utc > dt.timedelta(days=19)
    problems = certs.validate_driver_certificates(
        gen0["ca_cert"],
        gen0["registry_cert"],
        gen0["registry_key"],
        gen0["node_controller_cert"],
        gen0["node_controller_key"],
    )
    assert {p.reason for p in problems} == {"ExpiringSoon"}  # short test lifetimes only


def test_leaf_renewal_is_an_update_under_the_same_ca(gen0: dict[str, Any], tmp_path: Path) -> None:
    assert not CertificateProvider().diff("id", gen0, dict(SETTINGS)).changes
    diff = CertificateProvider().diff("id", gen0, dict(RENEW))
    assert diff.changes is True and diff.replaces == []
    renewed = step(gen0, dict(RENEW))
    assert renewed["ca_cert"] == gen0["ca_cert"]  # the CA, so ca.crt, is unchanged
    assert renewed[cert_resource.ISSUER_KEY] == gen0[cert_resource.ISSUER_KEY]
    assert renewed["phase"] == cert_resource.STABLE
    for key in ("registry_cert", "registry_key", "node_controller_cert", "node_controller_key"):
        assert renewed[key] != gen0[key]
    ca = pem_certs(gen0["ca_cert"])[0]
    for key in ("registry_cert", "node_controller_cert"):
        leaf = pem_certs(renewed[key])[0]
        leaf.verify_directly_issued_by(ca)
        assert leaf.not_valid_after_utc == ca.not_valid_after_utc  # capped by the CA
    # Old and new pods trust each other: same CA.
    assert links(gen0, renewed, tmp_path) == []
    # The next up changes nothing.
    assert not CertificateProvider().diff("id", renewed, dict(RENEW)).changes


def test_a_ca_change_is_staged_and_never_a_replacement(
    generations: list[dict[str, Any]],
) -> None:
    g0, g1, g2, g3 = generations
    ca0 = pem_certs(g0["ca_cert"])
    assert len(ca0) == 1
    # Stage 1: trust bundle old+new, leaves unchanged.
    assert g1["phase"] == cert_resource.TRUST
    bundle = pem_certs(g1["ca_cert"])
    assert bundle[0] == ca0[0] and len(bundle) == 2
    new_ca = bundle[1]
    assert new_ca.subject != ca0[0].subject  # no two same-named issuers in one pool
    assert (g1["registry_cert"], g1["node_controller_cert"]) == (
        g0["registry_cert"],
        g0["node_controller_cert"],
    )
    assert pem_certs(g1["issuer_cert"]) == [new_ca]
    assert g1["rotation"] == "r2"
    # Stage 2: new leaves from the new CA, the bundle unchanged.
    assert g2["phase"] == cert_resource.SWITCH and g2["ca_cert"] == g1["ca_cert"]
    for key in ("registry_cert", "node_controller_cert"):
        pem_certs(g2[key])[0].verify_directly_issued_by(new_ca)
    # Stage 3: the old CA leaves the bundle.
    assert g3["phase"] == cert_resource.STABLE and pem_certs(g3["ca_cert"]) == [new_ca]
    assert g3["registry_cert"] == g2["registry_cert"]
    # Every stage's material passes the program's (and the reporter's) check.
    for g in generations:
        problems = certs.validate_driver_certificates(
            g["ca_cert"],
            g["registry_cert"],
            g["registry_key"],
            g["node_controller_cert"],
            g["node_controller_key"],
        )
        assert [p for p in problems if p.severity == "error"] == []


def test_a_stage_waits_until_every_pod_runs_the_previous_one(
    generations: list[dict[str, Any]],
) -> None:
    g0, g1, g2, _ = generations
    news = {**SETTINGS, "rotation": "r2"}
    now = dt.datetime.now(dt.UTC)
    for stage in (g1, g2):
        # Unknown rollout (preflight off), or one pod still on older material: no step.
        assert next_step(stage, {**news, "runningFingerprints": None}, now) is None
        older = [fingerprint_of(stage), fingerprint_of(g0)]
        assert next_step(stage, {**news, "runningFingerprints": older}, now) is None
        assert next_step(stage, {**news, "runningFingerprints": [""]}, now) is None
        diff = CertificateProvider().diff("id", stage, {**news, "runningFingerprints": older})
        assert diff.changes is False
    assert next_step(g1, {**news, "runningFingerprints": [fingerprint_of(g1)]}, now) == "switch"
    assert next_step(g2, {**news, "runningFingerprints": []}, now) == "settle"  # no pods


def test_the_rotation_input_and_a_ca_near_expiry_start_a_change(gen0: dict[str, Any]) -> None:
    now = dt.datetime.now(dt.UTC)
    assert next_step(gen0, dict(SETTINGS), now) is None
    assert next_step(gen0, {**SETTINGS, "rotation": "x"}, now) == "begin"
    assert next_step(gen0, dict(RENEW), now) == "renew"
    renewed = step(gen0, dict(RENEW))
    ca_end = pem_certs(gen0["ca_cert"])[0].not_valid_after_utc
    # The CA within the window: a CA change, not a leaf renewal.
    assert next_step(renewed, dict(RENEW), ca_end - dt.timedelta(days=15)) == "begin"
    # Everything expired: nothing left to keep working, a whole new set at once.
    assert next_step(renewed, dict(RENEW), ca_end + dt.timedelta(days=1)) == "recreate"


def test_a_stack_from_before_the_ca_key_was_kept_renews_through_a_ca_change(
    gen0: dict[str, Any], tmp_path: Path
) -> None:
    legacy = {
        k: gen0[k]
        for k in ("rotation", "renewWithinDays", "validityDays", *cert_resource.PUBLIC_OUTPUTS)
    }
    legacy.update(
        registry_key=gen0["registry_key"], node_controller_key=gen0["node_controller_key"]
    )
    assert next_step(legacy, dict(SETTINGS), dt.datetime.now(dt.UTC)) is None
    first = step(legacy, dict(RENEW))  # leaves due, no CA key: stage 1
    assert first["phase"] == cert_resource.TRUST
    assert first["registry_cert"] == legacy["registry_cert"]
    assert links(legacy, first, tmp_path) == []


# --- mutual TLS between generations ------------------------------------------------------------


def test_pods_of_adjacent_generations_accept_each_other(
    generations: list[dict[str, Any]], tmp_path: Path
) -> None:
    """Every pair that can meet during a rollout (or after an interrupted up): a stage and the
    one before it, in both roles and on both links."""
    for older, newer in itertools.pairwise(generations):
        assert links(older, newer, tmp_path) == [], (older["phase"], newer["phase"])
        assert links(newer, newer, tmp_path) == []


def test_pods_two_stages_apart_would_not_which_is_why_a_stage_waits(
    generations: list[dict[str, Any]], tmp_path: Path
) -> None:
    g0, g1, g2, g3 = generations
    assert links(g0, g2, tmp_path)  # g0 trusts only the old CA, g2 presents new leaves
    assert links(g1, g3, tmp_path)  # g3 trusts only the new CA, g1 presents old leaves


def test_the_secret_check_accepts_adjacent_generations_and_catches_a_real_mismatch(
    generations: list[dict[str, Any]],
) -> None:
    """The rule the reporter applies to the two Secrets (each side its own ca.crt)."""

    def check(reg: dict[str, Any], node: dict[str, Any]) -> list[str]:
        return [
            p.reason
            for p in certs.validate_driver_certificates(
                reg["ca_cert"],
                reg["registry_cert"],
                reg["registry_key"],
                node["node_controller_cert"],
                node["node_controller_key"],
                node_ca_cert=node["ca_cert"],
            )
            if p.severity == "error"
        ]

    for a, b in itertools.pairwise(generations):
        assert check(a, b) == [] and check(b, a) == []
    g0, _, g2, _ = generations
    assert check(g2, g0)  # registry presents a new-CA leaf, the node trusts only the old CA
    assert "CAMismatch" in check(g2, g0)
    # The registry trusts only the old CA, the node presents a new-CA leaf.
    assert "WrongCA" in check(g0, g2)


# --- the program's side ------------------------------------------------------------------------


def test_the_project_makes_secret_data_mutable_and_the_program_insists() -> None:
    from pmem_components import secretmutable

    project = yaml.safe_load((PROJECT_DIR / "Pulumi.yaml").read_text())
    assert project["config"]["kubernetes:enableSecretMutable"] == {"value": True}
    stack = load_config({"deployments": [{}]})
    assert secretmutable.problems(stack.deployments, "true", {}) == []
    assert (
        secretmutable.problems(stack.deployments, None, {secretmutable.ENV: "true"}) == []
    )
    for setting, env in ((None, {}), ("false", {secretmutable.ENV: "true"})):
        (problem,) = secretmutable.problems(stack.deployments, setting, env)
        assert problem.startswith("kubernetes:enableSecretMutable: ")


def test_pod_fingerprints_are_read_from_the_driver_pods_only() -> None:
    cfg = load_config({"deployments": [{}]}).deployments[0]
    ann = "pmem-csi.intel.com/certificates-hash"

    def pod(kind: str, name: str, fp: str | None) -> dict[str, Any]:
        meta: dict[str, Any] = {"ownerReferences": [{"kind": kind, "name": name}]}
        if fp is not None:
            meta["annotations"] = {ann: fp}
        return {"metadata": meta}

    pods = [
        pod("StatefulSet", cfg.names.controller_driver, "a"),
        pod("DaemonSet", cfg.names.node_driver, "b"),
        pod("DaemonSet", cfg.names.node_driver, None),  # from before fingerprints
        pod("ReplicaSet", cfg.names.reporter, "zzz"),  # not a driver pod
    ]
    assert certrollout.pod_fingerprints(pods, cfg) == ["a", "b", ""]
