"""How long ``pulumi up`` waits for which object: the provider's await, set per deployment.

pulumi-kubernetes waits after creating or updating an object until it is "ready" by rules of
its kind. Two of those waits are worth having and two are not:

* **Services are never awaited.** The provider waits until a Service has endpoints, i.e. until
  pods of the controller StatefulSet are ready -- which the StatefulSet's own await already
  shows. Worse, the StatefulSet is created after the Services, so each Service waited for pods
  that did not exist yet; that cost about 10 s of every first ``pulumi up`` (BENCHMARKS.md).
  ``pulumi.com/skipAwait`` on the Services removes the wait, not any information.
* **Workloads** (controller StatefulSet, node DaemonSet, reporter Deployment) are awaited by
  default, so a ``pulumi up`` that returns means running driver pods. ``await.enabled: false``
  skips that (the CR status written by the reporter tells when they are ready), and
  ``await.timeout`` replaces the provider's 10 minutes for create, update and delete, for
  clusters whose DaemonSet rollout takes longer.

Applied as a Pulumi resource transform of the deployment component, before the user's patches,
so a patch can still change the annotation of a single object.
"""

from __future__ import annotations

import copy
from typing import Any

import pulumi

from pmem_components.config import DeploymentConfig

SKIP_AWAIT_ANNOTATION = "pulumi.com/skipAwait"
SERVICE_TYPE = "kubernetes:core/v1:Service"
WORKLOAD_TYPES = frozenset(
    {
        "kubernetes:apps/v1:StatefulSet",
        "kubernetes:apps/v1:DaemonSet",
        "kubernetes:apps/v1:Deployment",
    }
)


def _with_annotation(props: dict[str, Any], key: str, value: str) -> dict[str, Any]:
    out = dict(props)
    meta = copy.copy(out.get("metadata") or {})
    meta["annotations"] = {**(meta.get("annotations") or {}), key: value}
    out["metadata"] = meta
    return out


def custom_timeouts(cfg: DeploymentConfig) -> pulumi.CustomTimeouts | None:
    timeout = cfg.await_.timeout
    if not cfg.await_.enabled or timeout is None:
        return None
    return pulumi.CustomTimeouts(create=timeout, update=timeout, delete=timeout)


def transform(cfg: DeploymentConfig) -> pulumi.ResourceTransform:
    """The resource transform for one deployment's await settings."""
    timeouts = custom_timeouts(cfg)

    def apply(args: pulumi.ResourceTransformArgs) -> pulumi.ResourceTransformResult | None:
        if not args.custom:
            return None
        if args.type_ == SERVICE_TYPE:
            props = _with_annotation(args.props, SKIP_AWAIT_ANNOTATION, "true")
            return pulumi.ResourceTransformResult(props=props, opts=args.opts)
        if args.type_ not in WORKLOAD_TYPES:
            return None
        if not cfg.await_.enabled:
            props = _with_annotation(args.props, SKIP_AWAIT_ANNOTATION, "true")
            return pulumi.ResourceTransformResult(props=props, opts=args.opts)
        if timeouts is not None:
            opts = pulumi.ResourceOptions.merge(
                args.opts, pulumi.ResourceOptions(custom_timeouts=timeouts)
            )
            return pulumi.ResourceTransformResult(props=args.props, opts=opts)
        return None

    return apply
