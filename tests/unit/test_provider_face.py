"""The component provider's typed face: every deployment field, the same defaults and rules.

``pmem_components.provider_face`` serves the Python component to other languages; its schema
is inferred by the Python SDK from the TypedDicts. These tests hold that schema to the stack
config model (every field of a ``pmem-csi:deployments`` entry, by the same camelCase name,
nothing else but the component's own ``retainNamespace``, ``takeOverFields`` and
``allowedFieldOwners``), the defaults and messages to ``pmem_components.config``, and the
outputs to the Python component's.
"""

from __future__ import annotations

import json
from typing import Any

import pulumi
import pytest
from pulumi.provider.experimental.component import ComponentProvider
from pydantic import BaseModel

from pmem_components import components, config, provider_face


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    provider = ComponentProvider(
        provider_face.SERVED_COMPONENTS, provider_face.PACKAGE_NAME, None, "0.0.0"
    )
    return json.loads(provider.schema or "{}")


def _model_keys(model: type[BaseModel]) -> set[str]:
    return {f.validation_alias or config.to_camel(n) for n, f in model.model_fields.items()}  # type: ignore[misc]


def _nested(model: type[BaseModel], field: str) -> type[BaseModel]:
    annotation = model.model_fields[field].annotation
    args = getattr(annotation, "__args__", ())
    return next(a for a in (annotation, *args) if isinstance(a, type) and issubclass(a, BaseModel))


def test_the_served_type_is_the_python_components(schema: dict[str, Any]) -> None:
    # Beside it: PmemCsiCrd and PmemCsiReporter (tests/unit/test_served_crd_reporter.py).
    assert components.COMPONENT_TYPE in schema["resources"]
    assert schema["name"] == "pmem-csi"
    assert schema["resources"][components.COMPONENT_TYPE]["isComponent"] is True


def test_every_field_of_a_deployment_entry_is_an_input_by_its_config_name(
    schema: dict[str, Any],
) -> None:
    inputs = schema["resources"][components.COMPONENT_TYPE]["inputProperties"]
    component_own = {"retainNamespace", "takeOverFields", "allowedFieldOwners"}
    assert set(inputs) == _model_keys(config.DeploymentConfig) | component_own
    # All optional: a missing field takes the stack config's default.
    assert not schema["resources"][components.COMPONENT_TYPE].get("requiredInputs")
    nested = {
        "certificates": ("certificates", "CertificatesArgs"),
        "reporter": ("reporter", "ReporterArgs"),
        "await_": ("await", "AwaitArgs"),
        "controller_resources": ("controllerResources", "ResourceRequirementsArgs"),
        "patches": ("patches", "PatchArgs"),
    }
    for field, (key, type_name) in nested.items():
        model = _nested(config.DeploymentConfig, field)
        prop = inputs[key]
        ref = (prop.get("items") or prop)["$ref"]
        assert ref == f"#/types/pmem-csi:index:{type_name}"
        served = schema["types"][f"pmem-csi:index:{type_name}"]["properties"]
        assert set(served) == _model_keys(model), key


def test_outputs_are_the_python_components(schema: dict[str, Any]) -> None:
    # PmemCsiDeployment.register_outputs: namespace, objectNames, caCert.
    outputs = schema["resources"][components.COMPONENT_TYPE]["properties"]
    assert outputs == {
        "namespace": {"description": "The driver's namespace.", "type": "string"},
        "objectNames": {
            "description": "The names of the deployment's objects, by role.",
            "type": "object",
            "additionalProperties": {
                "description": "The names of the deployment's objects, by role.",
                "type": "string",
            },
        },
        "caCert": {
            "description": "The CA certificate (PEM) the driver's certificates are signed with.",
            "type": "string",
        },
    }


def test_no_args_are_the_stack_configs_default_deployment() -> None:
    assert provider_face.deployment_config("d", {}) == config.DeploymentConfig()


def test_args_become_the_config_entry_with_free_form_keys_kept() -> None:
    args = {
        "device_mode": "direct",
        "node_selector": {"storage_kind": "pmem"},
        "controller_resources": {"limits": {"cpu": "1"}},
        "certificates": {"validity_days": 10, "renew_before_days": 1},
        "patches": [{"kind": "DaemonSet", "merge_patch": {"spec": {"min_ready": 1}}}],
        "await": {"enabled": False},
    }
    assert provider_face.to_config_entry(args) == {
        "deviceMode": "direct",
        "nodeSelector": {"storage_kind": "pmem"},
        "controllerResources": {"limits": {"cpu": "1"}},
        "certificates": {"validityDays": 10, "renewBeforeDays": 1},
        "patches": [{"kind": "DaemonSet", "mergePatch": {"spec": {"min_ready": 1}}}],
        "await": {"enabled": False},
    }
    cfg = provider_face.deployment_config("d", args)
    entry = provider_face.to_config_entry(args)
    assert cfg == config.load_config({"deployments": [entry]}).deployments[0]


