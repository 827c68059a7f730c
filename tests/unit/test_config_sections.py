"""pmem_components/config.py, the checks of one section of a deployment entry: labels, resources,
certificates and their renewal, patches, the reporter, name lengths, and the models' own
validators.

Written to pin behaviours that `make mutate` found unpinned (docs/testing.md, "Scores").
"""

from __future__ import annotations

from typing import Any

import pytest

from pmem_components import config as c
from pmem_components.config import ConfigError, load_config

NS = c.CONFIG_NAMESPACE


def labels_problems(labels: Any, *, reserved: bool = True) -> list[str]:
    """What ``_check_labels`` says about ``labels`` under deployments[0].labels."""
    found: list[str] = []
    c._check_labels(labels, ("deployments", 0, "labels"), found, reserved=reserved)
    return found


def resources_problems(res: Any) -> list[str]:
    """What ``_check_resources`` says about ``res`` under deployments[0].nodeResources."""
    found: list[str] = []
    c._check_resources(res, ("deployments", 0, "nodeResources"), found)
    return found


def certificates_problems(certs: Any) -> list[str]:
    """What ``_check_certificates`` says about ``certs`` under deployments[0].certificates."""
    found: list[str] = []
    c._check_certificates(certs, ("deployments", 0, "certificates"), found)
    return found


def renewal_problems(certs: Any) -> list[str]:
    """What ``_check_renewal`` says about ``certs`` under deployments[0].certificates."""
    found: list[str] = []
    c._check_renewal(certs, ("deployments", 0, "certificates"), found)
    return found


def patches_problems(patches: Any) -> list[str]:
    """What ``_check_patches`` says about ``patches`` under deployments[0].patches."""
    found: list[str] = []
    c._check_patches(patches, ("deployments", 0, "patches"), found)
    return found


def reporter_problems(reporter: Any) -> list[str]:
    """What ``_check_reporter`` says about ``reporter`` under deployments[0].reporter."""
    found: list[str] = []
    c._check_reporter(reporter, ("deployments", 0, "reporter"), found)
    return found


def load_problems(**fields: Any) -> list[str]:
    """Every problem ``load_config`` reports for one deployment with ``fields``."""
    with pytest.raises(ConfigError) as info:
        load_config({"deployments": [fields]})
    return info.value.problems


# --------------------------------------------------------------------------- ConfigError


def test_config_error_lists_every_problem_on_its_own_line_and_keeps_them() -> None:
    """The message ``pulumi preview`` shows: a count, then one indented line per problem."""
    error = ConfigError(("first: is wrong", "second: is wrong too"))
    assert str(error) == (
        "invalid stack configuration (2 problem(s)):\n  - first: is wrong\n  - second: is wrong too"
    )
    assert error.problems == ["first: is wrong", "second: is wrong too"]
    assert type(error.problems) is list  # a tuple given is kept as a list
    assert isinstance(error, ValueError)


# --------------------------------------------------------------------------- labels


def test_labels_that_are_not_a_mapping_are_left_to_the_type_check() -> None:
    """A list or a string has its own "must be a mapping" error from the model."""
    assert labels_problems(["app"]) == []
    assert labels_problems("app=x") == []
    assert labels_problems(None) == []


@pytest.mark.parametrize(
    "key",
    [
        "team",
        "a",
        "A_b.c-D",
        "n" * 63,
        "example.com/team",
        "a" * 253 + "/x",
        "sub.example-1.com/" + "n" * 63,
    ],
)
def test_valid_label_keys_are_accepted(key: str) -> None:
    """Names up to 63 characters, prefixes (DNS subdomains) up to 253: the API server's
    limits, exactly."""
    assert labels_problems({key: "x"}) == []


@pytest.mark.parametrize(
    "key",
    [
        "n" * 64,  # a name of more than 63 characters
        "-team",
        "team-",
        "te am",
        "",
        "a/",  # an empty name after the prefix
        "a/-b",  # a valid prefix with an invalid name
        "Example.com/team",  # a prefix is a DNS subdomain: lower case only
        "a..b/team",
        "a" * 254 + "/x",  # a prefix of more than 253 characters
        "a/b/c",
        "/team",  # an empty prefix: Kubernetes rejects it
        "/",
    ],
)
def test_invalid_label_keys_are_named(key: str) -> None:
    """Each key the API server would refuse is refused before ``pulumi up`` registers anything."""
    assert labels_problems({key: "x"}) == [
        f"{c.key_path(('deployments', 0, 'labels', key))}: is not a valid label key"
    ]


