"""Pulumi component resources of a PMEM-CSI driver deployment.

The components are deliberately thin: every object comes from the pure builders in
:mod:`pmem_components.manifests`, the components only register them with the right parent
and dependencies. They are also usable as a library by other Pulumi programs::

    from pmem_components import PmemCsiDeployment
    from pmem_components.config import DeploymentConfig

    PmemCsiDeployment(DeploymentConfig(name="pmem-csi.example.org", device_mode="direct"))
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pulumi

from pmem_components import (
    awaiting,
    cert_resource,
    names,
    registry,
    secretmutable,
    takeover_transform,
)
from pmem_components.config import (
    ConfigError,
    DeploymentConfig,
    certificate_problems,
    deployment_problems,
    key_path,
)
from pmem_components.manifests import bundle
from pmem_components.manifests.crd import load_crd
from pmem_components.patches import DIGEST_KINDS, PatchError, PatchSet

TYPE_PREFIX = "pmem-csi:index:"
COMPONENT_TYPE = f"{TYPE_PREFIX}PmemCsiDeployment"
CONTROLLER_TYPE = f"{TYPE_PREFIX}ControllerDriver"
NODE_TYPE = f"{TYPE_PREFIX}NodeDriver"

# pulumi-kubernetes' annotations: resolve server-side apply conflicts in this stack's favour;
# how a delete propagates to dependents (pods of a workload).
PATCH_FORCE_ANNOTATION = "pulumi.com/patchForce"
DELETION_POLICY_ANNOTATION = "pulumi.com/deletionPropagationPolicy"

# (object, parent, depends_on) -> resource
Registrar = Callable[
    [dict[str, Any], pulumi.Resource, list[pulumi.Resource]], pulumi.CustomResource
]


def _child_opts(
    parent: pulumi.Resource, depends_on: Sequence[pulumi.Resource] = ()
) -> pulumi.ResourceOptions:
    return pulumi.ResourceOptions(parent=parent, depends_on=list(depends_on))


def _plain_register(
    obj: dict[str, Any], parent: pulumi.Resource, deps: list[pulumi.Resource]
) -> pulumi.CustomResource:
    return registry.register(obj, _child_opts(parent, deps))


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
        register: Registrar | None = None,
    ) -> None:
        super().__init__(CONTROLLER_TYPE, name, None, opts)
        objs = objects if objects is not None else bundle.controller_objects(cfg)
        reg = register or _plain_register
        # ServiceAccount and RBAC before the StatefulSet, so its pods start with what they
        # need. Not the Services: the pods do not need them, and they are created in parallel.
        self.resources = []
        for obj in objs:
            deps = list(depends_on)
            if obj["kind"] == "StatefulSet":
                done = zip(self.resources, objs[: len(self.resources)], strict=True)
                deps += [r for r, o in done if o["kind"] != "Service"]
            self.resources.append(reg(obj, self, deps))
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
        register: Registrar | None = None,
    ) -> None:
        super().__init__(NODE_TYPE, name, None, opts)
        objs = objects if objects is not None else bundle.node_objects(cfg)
        reg = register or _plain_register
        created = [reg(obj, self, list(depends_on)) for obj in objs]
        self.daemon_set = created[0]
        self.register_outputs({"daemonSet": cfg.names.node_driver, "namespace": cfg.namespace})


def _certificates(
    name: str,
    cfg: DeploymentConfig,
    opts: pulumi.ResourceOptions,
    running: Any = None,
    index: int = 0,
) -> bundle.CertificateValues:
    """The configured certificates, or a set generated once and kept in Pulumi state.

    Generated sets are renewed in place by ``pulumi up`` once they expire within
    ``certificates.renewBeforeDays``; a change of ``certificates.rotation`` (or a CA near
    expiry) changes the CA in three stages (:mod:`pmem_components.cert_resource`), each
    taken once ``running`` (the driver pods, read from the cluster: a
    ``certrollout.Rollout``, or their fingerprints) shows that every pod runs the previous
    one, or, when the pods are unknown, once ``certificates.rolledOut`` confirms it. The
    fingerprint of the public certificates goes into the pod templates, so any change of
    certificate material (renewal, each stage, provided <-> generated) rolls the driver pods.
    """
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
        name,
        provided,
        rotation=str(c.rotation),
        renew_within_days=c.renew_before_days,
        validity_days=c.validity_days,
        running=running,
        confirmed_fingerprint=c.rolled_out,
        config_key=key_path(("deployments", index, "certificates")),
        namespace=cfg.namespace,
        selector=cfg.names.label_selector(),
        opts=opts,
    )
    fingerprint = pulumi.Output.all(certs.ca_cert, certs.registry_cert, certs.node_controller_cert)
    return bundle.CertificateValues(
        ca_cert=certs.ca_cert,
        registry_cert=certs.registry_cert,
        registry_key=certs.registry_key,
        node_controller_cert=certs.node_controller_cert,
        node_controller_key=certs.node_controller_key,
        fingerprint=fingerprint.apply(lambda pems: bundle.certificates_fingerprint(*pems)),
    )


def check_patches(cfg: DeploymentConfig, index: int) -> list[str]:
    """Problems of the deployment's patches against its objects (nothing is registered)."""
    if not cfg.patches:
        return []
    objects = bundle.build_deployment_objects(cfg).all()
    for obj in objects:
        if obj.get("kind") in DIGEST_KINDS:
            # As registration stamps them (PmemCsiDeployment): the dry run then refuses a
            # patch that removes or changes the digest (patches.fixed_field_changes).
            _annotate(obj, {names.SPEC_DIGEST_ANNOTATION: "<spec digest>"})
    try:
        PatchSet.for_deployment(index, cfg.patches).dry_run(objects)
    except PatchError as e:
        lines = [line.strip() for line in str(e).splitlines()]
        return lines[1:] if len(lines) > 1 else lines
    return []


