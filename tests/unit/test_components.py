"""Components and program under Pulumi mocks: what gets registered, with which inputs.

Mocks do not run an engine: no transforms, no API server. What they do show is the resource
graph the program builds: types, names, inputs, secrecy of outputs and stack outputs.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pulumi
import pytest
from certutil import good_set
from pulumi.runtime.rpc import is_rpc_secret, unwrap_rpc_secret
from pulumi_mocks import RecordingMocks, project_config

from pmem_components import names
from pmem_components.config import ConfigError, StackConfig, load_config
from pmem_components.manifests import bundle, node
from pmem_components.manifests.crd import load_crd

FAKE_CERTS = {
    "ca_cert": "GENERATED-CA",
    "registry_cert": "GENERATED-RC",
    "registry_key": "GENERATED-RK",
    "node_controller_cert": "GENERATED-NC",
    "node_controller_key": "GENERATED-NK",
}


class Mocks(RecordingMocks):
    def __init__(self) -> None:
        super().__init__(FAKE_CERTS)

    def of_type(self, typ: str) -> list[pulumi.runtime.MockResourceArgs]:
        return [r for r in self.resources if r.typ == typ]

    def one(self, typ: str, name: str | None = None) -> pulumi.runtime.MockResourceArgs:
        found = [r for r in self.of_type(typ) if name is None or r.name == name]
        assert len(found) == 1, (typ, name, [r.name for r in self.of_type(typ)])
        return found[0]


@pytest.fixture
def mocks() -> Iterator[Mocks]:
    """Pulumi mocks, and the stack config every stack of this project has (Pulumi.yaml):
    ``kubernetes:enableSecretMutable``, which the component asks of the default provider."""
    m = Mocks()
    pulumi.runtime.set_mocks(m, project="pmem-csi-pulumi", stack="unit", preview=False)
    with project_config():
        yield m


def stack(*deployments: dict[str, Any], manage_crd: bool = True) -> StackConfig:
    return load_config({"deployments": list(deployments), "manageCrd": manage_crd})


def deploy(s: StackConfig) -> dict[str, Any]:
    from pmem_components.program import deploy as program_deploy

    return program_deploy(s)


def settle(value: Any, check: Callable[[Any], None]) -> Callable[[], None]:
    """Resolve ``value``; ``check`` runs after every registration finished (see ``run``)."""
    box: dict[str, Any] = {}
    pulumi.Output.from_input(value).apply(lambda v: box.setdefault("v", v))
    return lambda: check(box["v"])


def nothing_registered(mocks: Mocks) -> Callable[[], None]:
    """The check for a component that refused its config: ``run`` calls it only once every
    registration the program started has reached the mocks, so one sent just before the
    error (a child registered, then the raise) is seen; asserted at once it would not be."""

    def check() -> None:
        assert [(r.typ, r.name) for r in mocks.resources] == []

    return check


def run(program: Callable[[], Callable[[], None] | None]) -> None:
    """Run ``program`` under the mocks, wait for all registrations, then run its check."""
    after: list[Callable[[], None] | None] = []

    @pulumi.runtime.test
    def inner() -> None:
        after.append(program())

    inner()
    if after and after[0] is not None:
        after[0]()


def secret_value(value: Any) -> Any:
    """The payload of a value the SDK sent as secret; fails when it is not secret."""
    assert is_rpc_secret(value), "expected a secret value"
    return unwrap_rpc_secret(value)


EXPECTED_TYPES = {
    "kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition": 1,
    "kubernetes:core/v1:Namespace": 1,
    "kubernetes:core/v1:Secret": 2,
    "kubernetes:storage.k8s.io/v1:CSIDriver": 1,
    "kubernetes:apps/v1:StatefulSet": 1,
    "kubernetes:apps/v1:DaemonSet": 1,
    "kubernetes:pmem-csi.intel.com/v1beta1:Deployment": 1,
    "pmem-csi:index:PmemCsiDeployment": 1,
    "pmem-csi:index:ControllerDriver": 1,
    "pmem-csi:index:NodeDriver": 1,
    "pmem-csi:index:DriverCertificates": 1,
}


def test_stack_with_a_reporter_image_registers_every_object(mocks: Mocks) -> None:
    run(lambda: _test_stack_with_a_reporter_image_registers_every_object(mocks))


def _test_stack_with_a_reporter_image_registers_every_object(mocks: Mocks) -> Any:
    # Defaults everywhere but the reporter's image, which has no default (see config.Reporter).
    outputs = deploy(stack({"reporter": {"image": "registry.example/pmem-csi-reporter:1"}}))

    def check(_: Any) -> None:
        counts: dict[str, int] = {}
        for r in mocks.resources:
            counts[r.typ] = counts.get(r.typ, 0) + 1
        for typ, n in EXPECTED_TYPES.items():
            assert counts.get(typ) == n, (typ, counts)
        # Controller objects, reporter objects included, by kind and name.
        got = {
            (r.typ.rsplit(":", 1)[-1], r.inputs["metadata"]["name"])
            for r in mocks.resources
            if r.typ.startswith("kubernetes:")
        }
        h = "pmem-csi-intel-com"
        for kind, name in [
            ("ServiceAccount", f"{h}-controller"),
            ("Role", f"{h}-external-provisioner-cfg"),
            ("RoleBinding", f"{h}-csi-provisioner-role-cfg"),
            ("ClusterRole", f"{h}-external-provisioner-runner"),
            ("ClusterRoleBinding", f"{h}-csi-provisioner-role"),
            ("Service", f"{h}-controller"),
            ("Service", f"{h}-metrics"),
            ("StatefulSet", f"{h}-controller"),
            ("DaemonSet", f"{h}-node"),
            ("Secret", f"{h}-registry-secrets"),
            ("Secret", f"{h}-node-secrets"),
            ("CSIDriver", "pmem-csi.intel.com"),
            ("Deployment", "pmem-csi.intel.com"),
            ("Deployment", f"{h}-reporter"),
            ("Namespace", "pmem-csi"),
            ("CustomResourceDefinition", names.CRD_NAME),
        ]:
            assert (kind, name) in got, (kind, name)

    return settle(outputs, check)


def test_crd_takes_over_conflicting_fields_when_managed_here(mocks: Mocks) -> None:
    run(lambda: _test_crd_takes_over_conflicting_fields_when_managed_here(mocks))


def _test_crd_takes_over_conflicting_fields_when_managed_here(mocks: Mocks) -> Any:
    outputs = deploy(stack({}))

    def check(_: Any) -> None:
        crd = mocks.one("kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition")
        assert crd.inputs["metadata"]["annotations"] == {"pulumi.com/patchForce": "true"}
        assert crd.inputs["spec"] == load_crd()["spec"]

    return settle(outputs, check)


def test_resources_get_exactly_the_builder_dicts(mocks: Mocks) -> None:
    run(lambda: _test_resources_get_exactly_the_builder_dicts(mocks))


def _test_resources_get_exactly_the_builder_dicts(mocks: Mocks) -> Any:
    s = stack({"name": "a.b", "namespace": "ns1", "labels": {"t": "1"}, "deviceMode": "direct"})
    outputs = deploy(s)

    def check(_: Any) -> None:
        ds = mocks.one("kubernetes:apps/v1:DaemonSet")
        expected = node.build_node_daemonset(s.deployments[0])
        assert ds.name == "ns1/a-b-node"
        # The component adds what is Pulumi's business: foreground deletion of the workload,
        # forced applies (takeOverFields, on by default), the digest of the CR spec it
        # implements (the reporter's generation check) and the certificates' fingerprint in
        # the pod template.
        cr = mocks.one("kubernetes:pmem-csi.intel.com/v1beta1:Deployment")
        policy = {
            "pulumi.com/deletionPropagationPolicy": "foreground",
            "pulumi.com/patchForce": "true",
            names.SPEC_DIGEST_ANNOTATION: names.spec_digest(cr.inputs["spec"]),
        }
        assert ds.inputs["metadata"] == {**expected["metadata"], "annotations": policy}
        template = expected["spec"]["template"]["metadata"]
        template["annotations"][bundle.CERTIFICATES_HASH_ANNOTATION] = (
            bundle.certificates_fingerprint("GENERATED-CA", "GENERATED-RC", "GENERATED-NC")
        )
        assert ds.inputs["spec"] == expected["spec"]
        assert cr.inputs["spec"]["deviceMode"] == "direct"
        assert cr.inputs["spec"]["namespace"] == "ns1"
        assert cr.inputs["metadata"]["name"] == "a.b"

    return settle(outputs, check)


def test_generated_certificates_fill_the_secrets(mocks: Mocks) -> None:
    run(lambda: _test_generated_certificates_fill_the_secrets(mocks))


def _test_generated_certificates_fill_the_secrets(mocks: Mocks) -> Any:
    outputs = deploy(stack({}))

    def check(resolved: Any) -> None:
        reg = mocks.one("kubernetes:core/v1:Secret", "pmem-csi/pmem-csi-intel-com-registry-secrets")
        nod = mocks.one("kubernetes:core/v1:Secret", "pmem-csi/pmem-csi-intel-com-node-secrets")
        assert reg.inputs["type"] == "kubernetes.io/tls"
        assert secret_value(reg.inputs["stringData"]) == {
            "ca.crt": "GENERATED-CA",
            "tls.crt": "GENERATED-RC",
            "tls.key": "GENERATED-RK",
        }
        assert secret_value(nod.inputs["stringData"])["tls.key"] == "GENERATED-NK"
        text = json.dumps(resolved)
        assert "GENERATED-RK" not in text and "GENERATED-NK" not in text
        assert "GENERATED-CA" in text
        cr = mocks.one("kubernetes:pmem-csi.intel.com/v1beta1:Deployment")
        assert "caCert" not in cr.inputs["spec"]

    return settle(outputs, check)


def test_stack_outputs(mocks: Mocks) -> None:
    run(lambda: _test_stack_outputs(mocks))


def _test_stack_outputs(mocks: Mocks) -> Any:
    outputs = deploy(stack({}, {"name": "second.example", "namespace": "other"}))

    def check(resolved: dict[str, Any]) -> None:
        assert set(resolved) == {"pmem-csi.intel.com", "second.example"}
        first = resolved["pmem-csi.intel.com"]
        assert first["namespace"] == "pmem-csi"
        assert first["caCert"] == "GENERATED-CA"
        assert first["objectNames"] == bundle.object_names(stack({}).deployments[0])
        assert resolved["second.example"]["objectNames"]["nodeDaemonSet"] == "second-example-node"

    return settle(outputs, check)


def test_provided_certificates_are_used_and_public_parts_recorded(mocks: Mocks) -> None:
    run(lambda: _test_provided_certificates_are_used_and_public_parts_recorded(mocks))


def _test_provided_certificates_are_used_and_public_parts_recorded(mocks: Mocks) -> Any:
    cs = good_set()
    certs = {
        "caCert": cs.ca_cert,
        "registryCert": cs.registry_cert,
        "registryKey": cs.registry_key,
        "nodeControllerCert": cs.node_controller_cert,
        "nodeControllerKey": cs.node_controller_key,
    }
    outputs = deploy(stack({"certificates": certs}))

    def check(resolved: dict[str, Any]) -> None:
        assert not mocks.of_type("pulumi-python:dynamic:Resource")
        reg = mocks.one("kubernetes:core/v1:Secret", "pmem-csi/pmem-csi-intel-com-registry-secrets")
        assert secret_value(reg.inputs["stringData"]) == {
            "ca.crt": cs.ca_cert,
            "tls.crt": cs.registry_cert,
            "tls.key": cs.registry_key,
        }
        cr = mocks.one("kubernetes:pmem-csi.intel.com/v1beta1:Deployment")
        assert "caCert" in cr.inputs["spec"] and "registryKey" not in cr.inputs["spec"]
        assert cs.registry_key not in json.dumps(cr.inputs)
        assert resolved["pmem-csi.intel.com"]["caCert"] == cs.ca_cert

    return settle(outputs, check)


def test_crd_left_alone_when_managed_elsewhere(mocks: Mocks) -> None:
    run(lambda: _test_crd_left_alone_when_managed_elsewhere(mocks))


def _test_crd_left_alone_when_managed_elsewhere(mocks: Mocks) -> Any:
    outputs = deploy(stack({}, manage_crd=False))

    def check(_: Any) -> None:
        assert not mocks.of_type("kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition")
        assert mocks.of_type("kubernetes:pmem-csi.intel.com/v1beta1:Deployment")

    return settle(outputs, check)


def test_shared_namespace_is_created_once(mocks: Mocks) -> None:
    run(lambda: _test_shared_namespace_is_created_once(mocks))


def _test_shared_namespace_is_created_once(mocks: Mocks) -> Any:
    outputs = deploy(stack({"name": "a"}, {"name": "b"}, {"name": "c", "namespace": "x"}))

    def check(_: Any) -> None:
        names_ = sorted(r.name for r in mocks.of_type("kubernetes:core/v1:Namespace"))
        assert names_ == ["pmem-csi", "x"]
        assert len(mocks.of_type("kubernetes:apps/v1:DaemonSet")) == 3

    return settle(outputs, check)


def test_no_namespace_when_not_wanted_and_no_reporter_when_disabled(mocks: Mocks) -> None:
    run(lambda: _test_no_namespace_when_not_wanted_and_no_reporter_when_disabled(mocks))


def _test_no_namespace_when_not_wanted_and_no_reporter_when_disabled(mocks: Mocks) -> Any:
    outputs = deploy(stack({"createNamespace": False, "reporter": {"enabled": False}}))

    def check(_: Any) -> None:
        assert not mocks.of_type("kubernetes:core/v1:Namespace")
        deployments = mocks.of_type("kubernetes:apps/v1:Deployment")
        assert deployments == []

    return settle(outputs, check)


def test_patch_that_selects_nothing_fails_before_registration(mocks: Mocks) -> None:
    run(lambda: _test_patch_that_selects_nothing_fails_before_registration(mocks))


def _test_patch_that_selects_nothing_fails_before_registration(mocks: Mocks) -> Any:
    from pmem_components.components import PmemCsiDeployment

    s = stack({"patches": [{"kind": "CronJob", "mergePatch": {"a": 1}}]})
    with pytest.raises(ConfigError) as info:
        PmemCsiDeployment(s.deployments[0])
    assert "pmem-csi:deployments[0].patches[0]: selects no object" in str(info.value)
    return nothing_registered(mocks)


def test_valid_patches_register_a_transform(mocks: Mocks) -> None:
    run(lambda: _test_valid_patches_register_a_transform(mocks))


def _test_valid_patches_register_a_transform(mocks: Mocks) -> Any:
    patch = {"kind": "DaemonSet", "mergePatch": {"spec": {"minReadySeconds": 5}}}
    outputs = deploy(stack({"patches": [patch]}))

    def check(_: Any) -> None:
        # Mocks run no transforms; the engine does (tests/e2e). Registration must still work.
        ds = mocks.one("kubernetes:apps/v1:DaemonSet")
        assert "minReadySeconds" not in ds.inputs["spec"]

    return settle(outputs, check)


def test_patch_transform_is_on_the_top_component(
    monkeypatch: pytest.MonkeyPatch, mocks: Mocks
) -> None:
    """The transform reaches the component's options (the engine applies it to children)."""
    from pmem_components import components

    seen: list[pulumi.ResourceOptions | None] = []
    original = pulumi.ComponentResource.__init__

    def spy(self: Any, t: str, name: str, props: Any = None, opts: Any = None, *a: Any) -> None:
        if t.endswith("PmemCsiDeployment"):
            seen.append(opts)
        original(self, t, name, props, opts, *a)

    monkeypatch.setattr(pulumi.ComponentResource, "__init__", spy)
    patch = {"kind": "DaemonSet", "mergePatch": {"spec": {"minReadySeconds": 5}}}
    dep = stack({"patches": [patch]}).deployments[0]

    @pulumi.runtime.test
    def body() -> None:
        components.PmemCsiDeployment(dep)

    body()
    (opts,) = seen
    # The await settings' transform (pmem_components.awaiting) first, the patches last.
    assert opts is not None and opts.transforms and len(opts.transforms) == 2
    transform = opts.transforms[-1]
    args = pulumi.ResourceTransformArgs(
        custom=True,
        type_="kubernetes:apps/v1:DaemonSet",
        name="x",
        props=node.build_node_daemonset(dep),
        opts=pulumi.ResourceOptions(),
    )
    result = transform(args)
    assert result is not None and result.props["spec"]["minReadySeconds"] == 5


