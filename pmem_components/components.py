"""Pulumi component resources of a PMEM-CSI driver deployment.

The components are deliberately thin: every object comes from the pure builders in
:mod:`pmem_components.manifests`, the components only register them with the right parent
and dependencies. They are also usable as a library by other Pulumi programs::

    from pmem_components import PmemCsiDeployment
    from pmem_components.config import DeploymentConfig

    PmemCsiDeployment(DeploymentConfig(name="pmem-csi.example.org", device_mode="direct"))
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pulumi

from pmem_components import awaiting, cert_resource, registry
from pmem_components.config import (
    ConfigError,
    DeploymentConfig,
    certificate_problems,
    deployment_problems,
)
from pmem_components.manifests import bundle
from pmem_components.manifests.crd import load_crd
from pmem_components.patches import PatchError, PatchSet

TYPE_PREFIX = "pmem-csi:index:"


def _child_opts(
    parent: pulumi.Resource, depends_on: Sequence[pulumi.Resource] = ()
) -> pulumi.ResourceOptions:
    return pulumi.ResourceOptions(parent=parent, depends_on=list(depends_on))


class ControllerDriver(pulumi.ComponentResource):
    """The controller StatefulSet with its ServiceAccount, provisioner RBAC and Services."""

    stateful_set: pulumi.CustomResource
    resources: list[pulumi.CustomResource]

    def __init__(
        self,
        name: str,
        cfg: DeploymentConfig,
        opts: pulumi.ResourceOptions | None = None,
        *,
        depends_on: Sequence[pulumi.Resource] = (),
        objects: list[dict[str, Any]] | None = None,
    ) -> None:
        super().__init__(f"{TYPE_PREFIX}ControllerDriver", name, None, opts)
        objs = objects if objects is not None else bundle.controller_objects(cfg)
        # ServiceAccount and RBAC before the StatefulSet, so its pods start with what they
        # need. Not the Services: the pods do not need them, and they are created in parallel.
        self.resources = []
        for obj in objs:
            deps = list(depends_on)
            if obj["kind"] == "StatefulSet":
                done = zip(self.resources, objs[: len(self.resources)], strict=True)
                deps += [r for r, o in done if o["kind"] != "Service"]
            self.resources.append(registry.register(obj, _child_opts(self, deps)))
        self.stateful_set = self.resources[-1]
        self.register_outputs(
            {"statefulSet": cfg.names.controller_driver, "namespace": cfg.namespace}
        )


class NodeDriver(pulumi.ComponentResource):
    """The node DaemonSet (node driver and driver registrar on every selected node)."""

    daemon_set: pulumi.CustomResource

    def __init__(
        self,
        name: str,
        cfg: DeploymentConfig,
        opts: pulumi.ResourceOptions | None = None,
        *,
        depends_on: Sequence[pulumi.Resource] = (),
        objects: list[dict[str, Any]] | None = None,
    ) -> None:
        super().__init__(f"{TYPE_PREFIX}NodeDriver", name, None, opts)
        objs = objects if objects is not None else bundle.node_objects(cfg)
        created = [registry.register(obj, _child_opts(self, depends_on)) for obj in objs]
        self.daemon_set = created[0]
        self.register_outputs({"daemonSet": cfg.names.node_driver, "namespace": cfg.namespace})


def _certificates(
    name: str, cfg: DeploymentConfig, parent: pulumi.Resource
) -> bundle.CertificateValues:
    """The configured certificates, or a set generated once and kept in Pulumi state."""
    c = cfg.certificates
    provided = (
        cert_resource.ProvidedCertificates(
            ca_cert=c.ca_cert or "",
            registry_cert=c.registry_cert or "",
            registry_key=pulumi.Output.secret(c.registry_key or ""),
            node_controller_cert=c.node_controller_cert or "",
            node_controller_key=pulumi.Output.secret(c.node_controller_key or ""),
        )
        if c.provided
        else None
    )
    certs = cert_resource.DriverCertificates(
        name, provided, opts=pulumi.ResourceOptions(parent=parent)
    )
    return bundle.CertificateValues(
        ca_cert=certs.ca_cert,
        registry_cert=certs.registry_cert,
        registry_key=certs.registry_key,
        node_controller_cert=certs.node_controller_cert,
        node_controller_key=certs.node_controller_key,
    )


def check_patches(cfg: DeploymentConfig, index: int) -> list[str]:
    """Problems of the deployment's patches against its objects (nothing is registered)."""
    if not cfg.patches:
        return []
    try:
        PatchSet.for_deployment(index, cfg.patches).dry_run(
            bundle.build_deployment_objects(cfg).all()
        )
    except PatchError as e:
        lines = [line.strip() for line in str(e).splitlines()]
        return lines[1:] if len(lines) > 1 else lines
    return []


