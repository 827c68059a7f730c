"""A shared namespace whose creator would delete it (issue 19, review of ns19).

A creator with ``retainNamespace: false`` deletes the namespace when it is removed from the
program, and with it every other driver there, while their state still lists their objects
(the next ``up`` reports them unchanged). In one program the face sees both components, in
either order, and refuses that combination in ``preview``, naming the creator's field.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pulumi
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


@pytest.fixture
def mocks(monkeypatch: pytest.MonkeyPatch) -> Iterator[RecordingMocks]:
    monkeypatch.setattr(provider_face, "_NAMESPACE_CREATORS", {}, raising=False)
    monkeypatch.setattr(provider_face, "_NAMESPACE_MEMBERS", {}, raising=False)
    with project_config():
        m = RecordingMocks(CERT_OUTPUTS)
        pulumi.runtime.set_mocks(m, project="yaml", stack="unit", preview=False)
        yield m


def _served(name: str, **args: Any) -> None:
    provider_face.PmemCsiDeployment(
        name,
        {"name": f"{name.lower()}.example.org", "deviceMode": "direct", **args},  # type: ignore[typeddict-item]
    )


def _refusal(first: dict[str, Any], second: dict[str, Any]) -> provider_face.ArgsError:
    def program() -> None:
        _served("driverA", namespace="shared", **first)
        _served("driverB", namespace="shared", **second)

    with pytest.raises(provider_face.ArgsError) as caught:
        pulumi.runtime.test(program)()
    return caught.value


EXPECTED = (
    "retainNamespace: false on 'driverA' deletes namespace 'shared' when 'driverA' is "
    "removed, and with it the driver of 'driverB' there (whose state would still list its "
    "objects); leave retainNamespace unset (true) on a namespace another component shares"
)


def test_a_deleting_creator_registered_first_is_refused_when_another_joins(
    mocks: RecordingMocks,
) -> None:
    err = _refusal({"retain_namespace": False}, {"create_namespace": False})
    assert err.problems == [EXPECTED]


def test_a_deleting_creator_registered_after_another_is_refused(mocks: RecordingMocks) -> None:
    def program() -> None:
        _served("driverB", namespace="shared", create_namespace=False)
        _served("driverA", namespace="shared", retain_namespace=False)

    with pytest.raises(provider_face.ArgsError) as caught:
        pulumi.runtime.test(program)()
    assert caught.value.problems == [EXPECTED]


def test_a_deleting_creator_alone_in_its_namespace_is_accepted(mocks: RecordingMocks) -> None:
    def program() -> None:
        _served("driverA", namespace="own", retain_namespace=False)
        _served("driverB", namespace="other", create_namespace=False)

    pulumi.runtime.test(program)()
    assert any(r.typ == "kubernetes:core/v1:Namespace" for r in mocks.resources)


def test_a_retaining_creator_shares_its_namespace(mocks: RecordingMocks) -> None:
    def program() -> None:
        _served("driverA", namespace="shared")
        _served("driverB", namespace="shared", create_namespace=False)

    pulumi.runtime.test(program)()