@dataclass(frozen=True)
class PreviousDeployment:
    """Where this deployment ran before, when the stack config moves it (renamedFrom, or a
    new namespace with ``allowReinstall``). Its objects become aliases of the new ones, so the
    engine *replaces* them, and the workloads are deleted before their replacements start:
    two node drivers never run at once."""

    name: str
    namespace: str


@dataclass
class PmemCsiDeploymentArgs:
    """Inputs of :class:`PmemCsiDeployment`.

    ``config``: the deployment. ``crd``: the CRD resource when the same program installs it,
    so the CR is created after (and deleted before) it. ``namespace``: a Namespace resource
    registered elsewhere (the program registers namespaces at stack level) to depend on;
    without it the component registers ``config.namespace`` itself when
    ``config.createNamespace`` is true, kept on delete unless ``retain_namespace`` is false.
    ``index``: position in ``pmem-csi:deployments``, used in error messages. ``validate``:
    check cross-field rules, provided certificates and patches here (the program has done
    that already). ``previous``: see :class:`PreviousDeployment`.
    """

    config: DeploymentConfig
    crd: pulumi.Resource | None = None
    namespace: pulumi.Resource | None = None
    retain_namespace: bool = True
    index: int = 0
    validate: bool = True
    previous: PreviousDeployment | None = None
    # See pmem_components.takeover_transform: when the engine updates an object, fields other
    # field managers own are taken over first. Off for library use unless asked for: it
    # calls the API server from the program -- the cluster of the Kubernetes provider the
    # component deploys through (the one in ``opts``, else the default provider), and none
    # when that cannot be known for certain. ``allowed_field_owners``: the administrator's
    # ownership policy entries (pmem_components.fieldowners), on top of the built-in ones.
    take_over_fields: bool = False
    allowed_field_owners: Sequence[Any] = ()
    # The driver pods running now: a pmem_components.certrollout.Rollout (read_rollout: the
    # pods and their workloads' desired counts), or their certificate fingerprints
    # (bundle.CERTIFICATES_HASH_ANNOTATION); None or an empty list: not known. A generated
    # set's CA change moves to its next stage only when every running pod has the current
    # one (an empty list cannot tell "no pod wanted" from "pods not there", a Rollout can).
    running_certificates: Any = None


def default_provider_settings() -> Any:
    """The default Kubernetes provider's cluster settings (stack config ``kubernetes:*``)."""
    from pulumi.runtime import config as runtime_config

    from pmem_components import kubetarget

    return kubetarget.ProviderSettings.from_stack_config(runtime_config.get_config)


