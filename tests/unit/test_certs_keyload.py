"""validate_driver_certificates parses each private key once (a cost, not a timing, check).

Parsing an RSA-3072 key with its consistency checks is the bulk of a cold certificate
verdict (see BENCHMARKS.md); the handshake reuses the keys the static checks loaded. Counting
calls instead of timing them keeps the test deterministic on any machine.
"""

from __future__ import annotations

import pytest
from certutil import good_set

from pmem_components import certs


def test_each_key_is_parsed_once_and_the_handshake_still_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    s = good_set()
    real = certs._load_key
    loads: list[str] = []
    handshakes: list[bool] = []
    real_check = certs.check_mutual_tls

    def counting_load(pem: str) -> object:
        loads.append(pem)
        return real(pem)

    def spy_check(*args: str, **kwargs: object) -> list[certs.CertProblem]:
        handshakes.append(kwargs.get("loaded_keys") is not None)
        return real_check(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(certs, "_load_key", counting_load)
    monkeypatch.setattr(certs, "check_mutual_tls", spy_check)
    assert certs.validate_driver_certificates(*s.args()) == []
    assert handshakes == [True]
    assert sorted(loads) == sorted([s.registry_key, s.node_controller_key])


def test_check_mutual_tls_alone_still_loads_its_keys() -> None:
    assert certs.check_mutual_tls(*good_set().args()) == []
