"""Bad certificates and bad patches: one error naming the key, no resource registered.

Each case puts one broken certificate or patch into the valid base config of ``bad_input``
and runs both the config validation and the Pulumi program under recording mocks
(``assert_one_error_naming``). Certificates are minted in memory (``certutil``); malformed
PEM and broken JSON Patch operations are generated with hypothesis.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest
from bad_input import (
    BASE,
    CERTIFICATES,
    _accepted,
    assert_one_error_naming,
    certificates_verified_once,
    put,
    run_program,
)
from certutil import DAY, NOW, key, make_ca, make_leaf, pem_key
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, rsa
from hypothesis import given, settings
from hypothesis import strategies as st

from pmem_components.certs import NODE_CONTROLLER_NAME, REGISTRY_NAME
from pmem_components.names import SPEC_DIGEST_ANNOTATION

CERT_KEY = "pmem-csi:deployments[0].certificates"
PATCH_KEY = "pmem-csi:deployments[0].patches[0]"
SETTINGS = settings(max_examples=40, deadline=None, derandomize=True, database=None)


def with_certificates(**fields: str) -> dict[str, Any]:
    return put(BASE, ("deployments", 0, "certificates"), {**CERTIFICATES, **fields})


def with_patch(patch: Any) -> dict[str, Any]:
    return put(BASE, ("deployments", 0, "patches"), [patch])


def _pkcs8(private_key: Any) -> str:
    return private_key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


@pytest.fixture(autouse=True, scope="module")
def _same_certificates_verified_once() -> Iterator[None]:
    with certificates_verified_once():
        yield


# --------------------------------------------------------------------------- certificates


@st.composite
def malformed_pem(draw: st.DrawFn) -> tuple[str, str]:
    """(field, value): one of the five PEM settings, broken so that it no longer parses."""
    field = draw(st.sampled_from(sorted(CERTIFICATES)))
    lines = CERTIFICATES[field].strip().splitlines()
    head, body, tail = lines[0], lines[1:-1], lines[-1]
    how = draw(st.sampled_from(["truncate", "garble", "no-end", "foreign-text"]))
    if how == "truncate":  # the base64 body cut short: DER that ends too early
        cut = draw(st.integers(min_value=0, max_value=len(body) - 2))
        body = body[:cut]
    elif how == "garble":  # characters that are not base64 inside the body
        at = draw(st.integers(min_value=0, max_value=len(body) - 1))
        junk = draw(st.text(alphabet="!*%$#?", min_size=1, max_size=8))
        body = [*body[:at], junk + body[at][len(junk) :], *body[at + 1 :]]
    elif how == "no-end":
        tail = ""
    else:
        body = [draw(st.text(alphabet="abcdefghij klmnop", min_size=1, max_size=40))]
    return field, "\n".join([head, *body, tail]) + "\n"


@SETTINGS
@given(malformed_pem())
def test_malformed_pem_in_any_certificate_setting_is_named(case: tuple[str, str]) -> None:
    field, value = case
    line = assert_one_error_naming(with_certificates(**{field: value}), f"{CERT_KEY}.{field}")
    assert "PEM" in line, line


@pytest.mark.parametrize(
    ("wrong_key", "reason"),
    [
        (lambda: _pkcs8(dsa.generate_private_key(2048)), "is not usable by the driver"),
        (lambda: _pkcs8(ec.generate_private_key(ec.SECP256R1())), "does not belong"),
        (lambda: pem_key(key(7)), "does not belong"),  # an RSA key of another certificate
    ],
    ids=["dsa", "ec-for-an-rsa-certificate", "another-rsa-key"],
)
def test_wrong_key_type_is_named(wrong_key: Any, reason: str) -> None:
    line = assert_one_error_naming(
        with_certificates(registryKey=wrong_key()), f"{CERT_KEY}.registryKey"
    )
    assert reason in line, line


def test_rsa_key_too_small_is_named() -> None:
    small = rsa.generate_private_key(public_exponent=65537, key_size=1024)
    ca = make_ca()  # certutil caches keys: the base's CA key and subject, so it chains
    leaf = make_leaf(ca, NODE_CONTROLLER_NAME, slot=2, leaf_key=small)
    line = assert_one_error_naming(
        with_certificates(nodeControllerCert=leaf.cert_pem, nodeControllerKey=pem_key(small)),
        f"{CERT_KEY}.nodeControllerKey",
    )
    assert "1024" in line and "2048" in line, line


def test_certificate_for_the_wrong_name_is_named() -> None:
    ca = make_ca()
    leaf = make_leaf(ca, "pmem-somebody-else", slot=1)
    line = assert_one_error_naming(
        with_certificates(registryCert=leaf.cert_pem, registryKey=pem_key(leaf.key)),
        f"{CERT_KEY}.registryCert",
    )
    assert REGISTRY_NAME in line, line


@pytest.mark.parametrize(
    ("not_before", "not_after", "words"),
    [
        (NOW - 400 * DAY, NOW - DAY, "expired"),
        (NOW + 2 * DAY, NOW + 400 * DAY, "not valid before"),
    ],
    ids=["expired-ca", "not-yet-valid-ca"],
)
def test_ca_outside_its_validity_is_named(
    not_before: dt.datetime, not_after: dt.datetime, words: str
) -> None:
    ca = make_ca(slot=5, cn="dated-ca", not_before=not_before, not_after=not_after)
    reg = make_leaf(ca, REGISTRY_NAME, slot=1)
    node = make_leaf(ca, NODE_CONTROLLER_NAME, slot=2)
    line = assert_one_error_naming(
        with_certificates(
            caCert=ca.cert_pem,
            registryCert=reg.cert_pem,
            nodeControllerCert=node.cert_pem,
        ),
        f"{CERT_KEY}.caCert",
    )
    assert words in line, line


def test_certificate_chaining_to_another_ca_is_named() -> None:
    other = make_ca(slot=6, cn="other-ca")
    leaf = make_leaf(other, NODE_CONTROLLER_NAME, slot=2)
    line = assert_one_error_naming(
        with_certificates(nodeControllerCert=leaf.cert_pem), f"{CERT_KEY}.nodeControllerCert"
    )
    assert "not signed by" in line, line


# --------------------------------------------------------------------------- patches

# What the base deployment (first.example.com in namespace first) builds.
DS, STS = "first-example-com-node", "first-example-com-controller"


@st.composite
def selects_nothing(draw: st.DrawFn) -> dict[str, Any]:
    patch: dict[str, Any] = {"mergePatch": {"metadata": {"annotations": {"a": "b"}}}}
    how = draw(st.sampled_from(["kind", "name", "namespace"]))
    word = draw(st.text(alphabet="abcdefghijklmnopqrstuvwxyz", min_size=3, max_size=10))
    if how == "kind":
        patch["kind"] = word.capitalize() + "Set"
    elif how == "name":
        patch.update(kind="DaemonSet", name=f"{word}-node")
    else:
        patch.update(kind="DaemonSet", name=DS, namespace=f"{word}-ns")
    return patch


@SETTINGS
@given(selects_nothing())
def test_a_patch_that_selects_nothing_is_named(patch: dict[str, Any]) -> None:
    line = assert_one_error_naming(with_patch(patch), PATCH_KEY)
    assert "selects no object" in line, line


@pytest.mark.parametrize(
    "patch",
    [
        {"kind": "DaemonSet", "mergePatch": {"spec": {"selector": {"matchLabels": {"x": "y"}}}}},
        {
            "kind": "StatefulSet",
            "jsonPatch": [
                {"op": "add", "path": "/spec/selector/matchLabels/tier", "value": "x"},
                {"op": "add", "path": "/spec/template/metadata/labels/tier", "value": "x"},
            ],
        },
        {"kind": "DaemonSet", "jsonPatch": [{"op": "remove", "path": "/spec/selector"}]},
        {"kind": "Service", "name": STS, "mergePatch": {"metadata": {"name": "renamed"}}},
        {"kind": "Secret", "mergePatch": {"metadata": {"namespace": "elsewhere"}}},
        {"kind": "DaemonSet", "mergePatch": {"apiVersion": "apps/v1beta2"}},
        {"kind": "CSIDriver", "mergePatch": {"kind": "Other"}},
    ],
    ids=[
        "daemonset-selector",
        "statefulset-selector",
        "selector-removed",
        "name",
        "namespace",
        "apiVersion",
        "kind",
    ],
)
def test_a_patch_changing_an_immutable_or_identifying_field_is_named(
    patch: dict[str, Any],
) -> None:
    line = assert_one_error_naming(with_patch(patch), PATCH_KEY)
    assert "cannot be patched" in line, line


def test_a_patch_breaking_the_template_labels_the_selector_needs_is_named() -> None:
    patch = {
        "kind": "DaemonSet",
        "jsonPatch": [{"op": "remove", "path": "/spec/template/metadata/labels"}],
    }
    line = assert_one_error_naming(with_patch(patch), PATCH_KEY)
    assert "selector" in line, line


VALID_OP = {"op": "add", "path": "/metadata/annotations/example.com~1x", "value": "1"}


@st.composite
def broken_json_patch(draw: st.DrawFn) -> Any:
    """A jsonPatch list with exactly one thing wrong."""
    how = draw(
        st.sampled_from(
            [
                "op",
                "path-not-pointer",
                "path-not-string",
                "no-value",
                "no-from",
                "missing-parent",
                "missing-target",
                "failed-test",
                "not-an-object",
                "not-a-list",
            ]
        )
    )
    op: Any = dict(VALID_OP)
    word = draw(st.text(alphabet="abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=8))
    if how == "op":
        op["op"] = draw(
            st.one_of(st.sampled_from(["ADD", "delete", "merge", ""]), st.integers(), st.just(word))
        )
        if op["op"] in ("add", "remove", "replace", "move", "copy", "test"):
            op["op"] = "upsert"
    elif how == "path-not-pointer":
        op["path"] = draw(st.sampled_from(["metadata/annotations", "", "~", word]))
    elif how == "path-not-string":
        op["path"] = draw(st.one_of(st.integers(), st.lists(st.just("spec"), min_size=1)))
    elif how == "no-value":
        op = {"op": draw(st.sampled_from(["add", "replace", "test"])), "path": "/metadata/name"}
    elif how == "no-from":
        op = {"op": draw(st.sampled_from(["move", "copy"])), "path": "/metadata/labels/x"}
    elif how == "missing-parent":
        op["path"] = f"/spec/{word}zz/{word}"
    elif how == "missing-target":
        op = {"op": draw(st.sampled_from(["remove", "replace"])), "path": f"/spec/{word}zz"}
        if op["op"] == "replace":
            op["value"] = 1
    elif how == "failed-test":
        op = {"op": "test", "path": "/kind", "value": "Not" + word}
    elif how == "not-an-object":
        op = draw(st.one_of(st.integers(), st.just(word), st.lists(st.integers(), max_size=2)))
    elif how == "not-a-list":
        return draw(st.one_of(st.just(word), st.integers(), st.just({"op": "add"})))
    return [op]


@settings(max_examples=80, deadline=None, derandomize=True, database=None)
@given(broken_json_patch())
def test_an_invalid_json_patch_is_named(ops: Any) -> None:
    assert_one_error_naming(with_patch({"kind": "DaemonSet", "jsonPatch": ops}), PATCH_KEY)


def test_a_patch_for_the_wrong_api_version_is_named() -> None:
    """``apiVersion: apps/v1beta2`` with ``kind: DaemonSet``: no object has that apiVersion.

    ``apiVersion`` is a selector of a patch, so the entry selects nothing: one error naming
    ``patches[0]``, and nothing registered.
    """
    patch = {"kind": "DaemonSet", "apiVersion": "apps/v1beta2", "mergePatch": {"spec": {}}}
    line = assert_one_error_naming(with_patch(patch), PATCH_KEY)
    assert "selects no object (kind='DaemonSet', apiVersion='apps/v1beta2')" in line, line


def test_patches_that_keep_identity_and_selectors_are_accepted() -> None:
    """The identity/selector check is not over-broad: ordinary patches still deploy."""
    patches = [
        {
            "kind": "DaemonSet",
            "mergePatch": {"spec": {"template": {"metadata": {"labels": {"tier": "x"}}}}},
        },
        {"kind": "Service", "mergePatch": {"spec": {"selector": {"extra": "label"}}}},
        {
            "kind": "StatefulSet",
            "jsonPatch": [{"op": "replace", "path": "/spec/replicas", "value": 1}],
        },
    ]
    raw = put(BASE, ("deployments", 0, "patches"), patches)
    message, registered = run_program(raw)
    assert message == ""
    assert len(registered) > 20


DIGEST_PATH = "/metadata/annotations/" + SPEC_DIGEST_ANNOTATION.replace("/", "~1")


@pytest.mark.parametrize(
    "patch",
    [
        {"kind": "DaemonSet", "jsonPatch": [{"op": "remove", "path": DIGEST_PATH}]},
        {
            "kind": "StatefulSet",
            "jsonPatch": [{"op": "replace", "path": DIGEST_PATH, "value": "x"}],
        },
        {"kind": "DaemonSet", "mergePatch": {"metadata": {"annotations": None}}},
        {
            "kind": "StatefulSet",
            "mergePatch": {"metadata": {"annotations": {SPEC_DIGEST_ANNOTATION: None}}},
        },
    ],
    ids=["json-remove", "json-replace", "merge-all-annotations", "merge-null"],
)
def test_a_patch_removing_or_changing_the_spec_digest_annotation_is_named(
    patch: dict[str, Any],
) -> None:
    """Review of issue 16: the reporter tells which CR spec a workload has rolled out by this
    annotation; a patch removing it made the rule skip the check (Running too early), one
    changing it kept the CR Progressing forever, both silently."""
    line = assert_one_error_naming(with_patch(patch), PATCH_KEY)
    assert SPEC_DIGEST_ANNOTATION in line and "cannot be patched" in line, line


def test_a_patch_of_other_annotations_of_a_workload_is_accepted() -> None:
    patch = {
        "kind": "DaemonSet",
        "mergePatch": {"metadata": {"annotations": {"example.com/x": "1"}}},
    }
    assert _accepted(with_patch(patch))