def kubernetes_provider(opts: pulumi.ResourceOptions | None) -> pulumi.ProviderResource | None:
    """The Kubernetes provider given in ``opts`` (``provider``, ``providers``, or inherited from
    ``parent``), as the SDK picks it for the component's children; None: the default provider."""
    if opts is None:
        return None
    if opts.provider is not None and opts.provider.package == "kubernetes":
        return opts.provider
    providers = opts.providers
    # A map is read as the SDK reads it: by each provider's package, whatever its key.
    for provider in providers.values() if isinstance(providers, Mapping) else providers or ():
        if provider is not None and provider.package == "kubernetes":
            return provider
    if opts.parent is not None:
        return opts.parent.get_provider("kubernetes:core/v1:Secret")
    return None


def secret_mutability_problems(
    cfg: DeploymentConfig, opts: pulumi.ResourceOptions | None
) -> list[str]:
    """The component's own check of :mod:`pmem_components.secretmutable` (library use and the
    served component; the stack program checks all its deployments first): for generated
    certificates deployed through the default provider, whose setting is the stack config's.
    An explicit provider's setting is not checked: the SDK does not give it back (its
    ``enable_secret_mutable`` output resolves to None, whatever it was given), so the docs
    ask library users to set it (docs/day2.md).
    """
    if cfg.certificates.provided or kubernetes_provider(opts) is not None:
        return []
    from pulumi.runtime import config as runtime_config

    return secretmutable.problems(
        [cfg], runtime_config.get_config(secretmutable.KEY), os.environ, this_project=False
    )


def stack_id() -> str:
    """``<organization>/<project>/<stack>``: the value of ``names.STACK_ANNOTATION`` on what
    this stack owns. It names the owner; what proves ownership is the stack's state (see
    :mod:`pmem_components.identity`: same-named stacks exist on other backends)."""
    from pmem_components import identity

    return identity.identity(pulumi.get_organization(), pulumi.get_project(), pulumi.get_stack())


def _urn(types: Sequence[str], name: str) -> str:
    """The URN of a resource whose type chain (parents first) is ``types``."""
    return f"urn:pulumi:{pulumi.get_stack()}::{pulumi.get_project()}::{'$'.join(types)}::{name}"


def _annotate(obj: dict[str, Any], annotations: dict[str, str]) -> dict[str, Any]:
    meta = obj.setdefault("metadata", {})
    meta["annotations"] = {**(meta.get("annotations") or {}), **annotations}
    return obj


