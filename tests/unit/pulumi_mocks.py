"""Pulumi mocks shared by the component unit tests.

They record every registered resource and echo its inputs as outputs; the dynamic
certificate resource gets fixed placeholder outputs, since mocks do not run providers.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pulumi
from pulumi.runtime import config as runtime_config

from pmem_components import secretmutable

CERTIFICATES_TYPE_SUFFIX = "dynamic/pmem-csi:Certificates"


@contextmanager
def project_config() -> Iterator[None]:
    """The stack config every stack of this project has (Pulumi.yaml):
    ``kubernetes:enableSecretMutable`` true, which the component asks of the default provider
    (``pmem_components.secretmutable``) whatever ``validate`` says."""
    token = runtime_config.CONFIG.set({secretmutable.KEY: "true"})
    try:
        yield
    finally:
        runtime_config.CONFIG.reset(token)


class RecordingMocks(pulumi.runtime.Mocks):
    def __init__(self, certificate_outputs: dict[str, str]) -> None:
        self.resources: list[pulumi.runtime.MockResourceArgs] = []
        self.certificate_outputs = certificate_outputs

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        self.resources.append(args)
        outs = dict(args.inputs)
        if args.typ.endswith(CERTIFICATES_TYPE_SUFFIX):
            outs.update(self.certificate_outputs)
        return f"{args.name}-id", outs

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict[str, Any], list[Any]]:
        return {}, []
