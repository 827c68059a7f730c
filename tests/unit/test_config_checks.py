"""pmem_components/config.py, the deployment entry's checks as a whole: `_check_deployment`,
`_check_await`, `_check_unique`, `load_config`, `deployment_problems`, `certificate_problems`.

Written to pin behaviours that `make mutate` found unpinned (docs/testing.md, "Scores").
"""

from __future__ import annotations

from typing import Any

import pytest
from certutil import DAY, NOW, CertSet, good_set, key, make_ca, make_leaf, pem_key

from pmem_components import certs
from pmem_components import config as c
from pmem_components.certs import REGISTRY_NAME, CertProblem
from pmem_components.config import Await, Certificates, ConfigError, DeploymentConfig, load_config

# The deployment under test goes second, so that every message must name its own index.
FIRST = {"name": "first.example.com"}
HERE = "pmem-csi:deployments[1]"


def problems_of(raw: dict[str, Any] | None, **kw: Any) -> list[str]:
    """The problems ``load_config`` raises for ``raw``; the error's text lists each."""
    with pytest.raises(ConfigError) as info:
        load_config(raw, **kw)
    for p in info.value.problems:
        assert f"  - {p}" in str(info.value)
    return info.value.problems


def second(**fields: Any) -> dict[str, Any]:
    """A stack whose second deployment has ``fields`` (and the name second.example.com)."""
    return {"deployments": [FIRST, {"name": "second.example.com", **fields}]}


def problems_of_second(**fields: Any) -> list[str]:
    return problems_of(second(**fields))


def accepted_second(**fields: Any) -> DeploymentConfig:
    """The second deployment's model: ``fields`` are valid and load without a problem."""
    stack = load_config(second(**fields))
    return stack.deployments[1]


def _as_config(s: CertSet) -> dict[str, str]:
    return {
        "caCert": s.ca_cert,
        "registryCert": s.registry_cert,
        "registryKey": s.registry_key,
        "nodeControllerCert": s.node_controller_cert,
        "nodeControllerKey": s.node_controller_key,
    }


def _certificates(s: CertSet) -> Certificates:
    return Certificates.model_validate(_as_config(s))


def _foreign_node_key(s: CertSet) -> CertSet:
    """``s`` with a node controller key that belongs to no certificate of the set."""
    s.node_controller_key = pem_key(key(7))
    return s


MISMATCH = (
    "certificates.nodeControllerKey: private key does not belong to the certificate in "
    "nodeControllerCert"
)


