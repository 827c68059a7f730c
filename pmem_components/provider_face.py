"""The typed face of :class:`~pmem_components.components.PmemCsiDeployment` for other languages.

Why it exists: the package serves the component to TypeScript, Go, C#, Java and YAML programs
as a component provider (``provider/``: ``PulumiPlugin.yaml`` with ``runtime: python``). The
Python SDK infers the provider's schema from the type annotation of the component's ``args``
parameter, and that inference takes plain typed dictionaries only (no unions except
``Optional``, string map keys). :class:`~pmem_components.components.PmemCsiDeploymentArgs`
wraps a pydantic model, so it needs a face of its own: the TypedDicts below, one field for
every field of a ``pmem-csi:deployments`` entry of the stack config, with the same
camelCase names.

Nothing here decides anything: the args are turned back into the stack config's deployment
entry and go through :func:`pmem_components.config.load_config` (the same defaults, the same
messages), the patches through :func:`pmem_components.components.check_patches`, and the
objects come from the Python component itself. Messages name the field as the other
language writes it (``deviceMode``, ``patches[0].mergePatch``), not as a config key.

Every field is optional: a missing one takes the stack config's default. Quantities
(``controllerResources.limits.cpu``) and ``certificates.rotation`` are strings here (the schema
has no "string or number").

No ``from __future__ import annotations`` in this module: the schema inference reads the
annotations as objects.
"""

import re
import threading
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NotRequired, Optional, Required, TypedDict

import pulumi
from pulumi.errors import InputPropertiesError
from pulumi.provider import main as _provider_main
from pulumi.provider.experimental.component import ComponentDefinition, ComponentProvider

from pmem_components import awaiting, components, fieldowners, names, program, registry
from pmem_components.config import (
    CONFIG_NAMESPACE,
    ConfigError,
    DeploymentConfig,
    StackConfig,
    key_path,
    load_config,
)

PACKAGE_NAME = "pmem-csi"


class ResourceRequirementsArgs(TypedDict, total=False):
    """Container resources, as in a Kubernetes ``ResourceRequirements``."""

    limits: dict[str, str]
    """Quantities by resource name, e.g. ``{"cpu": "100m", "memory": "250Mi"}``."""
    requests: dict[str, str]
    """Quantities by resource name; default: the limits."""


class CertificatesArgs(TypedDict, total=False):
    """PEM certificates and keys of the driver, all five or none (then generated once)."""

    ca_cert: str
    """The CA certificate."""
    registry_cert: str
    """The registry's certificate."""
    registry_key: str
    """The registry's private key."""
    node_controller_cert: str
    """The node controller's certificate."""
    node_controller_key: str
    """The node controller's private key."""
    validity_days: int
    """Generated sets: the leaf certificates' lifetime in days (default 365)."""
    renew_before_days: int
    """Generated sets: renew this many days before expiry (default 30; 0 = never)."""
    rotation: str
    """Generated sets: a change of this value starts a staged CA change."""
    rolled_out: str
    """Generated sets: the certificates hash every driver pod runs, confirmed by the
    administrator, which moves a CA change whose pods were not read to its next stage."""


class PatchArgs(TypedDict, total=False):
    """A patch of the deployment's objects: which objects, and exactly one of the two forms."""

    kind: str
    """The kind of the objects to patch (required)."""
    api_version: str
    """Their apiVersion; default: any."""
    name: str
    """Their name; default: every object of the kind."""
    namespace: str
    """Their namespace; default: any."""
    merge_patch: dict[str, Any]
    """An RFC 7396 merge patch."""
    json_patch: list[dict[str, Any]]
    """RFC 6902 operations."""


class ReporterArgs(TypedDict, total=False):
    """The status reporter's settings (deployed by the Python program's stack only)."""

    enabled: bool
    """Default: when an image is set."""
    image: str
    """The reporter image (no public one: docs/reporter.md)."""
    replicas: int
    """Default 2."""
    log_level: int
    """Default 3."""


class AllowedFieldOwnerArgs(TypedDict, total=False):
    """Fields another field manager may own without it being drift (not taken over)."""

    manager: str
    """The field manager, as metadata.managedFields names it (required)."""
    paths: list[str]
    """Field paths as the take-over names them, e.g. metadata.labels.team; a path also covers
    everything below it (required)."""
    reason: str
    """Why this manager may own them (required)."""


