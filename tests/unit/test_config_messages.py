"""pmem_components/config.py, how a config problem is worded: `parse_adopt`, key paths,
`string_fix`, `_describe`, `_pydantic_problems`, `_join_alternatives`.

Written to pin behaviours that `make mutate` found unpinned (docs/testing.md, "Scores").
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from pmem_components.config import (
    ConfigError,
    DeploymentConfig,
    _describe,
    _join_alternatives,
    _pydantic_problems,
    _quiet,
    _real_loc,
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
    """A YAML boolean: true consents to every object, false to none."""
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


def test_the_string_forms_through_load_config_are_the_booleans() -> None:
    """`load_config` passes the string form on: the stack's ``adopt`` is the boolean."""
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
    """`load_config` names the key as ``pmem-csi:adopt``, the path `pulumi config set` takes."""
    assert config_problems({"adopt": "yes"}) == [f'{KEY}: {ADOPT_SHAPE} (got "yes")']


def test_an_empty_list_adopts_nothing() -> None:
    """An empty list is a valid consent to no object, not a problem."""
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
    """A right kind with a name no such object can have would never match a preflight ref."""
    assert parse_adopt([item], KEY) == ((), [f"{KEY}[0]: {name!r} is not a valid {kind} name"])


def test_every_bad_entry_is_reported_at_once_through_load_config() -> None:
    """Validation never stops at the first mistake: each entry is checked, in order."""
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
    """A message line stays readable: 60 characters at most, the cut marked."""
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
    """``secret``: a private key's value is neither quoted nor put into the command."""
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


# --------------------------------------------------------------------------- _describe


def err(kind: str, **fields: Any) -> dict[str, Any]:
    """One pydantic error as ``ValidationError.errors()`` gives it, at a plain key."""
    return {"type": kind, "loc": ("logLevel",), "input": "v", **fields}


@pytest.mark.parametrize(
    ("error", "described"),
    [
        (err("missing"), "is required"),
        (err("extra_forbidden"), "is not a known setting"),
        (
            err("literal_error", ctx={"expected": "'lvm' or 'direct'"}),
            'must be one of lvm, direct (got "v")',
        ),
        (
            err("literal_error", ctx={"expected": "'a', 'b' or 'c'"}),
            'must be one of a, b, c (got "v")',
        ),
        (err("int_type"), 'must be an integer (got "v")'),
        (err("int_parsing"), 'must be an integer (got "v")'),
        (err("int_from_float"), 'must be an integer (got "v")'),
        (err("bool_type"), 'must be true or false (got "v")'),
        (err("bool_parsing"), 'must be true or false (got "v")'),
        (err("string_type"), 'must be a string (got "v")'),
        (err("dict_type"), 'must be a mapping (got "v")'),
        (err("model_type"), 'must be a mapping (got "v")'),
        (err("model_attributes_type"), 'must be a mapping (got "v")'),
        (err("list_type"), 'must be a list (got "v")'),
        (err("greater_than_equal", ctx={"ge": 1}), 'must be at least 1 (got "v")'),
        (err("less_than_equal", ctx={"le": 100}), 'must be at most 100 (got "v")'),
        (err("string_too_short"), "must not be empty"),
        (
            err("url_parsing", msg="Input should be a valid URL"),
            'Input should be a valid URL (got "v")',
        ),
        (err("url_parsing"), 'is invalid (got "v")'),
    ],
)
def test_each_pydantic_error_type_has_its_own_words(error: dict[str, Any], described: str) -> None:
    """Our wording per pydantic error type, the value shown after it; a type without words
    of its own keeps pydantic's message (or "is invalid" without one)."""
    assert _describe(error) == described


def test_an_error_without_input_shows_null() -> None:
    """An error without ``input`` shows the value as YAML's null, not as Python's None."""
    assert _describe({"type": "int_type", "loc": ("logLevel",)}) == "must be an integer (got null)"


