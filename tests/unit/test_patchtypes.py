"""Types of patched objects and of string settings, checked before anything is registered.

CI's red run: ``pulumi config set --path '...nodeSelector.interrupt-gate' 253578`` stored a
number; ``pulumi up`` created the namespace and more, and only the StatefulSet's create
failed at the API server ("expected string, got ... 253578"). These tests pin that every such
value is refused by the program's own checks, naming the stack-config key and the fix, and
that nothing the API server accepts is refused.
"""

from __future__ import annotations

from typing import Any

import pytest

from pmem_components import patchtypes
from pmem_components.components import check_patches
from pmem_components.config import ConfigError, DeploymentConfig, Reporter, load_config
from pmem_components.manifests import bundle

P0 = "pmem-csi:deployments[0].patches[0]"
STS = "StatefulSet pmem-csi/pmem-csi-intel-com-controller"


def problems(*patches: dict[str, Any], **cfg: Any) -> list[str]:
    """check_patches of a deployment with ``patches``: the program's dry run, by config key."""
    return check_patches(DeploymentConfig(patches=list(patches), **cfg), 0)


def sts_merge(spec: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "StatefulSet", "mergePatch": {"spec": spec}}


def pod_merge(kind: str, pod_spec: dict[str, Any]) -> dict[str, Any]:
    return {"kind": kind, "mergePatch": {"spec": {"template": {"spec": pod_spec}}}}


# --------------------------------------------------------------------------- refused


def test_a_number_in_a_node_selector_is_refused_naming_the_key_and_the_fix() -> None:
    found = problems(pod_merge("StatefulSet", {"nodeSelector": {"interrupt-gate": 253578}}))
    key = f"{P0}.mergePatch.spec.template.spec.nodeSelector.interrupt-gate"
    assert len(found) == 1, found
    line = found[0]
    assert line.startswith(f"{key}: "), line
    assert STS in line
    assert "spec.template.spec.nodeSelector.interrupt-gate" in line.removeprefix(key)
    assert "must be a string" in line and "253578" in line
    assert f"pulumi config set --type string --path '{key}' -- 253578" in line
    assert '"253578"' in line  # or quote it in the YAML


def test_a_number_as_a_label_value_is_refused() -> None:
    found = problems({"kind": "DaemonSet", "mergePatch": {"metadata": {"labels": {"zone": 7}}}})
    assert len(found) == 1, found
    assert found[0].startswith(f"{P0}.mergePatch.metadata.labels.zone: "), found
    assert "DaemonSet pmem-csi/pmem-csi-intel-com-node" in found[0]


def test_a_number_as_an_env_value_is_refused() -> None:
    containers = [{"name": "pmem-driver", "image": "x", "env": [{"name": "N", "value": 3}]}]
    found = problems(pod_merge("DaemonSet", {"containers": containers}))
    assert found == [
        f"{P0}.mergePatch.spec.template.spec.containers[0].env[0].value: must be a string, "
        "not the number 3 (DaemonSet pmem-csi/pmem-csi-intel-com-node, field "
        "spec.template.spec.containers[0].env[0].value); quote it (\"3\") in "
        "Pulumi.<stack>.yaml, or set it with pulumi config set --type string --path "
        f"'{P0}.mergePatch.spec.template.spec.containers[0].env[0].value' -- 3"
    ]


def test_a_string_for_an_integer_field_is_refused() -> None:
    found = problems(sts_merge({"replicas": "3"}))
    assert len(found) == 1, found
    assert found[0].startswith(f"{P0}.mergePatch.spec.replicas: must be an integer"), found
    assert 'the string "3"' in found[0] and "without quotes" in found[0]


def test_a_fraction_for_an_integer_field_and_a_string_for_a_boolean_are_refused() -> None:
    found = problems(
        sts_merge({"minReadySeconds": 1.5}),
        pod_merge("DaemonSet", {"hostNetwork": "true"}),
    )
    assert len(found) == 2, found
    assert found[0].startswith(f"{P0}.mergePatch.spec.minReadySeconds: must be an integer")
    assert found[1].startswith(
        "pmem-csi:deployments[0].patches[1].mergePatch.spec.template.spec.hostNetwork: "
        "must be true or false"
    )