class AwaitArgs(TypedDict, total=False):
    """How the deployment waits for its workloads."""

    enabled: bool
    """False: do not wait for the StatefulSet and DaemonSet to be ready (default true)."""
    timeout: str
    """A duration such as 20m replacing the provider's 10 minutes."""


# "await" is a Python keyword: only the functional TypedDict form can name the field.
_AwaitField = TypedDict("_AwaitField", {"await": NotRequired[AwaitArgs]})


class PmemCsiDeploymentArgs(_AwaitField, total=False):
    """One PMEM-CSI driver deployment: the fields of a ``pmem-csi:deployments`` entry."""

    name: str
    """The CSI driver name (default pmem-csi.intel.com)."""
    namespace: str
    """The driver's namespace (default pmem-csi)."""
    create_namespace: bool
    """Create the namespace (default true)."""
    image: str
    """The driver image."""
    image_pull_policy: str
    """Always, Never or IfNotPresent (default)."""
    provisioner_image: str
    """The external-provisioner image."""
    node_registrar_image: str
    """The node-driver-registrar image."""
    controller_resources: ResourceRequirementsArgs
    """Resources of the controller's driver container."""
    node_resources: ResourceRequirementsArgs
    """Resources of the node's driver container."""
    device_mode: str
    """lvm (default) or direct."""
    log_level: int
    """The driver's log level (default 5)."""
    pmem_percentage: int
    """lvm only: the share of PMEM to use (default 100)."""
    node_selector: dict[str, str]
    """Nodes of the node driver (default storage=pmem)."""
    labels: dict[str, str]
    """Extra labels on every object."""
    kubelet_dir: str
    """The kubelet's root directory (default /var/lib/kubelet)."""
    certificates: CertificatesArgs
    """Provided certificates; without them a set is generated."""
    patches: list[PatchArgs]
    """Patches of the deployment's objects."""
    reporter: ReporterArgs
    """The status reporter's settings."""
    adopt_namespace: bool
    """Take over an existing namespace (day 2, docs/day2.md)."""
    adopt_existing: bool
    """Take over existing objects of the same names."""
    allow_reinstall: bool
    """Allow a change that reinstalls the driver."""
    renamed_from: str
    """The previous driver name after a rename."""
    allow_device_mode_change: bool
    """Allow changing deviceMode."""
    retain_namespace: bool
    """Keep the namespace on delete (default true); not a stack config field."""
    take_over_fields: bool
    """When `pulumi up` updates an object, take back the fields other field managers changed
    (kubectl edit, patch, label, a server-side apply of another manager), so the declared
    state wins (default true, as the Python program's pmem-csi:takeOverFields); false
    leaves them to their owners, and such a change then fails the update with a conflict."""
    allowed_field_owners: list[AllowedFieldOwnerArgs]
    """What other field managers may own without the take-over taking it back, on top of the
    built-in entries (as the Python program's pmem-csi:allowedFieldOwners)."""


# Fields of the args that are the component's own, not part of the deployment entry, and
# their defaults.
COMPONENT_FIELDS = {"retain_namespace": True, "take_over_fields": True}
# The component's own fields that the Python program has as stack settings.
STACK_FIELDS = {"allowed_field_owners": "allowedFieldOwners"}