def test_an_error_with_a_null_context_is_described() -> None:
    """pydantic leaves ``ctx`` out or None for most types; neither is a crash."""
    assert _describe(err("int_type", ctx=None)) == 'must be an integer (got "v")'


@pytest.mark.parametrize(
    ("kind", "ctx", "described"),
    [
        ("int_type", None, "must be an integer"),
        ("string_type", None, "must be a string"),
        ("literal_error", {"expected": "'a' or 'b'"}, "must be one of a, b"),
        ("greater_than_equal", {"ge": 1}, "must be at least 1"),
        ("value_error", None, "Value error, bad"),
    ],
)
def test_the_value_of_a_secret_or_certificate_is_never_shown(
    kind: str, ctx: dict[str, Any] | None, described: str
) -> None:
    """Keys are secret and certificates too long: their errors carry no ``(got ...)``."""
    error = {
        "type": kind,
        "loc": ("certificates", "registryKey"),
        "input": "S3CRET",
        "ctx": ctx,
        "msg": "Value error, bad",
    }
    assert _describe(error) == described


def test_load_config_words_pydantic_errors_at_their_keys() -> None:
    """Through the public entry: the words above, each at its config key, in the order of
    the model's fields."""
    dep = {
        "deviceMode": "foo",
        "logLevel": 1.5,
        "createNamespace": "perhaps",
        "nodeSelector": ["x"],
        "patches": "x",
        "reporter": {"replicas": 11, "image": "", "other": 1},
        "certificates": {"validityDays": 0},
    }
    assert config_problems({"deployments": [dep]}) == [
        'pmem-csi:deployments[0].createNamespace: must be true or false (got "perhaps")',
        'pmem-csi:deployments[0].deviceMode: must be one of lvm, direct (got "foo")',
        "pmem-csi:deployments[0].logLevel: must be an integer (got 1.5)",
        "pmem-csi:deployments[0].nodeSelector: must be a mapping (got ['x'])",
        "pmem-csi:deployments[0].certificates.validityDays: must be at least 1 (got 0)",
        'pmem-csi:deployments[0].patches: must be a list (got "x")',
        "pmem-csi:deployments[0].reporter.image: must not be empty",
        "pmem-csi:deployments[0].reporter.replicas: must be at most 10 (got 11)",
        "pmem-csi:deployments[0].reporter.other: is not a known setting",
    ]


# --------------------------------------------------------------------------- _real_loc


@pytest.mark.parametrize(
    ("loc", "data", "expected"),
    [
        # pydantic's union member tags are dropped and returned.
        (("limits", "cpu", "str"), {"limits": {"cpu": [1]}}, (("limits", "cpu"), {"str"})),
        (("limits", "cpu", "int"), {"limits": {"cpu": [1]}}, (("limits", "cpu"), {"int"})),
        (("a", "function-after[...]"), {"a": [1]}, (("a",), {"function-after[...]"})),
        # A key of the input named like a tag is a key: walked along the input, kept.
        (("labels", "str"), {"labels": {"str": 5}}, (("labels", "str"), set())),
        (("labels", "int"), {"labels": {"int": 5}}, (("labels", "int"), set())),
        ((0, "str"), [{"str": 1}], ((0, "str"), set())),
        ((1, "str"), [{}, {"str": 1}], ((1, "str"), set())),
        # A tag in the middle is dropped and the walk goes on after it.
        (("x", "str", "y"), {"x": {"y": 1}}, (("x", "y"), {"str"})),
        # Past the input (a key it does not have, an index past its end): kept as it is.
        (("kind",), {}, (("kind",), set())),
        (("patches", 0, "kind"), {"patches": [{}]}, (("patches", 0, "kind"), set())),
        ((1, "a"), ["x"], ((1, "a"), set())),
        (("a", "b"), {"a": "x"}, (("a", "b"), set())),
        (("a", "b", "str"), {}, (("a", "b"), {"str"})),
        (("a",), None, (("a",), set())),
    ],
)
def test_real_loc_drops_union_tags_but_not_keys_of_the_input(
    loc: tuple[Any, ...], data: Any, expected: tuple[tuple[str | int, ...], set[str]]
) -> None:
    """A config key named "str" or "int" must not vanish from the message's key path."""
    assert _real_loc(loc, data) == expected