def test_bad_provided_certificates_fail_before_registration(mocks: Mocks) -> None:
    run(lambda: _test_bad_provided_certificates_fail_before_registration(mocks))


def _test_bad_provided_certificates_fail_before_registration(mocks: Mocks) -> Any:
    from pmem_components.components import PmemCsiDeployment

    cs = good_set()
    dep = load_config(
        {
            "deployments": [
                {
                    "certificates": {
                        "caCert": cs.ca_cert,
                        "registryCert": cs.node_controller_cert,  # wrong name
                        "registryKey": cs.node_controller_key,
                        "nodeControllerCert": cs.node_controller_cert,
                        "nodeControllerKey": cs.node_controller_key,
                    }
                }
            ]
        },
        check_certificates=False,
    ).deployments[0]
    with pytest.raises(ConfigError) as info:
        PmemCsiDeployment(dep)
    assert "pmem-csi:deployments[0].certificates.registryCert" in str(info.value)
    return nothing_registered(mocks)


def test_models_built_in_code_get_the_cross_field_checks(mocks: Mocks) -> None:
    run(lambda: _test_models_built_in_code_get_the_cross_field_checks(mocks))


def _test_models_built_in_code_get_the_cross_field_checks(mocks: Mocks) -> Any:
    from pmem_components.components import PmemCsiDeployment
    from pmem_components.config import DeploymentConfig

    dep = DeploymentConfig(name="lib.example", device_mode="direct", pmem_percentage=50)
    with pytest.raises(ConfigError, match=r"deployments\[0\]\.pmemPercentage: is only valid"):
        PmemCsiDeployment(dep)
    return nothing_registered(mocks)