# --------------------------------------------------------------------------- _check_deployment


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        (
            {"name": "Bad_Name"},
            [
                f"{HERE}.name: must be a DNS subdomain: lower case letters, digits, '-' and '.' "
                '(got "Bad_Name")'
            ],
        ),
        (
            {"name": "9pmem.example"},
            [
                f"{HERE}.name: must start with a letter: Service names are derived from it "
                '(got "9pmem.example")'
            ],
        ),
        (
            {"renamedFrom": "Old_Name"},
            [f'{HERE}.renamedFrom: must be the previous driver name (got "Old_Name")'],
        ),
        (
            {"namespace": "a.b"},
            [
                f"{HERE}.namespace: must be a DNS label: lower case letters, digits and '-' "
                '(got "a.b")'
            ],
        ),
        (
            {"namespace": "kube-public"},
            [
                f'{HERE}.namespace: "kube-public" belongs to Kubernetes itself; use a namespace '
                "of its own for the driver (e.g. pmem-csi)"
            ],
        ),
        (
            {"deviceMode": "direct", "pmemPercentage": 50},
            [f"{HERE}.pmemPercentage: is only valid with deviceMode lvm (remove it or use lvm)"],
        ),
        (
            {"deviceMode": "ndctl", "pmemPercentage": 50},
            [f"{HERE}.pmemPercentage: is only valid with deviceMode lvm (remove it or use lvm)"],
        ),
        (
            {"kubeletDir": "var/lib/kubelet"},
            [f'{HERE}.kubeletDir: must be an absolute path (got "var/lib/kubelet")'],
        ),
        (
            {"labels": {"app": "x"}},
            [f"{HERE}.labels.app: is set by pmem-csi-pulumi itself and cannot be configured"],
        ),
        ({"labels": {"-bad": "x"}}, [f'{HERE}.labels["-bad"]: is not a valid label key']),
        (
            {"nodeSelector": {"a": "b c"}},
            [f'{HERE}.nodeSelector.a: is not a valid label value (got "b c")'],
        ),
        (
            {"controllerResources": {"limits": {"cpu": "lots"}}},
            [f'{HERE}.controllerResources.limits.cpu: is not a Kubernetes quantity (got "lots")'],
        ),
        (
            {"nodeResources": {"requests": {"memory": "much"}}},
            [f'{HERE}.nodeResources.requests.memory: is not a Kubernetes quantity (got "much")'],
        ),
        (
            {"certificates": {"caCert": "-----BEGIN CERTIFICATE-----\nMIIB\n"}},
            [
                f"{HERE}.certificates: set all of caCert, registryCert, registryKey, "
                "nodeControllerCert, nodeControllerKey or none of them (missing: registryCert, "
                "registryKey, nodeControllerCert, nodeControllerKey)"
            ],
        ),
        (
            {"certificates": {"validityDays": 30, "renewBeforeDays": 30}},
            [
                f"{HERE}.certificates.renewBeforeDays: must be less than validityDays (30), or "
                "every pulumi up would renew the certificates (got 30)"
            ],
        ),
        (
            {"patches": [{"kind": "DaemonSet"}]},
            [f"{HERE}.patches[0]: set exactly one of mergePatch and jsonPatch"],
        ),
        (
            {"reporter": {"enabled": True}},
            [
                f"{HERE}.reporter.image: is required when reporter.enabled is true: there is no "
                "public reporter image; build it with `make image`, push it (see "
                "docs/reporter.md, The reporter image) and set its name here, or leave enabled "
                "unset"
            ],
        ),
        (
            {"await": {"timeout": "soon"}},
            [
                f"{HERE}.await.timeout: must be a positive duration such as 90s, 20m or 1h30m "
                '(got "soon")'
            ],
        ),
    ],
)
def test_each_cross_field_rule_reports_exactly_its_problem_under_its_own_key(
    fields: dict[str, Any], expected: list[str]
) -> None:
    """Each rule pydantic's types cannot express says what is wrong, with the value, under
    the key of the deployment it is in (here the second), and nothing else."""
    assert problems_of_second(**fields) == expected


def test_the_rules_of_one_deployment_are_all_reported_together_in_order() -> None:
    """One mistake does not hide the next: every rule runs on the same deployment."""
    found = problems_of_second(
        namespace="default",
        kubeletDir="rel",
        labels={"app": "x"},
        nodeSelector={"-a": "b"},
        controllerResources={"limits": {"cpu": "x"}},
        nodeResources={"limits": {"cpu": "y"}},
        patches=[{"kind": "DaemonSet"}],
        reporter={"enabled": True},
        **{"await": {"timeout": "0s"}},
    )
    assert [p.split(": ")[0] for p in found] == [
        f"{HERE}.namespace",
        f"{HERE}.kubeletDir",
        f"{HERE}.labels.app",
        f'{HERE}.nodeSelector["-a"]',
        f"{HERE}.controllerResources.limits.cpu",
        f"{HERE}.nodeResources.limits.cpu",
        f"{HERE}.patches[0]",
        f"{HERE}.reporter.image",
        f"{HERE}.await.timeout",
    ]


def test_a_name_of_253_characters_is_judged_by_its_length_and_one_of_254_is_no_subdomain() -> None:
    """253 characters is the DNS subdomain limit; up to it the message is the one about the
    derived names (which allow far fewer), beyond it the one about DNS subdomains."""
    at_limit, beyond = "a" * 253, "a" * 254
    assert problems_of_second(name=at_limit) == [
        f"{HERE}.name: is 253 characters; at most 41 fit, because the controller pod label "
        f"controller-revision-hash '{at_limit}-controller-<hash>' would exceed the 63 "
        "characters Kubernetes allows"
    ]
    assert problems_of_second(name=beyond) == [
        f"{HERE}.name: must be a DNS subdomain: lower case letters, digits, '-' and '.' "
        f'(got "{beyond}")'
    ]


