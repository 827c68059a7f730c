"""Fixtures the certificate-rollover unit modules share (the suite's own: tests/conftest.py)."""

from __future__ import annotations

from typing import Any

import pytest
from certutil import FIRST_SETTINGS

from pmem_components.cert_resource import CertificateProvider


@pytest.fixture(scope="module")
def gen0() -> dict[str, Any]:
    """A set created with :data:`FIRST_SETTINGS`, as the certificate resource stores it:
    within a 20-day window its leaves (10 days) are due, its CA (30 days) not."""
    created = CertificateProvider().create(dict(FIRST_SETTINGS))
    assert created.outs is not None
    return dict(created.outs)
