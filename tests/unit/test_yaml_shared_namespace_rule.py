"""Two served components in one namespace, from one program (issue 19).

Each served ``PmemCsiDeployment`` with ``createNamespace: true`` (the default) registers the
namespace as a child of its own. Two of them in the same namespace, through the same
Kubernetes provider, would be two Pulumi resources owning one Kubernetes object. The face
(``provider_face.claim_namespace``) lets the first one create it and refuses the second,
naming its ``createNamespace`` field and the first component, with the way forward
(``createNamespace: false`` and ``dependsOn`` the first).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import pytest
from pulumi_mocks import RecordingMocks, project_config

from pmem_components import provider_face

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
NAMESPACE = "kubernetes:core/v1:Namespace"


def _mocks(stack: str = "unit") -> RecordingMocks:
    m = RecordingMocks(CERT_OUTPUTS)
    pulumi.runtime.set_mocks(m, project="yaml", stack=stack, preview=False)
    return m


@pytest.fixture
def mocks(monkeypatch: pytest.MonkeyPatch) -> Iterator[RecordingMocks]:
    """Mocks of a fresh provider process: no namespace claimed yet."""
    monkeypatch.setattr(provider_face, "_NAMESPACE_CREATORS", {}, raising=False)
    monkeypatch.setattr(provider_face, "_NAMESPACE_MEMBERS", {}, raising=False)
    with project_config():
        yield _mocks()


def _run(program: Callable[[], None]) -> None:
    pulumi.runtime.test(program)()


def _served(name: str, opts: pulumi.ResourceOptions | None = None, **args: Any) -> None:
    provider_face.PmemCsiDeployment(
        name,
        {"name": f"{name.lower()}.example.org", "deviceMode": "direct", **args},  # type: ignore[typeddict-item]
        opts,
    )


def _namespaces(mocks: RecordingMocks) -> list[str]:
    return sorted(r.name for r in mocks.resources if r.typ == NAMESPACE)


def test_a_second_creator_of_the_namespace_is_refused_naming_its_field_and_the_first(
    mocks: RecordingMocks,
) -> None:
    def program() -> None:
        _served("driverA", namespace="shared")
        _served("driverB", namespace="shared")

    with pytest.raises(provider_face.ArgsError) as caught:
        _run(program)
    assert str(caught.value).startswith("invalid args of PmemCsiDeployment 'driverB' (1 problem")
    assert caught.value.problems == [
        "createNamespace: component 'driverA' of this program already creates namespace "
        "'shared' (through the same Kubernetes provider), and two components cannot own one "
        "namespace: removing either would release or delete it under the other. Set "
        "createNamespace: false on 'driverB' and make it depend on 'driverA' (the dependsOn "
        "resource option; in YAML: options: dependsOn: [${driverA}]), so its objects are "
        "created once the namespace exists"
    ]


def test_the_default_create_namespace_counts_as_creating_it(mocks: RecordingMocks) -> None:
    """``createNamespace`` left out is true (the stack config's default), so it is refused
    as much as one written out."""

    def program() -> None:
        _served("driverA", namespace="shared", createNamespace=True)
        _served("driverB", namespace="shared")

    with pytest.raises(provider_face.ArgsError, match="createNamespace: component 'driverA'"):
        _run(program)


def test_create_namespace_false_with_depends_on_the_creator_registers_one_namespace(
    mocks: RecordingMocks,
) -> None:
    """The documented way: one creator, the other component depends on it."""

    def program() -> None:
        first = provider_face.PmemCsiDeployment(
            "driverA", {"name": "a.example.org", "namespace": "shared"}
        )
        _served(
            "driverB",
            pulumi.ResourceOptions(depends_on=[first]),
            namespace="shared",
            createNamespace=False,
        )

    _run(program)
    assert _namespaces(mocks) == ["shared"]


def test_the_same_component_registered_again_is_its_own_creator(mocks: RecordingMocks) -> None:
    """One provider process may serve the preview and the update of one command: the same
    component's second registration is no second creator."""
    _run(lambda: _served("driverA", namespace="shared"))
    _run(lambda: _served("driverA", namespace="shared"))
    assert _namespaces(mocks) == ["shared", "shared"]


def test_another_stack_in_the_same_process_is_not_this_programs_creator(
    mocks: RecordingMocks,
) -> None:
    _run(lambda: _served("driverA", namespace="shared"))
    other = _mocks(stack="other")
    _run(lambda: _served("driverB", namespace="shared"))
    assert _namespaces(other) == ["shared"]


def test_different_namespaces_are_each_created_by_their_component(mocks: RecordingMocks) -> None:
    def program() -> None:
        _served("driverA", namespace="ns-a")
        _served("driverB", namespace="ns-b")

    _run(program)
    assert _namespaces(mocks) == ["ns-a", "ns-b"]


def test_two_clusters_creating_one_namespace_name_are_refused(mocks: RecordingMocks) -> None:
    """Through different Kubernetes providers (two clusters) the namespaces are two objects,
    but one Pulumi resource: served children are named after the objects (issue 19, renaming
    a resource keeps them), so the second is refused naming both and the way forward."""

    def program() -> None:
        east = k8s.Provider("east", enable_secret_mutable=True)
        west = k8s.Provider("west", enable_secret_mutable=True)
        _served("driverA", pulumi.ResourceOptions(provider=east), namespace="shared")
        _served("driverB", pulumi.ResourceOptions(provider=west), namespace="shared")

    with pytest.raises(provider_face.ArgsError) as caught:
        _run(program)
    (problem,) = caught.value.problems
    assert problem.startswith("createNamespace: PmemCsiDeployment 'driverA' of this program")
    assert "'driverB'" in problem and "set createNamespace: false on 'driverB'" in problem


def test_the_same_explicit_provider_is_the_same_cluster(mocks: RecordingMocks) -> None:
    def program() -> None:
        east = k8s.Provider("east", enable_secret_mutable=True)
        _served("driverA", pulumi.ResourceOptions(provider=east), namespace="shared")
        _served("driverB", pulumi.ResourceOptions(provider=east), namespace="shared")

    with pytest.raises(provider_face.ArgsError, match="createNamespace: component 'driverA'"):
        _run(program)