def test_a_namespace_may_have_63_characters_but_not_64() -> None:
    """The DNS label limit: 63 characters."""
    assert accepted_second(namespace="n" * 63).namespace == "n" * 63
    assert problems_of_second(namespace="n" * 64) == [
        f"{HERE}.namespace: must be a DNS label: lower case letters, digits and '-' "
        f'(got "{"n" * 64}")'
    ]


def test_valid_values_pass_every_rule() -> None:
    """The rules flag mistakes only: these values are all fine (and none is a default)."""
    dep = accepted_second(
        renamedFrom="old.example.com",
        namespace="storage",
        deviceMode="lvm",
        pmemPercentage=50,
        kubeletDir="/data/kubelet",
        labels={"team": "storage"},
        # Reserved keys are only for labels: selecting nodes by "app" is the user's choice.
        nodeSelector={"app": "pmem"},
        **{"await": {"timeout": "20m"}},
    )
    assert dep.renamed_from == "old.example.com"
    assert (dep.namespace, dep.pmem_percentage, dep.kubelet_dir) == ("storage", 50, "/data/kubelet")
    assert dep.node_selector == {"app": "pmem"}
    assert accepted_second(deviceMode="direct").pmem_percentage is None


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"renamedFrom": 5}, [f"{HERE}.renamedFrom: must be a string (got 5)"]),
        ({"namespace": 5}, [f"{HERE}.namespace: must be a string (got 5)"]),
        ({"kubeletDir": 5}, [f"{HERE}.kubeletDir: must be a string (got 5)"]),
        ({"deviceMode": []}, [f"{HERE}.deviceMode: must be one of lvm, direct (got [])"]),
    ],
)
def test_a_value_of_the_wrong_type_gets_only_the_type_error(
    fields: dict[str, Any], expected: list[str]
) -> None:
    """The rules skip values of the wrong type (pydantic reports those) instead of failing
    on them or adding a second, misleading problem."""
    found = [p.split("; ")[0] for p in problems_of_second(**fields)]
    assert found == expected


# --------------------------------------------------------------------------- _check_await


TIMEOUT_WITHOUT_AWAIT = (
    f"{HERE}.await.timeout: is only valid with await.enabled true (nothing is awaited)"
)
# What the Await model reads as false and as true (pydantic's bool parsing).
FALSE_SPELLINGS: list[Any] = [False, "false", "False", "FALSE", "off", "No", "n", "f", "0", 0]
TRUE_SPELLINGS: list[Any] = [True, "true", "True", "on", "Yes", "y", "t", "1", 1]


@pytest.mark.parametrize("enabled", FALSE_SPELLINGS)
def test_a_timeout_with_await_disabled_is_a_problem_however_false_is_spelt(enabled: Any) -> None:
    """``enabled`` is read as the model reads it: "off", "No" or "0" disable the await as
    ``false`` does, and a timeout then has nothing to time."""
    assert Await.model_validate({"enabled": enabled}).enabled is False
    assert problems_of_second(**{"await": {"enabled": enabled, "timeout": "20m"}}) == [
        TIMEOUT_WITHOUT_AWAIT
    ]


@pytest.mark.parametrize("enabled", TRUE_SPELLINGS)
def test_a_timeout_with_await_enabled_is_accepted_however_true_is_spelt(enabled: Any) -> None:
    dep = accepted_second(**{"await": {"enabled": enabled, "timeout": "20m"}})
    assert (dep.await_.enabled, dep.await_.timeout) == (True, "20m")


def test_a_timeout_alone_is_accepted_since_await_is_enabled_by_default() -> None:
    dep = accepted_second(**{"await": {"timeout": "1h30m"}})
    assert (dep.await_.enabled, dep.await_.timeout) == (True, "1h30m")


