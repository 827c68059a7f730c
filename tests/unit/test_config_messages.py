"""pmem_components/config.py, how a config problem is worded: `parse_adopt`, key paths,
`string_fix`, `_describe`, `_pydantic_problems`, `_join_alternatives`.

Written to pin behaviours that `make mutate` found unpinned (docs/testing.md, "Scores").
"""

from __future__ import annotations

from typing import Any

import pytest

from pmem_components.config import ConfigError, load_config, parse_adopt

KEY = "pmem-csi:adopt"
ADOPT_SHAPE = (
    'must be true or a list of objects such as "Namespace pmem-csi" or '
    '"Deployment pmem-csi.intel.com"'
)
ENTRY_SHAPE = (
    'must be "<Kind> <name>" with Kind one of Namespace, Deployment, '
    "as the preflight names the object"
)


def config_problems(raw: dict[str, Any]) -> list[str]:
    """The problems `load_config` raises for ``raw`` (it must raise)."""
    with pytest.raises(ConfigError) as info:
        load_config(raw)
    return info.value.problems


# --------------------------------------------------------------------------- parse_adopt


def test_an_unset_adopt_consents_to_nothing() -> None:
    """`pmem-csi:adopt` absent (None) is the default: no object is adopted, no problem."""
    assert parse_adopt(None, KEY) == (False, [])


@pytest.mark.parametrize("value", [True, False])
def test_a_boolean_adopt_is_taken_as_it_is(value: bool) -> None:
    assert parse_adopt(value, KEY) == (value, [])


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("true", True),
        ("True", True),
        ("TRUE", True),
        ("false", False),
        ("False", False),
        ("FALSE", False),
    ],
)
def test_the_strings_true_and_false_in_any_case_are_the_booleans(raw: str, expected: bool) -> None:
    """`pulumi config set pmem-csi:adopt true` stores the string "true" (no --type bool);
    it means the boolean, whatever its case, and is no problem."""
    assert parse_adopt(raw, KEY) == (expected, [])


def test_the_string_true_through_load_config_adopts_everything() -> None:
    assert load_config({"adopt": "true"}).adopt is True
    assert load_config({"adopt": "False"}).adopt is False


@pytest.mark.parametrize(
    ("raw", "shown"),
    [("yes", '"yes"'), ("", '""'), (3, "3"), ({"Namespace": "x"}, "{'Namespace': 'x'}")],
)
def test_anything_but_a_boolean_or_a_list_is_one_problem_naming_the_key_and_value(
    raw: Any, shown: str
) -> None:
    """Not true/false and not a list: nothing is adopted and the problem names the key it
    was given (not a fixed one) and shows the value."""
    assert parse_adopt(raw, "k:adopt") == (False, [f"k:adopt: {ADOPT_SHAPE} (got {shown})"])


def test_an_adopt_value_of_the_wrong_type_is_reported_by_load_config() -> None:
    assert config_problems({"adopt": "yes"}) == [f'{KEY}: {ADOPT_SHAPE} (got "yes")']


def test_an_empty_list_adopts_nothing() -> None:
    assert parse_adopt([], KEY) == ((), [])


def test_valid_refs_are_kept_in_order_as_kind_space_name() -> None:
    """A Namespace takes a DNS label, a Deployment (the driver name) a DNS subdomain."""
    raw = ["Deployment pmem-csi.intel.com", "Namespace pmem-csi", "Deployment a.b"]
    assert parse_adopt(raw, KEY) == (
        ("Deployment pmem-csi.intel.com", "Namespace pmem-csi", "Deployment a.b"),
        [],
    )


@pytest.mark.parametrize(
    ("item", "shown"),
    [
        ("Pod x", '"Pod x"'),  # a name, but not a kind that carries the stack annotation
        ("Namespace", '"Namespace"'),  # a kind without a name
        ("Namespace ", '"Namespace "'),  # the name empty after the space
        ("namespace pmem-csi", '"namespace pmem-csi"'),  # kinds are case-sensitive
        (5, "5"),  # not a string at all
        (None, "null"),
    ],
)
def test_an_entry_that_is_not_kind_and_name_is_a_problem_naming_its_index(
    item: Any, shown: str
) -> None:
    """Each bad entry is a problem of its own, under ``key[i]``; the good ones are kept."""
    refs, problems = parse_adopt(["Namespace ok", item], KEY)
    assert refs == ("Namespace ok",)
    assert problems == [f"{KEY}[1]: {ENTRY_SHAPE} (got {shown})"]


@pytest.mark.parametrize(
    ("item", "name", "kind"),
    [
        ("Namespace a.b", "a.b", "Namespace"),  # a subdomain is no DNS label
        ("Namespace A", "A", "Namespace"),
        ("Deployment A.b", "A.b", "Deployment"),
        ("Deployment -a", "-a", "Deployment"),
        # The name is everything after the first space, so a second space makes it invalid
        # rather than shifting the split.
        ("Namespace a b", "a b", "Namespace"),
        ("Namespace  a", " a", "Namespace"),
    ],
)
def test_a_name_that_is_not_valid_for_its_kind_is_a_problem(
    item: str, name: str, kind: str
) -> None:
    assert parse_adopt([item], KEY) == ((), [f"{KEY}[0]: {name!r} is not a valid {kind} name"])


def test_every_bad_entry_is_reported_at_once_through_load_config() -> None:
    raw = {"adopt": ["Namespace pmem-csi", "Pod x", "Namespace a.b", 7]}
    assert config_problems(raw) == [
        f'{KEY}[1]: {ENTRY_SHAPE} (got "Pod x")',
        f"{KEY}[2]: 'a.b' is not a valid Namespace name",
        f"{KEY}[3]: {ENTRY_SHAPE} (got 7)",
    ]
