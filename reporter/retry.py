"""Which API errors are worth retrying, and how long to wait between attempts.

One policy for every caller (status writes, events, informer restarts, lease renewals) so the
reporter backs off the same way everywhere when the API server is overloaded or restarting.
Jitter keeps two replicas, or many informers, from retrying in lockstep.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from dataclasses import dataclass

import urllib3.exceptions
from kubernetes.client.exceptions import ApiException

CONFLICT = 409
GONE = 410
TOO_MANY_REQUESTS = 429


def status_of(exc: BaseException) -> int | None:
    """HTTP status of an API error; 0 for the client's own connection failures."""
    if isinstance(exc, ApiException):
        return int(exc.status or 0)
    return None


def is_transient(exc: BaseException) -> bool:
    """True for errors that a later identical request may not hit: throttling, 5xx, network."""
    status = status_of(exc)
    if status is not None:
        return status in (0, TOO_MANY_REQUESTS) or 500 <= status <= 599
    return isinstance(exc, urllib3.exceptions.HTTPError | ConnectionError | TimeoutError | OSError)


def retry_after(exc: BaseException) -> float | None:
    """Seconds the server asked us to wait (Retry-After on 429/503), when it said."""
    headers = getattr(exc, "headers", None)
    if not headers:
        return None
    value = headers.get("Retry-After")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


# One generator for every Backoff's jitter: a ``random.Random`` is 2.5 KiB (its Mersenne
# Twister state), and a reporter holds a Backoff or two per informer -- 1,611 of them, 4 MiB,
# at 100 driver namespaces (BENCHMARKS.md section 6). Jitter needs spread, not independence;
# tests pass a seeded one of their own.
SHARED_JITTER = random.Random()
# A forked child would otherwise draw its parent's jitter (random reseeds only its own).
os.register_at_fork(after_in_child=SHARED_JITTER.seed)


@dataclass
class Backoff:
    """Exponential backoff with jitter: attempt n waits about base * factor**n, capped.

    The wait is drawn uniformly from [delay/2, delay] ("equal jitter"): never shorter than
    half the nominal delay, so it still backs off, yet spread out between clients.
    """

    base: float = 0.2
    factor: float = 2.0
    cap: float = 10.0
    max_attempts: int = 6
    rng: random.Random = SHARED_JITTER

    def delay(self, attempt: int) -> float:
        nominal = min(self.cap, self.base * self.factor**attempt)
        return self.rng.uniform(nominal / 2, nominal)

    def wait_for(self, attempt: int, exc: BaseException | None = None) -> float:
        """The delay before retry number ``attempt`` (0-based), honouring Retry-After."""
        hinted = retry_after(exc) if exc is not None else None
        if hinted is not None:
            return min(self.cap, max(hinted, 0.0))
        return self.delay(attempt)


def describe_error(exc: BaseException) -> str:
    """An error summary for logs: status and reason, never a response body.

    API error bodies can echo the object sent or stored, and for Secrets that is key material.
    """
    if isinstance(exc, ApiException):
        return f"{exc.status} {exc.reason}"
    return f"{type(exc).__name__}: {exc}"[:300]


class GiveUp(Exception):
    """Raised by a retried operation to stop retrying (e.g. leadership lost)."""


def call_with_retry(
    fn: Callable[[int], object],
    backoff: Backoff,
    sleep: Callable[[float], None],
    retryable: Callable[[BaseException], bool] = is_transient,
) -> object:
    """Call ``fn(attempt)`` until it returns, retrying errors ``retryable`` accepts.

    The attempt number is passed so the operation can refresh its inputs (a conflict needs a
    fresh read). The last error propagates once ``backoff.max_attempts`` are used up.
    """
    attempt = 0
    while True:
        try:
            return fn(attempt)
        except GiveUp:
            raise
        except Exception as exc:
            if not retryable(exc) or attempt + 1 >= backoff.max_attempts:
                raise
            sleep(backoff.wait_for(attempt, exc))
            attempt += 1