def test_a_label_key_with_an_empty_prefix_is_a_config_error() -> None:
    """``/abc``: a prefix, if there is a slash, must be a DNS subdomain; the API server
    rejects an empty one, so ``pulumi up`` would fail half way instead of ``preview``."""
    assert load_problems(labels={"/abc": "x"}) == [
        f'{NS}:deployments[0].labels["/abc"]: is not a valid label key'
    ]
    assert load_problems(nodeSelector={"/abc": "x"}) == [
        f'{NS}:deployments[0].nodeSelector["/abc"]: is not a valid label key'
    ]


@pytest.mark.parametrize("value", ["", "x", "A-b_c.9", "v" * 63])
def test_valid_label_values_are_accepted(value: str) -> None:
    """An empty value is a valid label value; 63 characters is the limit."""
    assert labels_problems({"team": value}) == []


@pytest.mark.parametrize("value", ["v" * 64, "-x", "x-", "a b", "a/b"])
def test_invalid_label_values_are_named_with_the_value(value: str) -> None:
    """The value is shown, so the administrator sees which one is meant."""
    assert labels_problems({"team": value}) == [
        f'{NS}:deployments[0].labels.team: is not a valid label value (got "{value}")'
    ]


def test_a_label_value_that_is_no_string_is_left_to_the_type_check() -> None:
    """pydantic says "must be a string"; the label rule has nothing to add."""
    assert labels_problems({"team": 5, "other": None}) == []


@pytest.mark.parametrize("key", sorted(c.RESERVED_LABEL_KEYS))
def test_reserved_label_keys_are_refused_in_labels_only(key: str) -> None:
    """The project's own labels would break its selectors; a node selector may use them."""
    assert labels_problems({key: "x"}) == [
        f"{c.key_path(('deployments', 0, 'labels', key))}: is set by pmem-csi-pulumi itself "
        "and cannot be configured"
    ]
    assert labels_problems({key: "x"}, reserved=False) == []


def test_every_label_and_every_rule_is_checked_in_order() -> None:
    """All labels are checked, each against the key, reserved and value rules, in that
    order, and the problems are added to those found before."""
    found = ["earlier problem"]
    c._check_labels(
        {"-bad": "ok", "app": "bad value", "fine": "ok", "z": "-"},
        ("deployments", 1, "labels"),
        found,
        reserved=True,
    )
    assert found == [
        "earlier problem",
        f'{NS}:deployments[1].labels["-bad"]: is not a valid label key',
        f"{NS}:deployments[1].labels.app: is set by pmem-csi-pulumi itself and cannot be "
        "configured",
        f'{NS}:deployments[1].labels.app: is not a valid label value (got "bad value")',
        f'{NS}:deployments[1].labels.z: is not a valid label value (got "-")',
    ]


def test_a_label_key_that_is_no_string_is_named_as_written() -> None:
    """YAML reads ``1: x`` with an integer key; the check names it as the text it is."""
    assert labels_problems({1: "-"}) == [
        f'{NS}:deployments[0].labels["1"]: is not a valid label value (got "-")'
    ]


# --------------------------------------------------------------------------- resources


@pytest.mark.parametrize("part", ["limits", "requests"])
def test_resources_accept_kubernetes_quantities_as_strings_and_integers(part: str) -> None:
    """Suffixes, exponents and signs are quantities; an integer is its own text."""
    res = {part: {"cpu": "100m", "memory": "1Gi", "pods": 10, "storage": "1.5e3", "x": "+.5"}}
    assert resources_problems(res) == []


@pytest.mark.parametrize("part", ["limits", "requests"])
def test_resources_that_are_no_quantity_are_named_with_the_value(part: str) -> None:
    """The cluster would refuse them on ``pulumi up``; each is named with what was written."""
    res = {part: {"cpu": "lots", "memory": "1 Gi", "gpu": True}}
    assert resources_problems(res) == [
        f'{NS}:deployments[0].nodeResources.{part}.cpu: is not a Kubernetes quantity (got "lots")',
        f"{NS}:deployments[0].nodeResources.{part}.memory: is not a Kubernetes quantity "
        '(got "1 Gi")',
        # pydantic would take true for 1, and the cluster would get "True".
        f"{NS}:deployments[0].nodeResources.{part}.gpu: is not a Kubernetes quantity (got true)",
    ]