class PmemCsiDeployment(pulumi.ComponentResource):
    """One complete PMEM-CSI driver deployment plus its ``Deployment`` CR.

    Pulumi's component convention: ``PmemCsiDeployment(name, args, opts)``; pass a provider
    in ``opts`` to deploy to another cluster. Child resources are named after the Kubernetes
    objects; when ``name`` differs from the driver name they are prefixed with ``name:`` so
    two instances (e.g. the same driver on two clusters) never share a URN. The older form
    ``PmemCsiDeployment(config)`` still works and uses the driver name as ``name``.
    """

    # Whether children are named "<name>:<object>" when ``name`` is not the driver name (library
    # use: the same driver on two clusters from one program). The served component (issue 19,
    # pmem_components.provider_face) names them by the objects only, so renaming its resource
    # key keeps every child's URN; it refuses two components that would share one instead.
    # (Not annotated: the served schema would read an annotation as an output.)
    children_prefixed_by_name = True

    # The attributes are annotated where __init__ sets them, not here: the component provider
    # (pmem_components.provider_face) infers its schema's outputs from the class annotations
    # of the served subclass and its bases, and these are not all outputs.

    def __init__(
        self,
        name: str | DeploymentConfig,
        args: PmemCsiDeploymentArgs | DeploymentConfig | None = None,
        opts: pulumi.ResourceOptions | None = None,
        **legacy: Any,
    ) -> None:
        if isinstance(name, DeploymentConfig):  # the pre-convention form (config, opts, ...)
            if isinstance(args, pulumi.ResourceOptions):
                opts, args = args, None
            args = PmemCsiDeploymentArgs(name, **legacy)
            name = name.name
        elif isinstance(args, DeploymentConfig):
            args = PmemCsiDeploymentArgs(args, **legacy)
        if args is None:
            raise TypeError("PmemCsiDeployment needs args (PmemCsiDeploymentArgs)")
        cfg = args.config
        problems: list[str] = []
        if args.validate:
            problems = deployment_problems(cfg, args.index)
            if not problems:
                problems = certificate_problems(cfg, args.index)[0] + check_patches(cfg, args.index)
        # Not one of the checks ``validate=False`` skips (the config's own rules, done by the
        # program already): it is about the provider the children deploy through.
        problems += secret_mutability_problems(cfg, opts)
        if problems:
            raise ConfigError(problems)
        # Await settings first, so a user patch can still change one object's annotation.
        transforms = [awaiting.transform(cfg)]
        if cfg.patches:
            transforms.append(PatchSet.for_deployment(args.index, cfg.patches).transform)
        take_over: takeover_transform.TakeOver | None = None
        if args.take_over_fields:
            # The provider is known once the component is (see below); the transform and the
            # hook ask for it only when the children register.
            take_over = takeover_transform.TakeOver(
                takeover_transform.ClusterSource(None, default_provider_settings),
                allowed=tuple(args.allowed_field_owners),
            )
            # Last: it must see the inputs exactly as the provider will apply them.
            transforms.append(take_over.transform)
        prev = args.previous
        own_aliases: list[Any] = []
        if prev is not None and prev.name != cfg.name and name == cfg.name:
            own_aliases.append(_urn([COMPONENT_TYPE], prev.name))
        # The names this instance had before (see _former_names): its children keep their
        # URNs when it switches faces, or moves from the program to library use.
        former = [n for n in _former_names(opts) if n != name]
        if name != cfg.name and cfg.name not in former:
            former.append(cfg.name)  # the config face's (and the program's) URNs
            own_aliases.append(_urn([COMPONENT_TYPE], cfg.name))
        prefix = "" if name == cfg.name or not self.children_prefixed_by_name else f"{name}:"
        if not prefix and name != cfg.name and name not in former:
            former.append(name)  # the "<name>:" children of the prefixed layout (before issue 19)
        # Never an alias of a child's own URN.
        former_prefixes = [
            p
            for p in dict.fromkeys("" if n == cfg.name else f"{n}:" for n in former)
            if p != prefix
        ]
        opts = pulumi.ResourceOptions.merge(
            opts, pulumi.ResourceOptions(transforms=transforms, aliases=own_aliases or None)
        )
        super().__init__(COMPONENT_TYPE, name, None, opts)
        hooks: pulumi.ResourceHookBinding | None = None
        if take_over is not None:
            take_over.source.provider = self.get_provider("kubernetes:core/v1:Secret")
            hook = pulumi.ResourceHook(f"pmem-csi-take-over-{name}", take_over.before_update)
            adopted = pulumi.ResourceHook(f"pmem-csi-adopted-{name}", take_over.after_create)
            hooks = pulumi.ResourceHookBinding(before_update=[hook], after_create=[adopted])
        self.namespace: str = cfg.namespace
        self.object_names: dict[str, str] = bundle.object_names(cfg)
        h = cfg.names.hyphened
        old_h = DeploymentConfig(name=prev.name).names.hyphened if prev is not None else h

        def sub_opts(kind: str, suffix: str) -> pulumi.ResourceOptions:
            aliases = [_urn([COMPONENT_TYPE, kind], f"{p}{h}{suffix}") for p in former_prefixes]
            if prev is not None and old_h != h and not prefix:
                aliases.append(_urn([COMPONENT_TYPE, kind], f"{old_h}{suffix}"))
            return pulumi.ResourceOptions(parent=self, aliases=aliases or None)

        certs = _certificates(
            f"{prefix}{h}-certificates",
            cfg,
            sub_opts(cert_resource.COMPONENT_TYPE, "-certificates"),
            args.running_certificates,
            args.index,
        )
        create_ns = cfg.create_namespace and args.namespace is None
        objs = bundle.build_deployment_objects(cfg, certs, create_namespace=create_ns)
        old_objs = (
            bundle.build_deployment_objects(
                cfg.model_copy(update={"name": prev.name, "namespace": prev.namespace}),
                certs,
                create_namespace=create_ns,
            )
            if prev is not None and not prefix
            else None
        )
        extra: dict[str, str] = {}
        if cfg.adopt_existing or args.take_over_fields:
            # Objects someone else created with these names (e.g. the operator) are taken
            # over: server-side apply takes the conflicting fields instead of failing. With
            # take_over_fields the declared state wins over any other field manager; forcing
            # also keeps the preview's dry-run apply from failing on a conflict that the
            # take-over (done in `up` only) resolves. The take-over leaves namespaces alone
            # (takeover_transform.SKIPPED_TYPES: administrators label them for others), so a
            # namespace this component creates is forced only with adoptExisting: here that
            # adopts the namespace too (the served args have no adoptNamespace), where the
            # program forces its stack namespaces for adoptNamespace / pmem-csi:adopt.
            extra[PATCH_FORCE_ANNOTATION] = "true"
            for obj in objs.all():
                if obj is objs.namespace and not cfg.adopt_existing:
                    continue
                _annotate(obj, extra)
        _annotate(objs.deployment_cr, {names.STACK_ANNOTATION: stack_id()})
        # The CR spec as the API server will store it (after the stack's patches), whose
        # digest the workloads carry: the reporter says Running at generation N only once
        # both carry generation N's (names.SPEC_DIGEST_ANNOTATION).
        final_cr = objs.deployment_cr
        if cfg.patches:
            patched = PatchSet.for_deployment(args.index, cfg.patches).apply("", final_cr)
            final_cr = patched if patched is not None else final_cr
        digest = names.spec_digest(final_cr.get("spec") or {})
        for workload in (*objs.controller, *objs.node):
            if workload["kind"] in DIGEST_KINDS:
                # Deleted only once its pods are gone: a reinstall (delete before replace)
                # then never overlaps two drivers on a node.
                _annotate(
                    workload,
                    {
                        DELETION_POLICY_ANNOTATION: "foreground",
                        names.SPEC_DIGEST_ANNOTATION: digest,
                    },
                )

        def register(
            obj: dict[str, Any],
            parent: pulumi.Resource,
            parent_types: Sequence[str],
            deps: Sequence[pulumi.Resource] = (),
        ) -> pulumi.CustomResource:
            token, rname = registry.type_token(obj), registry.resource_name(obj)
            aliases: list[Any] = [
                _urn([*parent_types, token], f"{p}{rname}") for p in former_prefixes
            ]
            replace_first = False
            if old_objs is not None:
                old = _counterpart(obj, objs, old_objs)
                if old is not None and registry.resource_name(old) != registry.resource_name(obj):
                    aliases.append(
                        _urn([*parent_types, registry.type_token(old)], registry.resource_name(old))
                    )
                    replace_first = obj["kind"] in ("StatefulSet", "DaemonSet")
            return registry.register(
                obj,
                pulumi.ResourceOptions(
                    parent=parent,
                    depends_on=list(deps),
                    aliases=aliases or None,
                    delete_before_replace=replace_first or None,
                    hooks=hooks,
                ),
                name_prefix=prefix,
            )

        top = [COMPONENT_TYPE]
        base: list[pulumi.Resource] = [args.namespace] if args.namespace is not None else []
        if objs.namespace is not None:
            ns_obj = _annotate(objs.namespace, {names.STACK_ANNOTATION: stack_id()})
            ns_token = registry.type_token(ns_obj)
            # Also where the program registers it: a stack resource (program -> library).
            ns_aliases = [_urn([ns_token], cfg.namespace)] + [
                _urn([*top, ns_token], f"{p}{cfg.namespace}") for p in former_prefixes
            ]
            ns_res = registry.register(
                ns_obj,
                pulumi.ResourceOptions(
                    parent=self, retain_on_delete=args.retain_namespace, aliases=ns_aliases
                ),
                name_prefix=prefix,
            )
            base = [ns_res]
        self.namespace_resource: pulumi.Resource | None = base[0] if base else None

        secrets = [register(o, self, top, base) for o in objs.secrets]
        self.csi_driver = register(objs.csi_driver, self, top)
        self.controller = ControllerDriver(
            f"{prefix}{h}-controller",
            cfg,
            sub_opts(CONTROLLER_TYPE, "-controller"),
            depends_on=[*base, *secrets],
            objects=objs.controller,
            register=lambda o, p, d: register(o, p, [*top, CONTROLLER_TYPE], d),
        )
        self.node = NodeDriver(
            f"{prefix}{h}-node",
            cfg,
            sub_opts(NODE_TYPE, "-node"),
            depends_on=[*base, *secrets, self.csi_driver],
            objects=objs.node,
            register=lambda o, p, d: register(o, p, [*top, NODE_TYPE], d),
        )
        cr_deps = [args.crd] if args.crd is not None else []
        self.deployment_cr = register(objs.deployment_cr, self, top, cr_deps)
        # The reporter is the stack's, not this deployment's: registered by
        # ``pmem_components.program.register_reporter`` for every deployment at once, as
        # children of the first deployment it serves (register_reporter_object): the same
        # transforms (await, patches, take-over), update hook and forced apply as every other
        # object, and the URNs that deployment's own reporter had.
        self.reporter: list[pulumi.CustomResource] = []

        def register_reporter_object(
            obj: dict[str, Any], deps: Sequence[pulumi.Resource]
        ) -> pulumi.CustomResource:
            return register(_annotate(obj, extra) if extra else obj, self, top, deps)

        self.register_reporter_object = register_reporter_object
        self.ca_cert: pulumi.Output[str] = pulumi.Output.from_input(certs.ca_cert)
        self.register_outputs(
            {
                "namespace": self.namespace,
                "objectNames": self.object_names,
                "caCert": self.ca_cert,
            }
        )


