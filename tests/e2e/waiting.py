"""Polling for eventually-consistent cluster state, shared by the end-to-end tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.2) -> Any:
    """Poll until ``predicate`` returns something truthy; fail with the last value seen.

    Every assertion about eventually-consistent state goes through this, so a test waits only
    as long as needed and its failure message shows what the cluster looked like at the end.
    """
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = predicate()
        except AssertionError as exc:  # predicates may assert to explain themselves
            last = f"AssertionError: {exc}"
        else:
            if last:
                return last
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout:.0f}s waiting for {what}; last: {last!r}"
            )
        time.sleep(interval)


def settled(
    read: Callable[[], T], quiet: float, timeout: float, what: str, interval: float = 0.2
) -> T:
    """Poll ``read`` until its value has stayed the same for ``quiet`` seconds; return it.

    For counters read after the action that moves them: a first nonzero (or any) value may
    still be short of increments already under way, and an upper bound read at once may hold
    only because they have not landed yet. ``quiet`` must cover the longest time the code
    under test can take to act on what it has already seen (read it from that code).
    """
    seen: dict[str, Any] = {}

    def unchanged_long_enough() -> tuple[T] | None:
        value = read()
        now = time.monotonic()
        if "value" not in seen or seen["value"] != value:
            seen.update(value=value, since=now)
        held = now - seen["since"]
        if held >= quiet:
            return (value,)  # a tuple: truthy whatever the value is
        raise AssertionError(f"{value!r}, unchanged for {held:.1f}s of {quiet:.1f}s")

    return wait_for(unchanged_long_enough, timeout, f"{what} to settle", interval)[0]
