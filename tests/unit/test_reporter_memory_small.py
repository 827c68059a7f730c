"""Small per-informer memory costs of the reporter (issue 16: RSS at 100 namespaces)."""

from __future__ import annotations

import random

from reporter.retry import SHARED_JITTER, Backoff


def test_backoffs_share_one_jitter_generator_unless_given_their_own() -> None:
    # A random.Random is 2.5 KiB; the reporter holds ~1,600 Backoffs at 100 namespaces.
    a, b = Backoff(), Backoff(base=1.0, cap=60.0, max_attempts=0)
    assert a.rng is b.rng is SHARED_JITTER
    seeded = random.Random(5)
    assert Backoff(rng=seeded).rng is seeded


def test_the_shared_generator_still_spreads_the_waits() -> None:
    b = Backoff(base=1.0, cap=8.0)
    waits = {round(b.delay(3), 6) for _ in range(50)}
    assert len(waits) > 40 and all(4.0 <= w <= 8.0 for w in waits)