def test_both_limits_and_requests_are_checked() -> None:
    """Neither part may hide the other's mistakes."""
    res = {"limits": {"cpu": "x"}, "requests": {"cpu": "y"}}
    assert resources_problems(res) == [
        f'{NS}:deployments[0].nodeResources.limits.cpu: is not a Kubernetes quantity (got "x")',
        f'{NS}:deployments[0].nodeResources.requests.cpu: is not a Kubernetes quantity (got "y")',
    ]


def test_resources_of_other_types_are_left_to_the_type_check() -> None:
    """Values that are neither string nor integer (a list, null) and sections that are no
    mapping have their own type errors from the model."""
    assert resources_problems({"limits": {"cpu": ["1"], "memory": None}}) == []
    assert resources_problems({"limits": ["cpu"], "requests": "1"}) == []
    assert resources_problems(["limits"]) == []
    assert resources_problems(None) == []


# --------------------------------------------------------------------------- certificates

CERT = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
KEY = "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n"
CERT_FIELDS = ("caCert", "registryCert", "registryKey", "nodeControllerCert", "nodeControllerKey")


def full_set() -> dict[str, Any]:
    """Five values that each carry their PEM marker: the check's happy path."""
    return {f: KEY if f.endswith("Key") else CERT for f in CERT_FIELDS}


def test_a_full_set_or_none_at_all_is_accepted() -> None:
    """None at all means generated certificates; other settings of the section do not count."""
    assert certificates_problems(full_set()) == []
    assert certificates_problems({}) == []
    assert certificates_problems({"validityDays": 10}) == []
    assert certificates_problems(None) == []
    assert certificates_problems(["caCert"]) == []


def test_empty_strings_count_as_unset() -> None:
    """An empty value is no certificate: it counts as unset, not as a field to check."""
    assert certificates_problems(dict.fromkeys(CERT_FIELDS, "")) == []
    assert certificates_problems({**dict.fromkeys(CERT_FIELDS), "caCert": ""}) == []


@pytest.mark.parametrize("absent", [None, ""])
@pytest.mark.parametrize("field", CERT_FIELDS)
def test_a_partial_set_names_what_is_missing(field: str, absent: str | None) -> None:
    """Each field counts, null or empty alike, and is named alone when it is the only one
    missing."""
    certs = {**full_set(), field: absent}
    assert certificates_problems(certs) == [
        f"{NS}:deployments[0].certificates: set all of caCert, registryCert, registryKey, "
        f"nodeControllerCert, nodeControllerKey or none of them (missing: {field})"
    ]


def test_a_partial_set_names_every_missing_field_in_order() -> None:
    """The message lists every missing field in the order of the section."""
    assert certificates_problems({"registryKey": KEY, "nodeControllerCert": CERT}) == [
        f"{NS}:deployments[0].certificates: set all of caCert, registryCert, registryKey, "
        "nodeControllerCert, nodeControllerKey or none of them "
        "(missing: caCert, registryCert, nodeControllerKey)"
    ]


def test_keys_must_be_pem_private_keys_and_certificates_pem_certificates() -> None:
    """Swapped values are named field by field, after the all-or-none problem."""
    certs = {f: CERT if f.endswith("Key") else KEY for f in CERT_FIELDS}
    assert certificates_problems(certs) == [
        f"{NS}:deployments[0].certificates.caCert: must be a PEM certificate",
        f"{NS}:deployments[0].certificates.registryCert: must be a PEM certificate",
        f"{NS}:deployments[0].certificates.registryKey: must be a PEM encoded private key",
        f"{NS}:deployments[0].certificates.nodeControllerCert: must be a PEM certificate",
        f"{NS}:deployments[0].certificates.nodeControllerKey: must be a PEM encoded private key",
    ]


def test_private_keys_of_any_algorithm_are_accepted() -> None:
    """Only the end of the marker is required: RSA and EC keys have their own first line."""
    certs = {
        **full_set(),
        "registryKey": "-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----\n",
        "nodeControllerKey": "-----BEGIN EC PRIVATE KEY-----\nMHc\n-----END EC PRIVATE KEY-----",
    }
    assert certificates_problems(certs) == []


