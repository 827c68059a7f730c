"""Stack configuration: the ``pmem-csi`` Pulumi config namespace as validated pydantic models.

One stack describes one cluster. Like the operator, which accepted several ``Deployment``
custom resources, a stack holds a list of driver deployments (``pmem-csi:deployments``), each
with every field of the reference ``DeploymentSpec`` (intel/pmem-csi d01bc59) and its defaults.

Validation never stops at the first mistake: an administrator editing ``Pulumi.<stack>.yaml``
should see everything that is wrong in one ``pulumi preview``. :func:`load_config` therefore
collects pydantic's type errors and our own cross-field checks and raises one
:class:`ConfigError` listing every problem by its config key path. Private keys are never
echoed in messages.

This module imports neither pulumi nor pulumi_kubernetes so that tests and tools can use it
cheaply; :mod:`pmem_components.program` reads the raw values from Pulumi.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, get_args

from pydantic import (
    AliasGenerator,
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from pmem_components import fieldowners, names

CONFIG_NAMESPACE = "pmem-csi"

# Reference defaults (deployment_types.go, EnsureDefaults and the Default* constants).
DEFAULT_NAMESPACE = "pmem-csi"
DEFAULT_IMAGE = "intel/pmem-csi-driver:canary"
DEFAULT_PROVISIONER_IMAGE = "k8s.gcr.io/sig-storage/csi-provisioner:v2.0.2"
DEFAULT_NODE_REGISTRAR_IMAGE = "k8s.gcr.io/sig-storage/csi-node-driver-registrar:v1.2.0"
DEFAULT_PULL_POLICY = "IfNotPresent"
DEFAULT_LOG_LEVEL = 5
DEFAULT_DEVICE_MODE = "lvm"
DEFAULT_PMEM_PERCENTAGE = 100
DEFAULT_KUBELET_DIR = "/var/lib/kubelet"
DEFAULT_CPU = "100m"
DEFAULT_MEMORY = "250Mi"
DEFAULT_NODE_SELECTOR: dict[str, str] = {"storage": "pmem"}

# The status reporter is this project's replacement for the operator's status updates. It has
# no default image: no public one exists; `make image` builds it and docs/reporter.md ("The
# reporter image") says how to push it. Without ``reporter.image`` the reporter is not
# deployed (see ``Reporter``).
DEFAULT_REPORTER_REPLICAS = 2
DEFAULT_REPORTER_LOG_LEVEL = 3

DEVICE_MODES = ("lvm", "direct")
DEVICE_MODE_ALIASES = {"ndctl": "direct"}  # the reference kept "ndctl" for compatibility
PULL_POLICIES = ("Always", "Never", "IfNotPresent")
JSON_PATCH_OPS = ("add", "remove", "replace", "move", "copy", "test")

# Fields whose values must never appear in an error message or log line.
SECRET_FIELDS = frozenset({"registryKey", "nodeControllerKey"})
# Fields whose values are too long to be useful in a message.
QUIET_FIELDS = SECRET_FIELDS | {"caCert", "registryCert", "nodeControllerCert"}

# Longest driver name for which every derived object and label fits (see
# ``names.derived_values``: the controller pod's controller-revision-hash label is the limit).
MAX_NAME_LENGTH = names.max_name_length(names.DEFAULT_DRIVER_NAME)[0]
# Namespaces that belong to Kubernetes itself: never created, adopted or deleted by a stack.
SYSTEM_NAMESPACES = frozenset({"kube-system", "kube-public", "kube-node-lease", "default"})
# Certificates generated here: the operator's one-year validity and a renewal lead time.
DEFAULT_VALIDITY_DAYS = 365
DEFAULT_RENEW_BEFORE_DAYS = 30

# Anchored with `\Z`, not `$`: Python's `$` also matches before a final newline ("x\n").
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]\Z")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?\Z")
QUANTITY = re.compile(
    r"^[+-]?(\d+(\.\d*)?|\.\d+)(([KMGTPE]i)|[numkMGTPE]|([eE][+-]?(\d+(\.\d*)?|\.\d+)))?\Z"
)

# Labels this project sets itself; a configured label with one of these keys would break
# selectors (the reporter's and the workloads') and is rejected.
RESERVED_LABEL_KEYS = frozenset(
    {
        "app",
        names.LABEL_NAME,
        names.LABEL_INSTANCE,
        names.LABEL_PART_OF,
        names.LABEL_COMPONENT,
        names.LABEL_MANAGED_BY,
    }
)


class ConfigError(ValueError):
    """Invalid stack configuration; ``problems`` holds one line per mistake."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"invalid stack configuration ({len(self.problems)} problem(s)):\n{lines}")


class _Model(BaseModel):
    """Config models use the camelCase keys of the reference CRD and reject unknown keys.

    Unknown keys are errors rather than ignored because a misspelt optional setting would
    otherwise silently fall back to its default.
    """

    model_config = ConfigDict(
        extra="forbid",
        populate_by_name=True,
        alias_generator=AliasGenerator(validation_alias=to_camel, serialization_alias=to_camel),
        frozen=True,
    )

    @field_validator("*", mode="before")
    @classmethod
    def _no_booleans_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        """pydantic reads ``true`` as 1; for a number setting in YAML it is a mistake."""
        if isinstance(value, bool) and info.field_name:
            annotation = cls.model_fields[info.field_name].annotation
            # Plain and optional integers; "str | int" settings check booleans themselves.
            if annotation is int or set(get_args(annotation)) == {int, type(None)}:
                raise PydanticCustomError("int_type", "Input should be a valid integer")
        return value


