"""pmem_components/config.py, how a config problem is worded: `parse_adopt`, key paths,
`string_fix`, `_describe`, `_pydantic_problems`, `_join_alternatives`.

Written to pin behaviours that `make mutate` found unpinned (docs/testing.md, "Scores").
"""

from __future__ import annotations

from typing import Any

import pytest

from pmem_components.config import (
    ConfigError,
    _quiet,
    _show,
    key_path,
    load_config,
    parse_adopt,
    string_fix,
    sub_path,
)

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


# --------------------------------------------------------------------------- key_path, sub_path


@pytest.mark.parametrize(
    ("loc", "expected"),
    [
        ((), "pmem-csi:"),
        (("manageCrd",), "pmem-csi:manageCrd"),
        (("deployments", 0, "nodeSelector"), "pmem-csi:deployments[0].nodeSelector"),
        (("a", "b", "c"), "pmem-csi:a.b.c"),
        ((0, "a"), "pmem-csi:[0].a"),
        (("_x", "Z9_-"), "pmem-csi:_x.Z9_-"),
        (("labels", "interrupt-gate"), "pmem-csi:labels.interrupt-gate"),
        (("labels", "a/b"), 'pmem-csi:labels["a/b"]'),
        (("labels", "app.kubernetes.io/name"), 'pmem-csi:labels["app.kubernetes.io/name"]'),
        (("labels", "9a"), 'pmem-csi:labels["9a"]'),
        (("labels", "-a"), 'pmem-csi:labels["-a"]'),
        (("labels", ""), 'pmem-csi:labels[""]'),
        (("a b",), 'pmem-csi:["a b"]'),
        (("deployments", 1, 2, "x"), "pmem-csi:deployments[1][2].x"),
    ],
)
def test_key_path_is_the_config_key_as_pulumi_config_set_path_takes_it(
    loc: tuple[str | int, ...], expected: str
) -> None:
    """The namespace, then plain names joined by dots (no dot before the first), ``[i]`` for
    list items, ``["..."]`` for a key the path syntax would misread; upper and lower case
    letters, digits (not first), ``_`` and ``-`` are plain."""
    assert key_path(loc) == expected


def test_sub_path_continues_a_path_so_a_first_name_gets_its_dot() -> None:
    """Appended to a key that is already written out (patchtypes' labels), a name is
    ``.name``; ``first`` drops that dot for a path that starts here."""
    assert sub_path(("spec", 0, "x.y")) == '.spec[0]["x.y"]'
    assert sub_path((0, "nodeSelector", "interrupt-gate")) == "[0].nodeSelector.interrupt-gate"
    assert sub_path(("spec", "template"), first=True) == "spec.template"
    assert sub_path(()) == ""


# --------------------------------------------------------------------------- _show


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("x", '"x"'),
        ("", '""'),
        ("None", '"None"'),
        (None, "null"),
        (True, "true"),
        (False, "false"),
        (0, "0"),
        (-1.5, "-1.5"),
        ([1, "a"], "[1, 'a']"),
        ({}, "{}"),
    ],
)
def test_a_value_is_shown_as_yaml_writes_it(value: Any, shown: str) -> None:
    """Strings quoted, null and booleans as YAML spells them (not None/True), the rest as
    Python shows it."""
    assert _show(value) == shown


def test_a_long_value_is_cut_to_sixty_characters_ending_in_dots() -> None:
    sixty = ["a" * 56]  # ['aaa...'] is 60 characters: shown whole
    assert len(repr(sixty)) == 60
    assert _show(sixty) == repr(sixty)
    longer = ["a" * 57]  # 61 characters: cut to 57 and "..."
    assert _show(longer) == "['" + "a" * 55 + "..."
    assert len(_show(longer)) == 60


# --------------------------------------------------------------------------- string_fix

FIX_KEY = "pmem-csi:deployments[0].labels.a"


@pytest.mark.parametrize(
    ("value", "text"), [(1, "1"), (-5, "-5"), (1.5, "1.5"), (True, "true"), (False, "false")]
)
def test_string_fix_says_how_to_quote_the_value_in_the_file_or_the_command(
    value: Any, text: str
) -> None:
    """The value as YAML wrote it, quoted; the command names the key and passes the value
    after ``--`` so that a negative number is not read as an option."""
    assert string_fix(FIX_KEY, value) == (
        f'quote it ("{text}") in Pulumi.<stack>.yaml, or set it with '
        f"pulumi config set --type string --path '{FIX_KEY}' -- {text}"
    )


def test_string_fix_without_the_exact_key_gives_no_command() -> None:
    """``exact=False``: the key is not the value's own (a value inside a patch), so no
    command could name it."""
    assert string_fix(FIX_KEY, 7, exact=False) == 'quote it ("7") in Pulumi.<stack>.yaml'


def test_string_fix_never_shows_a_secret_value() -> None:
    assert string_fix(FIX_KEY, 12345, secret=True) == (
        "quote it in Pulumi.<stack>.yaml, or set it with "
        f"pulumi config set --type string --path '{FIX_KEY}' -- <value>"
    )
    assert string_fix(FIX_KEY, 12345, exact=False, secret=True) == (
        "quote it in Pulumi.<stack>.yaml"
    )


# --------------------------------------------------------------------------- _quiet


@pytest.mark.parametrize(
    ("loc", "quiet"),
    [
        (("certificates", "registryKey"), True),
        (("certificates", "nodeControllerKey"), True),
        (("certificates", "caCert"), True),
        (("certificates", "registryCert"), True),
        (("certificates", "nodeControllerCert"), True),
        (("caCert", "x"), True),
        (("certificates", "rotation"), False),
        (("labels", 0), False),
        ((), False),
    ],
)
def test_a_key_is_quiet_when_any_part_is_a_secret_or_a_certificate(
    loc: tuple[str | int, ...], quiet: bool
) -> None:
    """Quiet keys never have their value shown: keys are secret, certificates too long."""
    assert _quiet(loc) is quiet