def test_a_value_that_is_no_string_counts_as_set_and_is_left_to_the_type_check() -> None:
    """``caCert: 5`` is set (so the set is complete) and pydantic reports its type; the fields
    after it are still checked."""
    certs = {**full_set(), "caCert": 5, "registryCert": "not pem"}
    assert certificates_problems(certs) == [
        f"{NS}:deployments[0].certificates.registryCert: must be a PEM certificate"
    ]


def test_a_partial_set_is_also_checked_for_its_pem_values() -> None:
    """Both problems at once: every mistake is reported in one ``pulumi preview``."""
    assert certificates_problems({"caCert": "x"}) == [
        f"{NS}:deployments[0].certificates: set all of caCert, registryCert, registryKey, "
        "nodeControllerCert, nodeControllerKey or none of them "
        "(missing: registryCert, registryKey, nodeControllerCert, nodeControllerKey)",
        f"{NS}:deployments[0].certificates.caCert: must be a PEM certificate",
    ]


def test_certificates_provided_means_a_ca_is_configured() -> None:
    """``provided`` decides whether certificates are generated; the CA stands for the set."""
    assert c.Certificates(ca_cert=CERT).provided is True
    assert c.Certificates().provided is False
    assert c.Certificates(registry_cert=CERT).provided is False


# --------------------------------------------------------------------------- name lengths


def test_the_longest_name_that_fits_has_no_length_problem() -> None:
    """MAX_NAME_LENGTH is the boundary: a name of exactly that length is accepted."""
    name = "p" * c.MAX_NAME_LENGTH
    assert c._name_length_problems(name, ("deployments", 0, "name")) == []


def test_a_name_one_character_too_long_is_named_with_the_value_that_limits_it() -> None:
    """The message says which derived value would break, with the hash shown as a placeholder."""
    name = "p" * (c.MAX_NAME_LENGTH + 1)
    assert c._name_length_problems(name, ("deployments", 3, "name")) == [
        f"{NS}:deployments[3].name: is 42 characters; at most 41 fit, because the controller "
        f"pod label controller-revision-hash '{name}-controller-<hash>' would exceed the 63 "
        "characters Kubernetes allows"
    ]


@pytest.mark.parametrize("name", ["9pmem.example", "-x", "", "9" + "a" * 60])
def test_a_name_must_start_with_a_letter(name: str) -> None:
    """Service names are derived from the driver name and must start with a letter; a too long
    name gets its length problem first."""
    found = c._name_length_problems(name, ("deployments", 0, "name"))
    assert found[-1] == (
        f"{NS}:deployments[0].name: must start with a letter: Service names are derived from "
        f'it (got "{name}")'
    )
    assert len(found) == (2 if len(name) > c.MAX_NAME_LENGTH else 1)


@pytest.mark.parametrize("name", ["p", "a9", "a-b.c", "Z1"])
def test_the_length_and_first_letter_rule_accepts_a_name_starting_with_a_letter(
    name: str,
) -> None:
    """This rule asks only that the first character be a letter, of either case ("Z1" is
    refused by the DNS subdomain rule before this one runs, not here)."""
    assert c._name_length_problems(name, ("deployments", 0, "name")) == []


# --------------------------------------------------------------------------- renewal


@pytest.mark.parametrize(
    ("certs", "validity", "renew"),
    [
        ({"validityDays": 30, "renewBeforeDays": 30}, 30, 30),
        ({"validityDays": 30, "renewBeforeDays": 31}, 30, 31),
        ({"validityDays": 30}, 30, c.DEFAULT_RENEW_BEFORE_DAYS),  # the default lead time
        ({"renewBeforeDays": 365}, c.DEFAULT_VALIDITY_DAYS, 365),  # the default validity
        ({"validityDays": "10", "renewBeforeDays": " 10 "}, 10, 10),  # as the model reads them
    ],
)
def test_a_lead_time_as_long_as_the_validity_is_refused(
    certs: dict[str, Any], validity: int, renew: int
) -> None:
    """Renewal would happen on every ``pulumi up``; values and defaults as the model reads them."""
    assert renewal_problems(certs) == [
        f"{NS}:deployments[0].certificates.renewBeforeDays: must be less than validityDays "
        f"({validity}), or every pulumi up would renew the certificates (got {renew})"
    ]