class ResourceRequirements(_Model):
    """The shape of a Kubernetes ``ResourceRequirements`` (limits and requests only)."""

    limits: dict[str, str | int] | None = None
    requests: dict[str, str | int] | None = None

    def to_k8s(self) -> dict[str, dict[str, str]]:
        """The container ``resources`` stanza; quantities as strings, as the API returns them."""
        out: dict[str, dict[str, str]] = {}
        if self.limits:
            out["limits"] = {k: str(v) for k, v in self.limits.items()}
        if self.requests:
            out["requests"] = {k: str(v) for k, v in self.requests.items()}
        return out


def _default_resources() -> ResourceRequirements:
    # The reference (d01bc59) put its defaults into limits; requests then default to them.
    return ResourceRequirements(limits={"cpu": DEFAULT_CPU, "memory": DEFAULT_MEMORY})


class Certificates(_Model):
    """PEM encoded CA certificate plus the two leaf certificates and their keys.

    Either all five are set or none; with none, the program generates them once
    (see ``pmem_components.cert_resource``).
    """

    ca_cert: str | None = None
    registry_cert: str | None = None
    registry_key: str | None = Field(default=None, repr=False)
    node_controller_cert: str | None = None
    node_controller_key: str | None = Field(default=None, repr=False)
    # Generated sets only: the leaves' lifetime (the CA lives certs.CA_LIFETIME_FACTOR times as
    # long), renewal lead time (0 = never renew) and a free-form value whose change starts a
    # CA change (explicit rotation, staged: pmem_components.cert_resource).
    validity_days: int = Field(default=DEFAULT_VALIDITY_DAYS, ge=1, le=3650)
    renew_before_days: int = Field(default=DEFAULT_RENEW_BEFORE_DAYS, ge=0, le=3650)
    rotation: str | int = ""
    # The administrator's word that every driver pod runs the material of this hash
    # (pmem-csi.intel.com/certificates-hash), for a CA change whose pods the program cannot
    # read (preflight off): it moves the change to its next stage once, for that hash only.
    rolled_out: str | None = Field(default=None, pattern=r"^[0-9a-f]{32}$")

    @field_validator(
        "ca_cert", "registry_cert", "registry_key", "node_controller_cert", "node_controller_key"
    )
    @classmethod
    def _empty_is_unset(cls, value: str | None) -> str | None:
        # "" (a template that rendered nothing) is unset, as _check_certificates reads it.
        return value or None

    @property
    def provided(self) -> bool:
        return self.ca_cert is not None


class Patch(_Model):
    """One patch entry: which objects to change (kind, optional name/namespace) and how.

    Applied by ``pmem_components.patches`` through Pulumi transforms; exactly one of
    ``mergePatch`` (RFC 7396) and ``jsonPatch`` (RFC 6902 operations) must be given.
    """

    kind: str = Field(min_length=1)
    api_version: str | None = None
    name: str | None = None
    namespace: str | None = None
    merge_patch: dict[str, Any] | None = None
    json_patch: list[dict[str, Any]] | None = None


