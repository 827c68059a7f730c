"""The await settings' transform: Services never awaited, workloads as configured.

Pulumi mocks do not run transforms, so the transform is called directly here with the
builders' objects; tests/e2e/test_cli.py shows the effect with the real engine.
"""

from __future__ import annotations

from typing import Any

import pulumi

from pmem_components import awaiting
from pmem_components.config import DeploymentConfig, load_config
from pmem_components.manifests import bundle

SKIP = awaiting.SKIP_AWAIT_ANNOTATION


def _dep(**await_settings: Any) -> DeploymentConfig:
    raw = {"await": await_settings} if await_settings else {}
    return load_config({"deployments": [raw]}).deployments[0]


def _type(obj: dict[str, Any]) -> str:
    group = obj["apiVersion"] if "/" in obj["apiVersion"] else f"core/{obj['apiVersion']}"
    return f"kubernetes:{group}:{obj['kind']}"


def _apply(cfg: DeploymentConfig) -> dict[str, Any]:
    """Kind -> transform result (None = unchanged) for every object of the deployment."""
    transform = awaiting.transform(cfg)
    results: dict[str, Any] = {}
    for obj in bundle.build_deployment_objects(cfg).all():
        args = pulumi.ResourceTransformArgs(
            custom=True, type_=_type(obj), name="x", props=obj, opts=pulumi.ResourceOptions()
        )
        results[f"{obj['kind']}/{obj['metadata']['name']}"] = transform(args)
    return results


def _annotations(result: Any) -> dict[str, str]:
    return result.props["metadata"].get("annotations") or {}


def test_default_skips_the_services_await_only() -> None:
    results = _apply(_dep())
    services = {k: v for k, v in results.items() if k.startswith("Service/")}
    assert len(services) == 2
    for result in services.values():
        assert _annotations(result) == {SKIP: "true"}
    others = {k: v for k, v in results.items() if not k.startswith("Service/")}
    assert others and all(v is None for v in others.values()), others


def test_disabled_skips_the_workloads_await() -> None:
    results = _apply(_dep(enabled=False))
    workloads = {
        k: v
        for k, v in results.items()
        if k.split("/")[0] in ("StatefulSet", "DaemonSet")
        or k == "Deployment/pmem-csi-intel-com-reporter"
    }
    assert len(workloads) == 3
    for result in workloads.values():
        assert _annotations(result)[SKIP] == "true"
    # The builder's own object is not modified (it is also the patch dry run's input).
    sts = bundle.build_deployment_objects(_dep(enabled=False)).controller[-1]
    assert SKIP not in (sts["metadata"].get("annotations") or {})


def test_timeout_becomes_custom_timeouts_of_the_workloads() -> None:
    results = _apply(_dep(timeout="25m"))
    sts = results["StatefulSet/pmem-csi-intel-com-controller"]
    timeouts = sts.opts.custom_timeouts
    assert (timeouts.create, timeouts.update, timeouts.delete) == ("25m", "25m", "25m")
    assert SKIP not in _annotations(sts)
    assert results["Deployment/pmem-csi.intel.com"] is None  # the CR: no await involved


def test_await_config_errors_name_each_key() -> None:
    import pytest

    from pmem_components.config import ConfigError

    with pytest.raises(ConfigError) as err:
        load_config(
            {
                "deployments": [
                    {"await": {"timeout": "soon", "enabled": "maybe"}},
                    {"name": "b.example.org", "await": {"enabled": False, "timeout": "5m"}},
                    {"name": "c.example.org", "await": {"timeout": "0s"}},
                ]
            }
        )
    assert err.value.problems == [
        'pmem-csi:deployments[0].await.enabled: must be true or false (got "maybe")',
        "pmem-csi:deployments[0].await.timeout: must be a positive duration such as 90s, "
        '20m or 1h30m (got "soon")',
        "pmem-csi:deployments[1].await.timeout: is only valid with await.enabled true "
        "(nothing is awaited)",
        "pmem-csi:deployments[2].await.timeout: must be a positive duration such as 90s, "
        '20m or 1h30m (got "0s")',
    ]
    # As `pulumi config set --path` stores them: strings.
    dep = load_config({"deployments": [{"await": {"enabled": "false"}}]}).deployments[0]
    assert dep.await_.enabled is False


def test_production_example_documents_a_valid_await_block() -> None:
    import yaml

    from tools import toolchain

    example = toolchain.PROJECT_DIR / "Pulumi.production.example.yaml"
    dep = yaml.safe_load(example.read_text())["config"]["pmem-csi:deployments"][0]
    parsed = load_config({"deployments": [{"await": dep["await"]}]}).deployments[0]
    assert (parsed.await_.enabled, parsed.await_.timeout) == (True, "20m")