@pytest.mark.parametrize(
    "certs",
    [
        {},
        {"validityDays": 31, "renewBeforeDays": 30},
        {"validityDays": 1, "renewBeforeDays": 0},
        {"validityDays": 365},
        {"renewBeforeDays": 364},
        None,
        ["validityDays"],
    ],
)
def test_a_shorter_lead_time_is_accepted(certs: Any) -> None:
    """Anything below the validity (and the defaults, 30 of 365 days) is fine."""
    assert renewal_problems(certs) == []


@pytest.mark.parametrize(
    "certs",
    [
        {"validityDays": "x", "renewBeforeDays": 400},
        {"validityDays": 0, "renewBeforeDays": 30},
        {"validityDays": 30, "renewBeforeDays": 4000},
        {"validityDays": True, "renewBeforeDays": 1},
    ],
)
def test_no_renewal_problem_on_top_of_a_value_that_is_wrong_on_its_own(certs: Any) -> None:
    """The model already reports a wrong type or a value out of range."""
    assert renewal_problems(certs) == []


def test_other_certificate_mistakes_do_not_hide_the_renewal_rule() -> None:
    """The pair is parsed on its own, so errors in other keys of the section do not suppress it."""
    certs = {"caCert": 5, "rolledOut": "x", "validityDays": 10, "renewBeforeDays": 10}
    assert renewal_problems(certs) == [
        f"{NS}:deployments[0].certificates.renewBeforeDays: must be less than validityDays "
        "(10), or every pulumi up would renew the certificates (got 10)"
    ]


@pytest.mark.parametrize("rotation", [True, False])
def test_a_boolean_rotation_is_refused(rotation: bool) -> None:
    """``rotation`` is "str | int": pydantic would take true for the string "True"."""
    assert renewal_problems({"rotation": rotation}) == [
        f"{NS}:deployments[0].certificates.rotation: must be a string or number"
    ]


@pytest.mark.parametrize("rotation", ["2026-12", 3, "", None])
def test_a_string_or_number_rotation_is_accepted(rotation: Any) -> None:
    """Any string or number (or none) is a rotation value."""
    assert renewal_problems({"rotation": rotation}) == []


def test_the_renewal_and_rotation_problems_come_together() -> None:
    """Both rules report, in order, after the problems found before."""
    found = ["earlier"]
    c._check_renewal(
        {"validityDays": 5, "renewBeforeDays": 5, "rotation": True},
        ("deployments", 2, "certificates"),
        found,
    )
    assert found == [
        "earlier",
        f"{NS}:deployments[2].certificates.renewBeforeDays: must be less than validityDays "
        "(5), or every pulumi up would renew the certificates (got 5)",
        f"{NS}:deployments[2].certificates.rotation: must be a string or number",
    ]


# --------------------------------------------------------------------------- patches

ONE_OF = "set exactly one of mergePatch and jsonPatch"
OPS_TEXT = "add, remove, replace, move, copy, test"


def test_patches_that_are_not_a_list_are_left_to_the_type_check() -> None:
    """The model says "must be a list"; this check has nothing to add."""
    assert patches_problems({"kind": "X"}) == []
    assert patches_problems(None) == []
    assert patches_problems("x") == []


@pytest.mark.parametrize(
    "patch",
    [
        {"kind": "X", "mergePatch": {}},
        {"kind": "X", "mergePatch": {"spec": None}},
        {"kind": "X", "jsonPatch": []},
        {"kind": "X", "mergePatch": None, "jsonPatch": []},
        {"kind": "X", "mergePatch": {}, "jsonPatch": None},
    ],
)
def test_a_patch_with_exactly_one_of_merge_and_json_patch_is_accepted(
    patch: dict[str, Any],
) -> None:
    """An empty patch counts as set; a null one as unset."""
    assert patches_problems([patch]) == []


@pytest.mark.parametrize(
    "patch",
    [
        {"kind": "X"},
        {"kind": "X", "mergePatch": None, "jsonPatch": None},
        {"kind": "X", "mergePatch": {}, "jsonPatch": []},
    ],
)
def test_a_patch_needs_exactly_one_of_merge_and_json_patch(patch: dict[str, Any]) -> None:
    """Neither or both: the patch would be ambiguous or empty."""
    assert patches_problems([patch]) == [f"{NS}:deployments[0].patches[0]: {ONE_OF}"]