class Reporter(_Model):
    """Settings of the status reporter that fills in the Deployment CR's status.

    Deployed only when ``image`` is set: a default pointing at an image nobody published
    would leave a first ``pulumi up`` on a real cluster waiting for pods stuck in
    ImagePullBackOff. ``enabled`` unset means "when an image is configured"; after
    validation it is always a bool. ``enabled: true`` without an image is a config error.
    """

    enabled: bool | None = None
    image: str | None = Field(default=None, min_length=1)
    replicas: int = Field(default=DEFAULT_REPORTER_REPLICAS, ge=1, le=10)
    log_level: int = Field(default=DEFAULT_REPORTER_LOG_LEVEL, ge=0, le=65535)

    @model_validator(mode="after")
    def _enabled_when_an_image_is_set(self) -> Reporter:
        if self.enabled is None:
            object.__setattr__(self, "enabled", self.image is not None)
        return self

    @model_serializer(mode="wrap")
    def _omit_unset_image(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # The CR spec records the settings; a null image is noise there (and not a string).
        data = handler(self)
        if self.image is None:
            data.pop("image", None)
        return data


# A Go duration as Pulumi's customTimeouts take it ("90s", "10m", "1h30m").
_DURATION = re.compile(r"^(\d+(\.\d+)?(ns|us|µs|ms|s|m|h))+\Z")


class Await(_Model):
    """How ``pulumi up`` waits for the workloads (StatefulSet, DaemonSet, reporter Deployment).

    ``enabled`` false sets ``pulumi.com/skipAwait`` on them: ``pulumi up`` returns once the API
    server accepted them and the CR status (the reporter) tells when they are ready. ``timeout``
    (a duration such as ``20m``) replaces the provider's 10 minutes for create, update and
    delete, for clusters where a rollout over many nodes takes longer. See pmem_components.
    awaiting.
    """

    enabled: bool = True
    timeout: str | None = None


class DeploymentConfig(_Model):
    """One PMEM-CSI driver deployment: the reference DeploymentSpec plus name and namespace."""

    name: str = names.DEFAULT_DRIVER_NAME
    namespace: str = DEFAULT_NAMESPACE
    create_namespace: bool = True
    image: str = Field(default=DEFAULT_IMAGE, min_length=1)
    image_pull_policy: Literal["Always", "Never", "IfNotPresent"] = DEFAULT_PULL_POLICY
    provisioner_image: str = Field(default=DEFAULT_PROVISIONER_IMAGE, min_length=1)
    node_registrar_image: str = Field(default=DEFAULT_NODE_REGISTRAR_IMAGE, min_length=1)
    controller_resources: ResourceRequirements = Field(default_factory=_default_resources)
    node_resources: ResourceRequirements = Field(default_factory=_default_resources)
    device_mode: Literal["lvm", "direct"] = DEFAULT_DEVICE_MODE
    log_level: int = Field(default=DEFAULT_LOG_LEVEL, ge=0, le=65535)
    # None means "not set"; for lvm the model fills in the default, for direct it stays None.
    pmem_percentage: int | None = Field(default=None, ge=1, le=100)
    node_selector: dict[str, str] = Field(default_factory=lambda: dict(DEFAULT_NODE_SELECTOR))
    labels: dict[str, str] = Field(default_factory=dict)
    kubelet_dir: str = DEFAULT_KUBELET_DIR
    certificates: Certificates = Field(default_factory=Certificates)
    patches: list[Patch] = Field(default_factory=list)
    reporter: Reporter = Field(default_factory=Reporter)
    # Day-2 safety switches; see docs/day2.md. All default to the safe choice.
    adopt_namespace: bool = False
    adopt_existing: bool = False
    allow_reinstall: bool = False
    renamed_from: str | None = None
    allow_device_mode_change: bool = False
    # "await" is a Python keyword, hence the attribute name.
    await_: Await = Field(
        default_factory=Await, validation_alias="await", serialization_alias="await"
    )

    @field_validator("device_mode", mode="before")
    @classmethod
    def _device_mode_alias(cls, value: Any) -> Any:
        if isinstance(value, str):
            return DEVICE_MODE_ALIASES.get(value, value)
        return value

    @field_validator("kubelet_dir", mode="after")
    @classmethod
    def _strip_trailing_slash(cls, value: str) -> str:
        # Host paths are built by appending "/plugins/...", so avoid "//" in them.
        return value.rstrip("/") or "/"

    @model_validator(mode="after")
    def _default_pmem_percentage(self) -> DeploymentConfig:
        if self.device_mode == "lvm" and self.pmem_percentage is None:
            object.__setattr__(self, "pmem_percentage", DEFAULT_PMEM_PERCENTAGE)
        return self

    @property
    def names(self) -> names.DeploymentNames:
        return names.DeploymentNames(self.name)


class StackConfig(_Model):
    """Everything under the ``pmem-csi`` config namespace of one stack."""

    deployments: list[DeploymentConfig] = Field(default_factory=lambda: [DeploymentConfig()])
    manage_crd: bool = True
    # Namespaces and the CRD are stack-level objects whose deletion takes other people's
    # objects with it, so by default they stay when removed from the stack or on destroy.
    retain_crd: bool = True
    retain_namespaces: bool = True
    # Read the cluster before registering anything (adoption, renames, operator migration).
    preflight: bool = True
    # On `pulumi up`, take over fields of the deployments' objects that other field managers
    # own, so the declared state wins (pmem_components/takeover.py; docs/day2.md: "Changed
    # behind Pulumi's back"). False leaves such fields to their owners (and `up` may then fail with
    # a server-side apply conflict).
    take_over_fields: bool = True
    # What other field managers may own without it being drift, on top of the built-in
    # entries (pmem_components/fieldowners.py): `[{manager, paths, reason}]`.
    allowed_field_owners: tuple[fieldowners.Allowance, ...] = ()
    # Objects carrying a pmem-csi-pulumi stack's identity that this stack's state does not
    # hold (retained by an earlier stack of this name, or another stack's), which this stack
    # takes over: True for all of them, or refs as the preflight names them
    # ("Namespace <name>", "Deployment <driver name>": the CR and the deployment's objects).
    # See pmem_components/identity.py.
    adopt: bool | tuple[str, ...] = False

    def adopts(self, ref: str) -> bool:
        """Whether the administrator consented to adopting ``ref`` (``pmem-csi:adopt``)."""
        return self.adopt is True or (isinstance(self.adopt, tuple) and ref in self.adopt)


# The kinds `pmem-csi:adopt` names: what carries the stack annotation.
ADOPT_KINDS = ("Namespace", "Deployment")


def parse_adopt(raw: Any, key: str) -> tuple[bool | tuple[str, ...], list[str]]:
    """``pmem-csi:adopt``: true, false, or a list of refs ``"<Kind> <name>"``; the problems
    name ``key`` and the entry."""
    if raw is None:
        return False, []
    if isinstance(raw, bool):
        return raw, []
    if isinstance(raw, str) and raw.lower() in ("true", "false"):
        return raw.lower() == "true", []
    if not isinstance(raw, list):
        return False, [
            f"{key}: must be true or a list of objects such as \"Namespace pmem-csi\" or "
            f"\"Deployment pmem-csi.intel.com\" (got {_show(raw)})"
        ]
    refs: list[str] = []
    problems: list[str] = []
    for i, item in enumerate(raw):
        where = f"{key}[{i}]"
        kind, _, name = item.partition(" ") if isinstance(item, str) else ("", "", "")
        if kind not in ADOPT_KINDS or not name:
            problems.append(
                f"{where}: must be \"<Kind> <name>\" with Kind one of "
                f"{', '.join(ADOPT_KINDS)}, as the preflight names the object (got {_show(item)})"
            )
        elif not (_DNS_LABEL if kind == "Namespace" else _DNS_SUBDOMAIN).match(name):
            problems.append(f"{where}: {name!r} is not a valid {kind} name")
        else:
            refs.append(f"{kind} {name}")
    return tuple(refs), problems


# Top-level keys of the config namespace that load_config knows.
STACK_KEYS = (
    "deployments",
    "manageCrd",
    "retainCrd",
    "retainNamespaces",
    "preflight",
    "takeOverFields",
    "allowedFieldOwners",
    "adopt",
)


# --------------------------------------------------------------------------- error reporting


def key_path(loc: Iterable[str | int]) -> str:
    """``('deployments', 0, 'labels', 'a/b')`` -> ``pmem-csi:deployments[0].labels["a/b"]``."""
    return f"{CONFIG_NAMESPACE}:" + sub_path(loc, first=True)


def sub_path(loc: Iterable[str | int], *, first: bool = False) -> str:
    """``(0, 'nodeSelector', 'interrupt-gate')`` -> ``[0].nodeSelector.interrupt-gate``.

    The syntax of ``pulumi config set --path``, so that a message's key can be pasted there:
    plain names (hyphens included, as in ``a.interrupt-gate``), ``[i]`` for list items and
    ``["..."]`` for keys with dots, slashes or other characters the path syntax reserves.
    """
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", part):
            out += part if first else f".{part}"
        else:
            out += f'["{part}"]'
        first = False
    return out


def _show(value: Any) -> str:
    if isinstance(value, str):
        # A newline or tab is shown escaped, as YAML would write it: "x\n" is seen.
        return '"' + value.replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t") + '"'
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def string_fix(key: str, value: Any, *, exact: bool = True, secret: bool = False) -> str:
    """How to store ``value`` (a number or boolean) under ``key`` as the string it should be.

    ``pulumi config set --path`` stores ``253578`` as a number and ``true`` as a boolean, and
    so does YAML; turning them into strings here would be lossy (``true`` is not "True", a
    YAML ``1.50`` is not "1.50"), so the value is refused and the message says how to write
    it. ``exact``: ``key`` is the value's own key, so the command can name it.
    """
    text = "<value>" if secret else _show(value)
    hint = "quote it" + ("" if secret else f' ("{text}")') + " in Pulumi.<stack>.yaml"
    if exact:
        # "--": a negative number would be read as an option ("unknown shorthand flag").
        hint += f", or set it with pulumi config set --type string --path '{key}' -- {text}"
    return hint


def _quiet(loc: Sequence[str | int]) -> bool:
    return any(isinstance(p, str) and p in QUIET_FIELDS for p in loc)


def _describe(err: Mapping[str, Any]) -> str:
    """Turn one pydantic error into our wording, without echoing secret values."""
    kind = err["type"]
    ctx = err.get("ctx") or {}
    loc = err["loc"]
    value = err.get("input")
    got = "" if _quiet(loc) else f" (got {_show(value)})"
    if kind == "missing":
        return "is required"
    if kind == "extra_forbidden":
        return "is not a known setting"
    if kind == "literal_error":
        expected = ", ".join(re.findall(r"'([^']*)'", str(ctx.get("expected", ""))))
        return f"must be one of {expected}{got}"
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return f"must be an integer{got}"
    if kind in ("bool_type", "bool_parsing"):
        return f"must be true or false{got}"
    if kind in ("string_type",):
        return f"must be a string{got}"
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        return f"must be a mapping{got}"
    if kind == "list_type":
        return f"must be a list{got}"
    if kind == "greater_than_equal":
        return f"must be at least {ctx.get('ge')}{got}"
    if kind == "less_than_equal":
        return f"must be at most {ctx.get('le')}{got}"
    if kind == "string_too_short":
        return "must not be empty"
    return f"{err.get('msg', 'is invalid')}{got}"


def _real_loc(loc: Sequence[Any], data: Any) -> tuple[tuple[str | int, ...], set[str]]:
    """``loc`` without the union members' tags ("str", "int") pydantic adds to it, and the
    tags. Walked along ``data`` (the validated input), so that a key named "str" is kept.
    """
    out: list[str | int] = []
    tags: set[str] = set()
    node = data
    for part in loc:
        in_map = isinstance(node, Mapping) and part in node
        if in_map or (isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)):
            node = node[part]
        elif part in ("str", "int", "function-after[...]"):
            tags.add(part)
            continue
        else:
            node = None  # past the input (a model's default): keep the rest as it is
        out.append(part)
    return tuple(out), tags