def test_await_disabled_without_a_timeout_is_accepted() -> None:
    assert accepted_second(**{"await": {"enabled": "off"}}).await_.enabled is False


def test_an_enabled_that_is_no_boolean_gets_only_its_type_error() -> None:
    """A value the model refuses has its own error; the rule does not guess whether it
    meant false and add a second problem about the timeout."""
    assert problems_of_second(**{"await": {"enabled": [], "timeout": "20m"}}) == [
        f"{HERE}.await.enabled: must be true or false (got [])"
    ]


def test_a_timeout_of_the_wrong_type_with_await_disabled_is_both_problems() -> None:
    """Any timeout (even one of the wrong type) has nothing to time when await is off."""
    assert problems_of_second(**{"await": {"enabled": False, "timeout": 5}}) == [
        f'{HERE}.await.timeout: must be a string (got 5); quote it ("5") in '
        "Pulumi.<stack>.yaml, or set it with pulumi config set --type string --path "
        f"'{HERE}.await.timeout' -- 5",
        TIMEOUT_WITHOUT_AWAIT,
    ]


@pytest.mark.parametrize("timeout", ["90s", "20m", "1h30m", "1.5h", "100ms"])
def test_a_go_duration_is_a_timeout(timeout: str) -> None:
    assert accepted_second(**{"await": {"timeout": timeout}}).await_.timeout == timeout


@pytest.mark.parametrize("timeout", ["10", "soon", "20 m", "0s", "0m0s", "0.0h"])
def test_a_timeout_must_be_a_go_duration_above_zero(timeout: str) -> None:
    """A number without a unit, or a duration of zero (no non-zero digit), times nothing."""
    assert problems_of_second(**{"await": {"timeout": timeout}}) == [
        f"{HERE}.await.timeout: must be a positive duration such as 90s, 20m or 1h30m "
        f'(got "{timeout}")'
    ]


def test_await_that_is_no_mapping_gets_only_its_type_error() -> None:
    assert problems_of_second(**{"await": "20m"}) == [
        f'{HERE}.await: must be a mapping (got "20m")'
    ]


# --------------------------------------------------------------------------- _check_unique


CLASH = (
    "pmem-csi:deployments[{i}].name: {name} clashes with pmem-csi:deployments[{j}].name; "
    "deployment names must be unique (also with dots replaced by hyphens)"
)


def test_a_clash_names_both_entries_and_later_clashes_name_the_first() -> None:
    found = problems_of(
        {"deployments": [{"name": "a.b"}, {"name": "c"}, {"name": "a-b"}, {"name": "a.b"}]}
    )
    assert found == [
        CLASH.format(i=2, name='"a-b"', j=0),
        CLASH.format(i=3, name='"a.b"', j=0),
    ]


def test_two_deployments_without_a_name_clash_on_the_default_name() -> None:
    assert problems_of({"deployments": [{}, {"namespace": "other"}]}) == [
        CLASH.format(i=1, name='"pmem-csi.intel.com"', j=0)
    ]


def test_entries_that_are_no_mapping_or_have_no_string_name_do_not_stop_the_search() -> None:
    """Such entries have their own error; the clash between the entries after them is
    still found."""
    found = problems_of({"deployments": ["x", {"name": 5}, {"name": "d"}, {"name": "d"}]})
    assert found == [
        'pmem-csi:deployments[0]: must be a mapping (got "x")',
        "pmem-csi:deployments[1].name: must be a string (got 5); quote it "
        '("5") in Pulumi.<stack>.yaml, or set it with pulumi config set --type string '
        "--path 'pmem-csi:deployments[1].name' -- 5",
        CLASH.format(i=3, name='"d"', j=2),
    ]


def test_distinct_names_do_not_clash() -> None:
    stack = load_config({"deployments": [{"name": "a.b"}, {"name": "a-c"}, {"name": "b.b"}]})
    assert [d.name for d in stack.deployments] == ["a.b", "a-c", "b.b"]