def test_every_patch_is_checked_past_entries_of_other_types() -> None:
    """Entries that are no mapping, or whose jsonPatch is no list, are left to the type
    check, and the entries after them are still checked, each by its own index."""
    found = patches_problems(
        [
            "not a mapping",
            {"kind": "X", "jsonPatch": {"op": "add"}},
            {"kind": "X"},
            {"kind": "X", "jsonPatch": ["not a mapping", {"op": "remove", "path": "a"}]},
        ]
    )
    assert found == [
        f"{NS}:deployments[0].patches[2]: {ONE_OF}",
        f"{NS}:deployments[0].patches[3].jsonPatch[1].path: must be a JSON pointer like /spec",
    ]


@pytest.mark.parametrize(
    "op",
    [
        {"op": "add", "path": "/a", "value": 1},
        {"op": "add", "path": "/a", "value": None},
        {"op": "remove", "path": "/a"},
        {"op": "replace", "path": "/a", "value": "x"},
        {"op": "move", "path": "/a", "from": "/b"},
        {"op": "copy", "path": "/a", "from": "/b"},
        {"op": "test", "path": "/", "value": {}},
    ],
)
def test_valid_json_patch_operations_are_accepted(op: dict[str, Any]) -> None:
    """Each RFC 6902 operation with the members it needs (a null value is a value)."""
    assert patches_problems([{"kind": "X", "jsonPatch": [op]}]) == []


@pytest.mark.parametrize(
    ("op", "shown"),
    [({"op": "delete", "path": "/a"}, '"delete"'), ({"path": "/a"}, "null"), ({"op": 1}, "1")],
)
def test_an_unknown_operation_is_named_with_the_known_ones(op: dict[str, Any], shown: str) -> None:
    """The message lists the operations there are and shows what was written."""
    found = patches_problems([{"kind": "X", "jsonPatch": [op]}])
    assert found[0] == (
        f"{NS}:deployments[0].patches[0].jsonPatch[0].op: must be one of {OPS_TEXT} (got {shown})"
    )


@pytest.mark.parametrize("path", ["a/b", "spec", 5, None, ["/a"]])
def test_an_operation_path_must_be_a_json_pointer(path: Any) -> None:
    """A path that is no string or does not start with a slash cannot be applied."""
    op = {"op": "remove", "path": path}
    assert patches_problems([{"kind": "X", "jsonPatch": [op]}]) == [
        f"{NS}:deployments[0].patches[0].jsonPatch[0].path: must be a JSON pointer like /spec"
    ]


@pytest.mark.parametrize("name", ["add", "replace", "test"])
def test_add_replace_and_test_need_a_value(name: str) -> None:
    """RFC 6902 requires ``value`` for these; ``from`` does not stand in for it."""
    op = {"op": name, "path": "/a", "from": "/b"}
    assert patches_problems([{"kind": "X", "jsonPatch": [op]}]) == [
        f"{NS}:deployments[0].patches[0].jsonPatch[0].value: is required for {name}"
    ]


@pytest.mark.parametrize("source", [None, 5, "missing"])
@pytest.mark.parametrize("name", ["move", "copy"])
def test_move_and_copy_need_a_from_path(name: str, source: Any) -> None:
    """RFC 6902 requires a string ``from`` for these; ``value`` does not stand in for it."""
    op: dict[str, Any] = {"op": name, "path": "/a", "value": 1}
    if source != "missing":
        op["from"] = source
    assert patches_problems([{"kind": "X", "jsonPatch": [op]}]) == [
        f"{NS}:deployments[0].patches[0].jsonPatch[0].from: is required for {name}"
    ]


def test_every_operation_of_every_patch_is_checked_for_every_rule() -> None:
    """Each operation is named by its patch's and its own index, every rule reporting."""
    found = ["earlier"]
    c._check_patches(
        [
            {"kind": "X", "mergePatch": {}},
            {
                "kind": "Y",
                "jsonPatch": [
                    {"op": "remove", "path": "/ok"},
                    {"op": "add", "path": "rel"},
                    {"op": "copy"},
                ],
            },
        ],
        ("deployments", 1, "patches"),
        found,
    )
    assert found == [
        "earlier",
        f"{NS}:deployments[1].patches[1].jsonPatch[1].path: must be a JSON pointer like /spec",
        f"{NS}:deployments[1].patches[1].jsonPatch[1].value: is required for add",
        f"{NS}:deployments[1].patches[1].jsonPatch[2].path: must be a JSON pointer like /spec",
        f"{NS}:deployments[1].patches[1].jsonPatch[2].from: is required for copy",
    ]


