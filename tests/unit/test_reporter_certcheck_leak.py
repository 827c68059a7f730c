"""A remembered verifier failure holds no key material and does not grow (issue 16).

The memo used to keep the exception object and raise it again on every hit: each raise added
the caller's frames to its traceback (it grew for as long as the verdict stood, 5 minutes),
and its first frames held the private key PEM and the whole observed snapshot.
"""

from __future__ import annotations

import datetime as dt
import traceback

import pytest

from reporter.certcheck import CertVerifier

NOW = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
KEY = "-----BEGIN PRIVATE KEY-----\nSECRETSECRET\n-----END PRIVATE KEY-----\n"


def broken(ca, registry_cert, registry_key, node_cert, node_key, *, now):
    held = registry_key  # a local of the failing frame, as in the real key loader
    raise ValueError(f"cannot load key ({len(held)} bytes)")


def call(verifier: CertVerifier) -> Exception:
    with pytest.raises(Exception) as info:
        verifier("ca", "rc", KEY, "nc", KEY, now=NOW)
    return info.value


def test_a_cached_failure_is_raised_as_a_fresh_exception_without_key_material():
    verifier = CertVerifier(broken)
    first, second, third = call(verifier), call(verifier), call(verifier)
    assert verifier.calls == 1  # still remembered
    assert second is not third
    assert len(traceback.extract_tb(second.__traceback__)) == len(
        traceback.extract_tb(third.__traceback__)
    )
    for exc in (first, second, third):
        assert type(exc).__name__ == "VerifierError"
        assert "ValueError: cannot load key" in str(exc)
        # Not chained to the original, whose frames hold the key.
        assert exc.__cause__ is None and exc.__context__ is None
    # What stays for FAILURE_RETRY: text, no exception, so no frame holding the key.
    for verdict in verifier._entries.values():
        assert "SECRETSECRET" not in repr(verdict)
        assert not isinstance(verdict.error, BaseException)