def test_several_mismatches_are_all_reported() -> None:
    found = problems(
        sts_merge({"replicas": "2", "template": {"spec": {"nodeSelector": {"a": 1, "b": True}}}}),
        {"kind": "Service", "mergePatch": {"metadata": {"annotations": {"x": 1}}}},
    )
    keys = sorted(line.split(": ", 1)[0] for line in found)
    # Both Services of the controller get the annotation: one line for the one mistake.
    assert keys == sorted(
        [
            f"{P0}.mergePatch.spec.replicas",
            f"{P0}.mergePatch.spec.template.spec.nodeSelector.a",
            f"{P0}.mergePatch.spec.template.spec.nodeSelector.b",
            "pmem-csi:deployments[0].patches[1].mergePatch.metadata.annotations.x",
        ]
    ), found


def test_a_json_patch_value_is_named_by_its_operation() -> None:
    ops = [
        {"op": "add", "path": "/spec/template/spec/nodeSelector/gate", "value": 5},
        {"op": "add", "path": "/spec/template/spec/containers/0/env", "value": [{"name": "A",
                                                                                "value": 1}]},
    ]
    found = problems({"kind": "DaemonSet", "jsonPatch": ops})
    keys = [line.split(": ", 1)[0] for line in found]
    assert keys == [f"{P0}.jsonPatch[0].value", f"{P0}.jsonPatch[1].value[0].value"], found


def test_a_patch_of_the_namespace_is_checked() -> None:
    found = problems({"kind": "Namespace", "mergePatch": {"metadata": {"labels": {"team": 42}}}})
    assert len(found) == 1 and found[0].startswith(f"{P0}.mergePatch.metadata.labels.team: ")


def test_a_patch_of_the_deployment_cr_is_checked_against_its_crd() -> None:
    cr = {"kind": "Deployment", "apiVersion": "pmem-csi.intel.com/v1beta1"}
    found = problems(
        {**cr, "mergePatch": {"spec": {"logLevel": "high"}, "metadata": {"labels": {"a": 1}}}}
    )
    keys = sorted(line.split(": ", 1)[0] for line in found)
    assert keys == [f"{P0}.mergePatch.metadata.labels.a", f"{P0}.mergePatch.spec.logLevel"]


def test_a_secret_value_is_never_shown() -> None:
    found = problems({"kind": "Secret", "mergePatch": {"stringData": {"ca.crt": 123456789}}})
    assert len(found) == 1, found  # one mistake, one line, naming both Secrets it hits
    (line,) = found
    assert line.startswith(f'{P0}.mergePatch.stringData["ca.crt"]: must be a string'), line
    assert line.count("Secret pmem-csi/") == 2 and "123456789" not in line, line


# --------------------------------------------------------------------------- accepted


@pytest.mark.parametrize(
    "patch",
    [
        pytest.param(sts_merge({"updateStrategy": {"rollingUpdate": {"maxUnavailable": 1}}}),
                     id="int-or-string-int"),
        pytest.param(sts_merge({"updateStrategy": {"rollingUpdate": {"maxUnavailable": "50%"}}}),
                     id="int-or-string-string"),
        pytest.param(
            pod_merge(
                "StatefulSet",
                {"containers": [{"name": "pmem-driver", "resources": {"limits": {"cpu": 2}}}]},
            ),
            id="quantity-int",
        ),
        pytest.param(
            pod_merge(
                "StatefulSet",
                {"containers": [{"name": "c", "resources": {"requests": {"cpu": 0.5}}}]},
            ),
            id="quantity-float",
        ),
        pytest.param(pod_merge("DaemonSet", {"nodeSelector": {"storage": None}}),
                     id="merge-null-deletes"),
        pytest.param(sts_merge({"replicas": 2.0}), id="integral-float-for-int"),
        pytest.param(sts_merge({"unknownField": 5}), id="unknown-field-left-to-the-api-server"),
        pytest.param(
            {"kind": "Deployment", "apiVersion": "pmem-csi.intel.com/v1beta1",
             "mergePatch": {"spec": {"controllerResources": {"limits": {"cpu": 1}}}}},
            id="cr-int-or-string",
        ),
    ],
)
def test_what_the_api_server_accepts_is_not_refused(patch: dict[str, Any]) -> None:
    assert problems(patch) == []


def test_the_builders_output_type_checks() -> None:
    """Every object the program builds has the API's types: mismatches are the patches'."""
    for cfg in (DeploymentConfig(), DeploymentConfig(reporter=Reporter(image="r:1"),
                                                     device_mode="direct")):
        for obj in bundle.build_deployment_objects(cfg).all():
            assert patchtypes.mismatches(obj) == [], obj["kind"]