def _problems(args: dict[str, Any]) -> list[str]:
    with pytest.raises(provider_face.ArgsError) as caught:
        provider_face.deployment_config("driver", args)
    assert str(caught.value).startswith(
        f"invalid args of PmemCsiDeployment 'driver' ({len(caught.value.problems)} problem(s)):"
    )
    return caught.value.problems


def test_the_config_rules_apply_named_by_the_args_field_path() -> None:
    entry = {"deviceMode": "pmem", "labels": {"app": "x"}, "await": {"timeout": "soon"}}
    stack_problems = _stack_problems(entry)
    got = _problems({"device_mode": "pmem", "labels": {"app": "x"}, "await": {"timeout": "soon"}})
    assert got == [
        'deviceMode: must be one of lvm, direct (got "pmem")',
        "labels.app: is set by pmem-csi-pulumi itself and cannot be configured",
        'await.timeout: must be a positive duration such as 90s, 20m or 1h30m (got "soon")',
    ]
    # The stack config's own messages, with the field path instead of the config key.
    assert got == [p.replace("pmem-csi:deployments[0].", "") for p in stack_problems]


def _stack_problems(entry: dict[str, Any]) -> list[str]:
    with pytest.raises(config.ConfigError) as caught:
        config.load_config({"deployments": [entry]})
    return caught.value.problems


def test_patches_are_dry_run_against_the_objects_named_by_field_path() -> None:
    got = _problems({"patches": [{"kind": "NoSuchKind", "merge_patch": {"a": 1}}]})
    assert len(got) == 1 and got[0].startswith("patches[0]"), got


def test_another_resources_output_or_a_secret_is_refused_by_field() -> None:
    unknown = pulumi.Output.from_input("x")
    got = _problems({"name": "a.b", "certificates": {"ca_cert": unknown}})
    assert got == _problems({"name": "a.b", "certificates": {"ca_cert": pulumi.Output.secret("x")}})
    assert got == [
        "certificates.caCert: must be a plain value known when the program runs (not another "
        "resource's output, not a secret)"
    ]


def _wire(inputs: dict[str, Any], deps: dict[str, list[str]] | None = None) -> dict[str, Any]:
    """The inputs as the provider's Construct receives them: unmarshalled by the SDK's server."""
    import asyncio

    from google.protobuf import struct_pb2
    from pulumi.provider.server import ProviderServicer
    from pulumi.runtime.proto import provider_pb2

    s = struct_pb2.Struct()
    s.update(inputs)
    idep = {
        k: provider_pb2.ConstructRequest.PropertyDependencies(urns=urns)
        for k, urns in (deps or {}).items()
    }
    return asyncio.run(ProviderServicer._construct_inputs(s, idep))


from pulumi.runtime import rpc as _rpc  # noqa: E402

_SIG = _rpc._special_sig_key
_SECRET = _rpc._special_secret_sig
_OUTPUT = _rpc._special_output_value_sig
_PEM = "-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----"
_KEY = "-----BEGIN PRIVATE KEY-----\nx\n-----END PRIVATE KEY-----"
_CERTS = {
    "caCert": _PEM,
    "registryCert": _PEM,
    "nodeControllerCert": _PEM,
    "nodeControllerKey": _KEY,
}


@pytest.mark.parametrize(
    ("inputs", "deps", "path"),
    [
        (
            {"certificates": {**_CERTS, "registryKey": {_SIG: _SECRET, "value": _KEY}}},
            None,
            "certificates",  # the SDK's unmarshalling lifts a nested secret to its object
        ),
        (
            {
                "certificates": {
                    _SIG: _OUTPUT,
                    "secret": True,
                    "value": {**_CERTS, "registryKey": _KEY},
                }
            },
            None,
            "certificates",
        ),
        ({"await": {"enabled": False}}, {"await": ["urn:pulumi:s::p::t::r"]}, "await"),
        (
            {"controllerResources": {"limits": {"cpu": "2"}}},
            {"controllerResources": ["urn:pulumi:s::p::t::r"]},
            "controllerResources",
        ),
    ],
)
def test_a_nested_secret_or_output_is_refused_before_the_sdk_maps_it_to_nothing(
    inputs: dict[str, Any], deps: dict[str, list[str]] | None, path: str
) -> None:
    """The SDK's map_inputs replaces an Output in a nested-object field by ``{}``: provided
    certificates would be dropped (a new CA generated), limits lost, await turned on."""
    from pulumi.errors import InputPropertiesError

    prov = provider_face.FaceProvider(
        provider_face.SERVED_COMPONENTS, provider_face.PACKAGE_NAME, None, "0.0.0"
    )
    with pytest.raises(InputPropertiesError) as err:
        prov.map_inputs(_wire(inputs, deps), prov._component_defs["PmemCsiDeployment"])
    assert [e["property_path"] for e in err.value.errors or []] == [path]
    assert "not another resource's output, not a secret" in (err.value.errors or [])[0]["reason"]