def test_models_built_in_code_that_pass_the_checks_register(mocks: Mocks) -> None:
    run(lambda: _test_models_built_in_code_that_pass_the_checks_register(mocks))


def _test_models_built_in_code_that_pass_the_checks_register(mocks: Mocks) -> Any:
    from pmem_components.components import PmemCsiDeployment
    from pmem_components.config import DeploymentConfig

    PmemCsiDeployment(DeploymentConfig(name="lib.example", device_mode="direct"))

    def check() -> None:
        assert len(mocks.of_type("pmem-csi:index:PmemCsiDeployment")) == 1
        assert len(mocks.of_type("kubernetes:apps/v1:DaemonSet")) == 1

    return check


# ------------------------------------------------------------------------------ program


def test_read_config_reports_all_problems_including_patches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pmem_components import program

    config = {
        "pmem-csi:deployments": json.dumps(
            [
                {"deviceMode": "foo"},
                {"name": "b", "patches": [{"kind": "CronJob", "mergePatch": {"x": 1}}]},
            ]
        ),
        "pmem-csi:manageCrd": "true",
        "pmem-csi:typo": "1",
    }
    monkeypatch.setattr(program.runtime_config, "get_config", config.get)
    monkeypatch.setattr(program, "_unknown_keys", lambda: ["typo"])
    with pytest.raises(ConfigError) as info:
        program.read_config()
    text = str(info.value)
    assert "pmem-csi:typo: is not a known setting" in text
    assert "pmem-csi:deployments[0].deviceMode: must be one of lvm, direct" in text
    # Patches are only dry-run once the config itself is valid.
    config["pmem-csi:deployments"] = json.dumps(
        [{}, {"name": "b", "patches": [{"kind": "CronJob", "mergePatch": {"x": 1}}]}]
    )
    monkeypatch.setattr(program, "_unknown_keys", lambda: [])
    with pytest.raises(ConfigError) as info:
        program.read_config()
    assert "pmem-csi:deployments[1].patches[0]: selects no object" in str(info.value)