@pytest.mark.parametrize(("model", "attr"), sorted(patchtypes.QUANTITY_FIELDS))
def test_each_quantity_field_is_a_string_field_of_the_clients_models(model: str, attr: str) -> None:
    """The list is by name: a renamed model or field would silently stop accepting numbers."""
    import kubernetes.client

    types = getattr(kubernetes.client, model).openapi_types
    assert types[attr] in ("str", "Dict[str, str]"), types.get(attr)


def test_a_later_patch_that_repairs_a_value_leaves_nothing_to_report() -> None:
    gate = {"nodeSelector": {"gate": 1}}
    repaired = {"nodeSelector": {"gate": "1"}}
    assert problems(pod_merge("DaemonSet", gate), pod_merge("DaemonSet", repaired)) == []


# --------------------------------------------------------------------------- string settings


@pytest.mark.parametrize(
    ("dep", "key", "shown"),
    [
        ({"nodeSelector": {"interrupt-gate": 253578}}, "nodeSelector.interrupt-gate", "253578"),
        ({"labels": {"team": 7}}, "labels.team", "7"),
        ({"image": 2}, "image", "2"),
        ({"reporter": {"image": 3}}, "reporter.image", "3"),
    ],
)
def test_a_number_for_a_string_setting_is_refused_with_the_fix(
    dep: dict[str, Any], key: str, shown: str
) -> None:
    with pytest.raises(ConfigError) as err:
        load_config({"deployments": [dep]})
    (line,) = err.value.problems
    full = f"pmem-csi:deployments[0].{key}"
    assert line.startswith(f"{full}: must be a string"), line
    assert f"pulumi config set --type string --path '{full}' -- {shown}" in line, line


def test_true_for_a_string_setting_is_refused_not_turned_into_true() -> None:
    with pytest.raises(ConfigError) as err:
        load_config({"deployments": [{"nodeSelector": {"ssd": True}}]})
    (line,) = err.value.problems
    assert "must be a string" in line and '("true")' in line, line


# --------------------------------------------------------------------------- review fixes

ENV = "/spec/template/spec/containers/0/env"
DS_NODE = "DaemonSet pmem-csi/pmem-csi-intel-com-node"


def keys_of(found: list[str]) -> list[str]:
    return [line.split(": ", 1)[0] for line in found]


def test_two_appends_blame_the_operation_that_added_the_value() -> None:
    ops = [
        {"op": "add", "path": f"{ENV}/-", "value": {"name": "A", "value": 1}},
        {"op": "add", "path": f"{ENV}/-", "value": {"name": "B", "value": "ok"}},
    ]
    found = problems({"kind": "DaemonSet", "jsonPatch": ops})
    assert keys_of(found) == [f"{P0}.jsonPatch[0].value.value"], found
    assert f"--path '{P0}.jsonPatch[0].value.value'" in found[0], found


@pytest.mark.parametrize(
    "later",
    [
        pytest.param({"op": "add", "path": f"{ENV}/0", "value": {"name": "B", "value": "ok"}},
                     id="insert-before"),
        pytest.param({"op": "remove", "path": f"{ENV}/0"}, id="remove-before"),
    ],
)
def test_a_later_patch_shifting_the_list_does_not_take_the_blame(later: dict[str, Any]) -> None:
    first = {"op": "add", "path": f"{ENV}/1", "value": {"name": "A", "value": 1}}
    found = problems(
        {"kind": "DaemonSet", "jsonPatch": [first]},
        {"kind": "DaemonSet", "jsonPatch": [later]},
    )
    assert keys_of(found) == [f"{P0}.jsonPatch[0].value.value"], found


def test_a_merge_patch_value_shifted_by_a_later_patch_is_blamed_on_the_merge_patch() -> None:
    found = problems(
        {"kind": "DaemonSet", "mergePatch": {"metadata": {"labels": {"a": 1}}}},
        {"kind": "DaemonSet",
         "jsonPatch": [{"op": "add", "path": f"{ENV}/0", "value": {"name": "B", "value": "x"}}]},
    )
    assert keys_of(found) == [f"{P0}.mergePatch.metadata.labels.a"], found


def test_a_copied_value_names_where_it_is_copied_from_and_gives_no_quoting_advice() -> None:
    ops = [{"op": "copy", "from": "/spec/replicas", "path": "/metadata/labels/r"}]
    (line,) = problems({"kind": "StatefulSet", "jsonPatch": ops})
    assert line.startswith(f"{P0}.jsonPatch[0]: must be a string"), line
    assert "copied from /spec/replicas" in line, line
    assert "quote" not in line and "config set" not in line, line


