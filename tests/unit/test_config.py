"""Stack config: defaults, aliases, and every validation error named by its config key."""

from __future__ import annotations

from typing import Any

import pytest
from certutil import CertSet, good_set, make_ca, make_leaf, pem_key

from pmem_components import config as c
from pmem_components.config import ConfigError, load_config


def problems(raw: dict[str, Any], **kw: Any) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(raw, **kw)
    assert isinstance(info.value, ValueError)
    for p in info.value.problems:
        assert p in str(info.value)
    return info.value.problems


def one_dep(**fields: Any) -> dict[str, Any]:
    return {"deployments": [fields]}


def only_problem(raw: dict[str, Any]) -> str:
    found = problems(raw)
    assert len(found) == 1, found
    return found[0]


def test_defaults_are_the_reference_defaults() -> None:
    stack = load_config({})
    assert stack.manage_crd is True
    (d,) = stack.deployments
    assert d.name == "pmem-csi.intel.com"
    assert d.namespace == "pmem-csi"
    assert d.create_namespace is True
    assert d.image == "intel/pmem-csi-driver:canary"
    assert d.image_pull_policy == "IfNotPresent"
    assert d.provisioner_image == "k8s.gcr.io/sig-storage/csi-provisioner:v2.0.2"
    assert d.node_registrar_image == "k8s.gcr.io/sig-storage/csi-node-driver-registrar:v1.2.0"
    assert d.controller_resources.to_k8s() == {"limits": {"cpu": "100m", "memory": "250Mi"}}
    assert d.node_resources.to_k8s() == {"limits": {"cpu": "100m", "memory": "250Mi"}}
    assert d.device_mode == "lvm"
    assert d.log_level == 5
    assert d.pmem_percentage == 100
    assert d.node_selector == {"storage": "pmem"}
    assert d.labels == {}
    assert d.kubelet_dir == "/var/lib/kubelet"
    assert not d.certificates.provided
    assert d.patches == []
    # No public reporter image exists, so by default the reporter is not deployed.
    assert d.reporter.enabled is False
    assert d.reporter.image is None
    assert d.reporter.replicas == 2


def test_none_values_mean_defaults_and_empty_list_means_no_deployment() -> None:
    assert len(load_config({"deployments": None, "manageCrd": None}).deployments) == 1
    assert load_config({"deployments": []}).deployments == []


def test_every_field_is_read() -> None:
    raw = {
        "name": "pmem.example.org",
        "namespace": "storage",
        "createNamespace": False,
        "image": "img:1",
        "imagePullPolicy": "Always",
        "provisionerImage": "prov:2",
        "nodeRegistrarImage": "reg:3",
        "controllerResources": {"requests": {"cpu": "1", "memory": 100}},
        "nodeResources": {"limits": {"cpu": "2"}},
        "deviceMode": "lvm",
        "logLevel": 2,
        "pmemPercentage": 50,
        "nodeSelector": {"a": "b"},
        "labels": {"team": "x"},
        "kubeletDir": "/data/kubelet/",
        "patches": [{"kind": "DaemonSet", "mergePatch": {"spec": {}}}],
        "reporter": {"enabled": False, "image": "rep:1", "replicas": 3, "logLevel": 4},
    }
    stack = load_config({"deployments": [raw], "manageCrd": False})
    d = stack.deployments[0]
    assert stack.manage_crd is False
    assert (d.name, d.namespace, d.create_namespace) == ("pmem.example.org", "storage", False)
    assert (d.image, d.image_pull_policy) == ("img:1", "Always")
    assert (d.provisioner_image, d.node_registrar_image) == ("prov:2", "reg:3")
    assert d.controller_resources.to_k8s() == {"requests": {"cpu": "1", "memory": "100"}}
    assert d.node_resources.to_k8s() == {"limits": {"cpu": "2"}}
    assert (d.log_level, d.pmem_percentage) == (2, 50)
    assert d.node_selector == {"a": "b"} and d.labels == {"team": "x"}
    assert d.kubelet_dir == "/data/kubelet"
    assert d.patches[0].kind == "DaemonSet" and d.patches[0].merge_patch == {"spec": {}}
    assert d.reporter.model_dump(by_alias=True) == {
        "enabled": False,
        "image": "rep:1",
        "replicas": 3,
        "logLevel": 4,
    }