# --------------------------------------------------------------------------- deployment_problems


def test_rules_for_a_model_built_in_code_name_deployment_zero_by_default() -> None:
    dep = DeploymentConfig(device_mode="direct", pmem_percentage=50)
    expected = "is only valid with deviceMode lvm (remove it or use lvm)"
    assert c.deployment_problems(dep) == [f"pmem-csi:deployments[0].pmemPercentage: {expected}"]
    assert c.deployment_problems(dep, 4) == [f"pmem-csi:deployments[4].pmemPercentage: {expected}"]


def test_a_model_built_in_code_is_checked_under_its_config_keys() -> None:
    """The model's fields are dumped by their config keys (kubeletDir, not kubelet_dir), which
    the rules read; None fields are left out, as if not set."""
    dep = DeploymentConfig(
        kubelet_dir="relative",
        labels={"app": "x"},
        await_=Await(enabled=False, timeout="20m"),
    )
    assert c.deployment_problems(dep, 1) == [
        f'{HERE}.kubeletDir: must be an absolute path (got "relative")',
        f"{HERE}.labels.app: is set by pmem-csi-pulumi itself and cannot be configured",
        TIMEOUT_WITHOUT_AWAIT,
    ]


def test_a_valid_model_built_in_code_has_no_problems() -> None:
    assert c.deployment_problems(DeploymentConfig()) == []
    assert c.deployment_problems(DeploymentConfig(device_mode="direct"), 3) == []


# --------------------------------------------------------------------------- certificate_problems


def test_without_certificates_there_is_nothing_to_validate() -> None:
    assert c.certificate_problems(DeploymentConfig(), 0) == ([], [])


def test_a_valid_set_has_neither_errors_nor_warnings() -> None:
    dep = DeploymentConfig(certificates=_certificates(good_set()))
    assert c.certificate_problems(dep, 0) == ([], [])


def test_errors_and_warnings_are_told_apart_and_named_by_config_key() -> None:
    """A warning (expiring soon) and an error (a foreign key) each go to their own list,
    under the deployment's index and the field's key, without the validator's own prefix."""
    ca = make_ca()
    s = good_set(ca)
    soon = make_leaf(ca, REGISTRY_NAME, slot=1, not_after=NOW + 10 * DAY)
    s.registry_cert = soon.cert_pem
    expires = soon.cert.not_valid_after_utc.isoformat()
    warning = (
        "pmem-csi:deployments[2].certificates.registryCert: certificate expires at "
        f"{expires}, within 30 days; rotate the certificates"
    )
    dep = DeploymentConfig(certificates=_certificates(s))
    assert c.certificate_problems(dep, 2) == ([], [warning])
    dep = DeploymentConfig(certificates=_certificates(_foreign_node_key(s)))
    assert c.certificate_problems(dep, 2) == (
        [f"pmem-csi:deployments[2].{MISMATCH}"],
        [warning],
    )