class ArgsError(ConfigError):
    """Invalid args of the served component; the problems name the fields as the caller wrote
    them (``deviceMode``), not as stack config keys."""

    def __init__(self, resource_name: str, problems: list[str]) -> None:
        super().__init__(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        self.args = (
            f"invalid args of PmemCsiDeployment {resource_name!r} "
            f"({len(self.problems)} problem(s)):\n{lines}",
        )

    def __str__(self) -> str:
        return str(self.args[0])


def _is_typeddict(hint: Any) -> bool:
    return isinstance(hint, type) and typing.is_typeddict(hint)


def to_config_entry(value: Mapping[str, Any], typ: type = PmemCsiDeploymentArgs) -> dict[str, Any]:
    """The args (Python names, as the provider passes them) as a stack config entry (camelCase).

    Only the keys of the TypedDicts are renamed; free-form maps (labels, nodeSelector, a merge
    patch, resource quantities) keep their keys as written.
    """
    hints = typing.get_type_hints(typ)
    out: dict[str, Any] = {}
    for key, item in value.items():
        hint = hints.get(key)
        if hint is not None and typing.get_origin(hint) is Optional:
            hint = typing.get_args(hint)[0]
        camel = _camel(key)
        if _is_typeddict(hint) and isinstance(item, Mapping):
            out[camel] = to_config_entry(item, hint)
        elif (
            typing.get_origin(hint) is list
            and _is_typeddict(typing.get_args(hint)[0])
            and isinstance(item, list)
        ):
            inner = typing.get_args(hint)[0]
            out[camel] = [to_config_entry(i, inner) if isinstance(i, Mapping) else i for i in item]
        else:
            out[camel] = item
    return out


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


# The SDK's unmarshalling of the Construct inputs drops every null inside an object, before
# the provider sees them: a JSON patch's ``value: null`` arrives as no value.
_NULL_DROPPED = re.compile(r"^patches\[\d+\]\.jsonPatch\[\d+\]\.value: is required for \w+$")


# The stack config's advice on writing a value in Pulumi.<stack>.yaml or with pulumi config set
# (config.string_fix, patchtypes.fix_hint), always the message's last "; " part: it does not
# apply to a program passing args.
_STRING_FIX = re.compile(r"; quote it\b.* in Pulumi\.<stack>\.yaml.*$")
_NUMBER_FIX = re.compile(r"; write it without quotes in Pulumi\.<stack>\.yaml.*$")


def _relabel(problem: str) -> str:
    """``pmem-csi:deployments[0].patches[0].kind: ...`` -> ``patches[0].kind: ...``, without
    the stack config's advice on how to write the value there."""
    root = key_path(("deployments", 0))
    out = problem.replace(f"{root}.", "").replace(root, "(args)")
    out = _NUMBER_FIX.sub("; write it without quotes", _STRING_FIX.sub("", out))
    if _NULL_DROPPED.match(out):
        out += (
            " (a null value does not reach the component provider: the Pulumi SDK drops nulls "
            "inside objects, so a null cannot be patched in from this language)"
        )
    return out


def _outputs_in(value: Any, path: str) -> list[str]:
    """Paths of values that are not known plain values (another resource's outputs)."""
    if isinstance(value, pulumi.Output):
        return [path or "(args)"]
    if isinstance(value, Mapping):
        return [p for k, v in value.items() for p in _outputs_in(v, f"{path}.{k}" if path else k)]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _outputs_in(v, f"{path}[{i}]")]
    return []


_NOT_PLAIN = (
    "must be a plain value known when the program runs (not another resource's output, "
    "not a secret)"
)


# Deployment fields that only the preflight of the Python stack program reads
# (pmem_components.preflight): the component provider runs no preflight, so they would do nothing.
_PREFLIGHT_FLAGS = {
    "adopt_namespace": "adoptNamespace",
    "allow_reinstall": "allowReinstall",
    "renamed_from": "renamedFrom",
    "allow_device_mode_change": "allowDeviceModeChange",
}


def _python_program_only(cfg: DeploymentConfig, args: Mapping[str, Any]) -> list[str]:
    """Problems for fields set here that only the Python stack program honours.

    Why refused rather than ignored: each would be accepted and do nothing. The preflight flags
    are read by the preflight, which reads the cluster before the program registers anything;
    a component is constructed after registration has begun, so the provider runs none. The
    status reporter is one per stack, deployed by the program beside its deployments.
    """
    problems = [
        f"{camel}: honoured by the Python stack program only (its preflight reads the "
        "cluster before anything is registered; the component provider runs no preflight); "
        "leave it unset here"
        for field, camel in _PREFLIGHT_FLAGS.items()
        if getattr(cfg, field)
    ]
    if cfg.reporter.enabled:
        raw = args.get("reporter") or {}
        field = "reporter.enabled" if raw.get("enabled") else "reporter.image"
        problems.append(
            f"{field}: a deployment's own reporter is deployed by the Python stack program only "
            "(one per stack, beside its deployments); here a pmem-csi:index:PmemCsiReporter "
            "serves deployments: name this one (name and namespace) in its deployments, and "
            "leave reporter.enabled and reporter.image unset here"
        )
    return problems


def deployment_config(resource_name: str, args: Mapping[str, Any]) -> DeploymentConfig:
    """The validated deployment of the args; :class:`ArgsError` lists every problem."""
    own = {*COMPONENT_FIELDS, *STACK_FIELDS}
    entry = to_config_entry({k: v for k, v in args.items() if k not in own})
    unknown = _outputs_in(entry, "")
    if unknown:
        raise ArgsError(
            resource_name,
            [f"{p}: {_NOT_PLAIN}" for p in unknown],
        )
    try:
        stack = load_config({"deployments": [entry]}, warn=pulumi.log.warn)
    except ConfigError as err:
        raise ArgsError(resource_name, [_relabel(p) for p in err.problems]) from None
    cfg = stack.deployments[0]
    problems = _python_program_only(cfg, args)
    if problems:
        raise ArgsError(resource_name, problems)
    problems = components.check_patches(cfg, 0)
    if problems:
        raise ArgsError(resource_name, [_relabel(p) for p in problems])
    return cfg