def test_a_chain_of_operations_blames_the_one_that_wrote_the_value() -> None:
    ops = [
        {"op": "add", "path": "/metadata/labels/a", "value": 1},
        {"op": "copy", "from": "/metadata/labels/a", "path": "/metadata/labels/b"},
    ]
    found = problems({"kind": "StatefulSet", "jsonPatch": ops})
    assert keys_of(found) == [f"{P0}.jsonPatch[0].value", f"{P0}.jsonPatch[1]"], found
    assert "quote it" in found[0]
    assert "copied from /metadata/labels/a" in found[1] and "quote" not in found[1], found
    assert f"where {P0}.jsonPatch[0].value wrote it" in found[1], found


@pytest.mark.parametrize(
    "patch",
    [
        pytest.param(sts_merge({"replicas": "three"}), id="replicas"),
        pytest.param({"kind": "Deployment", "apiVersion": "pmem-csi.intel.com/v1beta1",
                      "mergePatch": {"spec": {"logLevel": "high"}}}, id="cr-log-level"),
        pytest.param({"kind": "Service", "name": "pmem-csi-intel-com-metrics",
                      "mergePatch": {"spec": {"ports": [{"port": "metrics"}]}}},
                     id="service-port"),
        pytest.param(pod_merge("DaemonSet", {"hostNetwork": "yes"}), id="bool"),
    ],
)
def test_without_quotes_is_said_only_of_strings_that_are_numbers_or_booleans(
    patch: dict[str, Any],
) -> None:
    (line,) = problems(patch)
    assert "must be" in line and "without quotes" not in line, line


def test_a_fraction_for_an_int_or_string_gets_the_quoting_hint() -> None:
    cr = {"kind": "Deployment", "apiVersion": "pmem-csi.intel.com/v1beta1"}
    (line,) = problems(
        {**cr, "mergePatch": {"spec": {"controllerResources": {"limits": {"cpu": 0.5}}}}}
    )
    assert 'quote it ("0.5")' in line, line


def test_the_suggested_command_ends_options_before_a_negative_number() -> None:
    (line,) = problems({"kind": "DaemonSet", "mergePatch": {"metadata": {"labels": {"a-b": -5}}}})
    key = f"{P0}.mergePatch.metadata.labels.a-b"
    assert f"pulumi config set --type string --path '{key}' -- -5" in line, line


def test_a_string_with_a_newline_stays_one_line() -> None:
    found = problems(sts_merge({"replicas": "3\nreplicas: 4"}))
    assert len(found) == 1, found
    assert '"3\\nreplicas: 4"' in found[0], found


def test_the_type_check_walks_each_object_once_when_nothing_is_wrong(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []
    real = patchtypes.mismatches

    def counting(obj: Any) -> Any:
        calls.append(obj["kind"])
        return real(obj)

    monkeypatch.setattr(patchtypes, "mismatches", counting)
    labels = {"metadata": {"labels": {"a": "1"}}}
    assert problems(*[{"kind": "DaemonSet", "mergePatch": labels}] * 5) == []
    assert calls == ["DaemonSet"], calls


def test_a_value_of_a_secret_config_key_is_not_shown() -> None:
    import contextvars

    import pulumi.runtime.config as runtime_config

    def run() -> list[str]:
        runtime_config._SECRET_KEYS.set({"pmem-csi:deployments"})
        return problems(pod_merge("DaemonSet", {"nodeSelector": {"gate": 253578}}))

    (line,) = contextvars.copy_context().run(run)
    assert "must be a string" in line and "253578" not in line, line


def test_a_label_named_str_keeps_its_key() -> None:
    with pytest.raises(ConfigError) as err:
        load_config({"deployments": [{"labels": {"str": 7, "int": 8}}]})
    keys = sorted(line.split(": ", 1)[0] for line in err.value.problems)
    assert keys == ["pmem-csi:deployments[0].labels.int", "pmem-csi:deployments[0].labels.str"]


def test_a_value_moved_by_a_later_patch_names_the_patch_that_wrote_it() -> None:
    move = {"op": "move", "from": "/metadata/labels/a", "path": "/metadata/labels/b"}
    (line,) = problems(
        {"kind": "StatefulSet", "mergePatch": {"metadata": {"labels": {"a": 1}}}},
        {"kind": "StatefulSet", "jsonPatch": [move]},
    )
    assert line.startswith("pmem-csi:deployments[0].patches[1].jsonPatch[0]: "), line
    assert f"moved from /metadata/labels/a, where {P0}.mergePatch.metadata.labels.a wrote" in line
    assert "quote" not in line, line
