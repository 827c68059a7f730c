"""The shared backoff policy: growth, cap, jitter bounds, Retry-After, what counts as transient."""

from __future__ import annotations

import random

import pytest
import urllib3
from kubernetes.client.exceptions import ApiException

from reporter.retry import Backoff, GiveUp, call_with_retry, describe_error, is_transient


def test_delays_grow_exponentially_within_jitter_bounds_and_cap():
    b = Backoff(base=0.2, factor=2, cap=10, rng=random.Random(7))
    for attempt in range(10):
        nominal = min(10, 0.2 * 2**attempt)
        for _ in range(20):
            assert nominal / 2 <= b.delay(attempt) <= nominal
    assert len({round(b.delay(3), 6) for _ in range(10)}) > 1  # jittered


def test_retry_after_header_wins():
    exc = ApiException(status=429)
    exc.headers = {"Retry-After": "3"}
    assert Backoff().wait_for(0, exc) == 3.0


@pytest.mark.parametrize(
    ("exc", "transient"),
    [
        (ApiException(status=429), True),
        (ApiException(status=500), True),
        (ApiException(status=503), True),
        (ApiException(status=0), True),
        (urllib3.exceptions.ProtocolError("reset"), True),
        (ConnectionResetError(), True),
        (ApiException(status=409), False),
        (ApiException(status=403), False),
        (ApiException(status=422), False),
        (ValueError("bug"), False),
    ],
)
def test_is_transient(exc, transient):
    assert is_transient(exc) is transient


def test_call_with_retry_stops_after_max_attempts():
    sleeps: list[float] = []
    calls: list[int] = []

    def fail(n):
        calls.append(n)
        raise ApiException(status=503)

    with pytest.raises(ApiException):
        call_with_retry(fail, Backoff(max_attempts=4), sleeps.append)
    assert calls == [0, 1, 2, 3] and len(sleeps) == 3


def test_give_up_is_not_retried():
    def stop(n):
        raise GiveUp("no")

    with pytest.raises(GiveUp):
        call_with_retry(stop, Backoff(), lambda s: pytest.fail("slept"))


def test_error_description_never_has_the_body():
    exc = ApiException(status=422, reason="Invalid")
    exc.body = '{"data": {"tls.key": "c2VjcmV0"}}'
    assert describe_error(exc) == "422 Invalid"