# The namespaces the components of this provider process create, by (project, stack,
# Kubernetes provider, namespace) -> the component's name. One provider process serves every
# component of one program during a command (docs/yaml-and-other-languages.md, the observed
# calls), so a second creator of the same namespace is seen here. Constructs run one at a time
# on the SDK's event loop; the lock only makes that independent of the SDK.
_NAMESPACE_CREATORS: dict[tuple[str, str, str, str], str] = {}
# Per namespace key: every component of this process deploying there, and whether it creates
# the namespace and deletes it on removal (``retainNamespace: false``).
_NAMESPACE_MEMBERS: dict[tuple[str, str, str, str], dict[str, bool]] = {}
_NAMESPACE_LOCK = threading.Lock()


def _cluster_of(opts: pulumi.ResourceOptions | None) -> str | None:
    """Which Kubernetes provider the component's children deploy through, as a key: the
    stack's default one, or an explicit one by its name; None when that cannot be told (then
    no namespace is claimed: two clusters may each have a namespace of the same name)."""
    provider = components.kubernetes_provider(opts)
    if provider is None:
        return "(default provider)"
    name = getattr(provider, "_name", "")
    return f"provider {name}" if name else None


def claim_namespace(
    resource_name: str,
    cfg: DeploymentConfig,
    opts: pulumi.ResourceOptions | None,
    retain: bool = True,
) -> list[str]:
    """Problems when another component of this program already creates ``cfg.namespace``
    through the same Kubernetes provider; otherwise records this one as its creator.

    Why refused: each component registers the namespace as a child of its own, so two
    Pulumi resources would own one Kubernetes object; removing either component from the
    program releases it from the state or (``retainNamespace: false``) deletes it, with
    the other driver in it. Exactly one component creates a shared namespace; the others
    set ``createNamespace: false`` and depend on it, so theirs are created after it.
    A component registered again under the same name (preview, then update, in one
    process) is its own creator, not a second one. A creator with ``retain`` false beside
    another component of the namespace is refused too, in either order (:func:`_deleting_creator`).
    """
    cluster = _cluster_of(opts)
    if cluster is None:
        return []
    key = (pulumi.get_project(), pulumi.get_stack(), cluster, cfg.namespace)
    with _NAMESPACE_LOCK:
        members = _NAMESPACE_MEMBERS.setdefault(key, {})
        members[resource_name] = cfg.create_namespace and not retain
        first = _NAMESPACE_CREATORS.setdefault(key, resource_name) if cfg.create_namespace else None
        deleting = _deleting_creator(resource_name, cfg.namespace, members)
    if deleting:
        return deleting
    if first is None or first == resource_name:
        return []
    return [
        f"createNamespace: component {first!r} of this program already creates namespace "
        f"{cfg.namespace!r} (through the same Kubernetes provider), and two components cannot "
        f"own one namespace: removing either would release or delete it under the other. "
        f"Set createNamespace: false on {resource_name!r} and make it depend on {first!r} "
        f"(the dependsOn resource option; in YAML: options: dependsOn: [${{{first}}}]), so "
        f"its objects are created once the namespace exists"
    ]


def _deleting_creator(resource_name: str, namespace: str, members: Mapping[str, bool]) -> list[str]:
    """The problem when the namespace's creator deletes it on removal while another
    component deploys there: removing the creator would delete the other's driver with the
    namespace, and the other's state would still list its objects."""
    deleting = [name for name, deletes in members.items() if deletes]
    others = [name for name in members if name not in deleting]
    if not deleting or not others:
        return []
    creator = deleting[0]
    other = resource_name if resource_name != creator else others[0]
    return [
        f"retainNamespace: false on {creator!r} deletes namespace {namespace!r} when "
        f"{creator!r} is removed, and with it the driver of {other!r} there (whose state "
        "would still list its objects); leave retainNamespace unset (true) on a namespace "
        "another component shares"
    ]