def test_the_validator_gets_each_certificate_field_and_the_handshake_choice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What certificate_problems hands certs.validate_driver_certificates: the five PEM texts
    in its order (an unset one as empty text: its parameters are strings) and whether to run
    the TLS handshake (by default yes)."""
    calls: list[tuple[tuple[str, ...], dict[str, Any]]] = []

    def validator(*args: str, **kwargs: Any) -> list[CertProblem]:
        calls.append((args, kwargs))
        return []

    monkeypatch.setattr(certs, "validate_driver_certificates", validator)
    full = Certificates(
        ca_cert="ca",
        registry_cert="rc",
        registry_key="rk",
        node_controller_cert="nc",
        node_controller_key="nk",
    )
    c.certificate_problems(DeploymentConfig(certificates=full), 0)
    c.certificate_problems(DeploymentConfig(certificates=full), 0, handshake=False)
    # Built in code, a set may be partial (deployment_problems reports that): unset is "".
    c.certificate_problems(DeploymentConfig(certificates=Certificates(ca_cert="ca")), 0)
    assert calls == [
        (("ca", "rc", "rk", "nc", "nk"), {"handshake": True}),
        (("ca", "rc", "rk", "nc", "nk"), {"handshake": False}),
        (("ca", "", "", "", ""), {"handshake": True}),
    ]


# --------------------------------------------------------------------------- load_config


def test_no_config_at_all_is_one_default_deployment() -> None:
    for raw in (None, {}, {"deployments": None}):
        stack = load_config(raw)
        assert [d.name for d in stack.deployments] == ["pmem-csi.intel.com"]
        assert stack.manage_crd is True


def test_keys_set_to_null_take_their_defaults_and_set_keys_are_read() -> None:
    stack = load_config(
        {"manageCrd": None, "retainCrd": False, "preflight": "false", "unknown": None}
    )
    assert (stack.manage_crd, stack.retain_crd, stack.preflight) == (True, False, False)
    assert (stack.retain_namespaces, stack.take_over_fields) == (True, True)


def test_unknown_top_level_keys_are_each_reported() -> None:
    assert problems_of({"deployment": [], "manageCRD": True}) == [
        "pmem-csi:deployment: is not a known setting",
        "pmem-csi:manageCRD: is not a known setting",
    ]


def test_deployments_must_be_a_list() -> None:
    assert problems_of({"deployments": {"name": "x"}}) == [
        "pmem-csi:deployments: must be a list of deployments"
    ]


def test_the_deployments_are_read_in_order() -> None:
    stack = load_config({"deployments": [FIRST, {"name": "b.example.com", "logLevel": 3}]})
    assert [(d.name, d.log_level) for d in stack.deployments] == [
        ("first.example.com", 5),
        ("b.example.com", 3),
    ]
    assert load_config({"deployments": []}).deployments == []


def test_an_entry_that_is_no_mapping_does_not_stop_the_others_being_checked() -> None:
    assert problems_of({"deployments": [7, {"namespace": "kube-system"}]}) == [
        "pmem-csi:deployments[0]: must be a mapping (got 7)",
        'pmem-csi:deployments[1].namespace: "kube-system" belongs to Kubernetes itself; use '
        "a namespace of its own for the driver (e.g. pmem-csi)",
    ]


def test_type_errors_come_before_rule_problems_and_both_name_the_entry() -> None:
    assert problems_of_second(logLevel="x", kubeletDir="rel") == [
        f'{HERE}.logLevel: must be an integer (got "x")',
        f'{HERE}.kubeletDir: must be an absolute path (got "rel")',
    ]


def test_a_key_named_like_a_union_tag_stays_in_the_path() -> None:
    """pydantic tags union members ("str", "int") in its error locations; a label whose key
    is "str" is a real key, found in the entry's data, and stays in the message."""
    assert problems_of_second(labels={"str": 5}) == [
        f'{HERE}.labels.str: must be a string (got 5); quote it ("5") in Pulumi.<stack>.yaml, '
        f"or set it with pulumi config set --type string --path '{HERE}.labels.str' -- 5"
    ]


def test_certificates_are_validated_by_default_and_errors_name_the_entry() -> None:
    certs_raw = _as_config(_foreign_node_key(good_set()))
    assert problems_of_second(certificates=certs_raw) == [f"{HERE}.{MISMATCH}"]


def test_certificates_are_not_validated_when_asked_not_to() -> None:
    certs_raw = _as_config(_foreign_node_key(good_set()))
    stack = load_config(second(certificates=certs_raw), check_certificates=False)
    assert stack.deployments[1].certificates.node_controller_key == certs_raw["nodeControllerKey"]


def test_certificates_are_validated_only_once_the_rest_of_the_entry_is_valid() -> None:
    """A certificate verdict on an otherwise broken entry would be noise: fix the rest first."""
    certs_raw = _as_config(_foreign_node_key(good_set()))
    assert problems_of_second(certificates=certs_raw, kubeletDir="rel") == [
        f'{HERE}.kubeletDir: must be an absolute path (got "rel")'
    ]
    assert problems_of_second(certificates=certs_raw, logLevel="x") == [
        f'{HERE}.logLevel: must be an integer (got "x")'
    ]