def test_an_unknown_operation_needs_neither_value_nor_from() -> None:
    """One problem per mistake: an unknown operation is not also said to lack members."""
    op = {"op": "bogus", "path": "/a"}
    assert patches_problems([{"kind": "X", "jsonPatch": [op]}]) == [
        f'{NS}:deployments[0].patches[0].jsonPatch[0].op: must be one of {OPS_TEXT} (got "bogus")'
    ]


# --------------------------------------------------------------------------- reporter

REPORTER_IMAGE_REQUIRED = (
    f"{NS}:deployments[0].reporter.image: is required when reporter.enabled is true: there is "
    "no public reporter image; build it with `make image`, push it (see docs/reporter.md, The "
    "reporter image) and set its name here, or leave enabled unset"
)


@pytest.mark.parametrize("enabled", [True, "true", "True", "on", "yes", 1, "1"])
def test_an_enabled_reporter_without_an_image_is_refused(enabled: Any) -> None:
    """Whatever the Reporter model reads as true counts as enabled here too: ``"true"`` (as
    ``pulumi config set --path`` stores it) without an image used to pass the check and
    then fail inside ``pulumi up``."""
    assert c.Reporter.model_validate({"enabled": enabled}).enabled is True  # the model's rule
    assert reporter_problems({"enabled": enabled}) == [REPORTER_IMAGE_REQUIRED]
    assert load_problems(reporter={"enabled": enabled}) == [REPORTER_IMAGE_REQUIRED]


@pytest.mark.parametrize(
    "reporter",
    [
        {},
        {"enabled": False},
        {"enabled": "false"},
        {"enabled": 0},
        {"enabled": None},
        {"enabled": True, "image": "registry.example/reporter:1"},
        {"enabled": "true", "image": "registry.example/reporter:1"},
        {"image": "registry.example/reporter:1"},
        None,
        ["enabled"],
    ],
)
def test_a_reporter_that_is_off_or_has_an_image_passes(reporter: Any) -> None:
    """Off (as the model reads it) or with an image, there is nothing to refuse."""
    assert reporter_problems(reporter) == []


@pytest.mark.parametrize("enabled", ["maybe", 2, [True]])
def test_an_enabled_value_the_model_refuses_has_only_the_models_error(enabled: Any) -> None:
    """A value that is no boolean is the model's error alone, not also a missing image."""
    assert reporter_problems({"enabled": enabled}) == []
    found = load_problems(reporter={"enabled": enabled})
    assert len(found) == 1
    assert found[0].startswith(f"{NS}:deployments[0].reporter.enabled: must be true or false")


def test_an_enabled_reporter_with_a_wrong_image_has_only_the_models_error() -> None:
    """An image of the wrong type is set: the model names it, not this rule."""
    assert reporter_problems({"enabled": True, "image": 5}) == []


def test_the_reporter_is_enabled_by_an_image_unless_disabled() -> None:
    """``enabled`` unset follows the image; set, it is kept as written."""
    assert c.Reporter().enabled is False
    assert c.Reporter(image="r:1").enabled is True
    assert c.Reporter(image="r:1", enabled=False).enabled is False
    assert c.Reporter(enabled=True).enabled is True


def test_the_reporter_dump_leaves_out_an_unset_image_only() -> None:
    """The CR spec records the settings; a null image is noise there."""
    assert c.Reporter().model_dump(by_alias=True) == {
        "enabled": False,
        "replicas": c.DEFAULT_REPORTER_REPLICAS,
        "logLevel": c.DEFAULT_REPORTER_LOG_LEVEL,
    }
    assert c.Reporter(image="r:1").model_dump(by_alias=True)["image"] == "r:1"


# --------------------------------------------------------------------------- _dict_or_empty


def test_dict_or_empty_passes_mappings_through_and_replaces_anything_else() -> None:
    """The checks read wrongly typed sections as empty and leave their errors to the model."""
    mapping = {"a": 1}
    assert c._dict_or_empty(mapping) is mapping
    for other in (None, ["a"], "a", 1):
        assert c._dict_or_empty(other) == {}


# --------------------------------------------------------------------------- resources model


