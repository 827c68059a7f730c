"""Fixtures the unit modules share (the suite's own: tests/conftest.py).

Every unit test starts with a fresh, open event loop as the thread's current loop and with the
Pulumi SDK's ambient state as the SDK starts (no mocks, no root stack), and both are undone
after it: no unit test sees a loop or Pulumi state that an earlier one created, closed or left
behind, whatever the order or the xdist worker the tests run in (docs/testing.md, "Event loops
and Pulumi mocks").
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pulumi.runtime
import pytest
from certutil import FIRST_SETTINGS
from pulumi.runtime import settings as pulumi_settings

from pmem_components.cert_resource import CertificateProvider

# The SDK's ambient settings before any test touched them (the defaults it imports with).
_SDK_DEFAULTS = {
    name: getattr(pulumi_settings.SETTINGS, name)
    for name in ("project", "stack", "root_directory", "organization")
}


def reset_pulumi_runtime() -> None:
    """The Pulumi SDK's ambient state as at import: no mocks (monitor, engine), no pending
    RPCs or outputs, and no root stack. ``set_mocks`` keeps an existing root stack, whose
    outputs are futures of the loop that was current when it was made: a test on another
    loop reusing it failed ("attached to a different loop", "Event loop is closed")."""
    pulumi.runtime.reset_options(**_SDK_DEFAULTS)


@pytest.fixture(autouse=True)
def event_loop_per_test() -> Iterator[asyncio.AbstractEventLoop]:
    """A new event loop, current for this test (what ``pulumi.runtime.set_mocks`` and
    ``asyncio.get_event_loop`` use), and the Pulumi SDK state reset before and after.

    After the test the loop's remaining tasks are cancelled and it is closed, and the thread
    has no current loop, as ``asyncio.run`` leaves it: a test that runs ``asyncio.run`` or
    closes a loop of its own changes nothing for the next test."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    reset_pulumi_runtime()
    try:
        yield loop
    finally:
        try:  # tasks left are cancelled while their mocks are still there, then the reset
            _shut_down(loop)
        finally:
            reset_pulumi_runtime()
            asyncio.set_event_loop(None)
            loop.close()


def _shut_down(loop: asyncio.AbstractEventLoop) -> None:
    """What ``asyncio.run`` does with its loop at the end: cancel the tasks left, wait for
    them, finish async generators and the default executor."""
    if loop.is_closed() or loop.is_running():
        return
    tasks = asyncio.all_tasks(loop)
    for task in tasks:
        task.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_asyncgens())
    loop.run_until_complete(loop.shutdown_default_executor())


@pytest.fixture(scope="module")
def gen0() -> dict[str, Any]:
    """A set created with :data:`FIRST_SETTINGS`, as the certificate resource stores it:
    within a 20-day window its leaves (10 days) are due, its CA (30 days) not."""
    created = CertificateProvider().create(dict(FIRST_SETTINGS))
    assert created.outs is not None
    return dict(created.outs)