def _pydantic_problems(
    exc: ValidationError, prefix: tuple[str | int, ...], data: Any = None
) -> list[str]:
    # One line per key: a value that fits no member of a union ("str | int") fails once per
    # member; those become one "must be a string or an integer" line, not two problems.
    by_key: dict[str, list[str]] = {}
    for err in exc.errors(include_url=False):
        # Union members add their type name to loc ("str", "int"); drop those.
        loc, tags = _real_loc(err["loc"], data)
        described = _describe(err)
        key = key_path(prefix + loc)
        value = err.get("input")
        # A number or a boolean where only a string will do (not a "str | int" member):
        # `pulumi config set --path` stored it so; say how to store a string instead.
        if (
            err["type"] == "string_type"
            and "str" not in tags
            and isinstance(value, int | float)
            and not _quiet(loc)
        ):
            described += "; " + string_fix(key, value)
        texts = by_key.setdefault(key, [])
        if described not in texts:
            texts.append(described)
    return [f"{key}: {_join_alternatives(texts)}" for key, texts in by_key.items()]


def _join_alternatives(texts: list[str]) -> str:
    """``["must be a string (got x)", "must be an integer (got x)"]`` -> one sentence."""
    if len(texts) == 1:
        return texts[0]
    got = re.search(r" \(got .*\)$", texts[0])
    suffix = got.group(0) if got and all(t.endswith(got.group(0)) for t in texts) else ""
    parts = [t.removesuffix(suffix) for t in texts]
    parts = [parts[0], *(p.removeprefix("must be ") for p in parts[1:])]
    return " or ".join(parts) + suffix