class PmemCsiDeployment(pulumi.ComponentResource):
    """One complete PMEM-CSI driver deployment plus its ``Deployment`` CR.

    ``crd``: the CRD resource when this stack installs it, so the CR is created after (and
    deleted before) it. ``namespace``: a Namespace resource created elsewhere (another
    deployment of the same stack) to depend on instead of creating one. ``index``: position in
    ``pmem-csi:deployments``, used in error messages. ``validate``: check provided
    certificates and patches here (the program has done that already for all deployments).
    """

    namespace: str
    ca_cert: pulumi.Output[str]
    object_names: dict[str, str]
    namespace_resource: pulumi.Resource | None

    def __init__(
        self,
        cfg: DeploymentConfig,
        opts: pulumi.ResourceOptions | None = None,
        *,
        crd: pulumi.Resource | None = None,
        namespace: pulumi.Resource | None = None,
        index: int = 0,
        validate: bool = True,
    ) -> None:
        if validate:
            problems = deployment_problems(cfg, index)
            if not problems:
                problems = certificate_problems(cfg, index)[0] + check_patches(cfg, index)
            if problems:
                raise ConfigError(problems)
        # Await settings first, so a user patch can still change one object's annotation.
        transforms = [awaiting.transform(cfg)]
        if cfg.patches:
            transforms.append(PatchSet.for_deployment(index, cfg.patches).transform)
        opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(transforms=transforms))
        super().__init__(f"{TYPE_PREFIX}PmemCsiDeployment", cfg.name, None, opts)
        self.namespace = cfg.namespace
        self.object_names = bundle.object_names(cfg)
        h = cfg.names.hyphened

        certs = _certificates(f"{h}-certificates", cfg, self)
        objs = bundle.build_deployment_objects(
            cfg, certs, create_namespace=cfg.create_namespace and namespace is None
        )

        base: list[pulumi.Resource] = [namespace] if namespace is not None else []
        if objs.namespace is not None:
            namespace = registry.register(objs.namespace, _child_opts(self))
            base = [namespace]
        self.namespace_resource = namespace

        secrets = [registry.register(o, _child_opts(self, base)) for o in objs.secrets]
        self.csi_driver = registry.register(objs.csi_driver, _child_opts(self))
        self.controller = ControllerDriver(
            f"{h}-controller",
            cfg,
            pulumi.ResourceOptions(parent=self),
            depends_on=[*base, *secrets],
            objects=objs.controller,
        )
        self.node = NodeDriver(
            f"{h}-node",
            cfg,
            pulumi.ResourceOptions(parent=self),
            depends_on=[*base, *secrets, self.csi_driver],
            objects=objs.node,
        )
        cr_deps = [crd] if crd is not None else []
        self.deployment_cr = registry.register(objs.deployment_cr, _child_opts(self, cr_deps))
        self.reporter = [
            registry.register(o, _child_opts(self, [*base, self.deployment_cr]))
            for o in objs.reporter
        ]
        self.ca_cert = pulumi.Output.from_input(certs.ca_cert)
        self.register_outputs(
            {
                "namespace": self.namespace,
                "objectNames": self.object_names,
                "caCert": self.ca_cert,
            }
        )


# pulumi-kubernetes' annotation: resolve server-side apply conflicts in this stack's favour.
PATCH_FORCE_ANNOTATION = "pulumi.com/patchForce"


def install_crd(opts: pulumi.ResourceOptions | None = None) -> pulumi.CustomResource:
    """The ``deployments.pmem-csi.intel.com`` CRD from ``crd/`` as a stack resource.

    With ``manageCrd: true`` the stack is the CRD's owner, so it takes over fields that another
    field manager set: the provider creates by server-side apply, and a CRD applied earlier
    with ``kubectl`` from an older ``crd/`` file (the documented way for ``manageCrd: false``)
    would otherwise fail ``pulumi up`` with a field conflict on ``.spec.versions`` instead
    of being upgraded to the file in this repository.
    """
    crd = load_crd()
    meta = crd.setdefault("metadata", {})
    meta["annotations"] = {**(meta.get("annotations") or {}), PATCH_FORCE_ANNOTATION: "true"}
    return registry.register(crd, opts or pulumi.ResourceOptions())
