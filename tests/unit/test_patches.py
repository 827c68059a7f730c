"""User patches: selection, RFC 7396 merge, RFC 6902 JSON patch, secrets, error naming."""

from __future__ import annotations

import copy
from typing import Any

import pulumi
import pytest
from pulumi.runtime.rpc import is_rpc_secret, unwrap_rpc_secret, wrap_rpc_secret

from pmem_components.patches import PatchError, PatchSet, kind_of, merge_patch, select

WHERE = "pmem-csi:deployments[0].patches"


def daemonset(name: str = "pmem-csi-intel-com-node", ns: str = "pmem-csi") -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": ns, "labels": {"a": "1", "b": "2"}},
        "spec": {
            "template": {
                "spec": {
                    "containers": [
                        {"name": "pmem-driver", "image": "x", "args": ["-v=3"]},
                        {"name": "registrar", "image": "y"},
                    ]
                }
            }
        },
    }


def statefulset() -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "pmem-csi-intel-com-controller", "namespace": "pmem-csi"},
        "spec": {"replicas": 1},
    }


def args(obj: dict[str, Any], *, custom: bool = True, type_: str | None = None) -> Any:
    type_ = type_ or f"kubernetes:{obj['apiVersion']}:{obj['kind']}"
    if "/" not in type_.split(":")[1]:
        type_ = type_.replace(f":{obj['apiVersion']}:", f":core/{obj['apiVersion']}:")
    return pulumi.ResourceTransformArgs(
        custom=custom, type_=type_, name="r", props=obj, opts=pulumi.ResourceOptions()
    )


def patchset(*entries: dict[str, Any]) -> PatchSet:
    return PatchSet.from_config(list(entries), WHERE)


# --- merge patch (RFC 7396 appendix A examples) -----------------------------------------------


@pytest.mark.parametrize(
    ("target", "patch", "result"),
    [
        ({"a": "b"}, {"a": "c"}, {"a": "c"}),
        ({"a": "b"}, {"b": "c"}, {"a": "b", "b": "c"}),
        ({"a": "b"}, {"a": None}, {}),
        ({"a": "b", "b": "c"}, {"a": None}, {"b": "c"}),
        ({"a": ["b"]}, {"a": "c"}, {"a": "c"}),
        ({"a": "c"}, {"a": ["b"]}, {"a": ["b"]}),
        ({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}, {"a": {"b": "d"}}),
        ({"a": [{"b": "c"}]}, {"a": [1]}, {"a": [1]}),
        (["a", "b"], ["c", "d"], ["c", "d"]),
        ({"a": "b"}, ["c"], ["c"]),
        ({"a": "foo"}, None, None),
        ({"a": "foo"}, "bar", "bar"),
        ({"e": None}, {"a": 1}, {"e": None, "a": 1}),
        ([1, 2], {"a": "b", "c": None}, {"a": "b"}),
        ({}, {"a": {"bb": {"ccc": None}}}, {"a": {"bb": {}}}),
    ],
)
def test_merge_patch_rfc7396_examples(target: Any, patch: Any, result: Any) -> None:
    assert merge_patch(target, patch) == result


def test_merge_patch_does_not_alias_or_mutate() -> None:
    target = {"a": {"b": 1}}
    patch = {"a": {"c": [1, 2]}}
    out = merge_patch(target, patch)
    out["a"]["c"].append(3)
    assert patch == {"a": {"c": [1, 2]}}
    assert target == {"a": {"b": 1}}


# --- selection -------------------------------------------------------------------------------


def test_kind_from_type_token_or_props() -> None:
    assert kind_of("kubernetes:apps/v1:DaemonSet", {}) == "DaemonSet"
    assert kind_of("kubernetes:core/v1:Secret", {"kind": "Other"}) == "Secret"
    assert kind_of("kubernetes:pmem-csi.intel.com/v1beta1:Deployment", {}) == "Deployment"
    assert kind_of("", {"kind": "Service"}) == "Service"
    assert kind_of("pmem-csi:index:Thing", {}) is None


def test_transform_merge_patch_by_kind() -> None:
    ps = patchset({"kind": "DaemonSet", "mergePatch": {"metadata": {"labels": {"b": None}}}})
    obj = daemonset()
    original = copy.deepcopy(obj)
    result = ps.transform(args(obj))
    assert result is not None
    assert result.props["metadata"]["labels"] == {"a": "1"}
    assert obj == original  # input untouched
    assert ps.unmatched() == []


def test_transform_json_patch() -> None:
    ps = patchset(
        {
            "kind": "DaemonSet",
            "jsonPatch": [
                {"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": "-x"},
                {"op": "replace", "path": "/spec/template/spec/containers/1/image", "value": "z"},
            ],
        }
    )
    result = ps.transform(args(daemonset()))
    assert result is not None
    containers = result.props["spec"]["template"]["spec"]["containers"]
    assert containers[0]["args"] == ["-v=3", "-x"]
    assert containers[1]["image"] == "z"