def test_valid_certificates_are_accepted_and_kept() -> None:
    certs_raw = _as_config(good_set())
    dep = accepted_second(certificates=certs_raw)
    assert dep.certificates.provided
    assert dep.certificates.registry_cert == certs_raw["registryCert"]


def test_certificate_warnings_go_to_warn_and_do_not_fail_the_config() -> None:
    ca = make_ca()
    s = good_set(ca)
    soon = make_leaf(ca, REGISTRY_NAME, slot=1, not_after=NOW + 10 * DAY)
    s.registry_cert = soon.cert_pem
    warned: list[str] = []
    stack = load_config(second(certificates=_as_config(s)), warn=warned.append)
    assert stack.deployments[1].certificates.registry_cert == soon.cert_pem
    assert warned == [
        f"{HERE}.certificates.registryCert: certificate expires at "
        f"{soon.cert.not_valid_after_utc.isoformat()}, within 30 days; rotate the certificates"
    ]
    # Without a warn callback the warning is dropped, and the config still loads.
    assert load_config(second(certificates=_as_config(s))).deployments[1].certificates.provided


def test_allowed_field_owners_are_read_into_the_stack() -> None:
    entry = {"manager": "kubectl-edit", "paths": ["spec.replicas"], "reason": "scaled by hand"}
    stack = load_config({"allowedFieldOwners": [entry]})
    assert stack.allowed_field_owners == (
        c.fieldowners.Allowance("kubectl-edit", ("spec.replicas",), "scaled by hand"),
    )
    assert load_config({}).allowed_field_owners == ()


def test_a_wrong_allowed_field_owner_is_one_problem_under_its_key() -> None:
    assert problems_of({"allowedFieldOwners": ["x"]}) == [
        "pmem-csi:allowedFieldOwners[0]: must be a mapping with manager, paths and reason"
    ]


def test_adopt_is_read_into_the_stack() -> None:
    assert load_config({"adopt": True}).adopt is True
    assert load_config({"adopt": ["Namespace storage"]}).adopt == ("Namespace storage",)
    assert load_config({}).adopt is False


def test_a_wrong_adopt_is_one_problem_under_its_key() -> None:
    assert problems_of({"adopt": 5}) == [
        'pmem-csi:adopt: must be true or a list of objects such as "Namespace pmem-csi" or '
        '"Deployment pmem-csi.intel.com" (got 5)'
    ]


def test_a_wrong_stack_setting_is_named_by_its_key() -> None:
    assert problems_of({"manageCrd": "maybe", "retainNamespaces": []}) == [
        'pmem-csi:manageCrd: must be true or false (got "maybe")',
        "pmem-csi:retainNamespaces: must be true or false (got [])",
    ]


def test_every_kind_of_problem_is_raised_together_in_one_error() -> None:
    found = problems_of(
        {
            "nope": 1,
            "deployments": [{"kubeletDir": "rel"}, {}],
            "allowedFieldOwners": "x",
            "adopt": "maybe",
            "manageCrd": "maybe",
        }
    )
    assert found == [
        "pmem-csi:nope: is not a known setting",
        'pmem-csi:deployments[0].kubeletDir: must be an absolute path (got "rel")',
        CLASH.format(i=1, name='"pmem-csi.intel.com"', j=0),
        "pmem-csi:allowedFieldOwners: must be a list of {manager, paths, reason}",
        'pmem-csi:adopt: must be true or a list of objects such as "Namespace pmem-csi" or '
        '"Deployment pmem-csi.intel.com" (got "maybe")',
        'pmem-csi:manageCrd: must be true or false (got "maybe")',
    ]