@pytest.mark.parametrize(
    ("reporter", "enabled"),
    [
        ({}, False),
        ({"image": "registry.example/pmem-csi-reporter:1"}, True),
        ({"image": "registry.example/pmem-csi-reporter:1", "enabled": False}, False),
        ({"enabled": False}, False),
    ],
)
def test_reporter_is_enabled_exactly_when_an_image_is_set_and_not_disabled(
    reporter: dict[str, Any], enabled: bool
) -> None:
    d = load_config(one_dep(reporter=reporter)).deployments[0]
    assert d.reporter.enabled is enabled
    # The CR spec (a model dump) never carries a null image.
    dumped = d.reporter.model_dump(by_alias=True)
    assert ("image" in dumped) is ("image" in reporter)
    assert dumped["enabled"] is enabled


def test_reporter_enabled_without_image_is_caught_for_models_built_in_code() -> None:
    dep = c.DeploymentConfig(reporter=c.Reporter(enabled=True))
    assert c.deployment_problems(dep) == [
        "pmem-csi:deployments[0].reporter.image: is required when reporter.enabled is true: "
        "there is no public reporter image; build it with `make image`, push it (see "
        "docs/reporter.md, The reporter image) and set its name here, or leave enabled unset"
    ]


def test_cross_field_rules_on_camel_case_keys_hold_for_models_built_in_code() -> None:
    """The checks read the config's keys (pmemPercentage), not the model's field names."""
    dep = c.DeploymentConfig(device_mode="direct", pmem_percentage=50)
    assert c.deployment_problems(dep, index=2) == [
        "pmem-csi:deployments[2].pmemPercentage: is only valid with deviceMode lvm "
        "(remove it or use lvm)"
    ]


def test_ndctl_is_an_alias_of_direct_and_direct_has_no_percentage() -> None:
    d = load_config(one_dep(deviceMode="ndctl")).deployments[0]
    assert d.device_mode == "direct"
    assert d.pmem_percentage is None