def test_read_config_parses_pulumi_values(monkeypatch: pytest.MonkeyPatch) -> None:
    from pmem_components import program

    config = {
        "pmem-csi:deployments": json.dumps([{"deviceMode": "direct"}]),
        "pmem-csi:manageCrd": "false",
        "kubernetes:enableSecretMutable": "true",  # Pulumi.yaml's
    }
    monkeypatch.setattr(program.runtime_config, "get_config", config.get)
    monkeypatch.setattr(program, "_unknown_keys", lambda: [])
    s = program.read_config()
    assert s.manage_crd is False and s.deployments[0].device_mode == "direct"


def test_unknown_keys_come_from_the_pulumi_config(monkeypatch: pytest.MonkeyPatch) -> None:
    from pmem_components import program

    fake = SimpleNamespace(
        CONFIG=SimpleNamespace(
            get=lambda: {"pmem-csi:deployments": "[]", "pmem-csi:foo": "1", "kubernetes:x": "y"}
        ),
        get_config_env=lambda: {"pmem-csi:bar": "2"},
    )
    monkeypatch.setattr(program, "runtime_config", fake)
    assert program._unknown_keys() == ["bar", "foo"]


def test_main_turns_config_errors_into_run_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    from pmem_components import program

    config = {"pmem-csi:deployments": json.dumps([{"deviceMode": "foo"}])}
    monkeypatch.setattr(program.runtime_config, "get_config", config.get)
    monkeypatch.setattr(program, "_unknown_keys", lambda: [])
    with pytest.raises(pulumi.RunError, match=r"deployments\[0\].deviceMode"):
        program.main()