def test_resource_requirements_become_strings_and_leave_out_empty_parts() -> None:
    """The stanza as the API returns it: quantities as strings, no empty parts."""
    res = c.ResourceRequirements(limits={"cpu": 2, "memory": "1Gi"}, requests={"cpu": "500m"})
    assert res.to_k8s() == {
        "limits": {"cpu": "2", "memory": "1Gi"},
        "requests": {"cpu": "500m"},
    }
    assert c.ResourceRequirements(requests={"memory": 100}).to_k8s() == {
        "requests": {"memory": "100"}
    }
    assert c.ResourceRequirements(limits={}, requests={}).to_k8s() == {}
    assert c.ResourceRequirements().to_k8s() == {}


def test_the_default_resources_are_the_reference_limits() -> None:
    """The reference put its defaults into limits; requests then default to them."""
    res = c._default_resources()
    assert res.limits == {"cpu": "100m", "memory": "250Mi"}
    assert res.requests is None
    assert res.to_k8s() == {"limits": {"cpu": "100m", "memory": "250Mi"}}


# --------------------------------------------------------------------------- models


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"logLevel": True}, "logLevel: must be an integer (got true)"),
        ({"pmemPercentage": True}, "pmemPercentage: must be an integer (got true)"),
        ({"reporter": {"replicas": True}}, "reporter.replicas: must be an integer (got true)"),
        (
            {"certificates": {"validityDays": False}},
            "certificates.validityDays: must be an integer (got false)",
        ),
    ],
)
def test_a_boolean_for_a_number_is_refused(fields: dict[str, Any], message: str) -> None:
    """pydantic reads ``true`` as 1; for a number setting in YAML that is a mistake."""
    assert load_problems(**fields) == [f"{NS}:deployments[0].{message}"]


def test_booleans_stay_valid_for_boolean_settings() -> None:
    """The boolean rule is for number settings only."""
    d = load_config({"deployments": [{"createNamespace": False, "adoptExisting": True}]})
    assert d.deployments[0].create_namespace is False
    assert d.deployments[0].adopt_existing is True


@pytest.mark.parametrize(("mode", "expected"), [("ndctl", "direct"), ("direct", "direct")])
def test_ndctl_is_read_as_direct(mode: str, expected: str) -> None:
    """The reference kept "ndctl" for compatibility; a stack written for it keeps working."""
    assert c.DeploymentConfig(device_mode=mode).device_mode == expected


def test_a_device_mode_that_is_no_string_is_refused_by_the_model() -> None:
    """The alias look-up leaves other types to the model's own error."""
    assert load_problems(deviceMode=5) == [
        f"{NS}:deployments[0].deviceMode: must be one of lvm, direct (got 5)"
    ]


@pytest.mark.parametrize(
    ("written", "kept"),
    [("/var/lib/kubelet/", "/var/lib/kubelet"), ("/data//", "/data"), ("/", "/"), ("//", "/")],
)
def test_trailing_slashes_of_the_kubelet_dir_are_dropped(written: str, kept: str) -> None:
    """Host paths are built by appending "/plugins/..."; the root stays the root."""
    assert c.DeploymentConfig(kubelet_dir=written).kubelet_dir == kept


def test_the_pmem_percentage_defaults_for_lvm_only() -> None:
    """Direct mode has no percentage; lvm gets the reference's 100 unless one is set."""
    assert c.DeploymentConfig().pmem_percentage == c.DEFAULT_PMEM_PERCENTAGE
    assert c.DeploymentConfig(pmem_percentage=40).pmem_percentage == 40
    assert c.DeploymentConfig(device_mode="direct").pmem_percentage is None


def test_a_deployments_names_derive_from_its_name() -> None:
    """Object names come from the driver name, with dots as hyphens."""
    assert c.DeploymentConfig(name="pmem.example.org").names.hyphened == "pmem-example-org"


def test_adopts_true_consents_to_anything_a_list_to_its_refs_and_false_to_nothing() -> None:
    """Adoption takes over other stacks' objects: only with the administrator's consent."""
    ref = "Namespace pmem-csi"
    assert c.StackConfig(adopt=True).adopts(ref) is True
    assert c.StackConfig(adopt=(ref,)).adopts(ref) is True
    assert c.StackConfig(adopt=(ref,)).adopts("Namespace other") is False
    assert c.StackConfig(adopt=()).adopts(ref) is False
    assert c.StackConfig(adopt=False).adopts(ref) is False