def test_manage_crd_accepts_config_strings() -> None:
    assert load_config({"manageCrd": "false"}).manage_crd is False


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        (
            {"deviceMode": "foo"},
            'deployments[0].deviceMode: must be one of lvm, direct (got "foo")',
        ),
        (
            {"imagePullPolicy": "Sometimes"},
            "deployments[0].imagePullPolicy: must be one of Always, Never, IfNotPresent",
        ),
        ({"logLevel": "x"}, 'deployments[0].logLevel: must be an integer (got "x")'),
        ({"logLevel": -1}, "deployments[0].logLevel: must be at least 0"),
        ({"pmemPercentage": 0}, "deployments[0].pmemPercentage: must be at least 1 (got 0)"),
        ({"pmemPercentage": 101}, "deployments[0].pmemPercentage: must be at most 100"),
        (
            {"deviceMode": "direct", "pmemPercentage": 50},
            "deployments[0].pmemPercentage: is only valid with deviceMode lvm",
        ),
        ({"image": ""}, "deployments[0].image: must not be empty"),
        ({"provisionerImage": ""}, "deployments[0].provisionerImage: must not be empty"),
        ({"nodeRegistrarImage": ""}, "deployments[0].nodeRegistrarImage: must not be empty"),
        ({"name": "Bad_Name"}, "deployments[0].name: must be a DNS subdomain"),
        ({"name": "a" * 42}, "deployments[0].name: is 42 characters; at most 41 fit"),
        ({"namespace": "kube-system"}, "deployments[0].namespace: \"kube-system\" belongs to"),
        ({"namespace": "default"}, "deployments[0].namespace: \"default\" belongs to"),
        ({"name": "9pmem.example"}, "deployments[0].name: must start with a letter"),
        (
            {"certificates": {"renewBeforeDays": 365}},
            "deployments[0].certificates.renewBeforeDays: must be less than validityDays",
        ),
        ({"namespace": "a.b"}, "deployments[0].namespace: must be a DNS label"),
        ({"createNamespace": "perhaps"}, "deployments[0].createNamespace: must be true or false"),
        ({"kubeletDir": "var/lib"}, "deployments[0].kubeletDir: must be an absolute path"),
        ({"nodeSelector": ["x"]}, "deployments[0].nodeSelector: must be a mapping"),
        ({"nodeSelector": {"a": 1}}, "deployments[0].nodeSelector.a: must be a string"),
        ({"nodeSelector": {"a": "b c"}}, "deployments[0].nodeSelector.a: is not a valid label"),
        ({"labels": {"app": "x"}}, "deployments[0].labels.app: is set by pmem-csi-pulumi"),
        (
            {"labels": {"app.kubernetes.io/instance": "x"}},
            'deployments[0].labels["app.kubernetes.io/instance"]: is set by pmem-csi-pulumi',
        ),
        ({"labels": {"-bad": "x"}}, 'deployments[0].labels["-bad"]: is not a valid label key'),
        (
            {"controllerResources": {"limits": {"cpu": "lots"}}},
            "deployments[0].controllerResources.limits.cpu: is not a Kubernetes quantity "
            '(got "lots")',
        ),
        (
            {"nodeResources": {"claims": []}},
            "deployments[0].nodeResources.claims: is not a known setting",
        ),
        ({"imagePullSecrets": []}, "deployments[0].imagePullSecrets: is not a known setting"),
        ({"patches": [{"kind": "DaemonSet"}]}, "deployments[0].patches[0]: set exactly one of"),
        (
            {"patches": [{"kind": "X", "mergePatch": {}, "jsonPatch": []}]},
            "deployments[0].patches[0]: set exactly one of mergePatch and jsonPatch",
        ),
        ({"patches": [{"mergePatch": {}}]}, "deployments[0].patches[0].kind: is required"),
        (
            {"patches": [{"kind": "X", "jsonPatch": [{"op": "bad", "path": "/a"}]}]},
            "deployments[0].patches[0].jsonPatch[0].op: must be one of add, remove",
        ),
        (
            {"patches": [{"kind": "X", "jsonPatch": [{"op": "remove", "path": "a"}]}]},
            "deployments[0].patches[0].jsonPatch[0].path: must be a JSON pointer",
        ),
        (
            {"patches": [{"kind": "X", "jsonPatch": [{"op": "add", "path": "/a"}]}]},
            "deployments[0].patches[0].jsonPatch[0].value: is required for add",
        ),
        (
            {"patches": [{"kind": "X", "jsonPatch": [{"op": "move", "path": "/a"}]}]},
            "deployments[0].patches[0].jsonPatch[0].from: is required for move",
        ),
        ({"reporter": {"replicas": 0}}, "deployments[0].reporter.replicas: must be at least 1"),
        ({"reporter": {"enabled": "x"}}, "deployments[0].reporter.enabled: must be true or false"),
        ({"reporter": {"image": ""}}, "deployments[0].reporter.image: must not be empty"),
        ({"reporter": {"other": 1}}, "deployments[0].reporter.other: is not a known setting"),
        (
            {"reporter": {"enabled": True}},
            "deployments[0].reporter.image: is required when reporter.enabled is true",
        ),
    ],
)
def test_field_errors_name_the_key(fields: dict[str, Any], expected: str) -> None:
    message = only_problem(one_dep(**fields))
    assert message.startswith(c.CONFIG_NAMESPACE + ":" + expected.split(":")[0] + ":")
    assert expected in message


def test_stack_level_errors() -> None:
    assert problems({"deployments": {"a": 1}}) == [
        "pmem-csi:deployments: must be a list of deployments"
    ]
    assert problems({"deployments": ["x"]}) == [
        'pmem-csi:deployments[0]: must be a mapping (got "x")'
    ]
    assert problems({"manageCrd": "maybe"}) == [
        'pmem-csi:manageCrd: must be true or false (got "maybe")'
    ]
    assert problems({"deployment": []}) == ["pmem-csi:deployment: is not a known setting"]


def test_names_must_be_unique_also_after_hyphenation() -> None:
    found = problems({"deployments": [{}, {"name": "pmem-csi-intel-com"}, {"name": "x"}, {}]})
    assert found == [
        'pmem-csi:deployments[1].name: "pmem-csi-intel-com" clashes with '
        "pmem-csi:deployments[0].name; deployment names must be unique "
        "(also with dots replaced by hyphens)",
        'pmem-csi:deployments[3].name: "pmem-csi.intel.com" clashes with '
        "pmem-csi:deployments[0].name; deployment names must be unique "
        "(also with dots replaced by hyphens)",
    ]


