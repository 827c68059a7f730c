"""Fixtures the reporter's end-to-end modules share (the cluster itself: tests/conftest.py)."""

from __future__ import annotations

from typing import Any

import pytest

from pmem_components import certs as certs_mod
from pmem_components.certs import DriverCertificates
from reporter.kubeapi import RawApi
from tests.e2e.reporter_helpers import ensure_crd


@pytest.fixture(scope="module")
def raw(api_client: Any) -> RawApi:
    """The administrator's raw API access, as the reporter's own client makes requests."""
    return RawApi(api_client)


@pytest.fixture(scope="module")
def driver_certs() -> DriverCertificates:
    """One certificate set per module: RSA-3072 generation costs about a second."""
    return certs_mod.generate_driver_certificates()


@pytest.fixture(scope="module")
def crd(raw: RawApi) -> None:
    """The Deployment CRD, installed once; modules that manage it with Pulumi override this."""
    ensure_crd(raw)
