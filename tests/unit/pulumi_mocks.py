"""Pulumi mocks shared by the component unit tests.

They record every registered resource and echo its inputs as outputs; the dynamic
certificate resource gets fixed placeholder outputs, since mocks do not run providers.
"""

from __future__ import annotations

from typing import Any

import pulumi

CERTIFICATES_TYPE_SUFFIX = "dynamic/pmem-csi:Certificates"


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