def test_name_and_namespace_must_match() -> None:
    ps = patchset(
        {"kind": "DaemonSet", "name": "other", "mergePatch": {"spec": {"x": 1}}},
        {"kind": "DaemonSet", "namespace": "kube-system", "mergePatch": {"spec": {"y": 1}}},
        {
            "kind": "DaemonSet",
            "name": "pmem-csi-intel-com-node",
            "namespace": "pmem-csi",
            "mergePatch": {"spec": {"z": 1}},
        },
    )
    result = ps.transform(args(daemonset()))
    assert result is not None
    assert "x" not in result.props["spec"] and "y" not in result.props["spec"]
    assert result.props["spec"]["z"] == 1
    assert ps.unmatched() == [f"{WHERE}[0]", f"{WHERE}[1]"]
    with pytest.raises(PatchError, match=r"deployments\[0\]\.patches\[0\]"):
        ps.check_all_matched()


def test_other_kinds_and_components_pass_through() -> None:
    ps = patchset({"kind": "DaemonSet", "mergePatch": {"spec": {"x": 1}}})
    assert ps.transform(args(statefulset())) is None
    assert ps.transform(args(daemonset(), custom=False)) is None
    assert ps.unmatched() == [f"{WHERE}[0]"]


def test_entries_apply_in_order() -> None:
    ps = patchset(
        {"kind": "StatefulSet", "mergePatch": {"spec": {"replicas": 2}}},
        {
            "kind": "StatefulSet",
            "jsonPatch": [{"op": "test", "path": "/spec/replicas", "value": 2}],
        },
    )
    result = ps.transform(args(statefulset()))
    assert result is not None and result.props["spec"]["replicas"] == 2


def test_transform_usable_in_resource_options() -> None:
    """The bound method satisfies ``pulumi.ResourceTransform`` (used in ResourceOptions)."""
    ps = patchset({"kind": "DaemonSet", "mergePatch": {}})
    opts = pulumi.ResourceOptions(transforms=[ps.transform])
    assert opts.transforms == [ps.transform]


# --- secrets ---------------------------------------------------------------------------------


def test_secret_properties_stay_secret() -> None:
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "s", "namespace": "pmem-csi"},
        "stringData": wrap_rpc_secret({"tls.key": "KEY", "ca.crt": "CA"}),
    }
    ps = patchset(
        {"kind": "Secret", "mergePatch": {"stringData": {"extra": "1"}, "metadata": {"x": "y"}}}
    )
    result = ps.transform(args(secret, type_="kubernetes:core/v1:Secret"))
    assert result is not None
    assert is_rpc_secret(result.props["stringData"])
    assert unwrap_rpc_secret(result.props["stringData"]) == {
        "tls.key": "KEY",
        "ca.crt": "CA",
        "extra": "1",
    }
    assert not is_rpc_secret(result.props["metadata"])


def test_failed_patch_does_not_echo_object_content() -> None:
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "s"},
        "stringData": wrap_rpc_secret({"tls.key": "TOPSECRET"}),
    }
    ps = patchset(
        {"kind": "Secret", "jsonPatch": [{"op": "remove", "path": "/stringData/missing"}]},
    )
    with pytest.raises(PatchError) as err:
        ps.transform(args(secret, type_="kubernetes:core/v1:Secret"))
    assert "TOPSECRET" not in str(err.value)
    assert f"{WHERE}[0]" in str(err.value)
    ps = patchset(
        {
            "kind": "Secret",
            "jsonPatch": [{"op": "test", "path": "/stringData/tls.key", "value": "guess"}],
        },
    )
    with pytest.raises(PatchError) as err:
        ps.transform(args(secret, type_="kubernetes:core/v1:Secret"))
    assert "TOPSECRET" not in str(err.value)


# --- errors ----------------------------------------------------------------------------------


def test_bad_json_patch_path_names_the_entry() -> None:
    ps = patchset(
        {"kind": "StatefulSet", "mergePatch": {}},
        {"kind": "DaemonSet", "jsonPatch": [{"op": "replace", "path": "/spec/nope", "value": 1}]},
    )
    with pytest.raises(PatchError, match=r"pmem-csi:deployments\[0\]\.patches\[1\].*DaemonSet"):
        ps.transform(args(daemonset()))


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"kind": "DaemonSet"}, "exactly one of mergePatch and jsonPatch"),
        (
            {"kind": "DaemonSet", "mergePatch": {}, "jsonPatch": []},
            "exactly one of mergePatch and jsonPatch",
        ),
        ({"mergePatch": {}}, r"patches\[0\]\.kind"),
        ({"kind": "X", "mergePatch": [1]}, "mergePatch: must be an object"),
        ({"kind": "X", "jsonPatch": [{"op": "frobnicate", "path": "/a"}]}, "jsonPatch"),
        ({"kind": "X", "jsonPatch": ["add"]}, "jsonPatch"),
    ],
)
def test_malformed_entries(entry: dict[str, Any], message: str) -> None:
    with pytest.raises(PatchError, match=message):
        patchset(entry)


