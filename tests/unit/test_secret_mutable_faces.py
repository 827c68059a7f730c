"""The component asks for ``kubernetes:enableSecretMutable`` in every face, as the program does.

Why: with the setting off the Kubernetes provider replaces a Secret whose data changes (delete,
then create), so each certificate renewal leaves the driver without its Secrets for a moment.
The stack program refuses such a stack (``program.read_config``); the component used as a
library, or served to YAML and other languages (``provider_face``), deployed generated
certificates through the default provider without asking. Here: the same refusal there,
naming the setting with advice for the user's own project. Not for an explicit provider: its
setting is not readable from the program (docs/day2.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import pytest
from certutil import good_set
from pulumi.runtime import config as runtime_config
from pulumi_mocks import RecordingMocks

from pmem_components import components, provider_face, secretmutable
from pmem_components.config import ConfigError, DeploymentConfig, load_config

CERT_OUTPUTS = {
    key: f"GENERATED-{key}"
    for key in (
        "ca_cert",
        "registry_cert",
        "registry_key",
        "node_controller_cert",
        "node_controller_key",
    )
}


@pytest.fixture
def mocks(monkeypatch: pytest.MonkeyPatch) -> Iterator[RecordingMocks]:
    m = RecordingMocks(CERT_OUTPUTS)
    pulumi.runtime.set_mocks(m, project="lib", stack="unit", preview=False)
    monkeypatch.delenv(secretmutable.ENV, raising=False)
    token = runtime_config.CONFIG.set({})
    yield m
    runtime_config.CONFIG.reset(token)


def _config(values: dict[str, str]) -> None:
    runtime_config.CONFIG.set(values)


def _run(program: Any) -> None:
    pulumi.runtime.test(program)()


UNSET = (
    "kubernetes:enableSecretMutable: is not set (the provider's default is false), but must "
    "be true: certificate renewal updates the driver's Secrets, and without it the Kubernetes "
    "provider deletes and re-creates them (the driver is without certificates meanwhile). Set "
    "it in this stack's config: pulumi config set kubernetes:enableSecretMutable true (or "
    "kubernetes:enableSecretMutable: true under config: in Pulumi.yaml, or "
    "PULUMI_K8S_ENABLE_SECRET_MUTABLE=true in the environment)"
)


def test_the_library_face_refuses_generated_certificates_without_mutable_secrets(
    mocks: RecordingMocks,
) -> None:
    """Library use through the default provider: the refusal names the setting, before
    anything is registered."""
    with pytest.raises(ConfigError) as caught:
        _run(lambda: components.PmemCsiDeployment("lib", DeploymentConfig()))
    assert caught.value.problems == [UNSET]
    assert mocks.resources == []  # raised before the component registered


def test_a_false_setting_is_named_with_advice_for_the_users_own_project(
    mocks: RecordingMocks,
) -> None:
    """Not this project's Pulumi.yaml advice (``pulumi config rm``): the user's stack sets it."""
    _config({secretmutable.KEY: "false"})
    with pytest.raises(ConfigError) as caught:
        _run(lambda: components.PmemCsiDeployment(DeploymentConfig()))
    (problem,) = caught.value.problems
    assert problem.startswith("kubernetes:enableSecretMutable: is 'false', but must be true: ")
    assert problem.endswith(
        "set it true in this stack's config (pulumi config set "
        "kubernetes:enableSecretMutable true, or under config: in Pulumi.yaml)"
    )
    assert "config rm" not in problem


@pytest.mark.parametrize("where", ["config", "environment"])
def test_the_setting_on_lets_the_library_face_register(
    mocks: RecordingMocks, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """The provider reads the config, else the environment variable: either makes it pass."""
    if where == "config":
        _config({secretmutable.KEY: "true"})
    else:
        monkeypatch.setenv(secretmutable.ENV, "true")
    _run(lambda: components.PmemCsiDeployment("lib", DeploymentConfig()))
    assert sum(r.typ == "kubernetes:core/v1:Secret" for r in mocks.resources) == 2


def test_provided_certificates_need_no_mutable_secrets(mocks: RecordingMocks) -> None:
    """Provided certificates change only when the administrator changes them: no refusal."""
    certs = good_set()
    cfg = load_config(
        {
            "deployments": [
                {
                    "certificates": {
                        "caCert": certs.ca_cert,
                        "registryCert": certs.registry_cert,
                        "registryKey": certs.registry_key,
                        "nodeControllerCert": certs.node_controller_cert,
                        "nodeControllerKey": certs.node_controller_key,
                    }
                }
            ]
        }
    ).deployments[0]
    _run(lambda: components.PmemCsiDeployment("lib", cfg))
    assert sum(r.typ == "kubernetes:core/v1:Secret" for r in mocks.resources) == 2


def test_the_served_face_refuses_as_the_library_does(mocks: RecordingMocks) -> None:
    """A YAML program's component (provider_face) through its stack's default provider."""
    with pytest.raises(provider_face.ArgsError) as caught:
        _run(lambda: provider_face.PmemCsiDeployment("driver", {"deviceMode": "direct"}))
    assert caught.value.problems == [UNSET]
    assert str(caught.value).startswith("invalid args of PmemCsiDeployment 'driver' (1 problem")
    assert mocks.resources == []


def test_an_explicit_provider_is_not_judged_by_the_default_providers_setting(
    mocks: RecordingMocks,
) -> None:
    """The children deploy through the given provider, so the stack config's (default
    provider's) missing setting is no reason to refuse. That provider's own setting cannot be
    read back from the SDK (docs/day2.md asks library users to set it)."""

    def program() -> None:
        provider = k8s.Provider("other", enable_secret_mutable=True)
        components.PmemCsiDeployment(
            "lib", DeploymentConfig(), pulumi.ResourceOptions(provider=provider)
        )

    _run(program)
    assert sum(r.typ == "kubernetes:core/v1:Secret" for r in mocks.resources) == 2


def test_a_provider_inherited_from_the_parent_counts_as_explicit(
    mocks: RecordingMocks,
) -> None:
    """The children deploy through the parent's provider, so the default provider's missing
    setting is no reason to refuse."""

    def program() -> None:
        provider = k8s.Provider("other", enable_secret_mutable=True)
        parent = pulumi.ComponentResource(
            "test:index:Parent", "p", None, pulumi.ResourceOptions(providers=[provider])
        )
        components.PmemCsiDeployment(
            "lib", DeploymentConfig(), pulumi.ResourceOptions(parent=parent)
        )

    _run(program)
    assert sum(r.typ == "kubernetes:core/v1:Secret" for r in mocks.resources) == 2


def test_validate_false_does_not_switch_off_the_secret_mutable_rule(
    mocks: RecordingMocks,
) -> None:
    """docs/day2.md: library use through the default provider is refused without
    kubernetes:enableSecretMutable. ``validate=False`` (documented as "the program has done
    that already": cross-field rules, certificates, patches) silently skips it."""
    args = components.PmemCsiDeploymentArgs(DeploymentConfig(), validate=False)
    with pytest.raises(ConfigError):
        _run(lambda: components.PmemCsiDeployment("lib", args))


def test_a_providers_map_is_read_as_the_sdk_reads_it(
    mocks: RecordingMocks,
) -> None:
    """ResourceOptions.merge (done by the component before super().__init__) re-keys a
    providers map by each provider's package, so the children deploy through this explicit
    provider; kubernetes_provider() looks the map up by its key and calls it the default."""

    def program() -> None:
        provider = k8s.Provider("other", enable_secret_mutable=True)
        components.PmemCsiDeployment(
            "lib", DeploymentConfig(), pulumi.ResourceOptions(providers={"k8s": provider})
        )

    _run(program)
