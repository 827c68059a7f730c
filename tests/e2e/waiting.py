"""Polling for eventually-consistent cluster state, shared by the end-to-end tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


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