def test_config_model_like_objects_are_accepted() -> None:
    class Model:  # shaped like pmem_components.config.Patch
        kind = "StatefulSet"
        name = None
        namespace = None
        merge_patch = {"spec": {"replicas": 3}}  # noqa: RUF012
        json_patch = None

    result = PatchSet.from_config([Model()], WHERE).transform(args(statefulset()))
    assert result is not None and result.props["spec"]["replicas"] == 3


# --- dry run before registration -------------------------------------------------------------


def test_select_reports_unmatched_indices() -> None:
    patches = [
        {"kind": "DaemonSet", "mergePatch": {}},
        {"kind": "Deployment", "mergePatch": {}},
        {"kind": "StatefulSet", "name": "nope", "mergePatch": {}},
    ]
    assert select(patches, [daemonset(), statefulset()]) == [1, 2]


def test_dry_run_names_unmatched_and_failing_entries() -> None:
    ps = patchset(
        {"kind": "DaemonSet", "mergePatch": {"spec": {"a": 1}}},
        {"kind": "Deployment", "name": "x", "mergePatch": {}},
        {"kind": "StatefulSet", "jsonPatch": [{"op": "remove", "path": "/spec/none"}]},
    )
    objs = [daemonset(), statefulset()]
    before = copy.deepcopy(objs)
    with pytest.raises(PatchError) as err:
        ps.dry_run(objs)
    text = str(err.value)
    assert f"{WHERE}[1]: selects no object (kind='Deployment', name='x')" in text
    assert f"{WHERE}[2]" in text
    assert f"{WHERE}[0]" not in text
    assert objs == before
    assert ps.matches == {}  # the dry run does not count as transform matches


def test_dry_run_passes_and_tolerates_opaque_leaves() -> None:
    class Opaque:  # stands in for a pulumi.Output in builder output
        def __deepcopy__(self, memo: Any) -> Any:
            raise AssertionError("must not be deep-copied")

    obj = daemonset()
    obj["spec"]["template"]["spec"]["containers"][0]["image"] = Opaque()
    ps = patchset(
        {"kind": "DaemonSet", "mergePatch": {"metadata": {"labels": {"c": "3"}}}},
        {"kind": "DaemonSet", "jsonPatch": [{"op": "add", "path": "/metadata/x", "value": 1}]},
    )
    ps.dry_run([obj])


def test_for_deployment_labels() -> None:
    ps = PatchSet.for_deployment(2, [{"kind": "Service", "mergePatch": {}}])
    assert ps.unmatched() == ["pmem-csi:deployments[2].patches[0]"]


def test_selectors_tell_apps_deployments_from_the_cr() -> None:
    """``kind: Deployment`` alone is ambiguous next to the CR; apiVersion picks one."""
    from pmem_components.config import DeploymentConfig
    from pmem_components.manifests import bundle

    # With a reporter image the bundle holds both kinds named Deployment.
    config = DeploymentConfig(reporter={"image": "registry.example/reporter:1"})
    objs = bundle.build_deployment_objects(config).all()
    assert {o["apiVersion"] for o in objs if o["kind"] == "Deployment"} == {
        "apps/v1",
        "pmem-csi.intel.com/v1beta1",
    }
    ambiguous = PatchSet.from_config([{"kind": "Deployment", "mergePatch": {"x": 1}}])
    with pytest.raises(PatchError, match=r"several apiVersions \(apps/v1, pmem-csi.intel.com"):
        ambiguous.dry_run(objs)
    apps = PatchSet.from_config(
        [{"kind": "Deployment", "apiVersion": "apps/v1", "mergePatch": {"spec": {"paused": True}}}]
    )
    apps.dry_run(objs)
    # The transform sees typed resources by their type token, the CR by its apiVersion.
    reporter = next(o for o in objs if o["kind"] == "Deployment" and o["apiVersion"] == "apps/v1")
    cr = next(o for o in objs if o["kind"] == "Deployment" and o["apiVersion"] != "apps/v1")
    assert apps.apply("kubernetes:apps/v1:Deployment", reporter)["spec"]["paused"] is True
    cr_type = "kubernetes:pmem-csi.intel.com/v1beta1:Deployment"
    assert apps.apply(cr_type, cr) is None
    props = {k: v for k, v in reporter.items() if k != "apiVersion"}
    assert apps.apply("kubernetes:apps/v1:Deployment", props) is not None
    core = PatchSet.from_config([{"kind": "Secret", "apiVersion": "v1", "mergePatch": {"a": 1}}])
    assert core.apply("kubernetes:core/v1:Secret", {"metadata": {"name": "x"}}) is not None