def test_every_problem_is_reported_at_once() -> None:
    found = problems(
        {
            "deployments": [
                {"deviceMode": "foo", "logLevel": "x", "labels": {"app": "y"}},
                {"name": "b", "kubeletDir": "rel", "certificates": {"caCert": "x"}},
            ],
            "manageCrd": "maybe",
        }
    )
    keys = [p.split(": ")[0] for p in found]
    assert keys == [
        "pmem-csi:deployments[0].deviceMode",
        "pmem-csi:deployments[0].logLevel",
        "pmem-csi:deployments[0].labels.app",
        "pmem-csi:deployments[1].kubeletDir",
        "pmem-csi:deployments[1].certificates",
        "pmem-csi:deployments[1].certificates.caCert",
        "pmem-csi:manageCrd",
    ]


def test_certificates_all_or_none() -> None:
    message = only_problem(
        one_dep(certificates={"caCert": certutil_pem(), "registryCert": certutil_pem()})
    )
    assert message == (
        "pmem-csi:deployments[0].certificates: set all of caCert, registryCert, registryKey, "
        "nodeControllerCert, nodeControllerKey or none of them "
        "(missing: registryKey, nodeControllerCert, nodeControllerKey)"
    )


def certutil_pem() -> str:
    return "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def test_private_keys_never_appear_in_messages() -> None:
    secret = "TOPSECRET-KEY-MATERIAL"
    found = problems(
        one_dep(certificates={"registryKey": secret, "nodeControllerKey": 12345, "caCert": secret})
    )
    text = "\n".join(found)
    assert secret not in text and "12345" not in text
    assert (
        "pmem-csi:deployments[0].certificates.registryKey: must be a PEM encoded private key"
        in (text)
    )
    assert "pmem-csi:deployments[0].certificates.nodeControllerKey: must be a string" in text


def _as_config(s: CertSet) -> dict[str, str]:
    return {
        "caCert": s.ca_cert,
        "registryCert": s.registry_cert,
        "registryKey": s.registry_key,
        "nodeControllerCert": s.node_controller_cert,
        "nodeControllerKey": s.node_controller_key,
    }


def _valid_set() -> dict[str, str]:
    return _as_config(good_set())


def test_valid_certificates_are_accepted() -> None:
    certs = _valid_set()
    d = load_config(one_dep(certificates=certs)).deployments[0]
    assert d.certificates.provided
    assert d.certificates.registry_key == certs["registryKey"]
    assert certs["registryKey"] not in repr(d)


def test_invalid_certificates_are_config_errors_naming_the_field() -> None:
    certs = _valid_set()
    certs["registryKey"] = pem_key(make_leaf(make_ca(), "x", slot=7).key)  # another key
    found = problems(one_dep(certificates=certs))
    assert any(p.startswith("pmem-csi:deployments[0].certificates.registryKey: ") for p in found)
    assert certs["registryKey"] not in "\n".join(found)


def test_certificate_check_can_be_skipped() -> None:
    certs = _valid_set()
    certs["registryKey"] = pem_key(make_leaf(make_ca(), "x", slot=7).key)
    assert load_config(one_dep(certificates=certs), check_certificates=False).deployments


def test_key_path_quotes_keys_that_are_not_identifiers() -> None:
    assert (
        c.key_path(("deployments", 0, "labels", "a/b")) == 'pmem-csi:deployments[0].labels["a/b"]'
    )
    assert c.key_path(("manageCrd",)) == "pmem-csi:manageCrd"


def test_the_longest_accepted_name_fits_every_derived_value() -> None:
    """41 characters is the limit: the controller pod's controller-revision-hash label."""
    from pmem_components import names

    longest = "p" * 30 + ".example.o"  # 40
    longest += "r"
    assert len(longest) == c.MAX_NAME_LENGTH == 41
    c.load_config({"deployments": [{"name": longest}]})
    for value in names.derived_values(longest):
        assert len(value.value) <= value.limit, value
    with pytest.raises(c.ConfigError, match="controller-revision-hash"):
        c.load_config({"deployments": [{"name": longest + "x"}]})


def test_adopt_consents_to_everything_to_the_named_objects_or_to_nothing() -> None:
    """``StackConfig.adopts``: ``true`` consents to any object, a list to the objects it
    names exactly, ``false`` (the default) to none."""
    ref, other = "Namespace pmem-csi", "Deployment pmem-csi.intel.com"
    assert load_config({"adopt": True}).adopts(ref)
    named = load_config({"adopt": [ref]})
    assert named.adopts(ref)
    assert not named.adopts(other)
    assert not named.adopts("Namespace pmem")
    assert not load_config({"adopt": False}).adopts(ref)
    assert not load_config({}).adopts(ref)