# --------------------------------------------------------------------------- semantic checks


def _dict_or_empty(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def label_key_problem(key: str, what: str = "label key") -> str | None:
    """Why the API server refuses ``key`` as a label key, or None when it takes it.

    Its rule (a qualified name): a name of at most 63 characters, optionally after a prefix
    that is a DNS subdomain and a slash; an empty prefix ("/abc") is none it takes. The same
    rule holds for annotation keys (``what``), which the API server lowers first. One rule
    for the config's labels and for the labels patches write (patches.py).
    """
    prefix, slash, name = key.rpartition("/")
    if (
        not _LABEL_NAME.match(name)
        or len(name) > 63
        or (slash and (not _DNS_SUBDOMAIN.match(prefix) or len(prefix) > 253))
    ):
        return f"is not a valid {what}"
    return None


def label_value_problem(value: str) -> str | None:
    """Why the API server refuses ``value`` as a label value, or None when it takes it: at
    most 63 characters, alphanumeric at both ends (``\\Z``: not "x\\n")."""
    if not _LABEL_VALUE.match(value) or len(value) > 63:
        return f"is not a valid label value (got {_show(value)})"
    return None


def _check_labels(
    labels: Any, path: tuple[str | int, ...], problems: list[str], *, reserved: bool
) -> None:
    if not isinstance(labels, Mapping):
        return
    for key, value in labels.items():
        here = key_path((*path, str(key)))
        key_problem = label_key_problem(str(key))
        if key_problem:
            problems.append(f"{here}: {key_problem}")
        if reserved and key in RESERVED_LABEL_KEYS:
            problems.append(f"{here}: is set by pmem-csi-pulumi itself and cannot be configured")
        value_problem = label_value_problem(value) if isinstance(value, str) else None
        if value_problem:
            problems.append(f"{here}: {value_problem}")


def _check_resources(res: Any, path: tuple[str | int, ...], problems: list[str]) -> None:
    for part in ("limits", "requests"):
        for key, value in _dict_or_empty(_dict_or_empty(res).get(part)).items():
            # pydantic takes true for 1; as a quantity it would reach the cluster as "True".
            if isinstance(value, bool) or (
                isinstance(value, str | int) and not QUANTITY.match(str(value))
            ):
                problems.append(
                    f"{key_path((*path, part, key))}: is not a Kubernetes quantity "
                    f"(got {_show(value)})"
                )


def _check_certificates(certs: Any, path: tuple[str | int, ...], problems: list[str]) -> None:
    certs = _dict_or_empty(certs)
    fields = ("caCert", "registryCert", "registryKey", "nodeControllerCert", "nodeControllerKey")
    present = [f for f in fields if certs.get(f) not in (None, "")]
    if present and len(present) != len(fields):
        missing = ", ".join(f for f in fields if f not in present)
        problems.append(
            f"{key_path(path)}: set all of caCert, registryCert, registryKey, "
            f"nodeControllerCert, nodeControllerKey or none of them (missing: {missing})"
        )
    for f in present:
        value = certs[f]
        if not isinstance(value, str):
            continue
        marker = "PRIVATE KEY-----" if f.endswith("Key") else "-----BEGIN CERTIFICATE-----"
        if marker not in value:
            what = "a PEM encoded private key" if f.endswith("Key") else "a PEM certificate"
            problems.append(f"{key_path((*path, f))}: must be {what}")


def _name_length_problems(name: str, path: tuple[str | int, ...]) -> list[str]:
    """The driver name against every value Kubernetes derives from it (names.derived_values)."""
    problems = []
    allowed, limiting = names.max_name_length(name)
    if limiting is not None and len(name) > allowed:
        value = limiting.value.replace("h" * names.REVISION_HASH_MAX, "<hash>")
        problems.append(
            f"{key_path(path)}: is {len(name)} characters; at most {allowed} fit, because the "
            f"{limiting.what} {value!r} would exceed the {limiting.limit} characters "
            "Kubernetes allows"
        )
    if not name[:1].isalpha():
        problems.append(
            f"{key_path(path)}: must start with a letter: Service names are derived from it "
            f"(got {_show(name)})"
        )
    return problems


def _check_renewal(certs: Any, path: tuple[str | int, ...], problems: list[str]) -> None:
    """A lead time as long as the validity would renew the set on every ``pulumi up``."""
    certs = _dict_or_empty(certs)
    pair = {k: certs[k] for k in ("validityDays", "renewBeforeDays") if k in certs}
    try:
        # Compared as the model holds them, parsed by the model itself ("10.0", "1_0" and
        # " 30 " are ints there), so the rule and the model never disagree; the other keys
        # are left out so that their errors do not hide this one. Only when both are valid on
        # their own: a wrong type or a value out of range already has its own error (from
        # the model), and a second one about the pair would mislead.
        parsed: Certificates | None = Certificates.model_validate(pair)
    except ValidationError:
        parsed = None
    if parsed is not None and parsed.renew_before_days >= parsed.validity_days:
        problems.append(
            f"{key_path((*path, 'renewBeforeDays'))}: must be less than validityDays "
            f"({parsed.validity_days}), or every pulumi up would renew the certificates "
            f"(got {parsed.renew_before_days})"
        )
    rotation = certs.get("rotation")
    if isinstance(rotation, bool):
        problems.append(f"{key_path((*path, 'rotation'))}: must be a string or number")


def _check_patches(patches: Any, path: tuple[str | int, ...], problems: list[str]) -> None:
    if not isinstance(patches, list):
        return
    for i, patch in enumerate(patches):
        if not isinstance(patch, Mapping):
            continue
        here = (*path, i)
        has_merge = patch.get("mergePatch") is not None
        has_json = patch.get("jsonPatch") is not None
        if has_merge == has_json:
            problems.append(f"{key_path(here)}: set exactly one of mergePatch and jsonPatch")
        ops = patch.get("jsonPatch")
        if not isinstance(ops, list):
            continue
        for j, op in enumerate(ops):
            if not isinstance(op, Mapping):
                continue
            op_path = (*here, "jsonPatch", j)
            if op.get("op") not in JSON_PATCH_OPS:
                problems.append(
                    f"{key_path((*op_path, 'op'))}: must be one of {', '.join(JSON_PATCH_OPS)} "
                    f"(got {_show(op.get('op'))})"
                )
            if not isinstance(op.get("path"), str) or not str(op.get("path")).startswith("/"):
                problems.append(
                    f"{key_path((*op_path, 'path'))}: must be a JSON pointer like /spec"
                )
            if op.get("op") in ("add", "replace", "test") and "value" not in op:
                problems.append(f"{key_path((*op_path, 'value'))}: is required for {op['op']}")
            if op.get("op") in ("move", "copy") and not isinstance(op.get("from"), str):
                problems.append(f"{key_path((*op_path, 'from'))}: is required for {op['op']}")


def _check_trimmed(value: Any, path: tuple[str | int, ...], problems: list[str]) -> None:
    """An image or a path with whitespace around it (a newline from a template): the API
    server refuses such an image in the middle of ``pulumi up``, and a path so written is
    not the kubelet's."""
    if isinstance(value, str) and value != value.strip():
        problems.append(
            f"{key_path(path)}: must not begin or end with whitespace (got {_show(value)})"
        )


def _check_reporter(reporter: Any, path: tuple[str | int, ...], problems: list[str]) -> None:
    reporter = _dict_or_empty(reporter)
    _check_trimmed(reporter.get("image"), (*path, "image"), problems)
    try:
        # On as the model reads it ("true", "on", 1 are true there), so that the rule and the
        # model never disagree; an image is left out, for this rule is about enabled alone.
        enabled = Reporter.model_validate({"enabled": reporter.get("enabled")}).enabled
    except ValidationError:
        return  # not a boolean: the model's own error says so
    if enabled and reporter.get("image") is None:
        problems.append(
            f"{key_path((*path, 'image'))}: is required when reporter.enabled is true: there is "
            "no public reporter image; build it with `make image`, push it (see docs/reporter.md, "
            "The reporter image) and set its name here, or leave enabled unset"
        )


def _check_deployment(raw: Mapping[str, Any], path: tuple[str | int, ...]) -> list[str]:
    """Checks pydantic's field types cannot express; tolerant of wrongly typed values."""
    problems: list[str] = []
    name = raw.get("name", names.DEFAULT_DRIVER_NAME)
    if isinstance(name, str):
        if not _DNS_SUBDOMAIN.match(name) or len(name) > 253:
            problems.append(
                f"{key_path((*path, 'name'))}: must be a DNS subdomain: lower case letters, "
                f"digits, '-' and '.' (got {_show(name)})"
            )
        else:
            problems += _name_length_problems(name, (*path, "name"))
    renamed_from = raw.get("renamedFrom")
    if isinstance(renamed_from, str) and not _DNS_SUBDOMAIN.match(renamed_from):
        problems.append(
            f"{key_path((*path, 'renamedFrom'))}: must be the previous driver name "
            f"(got {_show(renamed_from)})"
        )
    namespace = raw.get("namespace", DEFAULT_NAMESPACE)
    if isinstance(namespace, str) and (not _DNS_LABEL.match(namespace) or len(namespace) > 63):
        problems.append(
            f"{key_path((*path, 'namespace'))}: must be a DNS label: lower case letters, digits "
            f"and '-' (got {_show(namespace)})"
        )
    elif isinstance(namespace, str) and namespace in SYSTEM_NAMESPACES:
        problems.append(
            f"{key_path((*path, 'namespace'))}: {_show(namespace)} belongs to Kubernetes itself; "
            "use a namespace of its own for the driver (e.g. pmem-csi)"
        )
    mode = raw.get("deviceMode", DEFAULT_DEVICE_MODE)
    mode = DEVICE_MODE_ALIASES.get(mode, mode) if isinstance(mode, str) else mode
    if mode == "direct" and raw.get("pmemPercentage") is not None:
        problems.append(
            f"{key_path((*path, 'pmemPercentage'))}: is only valid with deviceMode lvm "
            "(remove it or use lvm)"
        )
    kubelet_dir = raw.get("kubeletDir")
    if isinstance(kubelet_dir, str) and not kubelet_dir.startswith("/"):
        problems.append(
            f"{key_path((*path, 'kubeletDir'))}: must be an absolute path "
            f"(got {_show(kubelet_dir)})"
        )
    for key in ("image", "provisionerImage", "nodeRegistrarImage", "kubeletDir"):
        _check_trimmed(raw.get(key), (*path, key), problems)
    _check_labels(raw.get("labels"), (*path, "labels"), problems, reserved=True)
    _check_labels(raw.get("nodeSelector"), (*path, "nodeSelector"), problems, reserved=False)
    for res in ("controllerResources", "nodeResources"):
        _check_resources(raw.get(res), (*path, res), problems)
    _check_certificates(raw.get("certificates"), (*path, "certificates"), problems)
    _check_renewal(raw.get("certificates"), (*path, "certificates"), problems)
    _check_patches(raw.get("patches"), (*path, "patches"), problems)
    _check_reporter(raw.get("reporter"), (*path, "reporter"), problems)
    _check_await(raw.get("await"), (*path, "await"), problems)
    return problems


def _check_await(value: Any, path: tuple[str | int, ...], problems: list[str]) -> None:
    settings = _dict_or_empty(value)
    timeout = settings.get("timeout")
    if isinstance(timeout, str) and (
        not _DURATION.match(timeout) or not re.search(r"[1-9]", timeout)
    ):
        problems.append(
            f"{key_path((*path, 'timeout'))}: must be a positive duration such as 90s, 20m or "
            f"1h30m (got {_show(timeout)})"
        )
    try:
        # Read by the model itself ("off", "No" and "0" are false there, as false is), so that
        # the rule and the model never disagree; a value the model refuses has its own error
        # (from the model), and a second one about the timeout would mislead.
        given = {"enabled": settings["enabled"]} if "enabled" in settings else {}
        awaited = Await.model_validate(given).enabled
    except ValidationError:
        awaited = True
    if timeout is not None and not awaited:
        problems.append(
            f"{key_path((*path, 'timeout'))}: is only valid with await.enabled true "
            "(nothing is awaited)"
        )


def _check_unique(deployments: list[Any]) -> list[str]:
    """Names must be unique, also after dots become hyphens (object names would clash)."""
    problems = []
    seen: dict[str, int] = {}
    for i, dep in enumerate(deployments):
        if not isinstance(dep, Mapping):
            continue
        name = dep.get("name", names.DEFAULT_DRIVER_NAME)
        if not isinstance(name, str):
            continue
        hyphened = names.DeploymentNames(name).hyphened
        if hyphened in seen:
            other = seen[hyphened]
            problems.append(
                f"{key_path(('deployments', i, 'name'))}: {_show(name)} clashes with "
                f"{key_path(('deployments', other, 'name'))}; deployment names must be unique "
                "(also with dots replaced by hyphens)"
            )
        else:
            seen[hyphened] = i
    return problems


def _check_renames(deployments: list[Any]) -> list[str]:
    """A ``renamedFrom`` must name a deployment no longer configured, and no other entry's.

    A rename replaces the old deployment: the preflight plans the old driver's removal (the
    new one starts after it). With the old name still configured too, the update would
    remove the driver it also deploys. A cross-entry rule, so here beside the unique names,
    where it holds with ``preflight: false`` as well and before anything is changed.
    """
    problems = []
    configured: dict[str, int] = {}
    for i, dep in enumerate(deployments):
        name = dep.get("name", names.DEFAULT_DRIVER_NAME) if isinstance(dep, Mapping) else None
        if isinstance(name, str):
            configured.setdefault(name, i)
    renamed: dict[str, int] = {}
    for i, dep in enumerate(deployments):
        if not isinstance(dep, Mapping):
            continue
        old = dep.get("renamedFrom")
        if not isinstance(old, str):
            continue
        other = configured.get(old)
        here = key_path(("deployments", i, "renamedFrom"))
        if other is not None and other != i:
            problems.append(
                f"{here}: {_show(old)} is still "
                f"configured ({key_path(('deployments', other, 'name'))}); a rename replaces "
                "the old deployment, so remove it from the config in the same update to "
                "rename it, or drop renamedFrom to run both"
            )
        # One old deployment, one new name: two entries renamed from it both got it as their
        # previous deployment in the preflight, and both components (and their objects)
        # aliased its URNs, which the engine refuses in the middle of the update.
        first = renamed.setdefault(old, i)
        if first != i:
            problems.append(
                f"{here}: {_show(old)} is already renamed by "
                f"{key_path(('deployments', first, 'renamedFrom'))}; a deployment is renamed "
                "to one new name, so set renamedFrom on one of them only"
            )
    return problems


# --------------------------------------------------------------------------- entry point


def deployment_problems(dep: DeploymentConfig, index: int = 0) -> list[str]:
    """The cross-field checks of :func:`load_config` for a model built in code.

    Library users may construct :class:`DeploymentConfig` directly; pydantic then checks the
    field types but not the rules between fields (e.g. pmemPercentage with direct mode).
    """
    raw = dep.model_dump(by_alias=True, exclude_none=True)
    return _check_deployment(raw, ("deployments", index))


def certificate_problems(
    dep: DeploymentConfig, index: int, *, handshake: bool = True
) -> tuple[list[str], list[str]]:
    """Errors and warnings about a deployment's user-provided certificates, by config key.

    Delegates to :func:`pmem_components.certs.validate_driver_certificates` (parsing, key
    match, chain, expiry, names and a real mutual-TLS handshake, as the operator did).
    """
    certs = dep.certificates
    if not certs.provided:
        return [], []
    from pmem_components import certs as certlib  # cryptography is only needed here

    found = certlib.validate_driver_certificates(
        certs.ca_cert or "",
        certs.registry_cert or "",
        certs.registry_key or "",
        certs.node_controller_cert or "",
        certs.node_controller_key or "",
        handshake=handshake,
    )
    errors: list[str] = []
    warnings: list[str] = []
    for p in found:
        message = p.message.removeprefix(f"{p.field}: ")
        line = f"{key_path(('deployments', index, 'certificates', p.field))}: {message}"
        (warnings if p.severity == "warning" else errors).append(line)
    return errors, warnings


def load_config(
    raw: Mapping[str, Any] | None,
    *,
    check_certificates: bool = True,
    warn: Callable[[str], None] | None = None,
) -> StackConfig:
    """Validate the raw values of the ``pmem-csi`` config namespace.

    ``raw`` uses the config keys (``deployments``, ``manageCrd``) with plain JSON-like values;
    missing or ``None`` keys take their defaults (one default deployment when ``deployments``
    is absent). Raises :class:`ConfigError` listing every problem found. User-provided
    certificates are validated too (``check_certificates``), once the rest of their
    deployment is valid; certificate warnings (e.g. expiring soon) go to ``warn``.
    """
    raw = {k: v for k, v in (raw or {}).items() if v is not None}
    problems: list[str] = []
    for key in raw:
        if key not in STACK_KEYS:
            problems.append(f"{key_path((key,))}: is not a known setting")

    deployments_raw = raw.get("deployments")
    parsed: list[DeploymentConfig] = []
    if deployments_raw is None:
        parsed.append(DeploymentConfig())
    elif not isinstance(deployments_raw, list):
        problems.append(f"{key_path(('deployments',))}: must be a list of deployments")
    else:
        for i, dep in enumerate(deployments_raw):
            path: tuple[str | int, ...] = ("deployments", i)
            if not isinstance(dep, Mapping):
                problems.append(f"{key_path(path)}: must be a mapping (got {_show(dep)})")
                continue
            dep_problems = _check_deployment(dep, path)
            try:
                model = DeploymentConfig.model_validate(dep)
            except ValidationError as exc:
                dep_problems = _pydantic_problems(exc, path, dep) + dep_problems
            else:
                parsed.append(model)
                if check_certificates and not dep_problems:
                    errors, warnings = certificate_problems(model, i)
                    dep_problems += errors
                    for w in warnings:
                        (warn or (lambda _m: None))(w)
            problems.extend(dep_problems)
        problems.extend(_check_unique(deployments_raw))
        problems.extend(_check_renames(deployments_raw))

    allowed, allowed_problems = fieldowners.parse_allowed(
        raw.get("allowedFieldOwners"), key_path(("allowedFieldOwners",))
    )
    problems.extend(allowed_problems)
    adopt, adopt_problems = parse_adopt(raw.get("adopt"), key_path(("adopt",)))
    problems.extend(adopt_problems)
    separate = ("deployments", "allowedFieldOwners", "adopt")
    top = {k: raw[k] for k in STACK_KEYS if k in raw and k not in separate}
    stack: StackConfig | None = None
    try:
        stack = StackConfig.model_validate({**top, "deployments": []})
    except ValidationError as exc:
        problems.extend(_pydantic_problems(exc, (), {**top, "deployments": []}))

    if problems:
        raise ConfigError(problems)
    assert stack is not None
    return stack.model_copy(
        update={"deployments": parsed, "allowed_field_owners": tuple(allowed), "adopt": adopt}
    )
