"""Bad stack config, property-based: one invalid value -> one error naming its key, nothing made.

The property, over the whole config schema (see ``bad_input`` for how values and places are
derived from ``StackConfig``'s JSON schema): start from a valid config that sets every field,
put one invalid value anywhere, and

* ``load_config`` reports exactly one problem, and that problem names the key where the value
  was put (``pmem-csi:deployments[0].reporter.replicas: ...``);
* the Pulumi program (``program.main`` under recording mocks) fails with that message and
  registers no resource at all -- validation happens before the first registration.

Certificates and patches, whose mistakes are about content rather than type, are in
``test_bad_input_certs_patches``. The end-to-end counterpart with the real engine is
``tests/e2e/test_bad_input_and_leaks.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from bad_input import (
    BASE,
    SEMANTIC,
    SLOTS,
    Slot,
    assert_one_error_naming,
    canonical_wrong_value,
    certificates_verified_once,
    put,
    run_program,
    wrong_values,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pmem_components.config import key_path, load_config

# Derandomized: CI runs the same examples every time, and nothing is written to disk.
FAST = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
    database=None,
)


@pytest.fixture(autouse=True, scope="module")
def _same_certificates_verified_once() -> Iterator[None]:
    with certificates_verified_once():
        yield


def test_the_base_config_is_valid_and_registers_resources() -> None:
    """The property starts from a config the program accepts (else it proves nothing)."""
    stack = load_config(BASE)
    assert [d.name for d in stack.deployments] == ["first.example.com", "second.example.com"]
    message, registered = run_program(BASE)
    assert message == ""
    assert len(registered) > 20


def test_slots_cover_every_setting_of_the_schema() -> None:
    """Every field of every config model is a slot, so new fields are covered automatically."""
    from bad_input import DEFS, SCHEMA

    covered = {p for s in SLOTS for p in s.path if isinstance(p, str)}
    for model in (SCHEMA, *DEFS.values()):
        props = model.get("properties", {})
        optional_unset = {k for k, v in props.items() if "default" in v and v["default"] is None}
        missing = set(props) - covered - optional_unset
        assert not missing, f"{model['title']}: settings without a slot: {missing}"
    assert any(s.path == ("manageCrd",) for s in SLOTS)
    assert any(s.path[:2] == ("deployments", 1) for s in SLOTS)


@pytest.mark.parametrize("slot", SLOTS, ids=str)
def test_every_key_rejects_a_wrong_type_by_name(slot: Slot) -> None:
    """Exhaustive pass: one wrong-typed value in each slot."""
    assert_one_error_naming(put(BASE, slot.path, canonical_wrong_value(slot.schema)), slot.key)


@st.composite
def slot_and_wrong_value(draw: st.DrawFn) -> tuple[Slot, Any]:
    slot = draw(st.sampled_from(SLOTS))
    return slot, draw(wrong_values(slot.schema))


@FAST
@given(slot_and_wrong_value())
def test_any_wrong_value_anywhere_gives_one_error_naming_its_key(case: tuple[Slot, Any]) -> None:
    slot, value = case
    assert_one_error_naming(put(BASE, slot.path, value), slot.key)


@st.composite
def semantic_mistake(draw: st.DrawFn) -> tuple[tuple[str | int, ...], Any]:
    index = draw(st.sampled_from([0, 1]))
    field = draw(st.sampled_from(sorted(SEMANTIC)))
    return ("deployments", index, field), draw(SEMANTIC[field])


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(semantic_mistake())
def test_values_of_the_right_type_breaking_a_rule_name_their_key(
    case: tuple[tuple[str | int, ...], Any],
) -> None:
    path, value = case
    assert_one_error_naming(put(BASE, path, value), key_path(path))


@pytest.mark.parametrize(
    "second_name",
    ["first.example.com", "first-example-com", "first.example-com"],
)
def test_a_name_clashing_with_another_deployment_is_named(second_name: str) -> None:
    raw = put(BASE, ("deployments", 1, "name"), second_name)
    line = assert_one_error_naming(raw, "pmem-csi:deployments[1].name")
    assert "pmem-csi:deployments[0].name" in line


def test_cross_field_rule_names_the_field_to_remove() -> None:
    raw = put(BASE, ("deployments", 0, "deviceMode"), "direct")  # the base sets pmemPercentage
    line = assert_one_error_naming(raw, "pmem-csi:deployments[0].pmemPercentage")
    assert "only valid with deviceMode lvm" in line