@pytest.mark.parametrize(
    ("entry", "key"),
    [
        ({"labels": {"team": "x\n"}}, "labels.team"),
        ({"labels": {"team\n": "x"}}, "labels"),
        ({"labels": {"a.com\n/team": "x"}}, "labels"),
        ({"nodeSelector": {"team": "x\n"}}, "nodeSelector.team"),
        ({"nodeResources": {"requests": {"memory": "1\n"}}}, "nodeResources.requests.memory"),
        ({"name": "pmem.example.com\n"}, "name"),
        ({"renamedFrom": "old.example.com\n", "allowReinstall": True}, "renamedFrom"),
        ({"namespace": "pmem\n"}, "namespace"),
        ({"await": {"timeout": "90s\n"}}, "await.timeout"),
    ],
)
def test_a_value_with_a_trailing_newline_is_refused(entry: dict[str, Any], key: str) -> None:
    """Python's ``$`` also matches before a final newline, so ``^...$`` with ``match`` let
    ``"x\\n"`` through each syntax check, and Kubernetes (or the provider) refused it in the
    middle of ``pulumi up``: found by the review of the config tests (issue 17)."""
    with pytest.raises(ConfigError) as err:
        load_config({"deployments": [entry]})
    assert any(p.startswith(f"pmem-csi:deployments[0].{key}") for p in err.value.problems), (
        err.value.problems
    )


def test_an_adopt_entry_with_a_trailing_newline_is_refused() -> None:
    """The same for ``pmem-csi:adopt`` refs: ``Namespace pmem\\n`` names no namespace."""
    with pytest.raises(ConfigError) as err:
        load_config({"adopt": ["Namespace pmem\n"]})
    assert any(p.startswith("pmem-csi:adopt") for p in err.value.problems), err.value.problems


@pytest.mark.parametrize(
    ("entry", "key"),
    [
        ({"image": "intel/pmem-csi-driver:v1.0.0\n"}, "image"),
        ({"provisionerImage": "k8s.gcr.io/sig-storage/csi-provisioner:v3\n"}, "provisionerImage"),
        ({"reporter": {"image": "registry.example/reporter:1\n"}}, "reporter.image"),
        ({"kubeletDir": "/var/lib/kubelet\n"}, "kubeletDir"),
    ],
)
def test_other_values_with_a_trailing_newline_are_refused_too(
    entry: dict[str, Any], key: str
) -> None:
    """The hole 748420f closed for the regex checks is open for the values without one: the
    API server refuses a container image with trailing whitespace ("must not have leading or
    trailing whitespace") in the middle of ``pulumi up``, after the namespace, RBAC and
    Secrets went in; a kubeletDir ending in a newline gives hostPaths and a
    --kubelet-registration-path that are not the kubelet's (the driver never registers)."""
    with pytest.raises(ConfigError) as err:
        load_config({"deployments": [entry]})
    assert any(p.startswith(f"pmem-csi:deployments[0].{key}") for p in err.value.problems)


def test_a_refused_value_with_a_newline_is_shown_so_that_the_newline_is_seen() -> None:
    """748420f refuses "pmem.example.com\\n", but the message shows the value with the raw
    newline: ``(got "pmem.example.com`` then ``")`` on the next line, a name that looks valid.
    (The adopt check uses repr and shows ``'pmem\\n'``; patchtypes shows ``"1Gi\\n"``.)"""
    with pytest.raises(ConfigError) as err:
        load_config({"deployments": [{"name": "pmem.example.com\n"}]})
    (problem,) = err.value.problems
    assert "\n" not in problem, problem


def test_empty_certificate_values_are_unset_for_the_model_as_for_the_check() -> None:
    """_check_certificates counts "" as unset (test_config_sections.py::
    test_empty_strings_count_as_unset: "it counts as unset, not as a field to check"), but
    Certificates.provided is ``ca_cert is not None``: five empty values (a template that
    rendered none) pass the all-or-none rule and then fail five PEM parses, each naming a
    field as "not a PEM-encoded ..." though none was given; caCert "" alone gets errors for
    four fields the user never set instead of the all-or-none message."""
    fields = ("caCert", "registryCert", "registryKey", "nodeControllerCert", "nodeControllerKey")
    stack = load_config({"deployments": [{"certificates": dict.fromkeys(fields, "")}]})
    assert stack.deployments[0].certificates.provided is False
