"""Served components name their children after the objects, not the resource name (issue 19).

Why: a child URN holds its parent's type chain, not its name, so renaming the YAML key of a
served ``PmemCsiDeployment`` or ``PmemCsiReporter`` keeps every child's URN (before, the
children were ``<key>:<object>`` and a rename deleted the objects). Stacks made with the
prefixed names move by aliases; two components sharing children are refused.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pulumi
import pytest
from pulumi_mocks import RecordingMocks, project_config

from pmem_components import provider_face
from tests.e2e.reporter_helpers import REPORTER_IMAGE

DRIVER = {"name": "a.example.org", "namespace": "ns-a", "deviceMode": "direct"}
CERT_OUTPUTS = {
    k: f"GENERATED-{k}"
    for k in (
        "ca_cert",
        "registry_cert",
        "registry_key",
        "node_controller_cert",
        "node_controller_key",
    )
}
REPORTER = {
    "deployments": [{"name": "a.example.org", "namespace": "ns-a"}],
    "image": REPORTER_IMAGE,
}


@pytest.fixture
def mocks(monkeypatch: pytest.MonkeyPatch) -> Iterator[RecordingMocks]:
    monkeypatch.setattr(provider_face, "_NAMESPACE_CREATORS", {}, raising=False)
    with project_config():
        mocks = RecordingMocks(CERT_OUTPUTS)
        pulumi.runtime.set_mocks(mocks, project="yaml", stack="unit", preview=False)
        yield mocks


def _names(mocks: RecordingMocks) -> list[str]:
    return [r.name for r in mocks.resources if r.typ.startswith("kubernetes:")]


def _deploy(key: str, reporter_key: str | None = None) -> None:
    provider_face.PmemCsiDeployment(key, dict(DRIVER))  # type: ignore[arg-type]
    if reporter_key:
        provider_face.PmemCsiReporter(reporter_key, dict(REPORTER))  # type: ignore[arg-type]


def test_children_are_named_after_the_objects_whatever_the_key(mocks: RecordingMocks) -> None:
    pulumi.runtime.test(lambda: _deploy("driverA", "reporter"))()
    names = _names(mocks)
    assert "ns-a/a-example-org-reporter" in names and "a.example.org" in names
    assert not [n for n in names if n.startswith(("driverA:", "reporter:"))], names


def test_another_key_gives_the_same_child_names(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []
    for key, rep in (("driverA", "reporter"), ("driverX", "statusReporter")):
        monkeypatch.setattr(provider_face, "_NAMESPACE_CREATORS", {}, raising=False)
        with project_config():
            mocks = RecordingMocks(CERT_OUTPUTS)
            pulumi.runtime.set_mocks(mocks, project="yaml", stack="unit", preview=False)
            pulumi.runtime.test(lambda k=key, r=rep: _deploy(k, r))()
            seen.append(sorted(_names(mocks)))
    assert seen[0] == seen[1]


def test_two_components_with_the_same_children_are_refused_naming_both(
    mocks: RecordingMocks,
) -> None:
    def program() -> None:
        provider_face.PmemCsiReporter("one", dict(REPORTER))  # type: ignore[arg-type]
        provider_face.PmemCsiReporter("two", dict(REPORTER))  # type: ignore[arg-type]

    with pytest.raises(provider_face.ArgsError) as caught:
        pulumi.runtime.test(program)()
    (problem,) = caught.value.problems
    assert problem.startswith("deployments[0].name: PmemCsiReporter 'one' of this program")
    assert "'two'" in problem


def test_the_reporters_namespace_message_is_worded_for_the_reporter() -> None:
    args: dict[str, Any] = {**REPORTER, "namespace": "kube-system"}
    with pytest.raises(provider_face.ArgsError) as caught:
        provider_face.reporter_settings("r", args)
    (problem,) = caught.value.problems
    assert "for the reporter" in problem and "driver" not in problem, problem


@pytest.mark.parametrize("component", ["PmemCsiDeployment", "PmemCsiReporter"])
def test_names_that_differ_only_in_dots_and_hyphens_share_children_and_are_refused(
    mocks: RecordingMocks, component: str
) -> None:
    """Objects are named by the hyphened name (hy.phen and hy-phen both give hy-phen-...):
    refused by field, not left to the engine's duplicate-URN error (review of rename19)."""

    def program() -> None:
        for key, name, ns in (("h1", "hy.phen", "hy-1"), ("h2", "hy-phen", "hy-2")):
            if component == "PmemCsiDeployment":
                provider_face.PmemCsiDeployment(key, {"name": name, "namespace": ns})  # type: ignore[arg-type]
            else:
                args = {**REPORTER, "deployments": [{"name": name, "namespace": ns}]}
                provider_face.PmemCsiReporter(key, args)  # type: ignore[arg-type]

    with pytest.raises(provider_face.ArgsError) as caught:
        pulumi.runtime.test(program)()
    (problem,) = caught.value.problems
    assert "'h1'" in problem and "'h2'" in problem, problem
    assert "'hy-phen'" in problem and "differ only in dots and hyphens" in problem, problem
