"""The Pulumi program: read the ``pmem-csi`` stack config, validate all of it, then deploy.

Everything that can be wrong in the config (types, cross-field rules, certificates, patches
that select nothing) is checked for every deployment before the first resource is
registered, so a bad ``Pulumi.<stack>.yaml`` fails ``pulumi preview`` with one message and
leaves the stack untouched.

Secrets: ``Config.get_object`` returns plain values even for secret config (the private keys
set with ``pulumi config set --secret --path``). They are only ever used wrapped in
``Output.secret`` (Secret resources), never exported, logged or copied into the CR.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import Any

import pulumi
from pulumi.runtime import config as runtime_config

from pmem_components import names, secretmutable
from pmem_components.config import (
    CONFIG_NAMESPACE,
    STACK_KEYS,
    ConfigError,
    StackConfig,
    load_config,
)


def _raw_value(key: str) -> Any:
    """A config value as JSON when it parses as such (objects, lists, booleans), else text."""
    text = runtime_config.get_config(f"{CONFIG_NAMESPACE}:{key}")
    if text is None:
        return None
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return text


def _unknown_keys() -> list[str]:
    """Keys set in our namespace that the program does not know (typos)."""
    prefix = f"{CONFIG_NAMESPACE}:"
    known = set(STACK_KEYS)
    keys = set(runtime_config.CONFIG.get()) | set(runtime_config.get_config_env())
    ours = (k.removeprefix(prefix) for k in keys if k.startswith(prefix))
    return sorted(k for k in ours if k not in known)


def read_config() -> StackConfig:
    """Load and validate the stack config (raises :class:`ConfigError`)."""
    raw: dict[str, Any] = {key: _raw_value(key) for key in _unknown_keys()}
    for key in STACK_KEYS:
        raw[key] = _raw_value(key)
    stack = load_config(raw, warn=pulumi.log.warn)
    # Import here: components pull in pulumi_kubernetes, not needed for a config error.
    from pmem_components.components import check_patches

    problems = [p for i, d in enumerate(stack.deployments) for p in check_patches(d, i)]
    problems += reporter_problems(stack)
    problems += secretmutable.problems(
        [d for d in stack.deployments if not d.certificates.provided],
        runtime_config.get_config(secretmutable.KEY),
        os.environ,
    )
    if problems:
        raise ConfigError(problems)
    return stack


def reporter_problems(stack: StackConfig) -> list[str]:
    """One reporter serves every deployment of the stack: their reporter settings must agree.

    The first deployment with the reporter enabled gives the image, replicas and log level;
    another deployment asking for different ones would silently get the first's.
    """
    served = [(i, d) for i, d in enumerate(stack.deployments) if d.reporter.enabled]
    if not served:
        return []
    first_index, first = served[0]
    problems = []
    for i, dep in served[1:]:
        for key, attr in (("image", "image"), ("replicas", "replicas"), ("logLevel", "log_level")):
            if getattr(dep.reporter, attr) != getattr(first.reporter, attr):
                problems.append(
                    f"pmem-csi:deployments[{i}].reporter.{key}: is "
                    f"{getattr(dep.reporter, attr)!r}, but pmem-csi:deployments[{first_index}]"
                    f".reporter.{key} is {getattr(first.reporter, attr)!r}: one reporter serves "
                    "every deployment of the stack, so they must be the same"
                )
    return problems


def reporter_objects(stack: StackConfig, namespace: str | None = None) -> list[dict[str, Any]]:
    """The objects of the stack's one reporter (``manifests.reporter``), serving every
    deployment of ``stack`` with the reporter enabled; none when no deployment enables it.

    The first such deployment gives the image, replicas, log level, labels and image pull
    policy (:func:`reporter_problems`: the others agree); the reporter runs in ``namespace``,
    by default that deployment's. Its Deployment carries the stack's field ownership policy
    (``allowedFieldOwners``). Shared by :func:`register_reporter` and the served
    ``pmem-csi:index:PmemCsiReporter`` (``pmem_components.provider_face``), so both build the
    same objects for the same deployments.
    """
    from pmem_components.manifests.reporter import (
        build_reporter_objects,
        with_allowed_field_owners,
    )

    served = [d for d in stack.deployments if d.reporter.enabled]
    if not served:
        return []
    first = served[0]
    assert first.reporter.image is not None  # enabled implies an image (config.Reporter)
    objects = build_reporter_objects(
        [(d.names, d.namespace) for d in served],
        namespace or first.namespace,
        first.reporter.image,
        replicas=first.reporter.replicas,
        labels=dict(first.labels),
        log_level=first.reporter.log_level,
        image_pull_policy=first.image_pull_policy,
    )
    return [
        with_allowed_field_owners(o, stack.allowed_field_owners) if o["kind"] == "Deployment" else o
        for o in objects
    ]


def register_reporter_objects(
    objects: Sequence[dict[str, Any]],
    register: Any,
    deps: Sequence[pulumi.Resource],
) -> list[pulumi.CustomResource]:
    """Register the reporter's ``objects`` with ``register(obj, depends_on)``, each after
    ``deps``; the Deployment also after its ServiceAccount and every Role/ClusterRole (and
    binding) granting it the served deployments' namespaces.

    Why (review of issue 16): rolled out before its grants existed, its new pods met 403s
    and said "could not be read" meanwhile.
    """
    out = []
    rbac: list[Any] = []
    for obj in objects:
        if obj["kind"] == "Deployment":
            out.append(register(obj, [*deps, *rbac]))
            continue
        made = register(obj, list(deps))
        rbac.append(made)
        out.append(made)
    return out


def register_reporter(
    stack: StackConfig,
    components: Sequence[Any],
    namespaces: Mapping[str, pulumi.Resource],
) -> list[pulumi.CustomResource]:
    """The stack's one reporter (:func:`reporter_objects`), serving every deployment with the
    reporter enabled, registered after their CRs (``components``: the stack's
    PmemCsiDeployment components, in the order of ``stack.deployments``).

    It has the names and namespace the first such deployment's own reporter had, and its
    objects are that deployment's component's children as they were: one ``pulumi up``
    updates them in place (the Deployment rolls to the new arguments, its Lease stays). The
    other deployments' old reporters are deleted at the end of that update, after the
    stack's reporter Deployment is updated and, with the provider's await, rolled out:
    there is always a reporter writing each CR's status.
    """
    objects = reporter_objects(stack)
    if not objects:
        return []
    served = [d for d in stack.deployments if d.reporter.enabled]
    crs = [
        c.deployment_cr
        for c, d in zip(components, stack.deployments, strict=True)
        if d.reporter.enabled
    ]
    deps = [*crs, *(namespaces[d.namespace] for d in served if d.namespace in namespaces)]
    # Children of the first served deployment's component: its transforms apply (its
    # patches among them, validated against its own reporter objects,
    # bundle.reporter_objects), and the URNs are those its own reporter had.
    owner = components[next(i for i, d in enumerate(stack.deployments) if d.reporter.enabled)]
    return register_reporter_objects(objects, owner.register_reporter_object, deps)


def deploy(
    stack: StackConfig,
    previous: Mapping[int, Any] | None = None,
    keep_namespaces: Collection[str] = (),
    running_certificates: Mapping[int, Any] | None = None,
    adopted: Collection[str] = (),
    kept_metadata: Mapping[str, Mapping[str, Mapping[str, str]]] | None = None,
) -> dict[str, Any]:
    """Register the CRD (if managed here), the namespaces and every deployment.

    Namespaces belong to the stack, not to the first deployment that names one: removing
    that deployment must not delete the namespace (Kubernetes would delete every other
    deployment's objects in it). They and the CRD are kept on delete unless
    ``retainNamespaces`` / ``retainCrd`` say otherwise. ``previous``: deployments that move
    (index -> :class:`pmem_components.preflight.Previous`), found by the preflight.

    ``keep_namespaces``: namespaces this stack created that configured deployments still use
    though none creates them any more (``createNamespace: false``), found by the preflight.
    Not registering them would make the engine delete them (with ``retainNamespaces: false``
    the state says so), and with them the deployments that live there. They are registered
    once more, kept on delete and without the stack annotation: the next ``pulumi up`` no
    longer counts them as the stack's and drops them from the state, leaving them in place.
    ``kept_metadata`` (:attr:`pmem_components.preflight.Plan.kept_metadata`): the live
    labels and annotations this stack's field manager applied to them, registered as they
    are (:func:`_as_kept`); others' are not sent, so this stack never co-owns them.

    ``running_certificates``: per deployment index, its running driver pods
    (:func:`certificate_rollout`, a ``certrollout.Rollout``); None: not read at all (then a
    CA change of generated certificates waits, unless ``certificates.rolledOut`` confirms
    its stage). A deployment missing from a given map had no CA change under way when the
    preflight ran, so its pods were not needed.
    ``adopted``: refs the preflight adopted with the administrator's consent
    (``pmem-csi:adopt``). They are applied with force, as ``adoptNamespace`` /
    ``adoptExisting`` do, and the field managers the earlier stack left on them are merged
    into this stack's once they are created (:mod:`pmem_components.takeover_transform`).
    Of ``keep_namespaces``, those no configured deployment uses any more (another stack's
    deployment or another driver lives there, :attr:`~pmem_components.preflight.Plan.
    kept_namespaces`) are registered from ``kept_metadata`` alone.
    """
    from pmem_components import certrollout, registry
    from pmem_components.components import (
        COMPONENT_TYPE,
        PATCH_FORCE_ANNOTATION,
        PmemCsiDeployment,
        PmemCsiDeploymentArgs,
        PreviousDeployment,
        install_crd,
        stack_id,
    )
    from pmem_components.manifests import bundle

    crd = install_crd(retain=stack.retain_crd) if stack.manage_crd else None
    namespaces: dict[str, pulumi.Resource] = {}
    ns_opts = _namespace_take_over() if stack.take_over_fields else pulumi.ResourceOptions()
    creators = dict.fromkeys(d.namespace for d in stack.deployments if d.create_namespace)
    released = [ns for ns in keep_namespaces if ns not in creators]
    for ns in [*creators, *released]:
        members = [d for d in stack.deployments if d.namespace == ns]
        if members:
            obj = bundle.build_shared_namespace(ns, members)
        else:  # kept for what else lives in it: its labels as they are (_as_kept)
            obj = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
        annotations = {names.STACK_ANNOTATION: stack_id()} if ns in creators else {}
        # Adopted now, or since, while the consent still names it: dropping the forced apply
        # in the update right after the adoption would be a change nobody asked for.
        ref = f"Namespace {ns}"
        if any(d.adopt_namespace for d in members) or ref in adopted or stack.adopts(ref):
            annotations[PATCH_FORCE_ANNOTATION] = "true"
        obj["metadata"]["annotations"] = annotations
        obj = _patched_namespace(stack, obj, annotations)
        if ns not in creators:
            obj = _as_kept(obj, (kept_metadata or {}).get(ns), annotations)
        # Stacks made before namespaces moved to stack level have it under a deployment.
        old_urn = (
            f"urn:pulumi:{pulumi.get_stack()}::{pulumi.get_project()}::"
            f"{COMPONENT_TYPE}$kubernetes:core/v1:Namespace::{ns}"
        )
        namespaces[ns] = registry.register(
            obj,
            pulumi.ResourceOptions.merge(
                ns_opts,
                pulumi.ResourceOptions(
                    retain_on_delete=stack.retain_namespaces or ns not in creators,
                    aliases=[old_urn],
                ),
            ),
        )
    outputs: dict[str, Any] = {}
    components: list[Any] = []
    for i, dep in enumerate(stack.deployments):
        prev = (previous or {}).get(i)
        update: dict[str, Any] = {"create_namespace": False}
        if f"Deployment {dep.name}" in adopted:
            update["adopt_existing"] = True  # forced apply of its objects, as adoptExisting
        component = PmemCsiDeployment(
            dep.name,
            PmemCsiDeploymentArgs(
                dep.model_copy(update=update),
                crd=crd,
                namespace=namespaces.get(dep.namespace),
                index=i,
                validate=False,
                previous=PreviousDeployment(prev.name, prev.namespace) if prev else None,
                take_over_fields=stack.take_over_fields,
                allowed_field_owners=stack.allowed_field_owners,
                running_certificates=(
                    None
                    if running_certificates is None
                    else running_certificates.get(i, certrollout.UNREAD)
                ),
            ),
        )
        components.append(component)
        outputs[dep.name] = {
            "namespace": component.namespace,
            "objectNames": component.object_names,
            "caCert": component.ca_cert,
        }
    register_reporter(stack, components, namespaces)
    if any(d.reporter.enabled for d in stack.deployments):
        reporter_name = next(d for d in stack.deployments if d.reporter.enabled).names.reporter
        for dep in stack.deployments:
            if dep.reporter.enabled:  # the stack's reporter, not one of its own
                outputs[dep.name]["objectNames"] = {
                    **outputs[dep.name]["objectNames"],
                    "reporter": reporter_name,
                }
    return outputs


def _namespace_take_over() -> pulumi.ResourceOptions:
    """Transform and hooks that merge the entries other Pulumi managers left on a stack
    namespace (an adopted one: another or an earlier stack's) into this stack's entry, when
    the engine creates (adopts) or updates it; nothing else of other managers is touched
    (:class:`pmem_components.takeover_transform.TakeOver` with ``stale_only``)."""
    from pmem_components import takeover_transform as tt
    from pmem_components.components import default_provider_settings

    take_over = tt.TakeOver(
        tt.ClusterSource(None, default_provider_settings),
        stale_only=True,
        skipped_types=tt.SKIPPED_TYPES - {"kubernetes:core/v1:Namespace"},
    )
    hooks = pulumi.ResourceHookBinding(
        before_update=[pulumi.ResourceHook("pmem-csi-namespace-update", take_over.before_update)],
        after_create=[pulumi.ResourceHook("pmem-csi-namespace-adopted", take_over.after_create)],
    )
    return pulumi.ResourceOptions(transforms=[take_over.transform], hooks=hooks)


def _patched_namespace(
    stack: StackConfig, obj: dict[str, Any], annotations: Mapping[str, str]
) -> dict[str, Any]:
    """The stack-level Namespace with the ``kind: Namespace`` patches of the deployments that
    create it, in config order.

    The namespace is registered here, outside the deployments' components whose transforms
    apply their patches, so they are applied here; the dry run (``check_patches``) has
    validated them against the namespace object each of those deployments builds. The
    annotations the stack relies on are put back after the patches.
    """
    from pmem_components import registry
    from pmem_components.patches import PatchSet

    ns = obj["metadata"]["name"]
    for i, d in enumerate(stack.deployments):
        if d.namespace != ns or not d.create_namespace or not d.patches:
            continue
        patched = PatchSet.for_deployment(i, d.patches).apply(registry.type_token(obj), obj)
        obj = patched if patched is not None else obj
    meta = obj.setdefault("metadata", {})
    meta["annotations"] = {**(meta.get("annotations") or {}), **annotations}
    return obj


def _as_kept(
    obj: dict[str, Any],
    live: Mapping[str, Mapping[str, str]] | None,
    annotations: Mapping[str, str],
) -> dict[str, Any]:
    """A released namespace as it is: the live labels and annotations this stack's field
    manager applied (``live``, :func:`pmem_components.preflight.own_metadata`; but the
    stack's annotation and the provider's ``pulumi.com/`` directives) under those the
    program sets (``annotations``: the stack's directives).

    The provider applies with server-side apply: a label the stack's field manager set
    before (a ``kind: Namespace`` patch's, e.g. ``pod-security.kubernetes.io/enforce``) and
    no longer sends would be removed by the very update that means to leave the namespace
    alone; the patch itself cannot stay in the config, since the deployment no longer builds
    the namespace. The administrator keeps a namespace as it is, not stripped.
    """
    if not live:
        return obj
    meta = obj.setdefault("metadata", {})
    meta["labels"] = {**dict(live.get("labels") or {}), **(meta.get("labels") or {})}
    kept = {
        k: v
        for k, v in (live.get("annotations") or {}).items()
        if k != names.STACK_ANNOTATION and not k.startswith("pulumi.com/")
    }
    meta["annotations"] = {**kept, **(meta.get("annotations") or {}), **annotations}
    return obj


def cluster_target() -> Any:
    """The cluster the default Kubernetes provider uses (:mod:`pmem_components.kubetarget`)."""
    from pmem_components import kubetarget
    from pmem_components.components import default_provider_settings

    return kubetarget.resolve(default_provider_settings())


def kube_client() -> Any:
    """A Kubernetes API client for the default provider's cluster (see :func:`cluster_target`).

    Raises :class:`pmem_components.kubetarget.TargetError` when there is none, or in
    ``renderYamlToDirectory`` mode, where nothing may be sent to any cluster.
    """
    from pmem_components import kubetarget

    return kubetarget.api_client(cluster_target())


def preflight(stack: StackConfig) -> Any:
    """Read the cluster and refuse unsafe changes (see :mod:`pmem_components.preflight`).

    Returns the :class:`~pmem_components.preflight.Plan`: the deployments that move
    (renamedFrom / allowReinstall), the namespaces to keep, the certificate fingerprints
    the driver pods run (:func:`certificate_rollout`) and the objects adopted
    (``pmem-csi:adopt``). Which namespaces and CRs are this stack's is decided by the stack's
    own state, read first (:func:`pmem_components.identity.read_state`). The reads go to the default
    Kubernetes provider's cluster (:func:`cluster_target`); with
    ``kubernetes:renderYamlToDirectory`` nothing is read, because no cluster is the target.
    """
    from pmem_components import kubetarget
    from pmem_components import preflight as pf

    if not stack.preflight:
        _drops_without_preflight(stack)
        return pf.Plan()
    from pmem_components.components import stack_id

    try:
        target = cluster_target()
    except kubetarget.TargetError as err:
        raise pf.PreflightError(
            f"pmem-csi:preflight: no cluster to read: {err}. The Kubernetes provider cannot "
            "connect either; set pmem-csi:preflight: false to skip the checks"
        ) from None
    if not target.makes_requests:
        pulumi.log.info(f"pmem-csi:preflight: skipped, {target.description}")
        return pf.Plan()
    from pmem_components import identity

    try:
        state = identity.read_state(stack_id())
    except identity.StateError as err:
        raise pf.PreflightError(
            f"pmem-csi:preflight: cannot read this stack's own state ({err}), which tells "
            "this stack's namespaces and Deployment CRs from those of another stack of the "
            "same name; set pmem-csi:preflight: false to skip the checks"
        ) from None
    try:
        client = kubetarget.api_client(target)
    except kubetarget.TargetError as err:
        raise pf.PreflightError(f"pmem-csi:preflight: {err}") from None
    except Exception as err:  # e.g. a proxy URL urllib3 cannot parse: its text may hold it
        raise pf.PreflightError(
            f"pmem-csi:preflight: cannot build a client for the cluster "
            f"({type(err).__name__}); check the proxy and credential settings of the "
            "kubeconfig, or set pmem-csi:preflight: false to skip the checks"
        ) from None
    try:
        result = pf.run(stack, stack_id(), client, state)
        if not result.problems:
            result.running_certificates = certificate_rollout(
                stack, client, state.certificate_phases
            )
    finally:
        client.close()
    if result.problems:
        raise ConfigError(result.problems)
    for ref in result.adopted:
        pulumi.log.info(f"pmem-csi:adopt: taking over {ref} (another stack's, or retained)")
    for ns, kept in result.kept_namespaces.items():
        pulumi.log.warn(kept_namespace_warning(stack, ns, kept.reason))
    return result


def kept_namespace_warning(stack: StackConfig, ns: str, reason: str) -> str:
    """The warning for a namespace kept for what else lives in it (``reason``).

    Whether the engine would have deleted it depends on the retainOnDelete the state
    recorded for it (the last update's ``retainNamespaces``), which the program cannot read:
    it is registered once more, kept on delete, either way. With ``retainNamespaces: true``
    now the warning says it is released as every namespace is; only with false does it say
    that it would have been deleted with what lives in it."""
    head = (
        f"pmem-csi: namespace {ns!r} is used by no deployment of this stack any more but "
        f"is kept (left in the cluster, out of the stack from the next pulumi up): {reason} "
        "live in it"
    )
    if stack.retain_namespaces:
        return (
            f"{head}; with pmem-csi:retainNamespaces: true it is released as any namespace "
            "of the stack (kept on delete also where the state recorded it with "
            "retainNamespaces: false)"
        )
    return (
        f"{head} and, with pmem-csi:retainNamespaces: false, would be deleted with it "
        "(unless an earlier update recorded it as retained)"
    )


def _drops_without_preflight(stack: StackConfig) -> None:
    """With ``pmem-csi:preflight: false``: refuse dropping objects another stack has
    adopted since (:mod:`pmem_components.dropcheck`); reads the cluster only when this update
    drops something from the state."""
    from pmem_components import dropcheck, identity, kubetarget
    from pmem_components.components import stack_id

    try:
        target = cluster_target()
    except kubetarget.TargetError as err:
        # Most likely the provider has no cluster either and deletes nothing; but its rules
        # can differ from the program's (an exec plugin, a value only it resolves).
        pulumi.log.warn(
            f"pmem-csi:preflight: false: no cluster to read ({err}), so it is not checked "
            "whether this update deletes Deployment CRs or namespaces that another stack "
            "has adopted since; fix the cluster settings, or set pmem-csi:preflight: true "
            "to stop the update instead"
        )
        return
    if not target.makes_requests:
        return
    try:
        state = identity.read_state(stack_id())
    except identity.StateError as err:
        pulumi.log.warn(
            f"pmem-csi:preflight: false: cannot read this stack's own state ({err}), so it "
            "is not checked whether this update deletes objects another stack has adopted "
            "since; set pmem-csi:preflight: true to check it"
        )
        return
    drops = dropcheck.dropped(stack, state)
    if not drops:
        return
    try:
        with _object_reader(target) as get:
            problems = dropcheck.check(drops, state, get)
    except kubetarget.TargetError as err:
        problems = [dropcheck.unreadable(*drop, state, str(err)) for drop in drops]
    if problems:
        raise ConfigError(problems)


@contextlib.contextmanager
def _object_reader(target: Any) -> Iterator[Any]:
    """A GET of one object's path on ``target`` (None: not found), its client closed after.

    Raises :class:`pmem_components.kubetarget.TargetError` when no client can be built for
    ``target`` (a tokenFile that cannot be read, a SOCKS proxy without PySocks)."""
    from pmem_components import kubetarget
    from pmem_components.takeover_transform import KubeApi

    client = kubetarget.api_client(target)
    try:
        yield KubeApi(client).get
    finally:
        client.close()


def certificate_rollout(
    stack: StackConfig, client: Any, phases: Mapping[str, str] | None = None
) -> dict[int, Any] | None:
    """The running driver pods per deployment whose CA change is under way (``phases``: the
    stored stages, from the stack's state; :mod:`pmem_components.certrollout`), read with
    the preflight's client; None when no deployment generates its certificates. When the
    read fails, each of those deployments gets ``certrollout.read_failed``: its stage holds
    until a later ``pulumi up`` reads the pods (None instead would mean "not read on
    purpose", where ``certificates.rolledOut`` moves the stage)."""
    from pmem_components import certrollout

    if all(d.certificates.provided for d in stack.deployments):
        return None
    try:
        return certrollout.running_fingerprints(client, stack, phases)
    except Exception as err:  # a failed read only holds a CA change back; say why
        from pmem_components import kubetarget

        reason = kubetarget.error_text(err)
        pulumi.log.warn(
            f"pmem-csi: cannot read the driver pods ({reason}); "
            "a certificate CA change in progress waits for the next pulumi up"
        )
        failed = certrollout.read_failed(reason)
        return dict.fromkeys(certrollout.needs_pods(stack, phases), failed)


def main() -> None:
    """Entry point of ``__main__.py`` and of Automation API inline programs."""
    from pmem_components.preflight import PreflightError

    try:
        stack = read_config()
        checked = preflight(stack)
    except (ConfigError, PreflightError) as e:
        # Raising fails the update; the message already names each config key.
        raise pulumi.RunError(str(e)) from None
    outputs = deploy(
        stack,
        checked.previous,
        checked.keep_namespaces,
        running_certificates=checked.running_certificates,
        adopted=checked.adopted,
        kept_metadata=checked.kept_metadata,
    )
    pulumi.export("crd", "deployments.pmem-csi.intel.com" if stack.manage_crd else None)
    pulumi.export("deployments", outputs)