def allowed_field_owners(
    resource_name: str, args: Mapping[str, Any]
) -> tuple[fieldowners.Allowance, ...]:
    """The ownership policy entries of the args, checked by the stack setting's rules
    (:func:`pmem_components.fieldowners.parse_allowed`) and named as the args' field."""
    raw = args.get("allowed_field_owners")
    if raw is not None and isinstance(raw, list):
        raw = [
            i if not isinstance(i, Mapping) else to_config_entry(i, AllowedFieldOwnerArgs)
            for i in raw
        ]
    allowed, problems = fieldowners.parse_allowed(raw, STACK_FIELDS["allowed_field_owners"])
    if problems:
        raise ArgsError(resource_name, problems)
    return tuple(allowed)


def _component_field(args: Mapping[str, Any], field: str) -> bool:
    """One of :data:`COMPONENT_FIELDS` as given, else its default."""
    value = args.get(field)
    return COMPONENT_FIELDS[field] if value is None else bool(value)


# The children of the served components of this provider process are claimed in
# ``_NAMESPACE_CREATORS`` too, by (project, stack, component type, what names them) -> the
# component's name. Why: served components name their children by the objects only (not
# "<resource name>:<object>"), so that renaming a resource key keeps every child's URN
# (issue 19); two components naming the same children would share URNs, and they would be the
# same Kubernetes objects (one cluster) or clash in the state (two).


def claim_children(
    component: str, resource_name: str, claims: list[tuple[str, str, str]]
) -> list[str]:
    """Problems when another component of this program already has the children ``claims``
    names (``(field as written, value as written, what names the objects)``: a driver name's
    objects are named by its hyphened form, so ``hy.phen`` and ``hy-phen`` claim the same);
    otherwise records this one as their owner. A component registered again under the same
    name (preview, then update) is their owner."""
    problems = []
    for field, value, names_objects in claims:
        if field == "createNamespace":
            what = (
                f"to have namespace {value!r} on both clusters, set createNamespace: false on "
                f"{resource_name!r} (its namespace then made by other means), or use a stack "
                "per cluster"
            )
        else:
            what = (
                f"give {resource_name!r} another {field} (the same driver on two clusters "
                "takes a stack per cluster)"
            )
        key = (pulumi.get_project(), pulumi.get_stack(), component, f"{field}={names_objects}")
        with _NAMESPACE_LOCK:
            first = _NAMESPACE_CREATORS.setdefault(key, resource_name)
        if first != resource_name:
            spelled = (
                f"{value!r}"
                if field == "createNamespace"
                else f"{value!r} (its objects are named {names_objects + '-...'!r}: names that "
                "differ only in dots and hyphens name the same objects)"
            )
            problems.append(
                f"{field}: {component} {first!r} of this program already has the objects of "
                f"{field} {spelled}, and {resource_name!r} would share their Pulumi resources "
                f"(served components name their children after the objects, so that renaming a "
                f"resource keeps them; the resource name is not part of them). Keep one of "
                f"{first!r} and {resource_name!r}, or {what}"
            )
    return problems


