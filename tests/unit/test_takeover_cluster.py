"""Which cluster the field take-over sends to (issue 14, 1): the component's provider's.

:class:`pmem_components.takeover_transform.ClusterSource` with stand-ins for a provider: the
default provider's stack config, an explicit provider's arguments as the engine reports them,
and the cases where the program cannot know for certain (then it sends nothing).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pulumi
import pytest

from pmem_components import kubetarget
from pmem_components.takeover_transform import ClusterSource, UnknownCluster, owns_declared
from tests.unit.test_kubetarget import BOTH_FILE, PROD, STAGING


class FakeProvider:
    """What the take-over reads of a ``kubernetes.Provider``: its name and its arguments."""

    def __init__(self, name: str, **args: Any) -> None:
        self._name = name
        self.__dict__.update(args)


def _done(value: Any) -> asyncio.Future[Any]:
    future: asyncio.Future[Any] = asyncio.get_event_loop().create_future()
    future.set_result(value)
    return future


def known(value: Any) -> pulumi.Output[Any]:
    return pulumi.Output(set(), _done(value), _done(True), _done(False))


def unknown() -> pulumi.Output[Any]:
    return pulumi.Output(set(), _done(None), _done(False), _done(False))


ARGS = ("kubeconfig", "context", "cluster", "render_yaml_to_directory")


def provider(**values: Any) -> FakeProvider:
    return FakeProvider("east", **{k: values.get(k) for k in ARGS})


def run(coro: Any) -> Any:
    """``coro`` run on the test's own event loop (tests/unit/conftest.py)."""
    return asyncio.get_event_loop().run_until_complete(coro)


def default(values: dict[str, str]) -> Any:
    return lambda: kubetarget.ProviderSettings.from_stack_config(values.get)


def test_the_default_provider_is_the_stack_config() -> None:
    source = ClusterSource(None, default({"kubernetes:kubeconfig": BOTH_FILE}))
    assert run(source.target()).server == PROD


def test_an_explicit_provider_uses_its_own_arguments() -> None:
    async def go() -> kubetarget.Target:
        p = provider(kubeconfig=known(BOTH_FILE), context=known("staging"))
        source = ClusterSource(p, default({"kubernetes:kubeconfig": "/nowhere"}))  # type: ignore[arg-type]
        return await source.target()

    assert run(go()).server == STAGING


def test_an_explicit_providers_render_mode_sends_nothing() -> None:
    async def go() -> kubetarget.Target:
        p = provider(kubeconfig=known(BOTH_FILE), render_yaml_to_directory=known("/out"))
        return await ClusterSource(p, default({})).target()  # type: ignore[arg-type]

    assert not run(go()).makes_requests


def test_an_argument_not_known_yet_is_not_guessed() -> None:
    async def go() -> None:
        p = provider(kubeconfig=unknown())
        await ClusterSource(p, default({"kubernetes:kubeconfig": BOTH_FILE})).target()  # type: ignore[arg-type]

    with pytest.raises(UnknownCluster, match="argument kubeconfig is not known"):
        run(go())


def test_a_provider_without_its_arguments_is_not_guessed() -> None:
    async def go() -> None:
        await ClusterSource(FakeProvider("ref"), default({})).target()  # type: ignore[arg-type]

    with pytest.raises(UnknownCluster, match="does not show its argument kubeconfig"):
        run(go())


DECLARED = {
    "metadata": {"labels": {"app": "x"}},
    "spec": {"template": {"spec": {"containers": [{"name": "a", "args": ["-v"]}]}}},
}


@pytest.mark.parametrize(
    ("fields", "declared"),
    [
        ({"f:metadata": {"f:labels": {"f:app": {}}}}, True),
        ({"f:metadata": {"f:labels": {"f:added": {}}}}, False),
        (
            {
                "f:spec": {
                    "f:template": {"f:spec": {"f:containers": {'k:{"name":"a"}': {"f:args": {}}}}}
                }
            },
            True,
        ),
        (
            {
                "f:spec": {
                    "f:template": {"f:spec": {"f:containers": {'k:{"name":"b"}': {"f:args": {}}}}}
                }
            },
            False,
        ),
        ({"f:spec": {"f:replicas": {}}}, False),
    ],
)
def test_owns_declared_tells_changed_declared_fields_from_added_ones(
    fields: dict[str, Any], declared: bool
) -> None:
    assert owns_declared(fields, DECLARED) is declared