# --------------------------------------------------------------------------- _pydantic_problems


def dep_problems(dep: dict[str, Any]) -> list[str]:
    """`_pydantic_problems` of one deployment as `load_config` calls it."""
    with pytest.raises(ValidationError) as info:
        DeploymentConfig.model_validate(dep)
    return _pydantic_problems(info.value, ("deployments", 3), dep)


def test_each_problem_is_named_by_its_full_key_after_the_prefix() -> None:
    """The prefix (the deployment's place in the stack) comes before each error's own path."""
    assert dep_problems({"logLevel": "x", "reporter": {"replicas": 0}}) == [
        'pmem-csi:deployments[3].logLevel: must be an integer (got "x")',
        "pmem-csi:deployments[3].reporter.replicas: must be at least 1 (got 0)",
    ]


@pytest.mark.parametrize(("value", "text"), [(5, "5"), (-5, "-5"), (1.5, "1.5"), (True, "true")])
def test_a_number_or_boolean_where_a_string_belongs_says_how_to_store_a_string(
    value: Any, text: str
) -> None:
    """YAML and `pulumi config set --path` store 5 and true as a number and a boolean."""
    key = "pmem-csi:deployments[3].labels.str"  # a label key named like a union tag
    assert dep_problems({"labels": {"str": value}}) == [
        f'{key}: must be a string (got {text}); quote it ("{text}") in Pulumi.<stack>.yaml, '
        f"or set it with pulumi config set --type string --path '{key}' -- {text}"
    ]


def test_the_string_fix_through_load_config() -> None:
    """The public entry gives the same fix, at the deployment's own index."""
    key = "pmem-csi:deployments[0].name"
    assert config_problems({"deployments": [{"name": 5}]}) == [
        f'{key}: must be a string (got 5); quote it ("5") in Pulumi.<stack>.yaml, '
        f"or set it with pulumi config set --type string --path '{key}' -- 5"
    ]


def test_a_list_where_a_string_belongs_gets_no_string_fix() -> None:
    """Quoting helps only a scalar that YAML read as a number or boolean."""
    assert dep_problems({"labels": {"a": [1]}}) == [
        "pmem-csi:deployments[3].labels.a: must be a string (got [1])"
    ]


def test_a_number_where_a_number_is_wrong_gets_no_string_fix() -> None:
    """Only a string setting gets the quoting hint; a wrong number is not fixed by quoting."""
    assert dep_problems({"logLevel": 1.5, "pmemPercentage": 0}) == [
        "pmem-csi:deployments[3].logLevel: must be an integer (got 1.5)",
        "pmem-csi:deployments[3].pmemPercentage: must be at least 1 (got 0)",
    ]


def test_a_number_for_a_secret_gets_neither_its_value_nor_a_string_fix() -> None:
    """The fix would show the value; a key's value is never shown."""
    problems = dep_problems({"certificates": {"registryKey": 12345, "caCert": 7}})
    assert problems == [
        "pmem-csi:deployments[3].certificates.caCert: must be a string",
        "pmem-csi:deployments[3].certificates.registryKey: must be a string",
    ]


@pytest.mark.parametrize(
    ("value", "shown"), [([1], "[1]"), (1.5, "1.5"), (None, "null"), ({"a": 1}, "{'a': 1}")]
)
def test_a_value_that_fits_no_member_of_a_union_is_one_problem(value: Any, shown: str) -> None:
    """``str | int``: both members fail; one line says both, the value once, and no string
    fix (a number is fine there, only not this one)."""
    assert dep_problems({"controllerResources": {"limits": {"cpu": value}}}) == [
        "pmem-csi:deployments[3].controllerResources.limits.cpu: "
        f"must be a string or an integer (got {shown})"
    ]