class PmemCsiDeployment(components.PmemCsiDeployment):
    """One complete PMEM-CSI driver deployment plus its Deployment custom resource.

    The same component as in Python (type pmem-csi:index:PmemCsiDeployment, the same
    children). The Deployment CRD must be installed first (crd/ in the repository, e.g.
    with kubectl apply).
    """

    # Children named after the objects: renaming the resource keeps them (claim_children).
    children_prefixed_by_name = False

    namespace: pulumi.Output[str]  # type: ignore[assignment]
    """The driver's namespace."""
    object_names: pulumi.Output[dict[str, str]]  # type: ignore[assignment]
    """The names of the deployment's objects, by role."""
    ca_cert: pulumi.Output[str]
    """The CA certificate (PEM) the driver's certificates are signed with."""

    def __init__(
        self,
        name: str,
        args: PmemCsiDeploymentArgs,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        cfg = deployment_config(name, args)
        allowed = allowed_field_owners(name, args)
        problems = components.secret_mutability_problems(cfg, opts)
        if problems:
            raise ArgsError(name, problems)
        retain = _component_field(args, "retain_namespace")
        problems = claim_namespace(name, cfg, opts, retain)
        if not problems:
            claims = [("name", cfg.name, cfg.names.hyphened)]
            if cfg.create_namespace:
                claims.append(("createNamespace", cfg.namespace, cfg.namespace))
            problems = claim_children("PmemCsiDeployment", name, claims)
        if problems:
            raise ArgsError(name, problems)
        super().__init__(
            name,
            components.PmemCsiDeploymentArgs(
                cfg,
                retain_namespace=retain,
                # As the Python program's default (pmem-csi:takeOverFields): without it a
                # change made with kubectl under another field manager is left in place or
                # fails `pulumi up --refresh` with a conflict (docs/day2.md).
                take_over_fields=_component_field(args, "take_over_fields"),
                allowed_field_owners=allowed,
                validate=False,
            ),
            opts,
        )


# ------------------------------------------------------------------ the CRD and the reporter
# Issue 19: what the Python program deploys at stack level beside its deployments (the CRD
# with manageCrd, the one reporter), served as components of their own. The SDK infers
# resource references only to other packages' resources (its analyzer: is_resource,
# get_package_name), so the reporter names the deployments it serves by plain values.

CRD_TYPE = f"{components.TYPE_PREFIX}PmemCsiCrd"
REPORTER_TYPE = f"{components.TYPE_PREFIX}PmemCsiReporter"


class ServedArgsError(ArgsError):
    """Invalid args of a served component other than PmemCsiDeployment, by field."""

    def __init__(self, component: str, resource_name: str, problems: list[str]) -> None:
        super().__init__(resource_name, problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        self.args = (
            f"invalid args of {component} {resource_name!r} "
            f"({len(self.problems)} problem(s)):\n{lines}",
        )


class PmemCsiCrdArgs(TypedDict, total=False):
    """The Deployment CRD's settings."""

    retain: bool
    """Keep the CRD in the cluster on delete and destroy (default true, as the Python
    program's retainCrd): deleting it deletes every Deployment CR, other stacks' too."""


def crd_retain(resource_name: str, args: Mapping[str, Any]) -> bool:
    """The ``retain`` arg (default true); :class:`ServedArgsError` for anything but a bool."""
    unknown = _outputs_in(dict(args), "")
    if unknown:
        raise ServedArgsError("PmemCsiCrd", resource_name, [f"{p}: {_NOT_PLAIN}" for p in unknown])
    retain = args.get("retain")
    if retain is None:
        return True
    if not isinstance(retain, bool):
        raise ServedArgsError(
            "PmemCsiCrd",
            resource_name,
            [f"retain: must be true or false (got {retain!r})"],
        )
    return retain


class PmemCsiCrd(pulumi.ComponentResource):
    """The deployments.pmem-csi.intel.com CRD (crd/ in the repository), installed as the
    Python program installs it with manageCrd: true. Give the PmemCsiDeployment resources
    dependsOn on it: their CRs are then created after it and deleted before it.
    """

    crd_name: pulumi.Output[str]
    """The CRD's name, deployments.pmem-csi.intel.com."""

    def __init__(
        self,
        name: str,
        args: PmemCsiCrdArgs,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        retain = crd_retain(name, args)
        super().__init__(CRD_TYPE, name, None, opts)
        # The program's own install_crd: the same object, forced apply, retain on delete.
        self.crd = components.install_crd(pulumi.ResourceOptions(parent=self), retain=retain)
        self.crd_name = names.CRD_NAME  # type: ignore[assignment]
        self.register_outputs({"crdName": names.CRD_NAME})


class ServedDeploymentArgs(TypedDict):
    """A PmemCsiDeployment the reporter serves: its name and namespace arguments."""

    name: str
    """The deployment's name argument (its CSI driver name, the name of its CR)."""
    namespace: str
    """The deployment's namespace argument."""


class PmemCsiReporterArgs(_AwaitField, total=False):
    """The status reporter serving several deployments, as the Python program's one per stack."""

    deployments: Required[list[ServedDeploymentArgs]]
    """The deployments it serves (at least one); the first names it (<first>-reporter)."""
    image: Required[str]
    """The reporter image (no public one: docs/reporter.md, The reporter image)."""
    replicas: int
    """Default 2 (one holds the Lease and writes, the other stands by)."""
    log_level: int
    """Default 3."""
    image_pull_policy: str
    """Always, Never or IfNotPresent (default)."""
    namespace: str
    """Where it runs, with its Lease (default: the first deployment's namespace; it must
    exist)."""
    labels: dict[str, str]
    """Extra labels on its objects (the program's reporter: the first deployment's labels)."""
    allowed_field_owners: list[AllowedFieldOwnerArgs]
    """What other field managers may own without it being reported as ObjectsModified: give
    it the allowedFieldOwners of the deployments it serves, so that it judges drift by the
    list their take-over keeps (as the Python program's pmem-csi:allowedFieldOwners)."""


@dataclass(frozen=True)
class ServedReporter:
    """A validated PmemCsiReporter: the deployments as a stack config whose entries enable
    the reporter (what :func:`pmem_components.program.reporter_objects` reads), and where
    the reporter runs."""

    stack: StackConfig
    namespace: str


_REPORTER_ENTRY_KEYS = ("name", "namespace")
# Args that are the reporter's own: given to the first entry only (the program's reporter
# takes them from its first deployment), or to every entry (they must agree).
_FIRST_ENTRY_ARGS = ("imagePullPolicy", "labels", "await")
_REPORTER_SETTINGS = ("image", "replicas", "logLevel")


def _reporter_relabel(problem: str) -> str:
    """A stack config problem of the entries :func:`reporter_settings` built, named by the
    PmemCsiReporter field: ``pmem-csi:deployments[1].reporter.image`` -> ``image``,
    ``pmem-csi:deployments[0].imagePullPolicy`` -> ``imagePullPolicy``,
    ``pmem-csi:deployments[1].name`` -> ``deployments[1].name``."""
    out = problem.replace(f"{CONFIG_NAMESPACE}:", "")
    out = re.sub(r"\bdeployments\[\d+\]\.reporter\.", "", out)
    out = re.sub(r"\bdeployments\[0\]\.(?=(?:imagePullPolicy|labels|await)\b)", "", out)
    return _NUMBER_FIX.sub("; write it without quotes", _STRING_FIX.sub("", out))


def _reporter_shape_problems(entry: Mapping[str, Any]) -> list[str]:
    """What the stack config cannot say about these args: a missing list, name or image."""
    problems = []
    deployments = entry.get("deployments")
    if not isinstance(deployments, list) or not deployments:
        problems.append(
            "deployments: is required: list each PmemCsiDeployment this reporter serves by "
            "its name and namespace arguments (at least one)"
        )
    else:
        for i, dep in enumerate(deployments):
            if not isinstance(dep, Mapping):
                problems.append(f"deployments[{i}]: must be an object with name and namespace")
                continue
            for key in _REPORTER_ENTRY_KEYS:
                if dep.get(key) is None:
                    problems.append(
                        f"deployments[{i}].{key}: is required: the {key} argument of the "
                        "PmemCsiDeployment it serves (write it even where that is the default)"
                    )
            problems += [
                f"deployments[{i}].{key}: is not a known setting (name and namespace only)"
                for key in dep
                if key not in _REPORTER_ENTRY_KEYS
            ]
    if entry.get("image") is None:
        problems.append(
            "image: is required: there is no public reporter image; build it with `make image`, "
            "push it to a registry your nodes pull from (docs/reporter.md, The reporter image) "
            "and name it here"
        )
    return problems


def reporter_settings(resource_name: str, args: Mapping[str, Any]) -> ServedReporter:
    """The validated reporter args; :class:`ServedArgsError` lists every problem by field.

    The deployments become stack config entries with the reporter settings, checked by
    :func:`pmem_components.config.load_config` (names and namespaces as a deployment's, the
    names unique, image, replicas, log level, pull policy, labels, await): a deployment the
    reporter could not serve under that name is refused as the stack config refuses it.
    """
    entry = to_config_entry(args, PmemCsiReporterArgs)
    unknown = _outputs_in(entry, "")
    if unknown:
        raise ServedArgsError(
            "PmemCsiReporter", resource_name, [f"{p}: {_NOT_PLAIN}" for p in unknown]
        )
    problems = _reporter_shape_problems(entry)
    if problems:
        raise ServedArgsError("PmemCsiReporter", resource_name, problems)
    settings = {k: entry[k] for k in _REPORTER_SETTINGS if k in entry}
    first = {k: entry[k] for k in _FIRST_ENTRY_ARGS if k in entry}
    entries = [
        {**dep, "reporter": dict(settings), **(first if i == 0 else {})}
        for i, dep in enumerate(entry["deployments"])
    ]
    found: list[str] = []
    stack: StackConfig | None = None
    try:
        raw: dict[str, Any] = {"deployments": entries}
        if "allowedFieldOwners" in entry:
            raw["allowedFieldOwners"] = entry["allowedFieldOwners"]
        stack = load_config(raw, check_certificates=False)
    except ConfigError as err:
        found += err.problems
    namespace = entry.get("namespace")
    if namespace is not None:
        try:
            load_config({"deployments": [{"namespace": namespace}]}, check_certificates=False)
        except ConfigError as err:
            # The deployment's messages, worded for where the reporter runs.
            found += [
                p.replace(key_path(("deployments", 0)) + ".", "").replace(
                    "for the driver (e.g. pmem-csi)",
                    "for the reporter (e.g. its first deployment's)",
                )
                for p in err.problems
            ]
    if found:
        problems = list(dict.fromkeys(_reporter_relabel(p) for p in found))
        raise ServedArgsError("PmemCsiReporter", resource_name, problems)
    assert stack is not None
    return ServedReporter(stack, namespace or stack.deployments[0].namespace)


class PmemCsiReporter(pulumi.ComponentResource):
    """The status reporter: writes the status of the named deployments' CRs (one reporter
    for several deployments, as the Python program's one per stack, with the same objects).
    Give it dependsOn on those deployments (their CRs and namespaces come first).
    """

    namespace: pulumi.Output[str]
    """The reporter's namespace."""
    deployment_name: pulumi.Output[str]
    """The name of its Deployment, ServiceAccount and Lease (<first deployment>-reporter)."""

    def __init__(
        self,
        name: str,
        args: PmemCsiReporterArgs,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        served = reporter_settings(name, args)
        first = served.stack.deployments[0]
        problems = claim_children(
            "PmemCsiReporter", name, [("deployments[0].name", first.name, first.names.hyphened)]
        )
        if problems:
            raise ServedArgsError("PmemCsiReporter", name, problems)
        # The program registers them as children of the first deployment's component, under
        # its await settings: here the reporter's own.
        opts = pulumi.ResourceOptions.merge(
            opts, pulumi.ResourceOptions(transforms=[awaiting.transform(first)])
        )
        super().__init__(REPORTER_TYPE, name, None, opts)
        objects = program.reporter_objects(served.stack, served.namespace)
        # Children named after the objects only, so renaming the resource keeps their URNs
        # (issue 19); aliases from the "<name>:<object>" names they had before.
        self.resources = program.register_reporter_objects(
            objects, lambda obj, deps: _register_reporter_child(self, name, obj, deps), []
        )
        self.namespace = served.namespace  # type: ignore[assignment]
        self.deployment_name = first.names.reporter  # type: ignore[assignment]
        self.register_outputs(
            {"namespace": served.namespace, "deploymentName": first.names.reporter}
        )


def _register_reporter_child(
    parent: pulumi.Resource, name: str, obj: dict[str, Any], deps: list[pulumi.Resource]
) -> pulumi.CustomResource:
    """One reporter object as a child named by the object, aliased from its former
    ``<name>:<object>`` name (the prefixed layout of stacks made before issue 19)."""
    former = components._urn(
        [REPORTER_TYPE, registry.type_token(obj)], f"{name}:{registry.resource_name(obj)}"
    )
    return registry.register(
        obj, pulumi.ResourceOptions(parent=parent, depends_on=deps, aliases=[former])
    )


SERVED_COMPONENTS: list[type[pulumi.ComponentResource]] = [
    PmemCsiDeployment,
    PmemCsiCrd,
    PmemCsiReporter,
]


class FaceProvider(ComponentProvider):
    """The SDK's component provider, refusing outputs and secrets before it maps the inputs.

    Why: the SDK's ``map_inputs`` turns an Output in a nested-object field (a secret
    ``certificates.registryKey``, ``await`` or ``controllerResources`` depending on another
    resource) into ``{}`` without a word, so provided certificates would be dropped and a new
    CA generated, limits lost. The inputs are checked at every depth while they still are
    Outputs, named by the caller's field path (``certificates.registryKey``).
    """

    def map_inputs(
        self, inputs: Mapping[str, Any], component_def: ComponentDefinition
    ) -> dict[str, Any]:
        """The SDK's mapping, after refusing any Output, unknown or secret in ``inputs``."""
        unknown = _outputs_in(inputs, "")
        if unknown:
            raise InputPropertiesError(
                f"invalid args of {component_def.name}",
                [{"property_path": p, "reason": f"{p}: {_NOT_PLAIN}"} for p in unknown],
            )
        return super().map_inputs(dict(inputs), component_def)


def serve(version: str | None = None) -> None:
    """Run the component provider (the plugin's entry point, ``provider/__main__.py``).

    The SDK's ``component_provider_host`` with :class:`FaceProvider` in place of its own
    provider class (it has no parameter for one).
    """
    import sys

    _provider_main(
        FaceProvider(SERVED_COMPONENTS, PACKAGE_NAME, None, version or "0.0.0"), sys.argv[1:]
    )
