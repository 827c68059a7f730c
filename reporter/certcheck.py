"""Memoized certificate verification for the reporter.

``pmem_components.certs.validate_driver_certificates`` loads RSA keys (with the costly
consistency checks) and runs a real TLS handshake: close to a second per call. The reporter
recomputes a CR's status on every watch event and resync, and the certificates almost never
change, so it remembers each verdict for as long as it provably holds: until the Secrets'
contents change or the clock crosses a point where a certificate becomes valid, enters its
30-day expiry warning, or expires. Within such an interval the verifier's answer cannot differ,
so caching changes no result, only the cost.

A verifier that *fails* (raises, e.g. because the environment cannot run the handshake) is
remembered too, for ``FAILURE_RETRY``: repeating a failing key load on every reconcile burns
the container's small CPU share and cannot give another answer until something changes.
What is remembered is the failure's text only, raised as a fresh ``VerifierError`` on every
hit: the original exception's traceback holds the verifier's frames (the private key PEM, the
whole observed snapshot above them), and raising one object again and again appends the
callers' frames to its traceback each time.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from cryptography import x509

from pmem_components import certs

_MAX_ENTRIES = 128
# How long a verifier exception stands before the same inputs are tried again.
FAILURE_RETRY = dt.timedelta(minutes=5)

Validator = Callable[..., list[certs.CertProblem]]


class VerifierError(Exception):
    """The certificate verifier raised; the message names the original error's type and text."""


@dataclass(frozen=True)
class _Verdict:
    problems: tuple[certs.CertProblem, ...]
    valid_from: dt.datetime | None  # None: since forever
    valid_until: dt.datetime | None  # None: forever
    error: str | None = None  # the verifier raised: its description, raised anew on a hit

    def holds_at(self, now: dt.datetime) -> bool:
        return (self.valid_from is None or self.valid_from <= now) and (
            self.valid_until is None or now < self.valid_until
        )


def _time_boundaries(pems: tuple[str, ...]) -> list[dt.datetime]:
    """Instants at which the verifier's time-dependent checks can change their answer."""
    points: list[dt.datetime] = []
    for pem in pems:
        try:
            loaded = x509.load_pem_x509_certificates(pem.encode())
        except ValueError:
            continue  # unparsable input yields the same problem at any time
        for cert in loaded:
            after = cert.not_valid_after_utc
            points += [cert.not_valid_before_utc, after - certs.EXPIRY_WARNING, after]
    return sorted(points)


class CertVerifier:
    """``validate_driver_certificates`` with a bounded, time-aware memo; thread-safe."""

    def __init__(self, validate: Validator = certs.validate_driver_certificates) -> None:
        self._validate = validate
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, _Verdict] = OrderedDict()
        self.calls = 0  # how often the real verifier ran (observable in tests)

    def __call__(
        self,
        ca_cert: str,
        registry_cert: str,
        registry_key: str,
        node_controller_cert: str,
        node_controller_key: str,
        *,
        now: dt.datetime,
        node_ca_cert: str | None = None,
    ) -> list[certs.CertProblem]:
        args = (ca_cert, registry_cert, registry_key, node_controller_cert, node_controller_key)
        node_ca = ca_cert if node_ca_cert is None else node_ca_cert
        # A digest, not the PEM text, is the key: no second copy of private keys in memory.
        key = hashlib.sha256("\0".join((*args, node_ca)).encode()).hexdigest()
        with self._lock:
            verdict = self._entries.get(key)
            if verdict is not None and verdict.holds_at(now):
                self._entries.move_to_end(key)
                if verdict.error is not None:
                    raise VerifierError(verdict.error)
                return list(verdict.problems)
        self.calls += 1
        error: str | None = None
        try:
            # Only when the sides differ, so validators that know one ca.crt keep working.
            extra = {} if node_ca == ca_cert else {"node_ca_cert": node_ca}
            problems = tuple(self._validate(*args, now=now, **extra))
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"[:300]
        if error is not None:
            # Raised outside the except block: not even __context__ keeps the original.
            self._remember(key, _Verdict((), now, now + FAILURE_RETRY, error))
            raise VerifierError(error)
        points = _time_boundaries((ca_cert, node_ca, registry_cert, node_controller_cert))
        self._remember(
            key,
            _Verdict(
                problems,
                valid_from=max((p for p in points if p <= now), default=None),
                valid_until=min((p for p in points if p > now), default=None),
            ),
        )
        return list(problems)

    def _remember(self, key: str, verdict: _Verdict) -> None:
        with self._lock:
            self._entries[key] = verdict
            self._entries.move_to_end(key)
            while len(self._entries) > _MAX_ENTRIES:
                self._entries.popitem(last=False)


# The process-wide instance compute_status uses by default.
default_verifier = CertVerifier()