def test_a_union_key_named_like_a_tag_keeps_its_name() -> None:
    """The tags after the key are dropped, the key named "str" or "int" is not."""
    assert dep_problems({"controllerResources": {"limits": {"str": [1], "int": [2]}}}) == [
        "pmem-csi:deployments[3].controllerResources.limits.str: "
        "must be a string or an integer (got [1])",
        "pmem-csi:deployments[3].controllerResources.limits.int: "
        "must be a string or an integer (got [2])",
    ]


def test_the_same_words_twice_for_one_key_are_said_once() -> None:
    """Two union members that fail with the same words give one sentence, not "x or x"."""
    exc = ValidationError.from_exception_data(
        "StackConfig",
        [
            {"type": "missing", "loc": ("a", "str"), "input": {}},
            {"type": "missing", "loc": ("a", "int"), "input": {}},
            {"type": "missing", "loc": ("b",), "input": {}},
        ],
    )
    assert _pydantic_problems(exc, ()) == ["pmem-csi:a: is required", "pmem-csi:b: is required"]


def test_stack_level_problems_have_no_prefix() -> None:
    """Top-level settings are named right after the namespace, one problem each."""
    assert config_problems({"manageCrd": "maybe", "retainCrd": 1.5, "preflight": [1]}) == [
        'pmem-csi:manageCrd: must be true or false (got "maybe")',
        "pmem-csi:retainCrd: must be true or false (got 1.5)",
        "pmem-csi:preflight: must be true or false (got [1])",
    ]


# --------------------------------------------------------------------------- _join_alternatives


def test_a_single_text_is_kept_as_it_is() -> None:
    """One alternative: nothing to join, the text is the message."""
    assert _join_alternatives(["must be a string (got 1)"]) == "must be a string (got 1)"
    assert _join_alternatives(["is required"]) == "is required"


def test_alternatives_share_one_must_be_and_one_shown_value() -> None:
    """One sentence, "must be a string or an integer (got x)", reads better than two."""
    texts = ["must be a string (got [1])", "must be an integer (got [1])"]
    assert _join_alternatives(texts) == "must be a string or an integer (got [1])"


def test_three_alternatives_are_all_joined() -> None:
    """Every alternative after the first loses its "must be ", none is dropped."""
    texts = ["must be a string (got x)", "must be an integer (got x)", "must be a list (got x)"]
    assert _join_alternatives(texts) == "must be a string or an integer or a list (got x)"


def test_alternatives_without_a_shown_value_are_joined() -> None:
    """Quiet keys show no value."""
    texts = ["must be a string", "must be an integer"]
    assert _join_alternatives(texts) == "must be a string or an integer"


def test_an_alternative_in_other_words_is_joined_as_it_is() -> None:
    """Only a leading "must be " is dropped from a later alternative."""
    texts = ["must be a string (got 1)", "is not a Kubernetes quantity (got 1)"]
    assert _join_alternatives(texts) == "must be a string or is not a Kubernetes quantity (got 1)"


@pytest.mark.parametrize(
    ("texts", "joined"),
    [
        (["must be a (got 1)", "must be b"], "must be a (got 1) or b"),
        (["must be a", "must be b (got 1)"], "must be a or b (got 1)"),
        (["must be a (got 1)", "must be b (got 2)"], "must be a (got 1) or b (got 2)"),
    ],
)
def test_a_shown_value_not_common_to_all_alternatives_stays_with_its_own(
    texts: list[str], joined: str
) -> None:
    """The shown value is factored out only when every alternative ends with the first one's."""
    assert _join_alternatives(texts) == joined