def test_two_instances_of_one_driver_get_distinct_resource_names(mocks: Mocks) -> None:
    run(lambda: _test_two_instances_of_one_driver_get_distinct_resource_names(mocks))


def _test_two_instances_of_one_driver_get_distinct_resource_names(mocks: Mocks) -> Any:
    """``(name, args, opts)``: the same driver for two clusters must not share URNs."""
    from pmem_components.components import PmemCsiDeployment, PmemCsiDeploymentArgs
    from pmem_components.config import DeploymentConfig

    cfg = DeploymentConfig()
    east = PmemCsiDeployment("east", PmemCsiDeploymentArgs(cfg))
    west = PmemCsiDeployment("west", PmemCsiDeploymentArgs(cfg))

    def check(_: Any) -> None:
        ds = sorted(r.name for r in mocks.of_type("kubernetes:apps/v1:DaemonSet"))
        node = "pmem-csi/pmem-csi-intel-com-node"
        assert ds == [f"east:{node}", f"west:{node}"]
        names_seen = [(r.typ, r.name) for r in mocks.resources]
        assert len(names_seen) == len(set(names_seen))

    return settle(pulumi.Output.all(east.ca_cert, west.ca_cert), check)


def test_a_namespace_the_stack_created_stays_when_its_deployment_stops_creating_it(
    mocks: Mocks, monkeypatch: pytest.MonkeyPatch
) -> None:
    """retainNamespaces false, and the last deployment that created the namespace switches
    to createNamespace: false while it still lives there: not registering the namespace
    would make the engine delete it, and the deployment with it (issue 15)."""
    from pmem_components import registry

    seen: list[tuple[dict[str, Any], pulumi.ResourceOptions]] = []
    real = registry.register

    def spy(obj: dict[str, Any], opts: pulumi.ResourceOptions, **kw: Any) -> Any:
        seen.append((obj, opts))
        return real(obj, opts, **kw)

    monkeypatch.setattr(registry, "register", spy)
    s = load_config(
        {"deployments": [{"createNamespace": False}], "retainNamespaces": False},
        check_certificates=False,
    )

    def program() -> Any:
        from pmem_components.program import deploy as program_deploy

        return settle(program_deploy(s, keep_namespaces={"pmem-csi"}), check)

    def check(_: Any) -> None:
        (ns,) = [(o, opts) for o, opts in seen if o["kind"] == "Namespace"]
        obj, opts = ns
        assert obj["metadata"]["name"] == "pmem-csi"
        assert opts.retain_on_delete is True
        # Released: the next pulumi up no longer counts it as the stack's.
        assert names.STACK_ANNOTATION not in obj["metadata"].get("annotations", {})

    run(program)