def test_plain_nested_inputs_map_unchanged() -> None:
    prov = provider_face.FaceProvider(
        provider_face.SERVED_COMPONENTS, provider_face.PACKAGE_NAME, None, "0.0.0"
    )
    mapped = prov.map_inputs(
        _wire({"controllerResources": {"limits": {"cpu": "2"}}, "await": {"enabled": False}}),
        prov._component_defs["PmemCsiDeployment"],
    )
    cfg = provider_face.deployment_config("d", mapped)
    assert cfg.controller_resources.limits == {"cpu": "2"}
    assert cfg.await_.enabled is False


def test_the_plugin_entry_point_serves_the_face_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    served: list[Any] = []
    monkeypatch.setattr(provider_face, "_provider_main", lambda prov, args: served.append(prov))
    provider_face.serve(version="1.2.3")
    assert [type(p) for p in served] == [provider_face.FaceProvider]


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ({"adopt_namespace": True}, "adoptNamespace"),
        ({"allow_reinstall": True}, "allowReinstall"),
        ({"renamed_from": "old.example.com"}, "renamedFrom"),
        ({"allow_device_mode_change": True}, "allowDeviceModeChange"),
    ],
)
def test_a_preflight_flag_is_refused_as_honoured_by_the_python_program_only(
    args: dict[str, Any], field: str
) -> None:
    """The face runs no preflight, so these flags would be accepted and do nothing."""
    [problem] = _problems(args)
    assert problem.startswith(f"{field}: ")
    assert "Python stack program only" in problem
    assert "preflight" in problem


@pytest.mark.parametrize(
    ("reporter", "field"),
    [
        ({"image": "example.com/reporter:1"}, "reporter.image"),
        ({"enabled": True, "image": "example.com/reporter:1"}, "reporter.enabled"),
    ],
)
def test_a_reporter_is_refused_as_deployed_by_the_python_program_only(
    reporter: dict[str, Any], field: str
) -> None:
    [problem] = _problems({"reporter": reporter})
    assert problem.startswith(f"{field}: ")
    assert "Python stack program only" in problem


def test_flags_left_off_and_a_disabled_reporter_are_accepted() -> None:
    provider_face.deployment_config(
        "driver",
        {
            "adopt_namespace": False,
            "allow_reinstall": False,
            "allow_device_mode_change": False,
            "reporter": {"enabled": False, "replicas": 3},
        },
    )


def _mapped(inputs: dict[str, Any]) -> dict[str, Any]:
    prov = provider_face.FaceProvider(
        provider_face.SERVED_COMPONENTS, provider_face.PACKAGE_NAME, None, "0.0.0"
    )
    return prov.map_inputs(_wire(inputs), prov._component_defs["PmemCsiDeployment"])


def test_a_null_in_a_merge_patch_never_reaches_the_provider() -> None:
    """Pins the SDK's behaviour the docs state: the unmarshalling drops nulls in objects, so a
    merge patch cannot delete a field from the provider (docs/yaml-and-other-languages.md)."""
    patch = {"metadata": {"labels": {"app.kubernetes.io/part-of": None, "x": "y"}}}
    cfg = provider_face.deployment_config(
        "d", _mapped({"patches": [{"kind": "DaemonSet", "mergePatch": patch}]})
    )
    assert [p.merge_patch for p in cfg.patches] == [{"metadata": {"labels": {"x": "y"}}}]


def test_a_json_patch_value_of_null_is_refused_saying_that_nulls_do_not_arrive() -> None:
    op = {"op": "add", "path": "/metadata/annotations/x", "value": None}
    with pytest.raises(provider_face.ArgsError) as caught:
        provider_face.deployment_config(
            "d", _mapped({"patches": [{"kind": "DaemonSet", "jsonPatch": [op]}]})
        )
    [problem] = caught.value.problems
    assert problem.startswith("patches[0].jsonPatch[0].value: is required for add")
    assert "null" in problem


def test_a_wrong_type_message_has_no_stack_config_advice() -> None:
    """config.string_fix says how to quote the value in Pulumi.<stack>.yaml or with pulumi
    config set: advice for the stack config, not for a program passing args."""
    assert _problems({"labels": {"tier": 1}, "image": 5}) == [
        "image: must be a string (got 5)",
        "labels.tier: must be a string (got 1)",
    ]


def test_a_patch_type_message_has_no_stack_config_advice() -> None:
    assert _problems(
        {"patches": [{"kind": "StatefulSet", "merge_patch": {"spec": {"replicas": "2"}}}]}
    ) == [
        'patches[0].mergePatch.spec.replicas: must be an integer, not the string "2" '
        "(StatefulSet pmem-csi/pmem-csi-intel-com-controller, field spec.replicas); "
        "write it without quotes"
    ]