def _former_names(opts: pulumi.ResourceOptions | None) -> list[str]:
    """Names this component had before, from its own aliases (``pulumi.Alias(name=...)`` or
    a URN of this type): each child then gets the alias of the child it was under that name.

    Pulumi derives a child's alias from its parent's only when the child's name starts with
    the parent's; the children of ``PmemCsiDeployment(config)`` are named after the objects,
    so the component spells them out. ``PmemCsiDeployment("name", args)`` always counts the
    driver name (the config face's and the program's) among them.
    """
    out: list[str] = []
    for alias in (opts.aliases if opts is not None else None) or []:
        former: Any = None
        if isinstance(alias, pulumi.Alias) and alias.type_ in (None, ..., COMPONENT_TYPE):
            former = alias.name
        elif isinstance(alias, str) and alias.count("::") == 3:
            _, _, type_, former = alias.split("::")
            former = former if type_ == COMPONENT_TYPE else None
        if isinstance(former, str) and former and former not in out:
            out.append(former)
    return out


def _counterpart(
    obj: dict[str, Any], new: bundle.DeploymentObjects, old: bundle.DeploymentObjects
) -> dict[str, Any] | None:
    """The object of the previous name/namespace that ``obj`` takes the place of.

    Both bundles come from the same builders, so the n-th object of a kind in one is the
    n-th of that kind in the other.
    """

    def key(o: dict[str, Any]) -> tuple[str, str]:
        return (o["apiVersion"], o["kind"])

    same_kind = [o for o in new.all() if key(o) == key(obj)]
    position = next(i for i, o in enumerate(same_kind) if o is obj)
    old_same = [o for o in old.all() if key(o) == key(obj)]
    return old_same[position] if position < len(old_same) else None


def install_crd(
    opts: pulumi.ResourceOptions | None = None, *, retain: bool = True
) -> pulumi.CustomResource:
    """The ``deployments.pmem-csi.intel.com`` CRD from ``crd/`` as a stack resource.

    With ``manageCrd: true`` the stack is the CRD's owner, so it takes over fields that another
    field manager set: the provider creates by server-side apply, and a CRD applied earlier
    with ``kubectl`` from an older ``crd/`` file (the documented way for ``manageCrd: false``)
    would otherwise fail ``pulumi up`` with a field conflict on ``.spec.versions`` instead
    of being upgraded to the file in this repository.

    ``retain`` (default): removing the CRD from the stack (``manageCrd: false``) or
    ``pulumi destroy`` leaves it in the cluster. Deleting a CRD deletes every object of its
    kind, including other stacks' ``Deployment`` CRs; ``retainCrd: false`` asks for that.
    """
    crd = load_crd()
    meta = crd.setdefault("metadata", {})
    meta["annotations"] = {**(meta.get("annotations") or {}), PATCH_FORCE_ANNOTATION: "true"}
    return registry.register(
        crd,
        pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(retain_on_delete=retain)),
    )