def test_a_namespace_patch_is_applied_to_the_stack_level_namespace(mocks: Mocks) -> None:
    run(lambda: _test_a_namespace_patch_is_applied_to_the_stack_level_namespace(mocks))


def _test_a_namespace_patch_is_applied_to_the_stack_level_namespace(mocks: Mocks) -> Any:
    """The program registers namespaces at stack level, outside the component whose
    transforms apply the deployment's patches: the patch is applied there (issue 15)."""
    label = {"pod-security.kubernetes.io/enforce": "privileged"}
    patch = {"kind": "Namespace", "mergePatch": {"metadata": {"labels": label}}}
    outputs = deploy(stack({"patches": [patch]}))

    def check(_: Any) -> None:
        ns = mocks.one("kubernetes:core/v1:Namespace")
        assert ns.inputs["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == (
            "privileged"
        )
        assert names.STACK_ANNOTATION in ns.inputs["metadata"]["annotations"]

    return settle(outputs, check)


# ------------------------------------------------------------------------- faces and URNs

URN_HEAD = "urn:pulumi:unit::pmem-csi-pulumi::"
DS_TYPES = "pmem-csi:index:PmemCsiDeployment$pmem-csi:index:NodeDriver$kubernetes:apps/v1:DaemonSet"


def _aliases_of(
    monkeypatch: pytest.MonkeyPatch, program: Callable[[], Any]
) -> dict[tuple[str, str], list[Any]]:
    """Run ``program`` under the mocks; (kind, resource name) -> the aliases registered."""
    from pmem_components import registry

    seen: dict[tuple[str, str], list[Any]] = {}
    real = registry.register

    def spy(obj: dict[str, Any], opts: pulumi.ResourceOptions, **kw: Any) -> Any:
        key = (obj["kind"], f"{kw.get('name_prefix', '')}{registry.resource_name(obj)}")
        seen[key] = list(opts.aliases or [])
        return real(obj, opts, **kw)

    monkeypatch.setattr(registry, "register", spy)
    run(lambda: (program(), None)[1])
    return seen


