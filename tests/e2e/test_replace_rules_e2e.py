"""Issue 15 item 5 review, end to end (the real engine and the pinned provider on the local
cluster): what the provider replaces is refused by its own rules (the recorded inputs), also
where the API server's dry run accepts the change; what the API server refuses is worded as a
failed update, not as a replacement."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from pmem_components.manifests import bundle
from tests.e2e.test_day2 import NO_REPORTER, cfg_of, delete_quietly, failed_up, suffix
from tests.e2e.test_program import (
    Cluster,
    _write_config,
    dispose,
    make_stack,
    resource_changes,
    up,
)

pytestmark = pytest.mark.timeout(1200)

HISTORY = {"kind": "StatefulSet", "mergePatch": {"spec": {"revisionHistoryLimit": 3}}}
ORDERED = {"kind": "StatefulSet", "mergePatch": {"spec": {"podManagementPolicy": "OrderedReady"}}}
ATTACH = {"kind": "CSIDriver", "mergePatch": {"spec": {"attachRequired": True}}}
PATCH = "pmem-csi:deployments[0].patches[0]"
REPLACED = "which the Kubernetes provider does not update in place: it would delete the object"


def _config(dep: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"pmem-csi:manageCrd": False, "pmem-csi:deployments": [dep], **extra}


@pytest.fixture
def started(
    pulumi_ready: dict[str, str], tmp_path: Path, api_client: Any
) -> Iterator[tuple[Any, dict[str, Any]]]:
    """A stack of one deployment, created without patches."""
    from reporter.kubeapi import RawApi
    from tests.e2e.reporter_helpers import ensure_crd

    ensure_crd(RawApi(api_client))
    sfx = suffix()
    dep = {"name": f"r-{sfx}.pmem-csi.example", "namespace": f"replace-{sfx}",
           "reporter": NO_REPORTER}
    stack = make_stack(tmp_path, _config(dep))
    try:
        assert up(stack, "replace rules: created").summary.result == "succeeded"
        yield stack, dep
    finally:
        try:
            dispose(stack)
        finally:
            delete_quietly(client.CoreV1Api(api_client).delete_namespace, dep["namespace"])


def test_the_providers_replacements_and_the_api_servers_refusals_are_told_apart(
    started: tuple[Any, dict[str, Any]], api_client: Any
) -> None:
    stack, dep = started
    kube = Cluster(api_client)
    cfg = cfg_of(dep)
    objs = bundle.build_deployment_objects(cfg)
    sts = next(o for o in objs.all() if o["kind"] == "StatefulSet")
    ref = f"StatefulSet {cfg.namespace}/{cfg.names.controller_driver}"

    def uid(obj: dict[str, Any]) -> str:
        live = kube.get(obj)
        assert live is not None
        return str(live["metadata"]["uid"])

    first, driver_uid = uid(sts), uid(objs.csi_driver)

    # revisionHistoryLimit: the API server changes it in place (the dry run says 200), the
    # provider replaces: refused, by the patch.
    _write_config(stack, _config({**dep, "patches": [HISTORY]}))
    text = failed_up(stack)
    assert f"{PATCH}: changes spec.revisionHistoryLimit of {ref}, {REPLACED}" in text, text[-3000:]
    assert uid(sts) == first

    # The value the object has already (the API server's default): no change live, but not
    # in the recorded inputs: the provider replaces, refused.
    _write_config(stack, _config({**dep, "patches": [ORDERED]}))
    text = failed_up(stack)
    assert f"{PATCH}: changes spec.podManagementPolicy of {ref}, {REPLACED}" in text, text[-3000:]
    assert uid(sts) == first

    # A CSIDriver's attachRequired: immutable in the API, not on the provider's list: the
    # update would fail (nothing is replaced), and the error says so.
    _write_config(stack, _config({**dep, "patches": [ATTACH]}))
    text = failed_up(stack)
    # (The API server names the field spec.attachedRequired, sic: the refusal names what
    # the API server names when no changed path matches it.)
    refusal = re.search(
        rf"{re.escape(PATCH)}: changes spec\.attach\w*Required of CSIDriver "
        rf"{re.escape(cfg.name)}, and the API server refuses this change: [^;]*field is "
        r"immutable; the update would fail",
        text,
    )
    assert refusal is not None, text[-3000:]
    assert "create it anew" not in text
    assert uid(objs.csi_driver) == driver_uid

    # The steady state passes.
    _write_config(stack, _config(dep))
    assert up(stack, "replace rules: unchanged").summary.result == "succeeded"
    assert uid(sts) == first

    # Without the preflight the provider does replace for the OrderedReady patch (the rule
    # is the provider's, not a guess) ...
    _write_config(stack, _config({**dep, "patches": [ORDERED]}, **{"pmem-csi:preflight": False}))
    result = up(stack, "replace rules: replaced without the preflight")
    assert resource_changes(result.summary.resource_changes).get("replace") == 1
    second = uid(sts)
    assert second != first

    # ... and removing the patch again (the API server would default the field back to the
    # same value, the dry run accepts) is refused as the deployment's change.
    _write_config(stack, _config(dep))
    text = failed_up(stack)
    assert (f"pmem-csi:deployments[0]: this update changes spec.podManagementPolicy of {ref}, "
            f"{REPLACED}") in text, text[-3000:]
    assert "for a removed patch, the patch" in text
    assert uid(sts) == second

    # The way forward: the patch back.
    _write_config(stack, _config({**dep, "patches": [ORDERED]}))
    assert up(stack, "replace rules: patch back").summary.result == "succeeded"
    assert uid(sts) == second