def test_the_named_face_keeps_the_urns_of_the_config_face_and_of_the_program(
    mocks: Mocks, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PmemCsiDeployment(config) (and the program) name the children after the objects;
    PmemCsiDeployment("name", args) prefixes them. Switching must move them, not delete and
    re-create them by name (issue 15)."""
    from pmem_components.components import PmemCsiDeployment, PmemCsiDeploymentArgs
    from pmem_components.config import DeploymentConfig

    cfg = DeploymentConfig(reporter={"enabled": False})
    seen = _aliases_of(
        monkeypatch, lambda: PmemCsiDeployment("pmem-east", PmemCsiDeploymentArgs(cfg))
    )
    ds = seen[("DaemonSet", "pmem-east:pmem-csi/pmem-csi-intel-com-node")]
    assert f"{URN_HEAD}{DS_TYPES}::pmem-csi/pmem-csi-intel-com-node" in ds
    # The namespace the component registers itself: the program's is a stack resource.
    ns = seen[("Namespace", "pmem-east:pmem-csi")]
    assert f"{URN_HEAD}kubernetes:core/v1:Namespace::pmem-csi" in ns


def test_the_config_face_follows_an_alias_of_the_named_face(
    mocks: Mocks, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pmem_components.components import PmemCsiDeployment
    from pmem_components.config import DeploymentConfig

    cfg = DeploymentConfig(reporter={"enabled": False})
    opts = pulumi.ResourceOptions(aliases=[pulumi.Alias(name="pmem-east")])
    seen = _aliases_of(monkeypatch, lambda: PmemCsiDeployment(cfg, opts))
    ds = seen[("DaemonSet", "pmem-csi/pmem-csi-intel-com-node")]
    assert f"{URN_HEAD}{DS_TYPES}::pmem-east:pmem-csi/pmem-csi-intel-com-node" in ds


class OptionsMonitor(pulumi.runtime.mocks.MockMonitor):
    """Remembers the replacement-related options of every registration (Mocks cannot)."""

    def __init__(self, mocks: Mocks) -> None:
        super().__init__(mocks)
        self.options: dict[str, dict[str, Any]] = {}

    def RegisterResource(self, request: Any) -> Any:  # the gRPC method name
        self.options[f"{request.type}::{request.name}"] = {
            "deleteBeforeReplace": request.deleteBeforeReplace,
            "replaceOnChanges": list(request.replaceOnChanges),
            "provider": request.provider,
        }
        return super().RegisterResource(request)


def test_secrets_are_never_set_up_for_replacement_and_the_pods_reach_the_generator() -> None:
    """Certificate changes must update the Secrets in place: nothing on them asks the engine
    to replace (delete first) them, they stay with the default provider (switching provider
    could itself replace them), and the running pods' fingerprints reach the dynamic resource
    that decides when a CA change takes its next stage."""
    m = Mocks()
    monitor = OptionsMonitor(m)
    pulumi.runtime.set_mocks(
        m, project="pmem-csi-pulumi", stack="unit", preview=False, monitor=monitor
    )
    from pmem_components.program import deploy as program_deploy

    def program() -> Callable[[], None]:
        program_deploy(stack({}), running_certificates={0: ["b", "a", "b"]})

        def check() -> None:
            secrets = {
                k: v
                for k, v in monitor.options.items()
                if k.startswith("kubernetes:core/v1:Secret")
            }
            assert len(secrets) == 2
            for opts in secrets.values():
                assert opts == {
                    "deleteBeforeReplace": False,
                    "replaceOnChanges": [],
                    "provider": "",
                }
            dyn = m.one("pulumi-python:dynamic/pmem-csi:Certificates")
            assert dyn.inputs["runningFingerprints"] == ["a", "b"]

        return check


@pytest.mark.parametrize(
    ("running", "given"),
    [
        ([], None),  # library use: an empty list cannot tell "no pod wanted" from "none yet"
        (None, None),
        ("unread", None),  # no CA change under way when the preflight ran
        ("none wanted", []),  # read, and the workloads want no pod: every pod is on it
        ("wanted", [""]),  # read, a workload wants pods and none is there: unknown material
    ],
)
def test_an_empty_pod_list_reaches_the_generator_as_unknown_unless_no_pod_is_wanted(
    mocks: Mocks, running: Any, given: list[str] | None
) -> None:
    from pmem_components import certrollout
    from pmem_components.components import PmemCsiDeployment, PmemCsiDeploymentArgs

    cfg = stack({}).deployments[0]
    if running == "unread":
        running = certrollout.UNREAD
    elif running in ("none wanted", "wanted"):
        count = 2 if running == "wanted" else 0
        running = certrollout.rollout_of([], cfg, {"DaemonSet": count, "StatefulSet": 0})

    def program() -> Callable[[], None]:
        PmemCsiDeployment(
            cfg.name,
            PmemCsiDeploymentArgs(cfg, running_certificates=running),
        )

        def check() -> None:
            dyn = mocks.one("pulumi-python:dynamic/pmem-csi:Certificates")
            assert dyn.inputs.get("runningFingerprints") == given

        return check

    run(program)


def test_adopted_objects_are_applied_with_force_and_carry_the_full_identity(
    mocks: Mocks,
) -> None:
    """``pmem-csi:adopt`` (the preflight's ``Plan.adopted``): the namespace and the deployment's
    objects are applied with force, as ``adoptNamespace`` / ``adoptExisting`` do, also with
    ``takeOverFields: false``; the identity annotation names the organization too."""

    def program() -> Callable[[], None]:
        from pmem_components.program import deploy as program_deploy

        s = load_config({"deployments": [{}], "takeOverFields": False})
        adopted = ["Namespace pmem-csi", f"Deployment {names.DEFAULT_DRIVER_NAME}"]
        return settle(program_deploy(s, adopted=adopted), check)

    def check(_: Any) -> None:
        ident = f"{pulumi.get_organization()}/pmem-csi-pulumi/unit"
        ns = mocks.one("kubernetes:core/v1:Namespace")
        assert ns.inputs["metadata"]["annotations"]["pulumi.com/patchForce"] == "true"
        assert ns.inputs["metadata"]["annotations"][names.STACK_ANNOTATION] == ident
        cr = mocks.one(f"kubernetes:{names.CRD_GROUP}/v1beta1:Deployment")
        assert cr.inputs["metadata"]["annotations"]["pulumi.com/patchForce"] == "true"
        assert cr.inputs["metadata"]["annotations"][names.STACK_ANNOTATION] == ident
        ds = mocks.one("kubernetes:apps/v1:DaemonSet")
        assert ds.inputs["metadata"]["annotations"]["pulumi.com/patchForce"] == "true"

    run(program)


def test_without_adoption_nothing_is_forced_when_take_over_is_off(mocks: Mocks) -> None:
    def program() -> Callable[[], None]:
        from pmem_components.program import deploy as program_deploy

        s = load_config({"deployments": [{}], "takeOverFields": False})
        return settle(program_deploy(s), check)

    def check(_: Any) -> None:
        for typ in ("kubernetes:core/v1:Namespace", "kubernetes:apps/v1:DaemonSet"):
            annotations = mocks.one(typ).inputs["metadata"].get("annotations") or {}
            assert "pulumi.com/patchForce" not in annotations, typ

    run(program)


def test_an_adopted_namespace_stays_forced_while_the_consent_names_it(mocks: Mocks) -> None:
    """The update after the adopting one: the state holds the namespace now (the preflight
    adopts nothing), but ``pmem-csi:adopt`` still names it. Dropping ``patchForce`` then
    would be a change the administrator did not make (a diff right after the adoption);
    removing the consent is one."""

    def program() -> Callable[[], None]:
        from pmem_components.program import deploy as program_deploy

        s = load_config({"deployments": [{}], "adopt": ["Namespace pmem-csi"]})
        return settle(program_deploy(s, adopted=[]), check)

    def check(_: Any) -> None:
        ns = mocks.one("kubernetes:core/v1:Namespace")
        assert ns.inputs["metadata"]["annotations"]["pulumi.com/patchForce"] == "true"

    run(program)
