"""The served component registers its children as the Python program does, options included.

Why (issue 19): ``tests/e2e/test_yaml_package.py`` compares the objects' inputs only. What the
engine does with a child also depends on its resource options -- its parent, ``dependsOn``,
``retainOnDelete``, ``protect``, ``deleteBeforeReplace``, ``ignoreChanges``,
``replaceOnChanges``, ``customTimeouts``, ``deletedWith``, ``additionalSecretOutputs``, its
hooks (the field take-over's ``before_update``/``after_create``, which is what makes
``pulumi up --refresh`` correct a change made with kubectl) -- and on which inputs are secret.
Here both are compared as the engine receives them: the ``RegisterResource`` requests of the
served face (:class:`pmem_components.provider_face.PmemCsiDeployment`, as the provider
constructs it for a YAML program) and of the Python stack program (``program.main``) for the
same deployments, each with its defaults (field take-over on: ``takeOverFields`` /
``pmem-csi:takeOverFields``) and the CRD installed beforehand, under Pulumi mocks.

The differences that are by design, asserted as such (:data:`BY_DESIGN`):

- the Namespace: the program registers it at stack level (one per stack, shared by its
  deployments) with hooks that merge only other Pulumi stacks' entries (adoption with
  ``pmem-csi:adopt``, which the face refuses); the served component registers it as its child;
- aliases: the served namespace and component also answer to the URNs the program's have,
  so a stack can move between the faces; every served child to its name under the old
  prefixed layout (:func:`test_the_served_aliases_are_the_prefixed_layouts_and_the_programs`);
  the program's have none.

The same records, taken from ``pulumi stack export`` of a real YAML stack, are compared in
``tests/e2e/test_yaml_drift.py`` (:func:`comparable`, :func:`state_registrations`).
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pytest
from google.protobuf import json_format
from pulumi.runtime import config as runtime_config

from pmem_components import components, provider_face

# The engine's marker of a secret value, in the wire format and in the state.
SECRET_SIG = ("4dabf18193072939515e22adb298388d", "1b47061264138c4ac30d75fd1eb44270")
CERT_OUTPUTS = {
    key: f"GENERATED-{key}"
    for key in ("ca_cert", "registry_cert", "registry_key", "node_controller_cert",
                "node_controller_key")
}  # fmt: skip
HOOK_KINDS = ("before_create", "after_create", "before_update", "after_update",
              "before_delete", "after_delete", "on_error")  # fmt: skip
_STATE_HOOK_KINDS = {"".join(p.title() for p in k.split("_")): k for k in HOOK_KINDS}
# The args as the YAML program writes them, the face's (Python) names, and the component's
# resource name there.
DEPLOYMENTS: list[dict[str, Any]] = [
    {
        "name": "parity-a.example.org",
        "namespace": "parity-a",
        "deviceMode": "direct",
        "labels": {"team": "storage"},
        "await": {"enabled": False},
        "patches": [
            {"kind": "DaemonSet", "mergePatch": {"metadata": {"labels": {"patched-by": "yaml"}}}}
        ],
    },
    {
        "name": "parity-b.example.org",
        "namespace": "parity-b",
        "logLevel": 3,
        "await": {"enabled": False},
    },
]
FACE_NAMES = {"driverA": DEPLOYMENTS[0]["name"], "driverB": DEPLOYMENTS[1]["name"]}


@dataclass
class Registration:
    """One resource as the engine was asked to register it (request or state)."""

    urn: str
    type: str
    parent: str = ""
    custom: bool = False
    dependencies: list[str] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)
    aliases: list[str] = field(default_factory=list)
    hooks: dict[str, list[str]] = field(default_factory=dict)
    inputs: dict[str, Any] = field(default_factory=dict)  # secrets as the wire has them


# --------------------------------------------------------------------------- recording


def _from_request(request: Any, urn: str) -> Registration:
    options: dict[str, Any] = {
        "protect": bool(request.protect),
        "retainOnDelete": bool(request.retainOnDelete),
        "ignoreChanges": sorted(request.ignoreChanges),
        "replaceOnChanges": sorted(request.replaceOnChanges),
        "additionalSecretOutputs": sorted(request.additionalSecretOutputs),
        "deletedWith": request.deletedWith,
        "customTimeouts": {
            k: v for k, v in json_format.MessageToDict(request.customTimeouts).items() if v
        },
        # Not in the state (the engine does not record it): compared under mocks only.
        "deleteBeforeReplace": bool(request.deleteBeforeReplace),
    }
    aliases = [a.urn for a in request.aliases if a.WhichOneof("alias") == "urn"]
    aliases += [
        json.dumps(json_format.MessageToDict(a.spec), sort_keys=True)
        for a in request.aliases
        if a.WhichOneof("alias") == "spec"
    ]
    hooks = {k: sorted(getattr(request.hooks, k)) for k in HOOK_KINDS}
    return Registration(
        urn=urn,
        type=request.type,
        parent=request.parent,
        custom=bool(request.custom),
        dependencies=sorted(request.dependencies),
        options=options,
        aliases=sorted([*request.aliasURNs, *aliases]),
        hooks={k: v for k, v in hooks.items() if v},
        inputs=json_format.MessageToDict(request.object),
    )


@contextmanager
def recording_mocks() -> Iterator[list[Registration]]:
    """Pulumi mocks whose monitor records every ``RegisterResource`` request."""
    # Here, not at the top: the e2e module imports this one for its comparison only, with
    # no tests/unit on sys.path.
    from pulumi.runtime.mocks import MockMonitor
    from pulumi_mocks import RecordingMocks

    seen: list[Registration] = []

    class Recording(MockMonitor):
        def RegisterResource(self, request: Any) -> Any:
            response = super().RegisterResource(request)
            seen.append(_from_request(request, response.urn))
            return response

    mocks = RecordingMocks(CERT_OUTPUTS)
    pulumi.runtime.set_mocks(
        mocks, project="parity", stack="unit", preview=True, monitor=Recording(mocks)
    )
    yield seen


def face_args(entry: Mapping[str, Any], typ: type = provider_face.PmemCsiDeploymentArgs) -> Any:
    """A YAML program's properties (camelCase) as the provider hands them to the face."""
    import typing

    by_camel = {provider_face._camel(k): (k, h) for k, h in typing.get_type_hints(typ).items()}
    out: dict[str, Any] = {}
    for key, value in entry.items():
        name, hint = by_camel.get(key, (key, None))
        if isinstance(hint, type) and typing.is_typeddict(hint) and isinstance(value, Mapping):
            value = face_args(value, hint)
        elif typing.get_origin(hint) is list and isinstance(value, list):
            inner = typing.get_args(hint)[0]
            if isinstance(inner, type) and typing.is_typeddict(inner):
                value = [face_args(v, inner) for v in value]
        out[name] = value
    return out


def face_registrations(
    resources: Mapping[str, Mapping[str, Any]],
) -> list[Registration]:
    """What the served component registers for ``resources`` (YAML resource name -> props)."""
    token = runtime_config.CONFIG.set({"kubernetes:enableSecretMutable": "true"})
    try:
        with recording_mocks() as seen:

            def program() -> None:
                for name, props in resources.items():
                    provider_face.PmemCsiDeployment(name, face_args(props))

            pulumi.runtime.test(program)()
    finally:
        runtime_config.CONFIG.reset(token)
    return seen


def program_registrations(raw: dict[str, Any]) -> list[Registration]:
    """What the Python stack program registers for the stack config ``raw`` (preflight off:
    mocks have no cluster)."""
    from bad_input import stack_config

    from pmem_components import program

    with recording_mocks() as seen, stack_config(raw):
        pulumi.runtime.test(program.main)()
    return seen


# --------------------------------------------------------------------------- from the state


def state_registrations(export: Mapping[str, Any]) -> list[Registration]:
    """The same records from ``pulumi stack export`` (the state has no deleteBeforeReplace)."""
    out = []
    for res in export["deployment"]["resources"]:
        # The state names the kinds BeforeUpdate, the request before_update.
        hooks = {
            _STATE_HOOK_KINDS.get(k, k): sorted(v)
            for k, v in (res.get("resourceHooks") or {}).items()
            if v
        }
        timeouts = {k: v for k, v in (res.get("customTimeouts") or {}).items() if v}
        out.append(
            Registration(
                urn=res["urn"],
                type=res["type"],
                parent=res.get("parent", ""),
                custom=bool(res.get("custom")),
                dependencies=sorted(res.get("dependencies") or []),
                options={
                    "protect": bool(res.get("protect")),
                    "retainOnDelete": bool(res.get("retainOnDelete")),
                    "ignoreChanges": sorted(res.get("ignoreChanges") or []),
                    "replaceOnChanges": sorted(res.get("replaceOnChanges") or []),
                    "additionalSecretOutputs": sorted(res.get("additionalSecretOutputs") or []),
                    "deletedWith": res.get("deletedWith", ""),
                    "customTimeouts": timeouts,
                },
                aliases=sorted(res.get("aliases") or []),
                hooks=hooks,
                inputs=res.get("inputs") or {},
            )
        )
    return out


# --------------------------------------------------------------------------- comparing


def role(urn: str, names: Mapping[str, str]) -> str:
    """A URN without what tells the faces apart: stack and project, the type chain (its
    last type stays), and the served component's name as the prefix of its children's
    (``driverA:ns/name``) or as its own (``driverA``: the driver name in the program)."""
    if not urn.startswith("urn:"):
        return urn  # empty, or an alias given as a spec
    _, _, types, name = urn.split("::", 3)
    typ = types.split("$")[-1]
    if typ == "pulumi:pulumi:Stack":
        return "stack"
    for face, driver in names.items():
        if name == face:
            name = driver
        elif name.startswith(f"{face}:"):
            name = name[len(face) + 1 :]
    return f"{typ}::{name}"


def secret_paths(value: Any, path: str = "") -> list[str]:
    """Paths of the secret values (the engine's secret marker) in inputs."""
    if isinstance(value, Mapping):
        if value.get(SECRET_SIG[0]) == SECRET_SIG[1]:
            return [path or "(inputs)"]
        return [p for k, v in value.items() for p in secret_paths(v, f"{path}.{k}".lstrip("."))]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in secret_paths(v, f"{path}[{i}]")]
    return []


def comparable(
    regs: list[Registration], names: Mapping[str, str] = {}
) -> dict[str, dict[str, Any]]:
    """The registrations by :func:`role`, with what must be the same in both faces.

    Providers and the stack are left out (both use the default Kubernetes provider; the
    e2e test checks the state's). Hook names carry the component's name, which is the
    driver name in the program: renamed like URNs.
    """
    out: dict[str, dict[str, Any]] = {}
    for reg in regs:
        if reg.type.startswith("pulumi:providers:") or reg.type == "pulumi:pulumi:Stack":
            continue
        key = role(reg.urn, names)
        assert key not in out, key
        meta = reg.inputs.get("metadata") or {}
        annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
        out[key] = {
            "parent": role(reg.parent, names),
            "dependencies": sorted({role(d, names) for d in reg.dependencies}),
            **reg.options,
            "deletedWith": role(reg.options.get("deletedWith", ""), names),
            "hooks": {k: sorted(_renamed(h, names) for h in v) for k, v in reg.hooks.items()},
            # Aliases other than the program's own URN of the object (see the module doc).
            "otherAliases": sorted({role(a, names) for a in reg.aliases} - {key}),
            "secrets": sorted(secret_paths(reg.inputs)),
            "patchForce": (annotations or {}).get(components.PATCH_FORCE_ANNOTATION)
            if isinstance(annotations, Mapping)
            else None,
        }
    return out


def _renamed(hook: str, names: Mapping[str, str]) -> str:
    for face, driver in names.items():
        if hook.endswith(f"-{face}"):
            return hook[: -len(face)] + driver
    return hook


NAMESPACE_TYPE = "kubernetes:core/v1:Namespace"
COMPONENT = components.COMPONENT_TYPE


def by_design(
    served: dict[str, dict[str, Any]], program: dict[str, dict[str, Any]]
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """Both sides without the differences of :data:`BY_DESIGN` (each asserted here)."""
    served, program = json.loads(json.dumps(served)), json.loads(json.dumps(program))
    for key, opts in served.items():
        if key.startswith(f"{NAMESPACE_TYPE}::"):
            # The program's namespace is the stack's; the component's is its child.
            assert opts["parent"].startswith(f"{COMPONENT}::"), (key, opts)
            assert program[key]["parent"] == "stack", (key, program[key])
            opts["parent"] = "stack"
            program[key]["hooks"] = opts["hooks"]  # stale-only (pmem-csi:adopt) in Python
    return served, program


BY_DESIGN = (
    "the Namespace's parent (stack in the program, the component when served) and its "
    "stale-only take-over hooks (pmem-csi:adopt, refused when served)",
    "aliases: the served namespace and component also answer to the program's URNs, every "
    "served child to its old prefixed name (asserted by "
    "test_the_served_aliases_are_the_prefixed_layouts_and_the_programs)",
)


def _raw(deployments: list[dict[str, Any]], **settings: Any) -> dict[str, Any]:
    return {"deployments": deployments, "manageCrd": False, **settings}


def _resources(take_over: bool | None) -> dict[str, dict[str, Any]]:
    extra = {} if take_over is None else {"takeOverFields": take_over}
    return {name: {**DEPLOYMENTS[i], **extra} for i, name in enumerate(FACE_NAMES)}


def _differences(
    served: dict[str, dict[str, Any]], program: dict[str, dict[str, Any]]
) -> list[str]:
    problems = [f"{k}: only served" for k in sorted(set(served) - set(program))]
    problems += [f"{k}: only in the program" for k in sorted(set(program) - set(served))]
    for key in sorted(set(served) & set(program)):
        for opt in sorted(set(served[key]) | set(program[key])):
            if served[key].get(opt) != program[key].get(opt):
                problems.append(
                    f"{key}.{opt}: served {served[key].get(opt)!r}, "
                    f"program {program[key].get(opt)!r}"
                )
    return problems


@pytest.mark.parametrize(
    ("take_over", "setting"),
    [(None, {}), (False, {"takeOverFields": False})],
    ids=["defaults", "take-over-off"],
)
def test_the_served_children_have_the_programs_options_hooks_and_secrets(
    take_over: bool | None, setting: dict[str, Any]
) -> None:
    """Every child, its options, hooks, secret inputs and forced apply: the same in both
    faces, by default (take-over on) and with it off in both."""
    served = comparable(face_registrations(_resources(take_over)), FACE_NAMES)
    program = comparable(program_registrations(_raw(DEPLOYMENTS, **setting)))
    served, program = by_design(served, program)
    assert _differences(served, program) == []


def test_by_default_every_object_is_taken_over_and_applied_with_force() -> None:
    """What the defaults mean (the Python program's): every Kubernetes child but the
    Namespace has the take-over's update and create hooks, and ``pulumi.com/patchForce``."""
    served = comparable(face_registrations(_resources(None)), FACE_NAMES)
    kube = {k: v for k, v in served.items() if k.startswith("kubernetes:")}
    assert kube
    for key, opts in kube.items():
        if key.startswith(f"{NAMESPACE_TYPE}::"):
            # Left to its administrators, as the program's stack namespaces: not forced.
            assert opts["hooks"] == {} and opts["patchForce"] is None, key
            continue
        assert set(opts["hooks"]) == {"before_update", "after_create"}, key
        assert opts["patchForce"] == "true", key


def test_with_take_over_off_nothing_is_taken_over_nor_forced() -> None:
    served = comparable(face_registrations(_resources(False)), FACE_NAMES)
    for key, opts in served.items():
        assert opts["hooks"] == {}, key
        assert opts["patchForce"] is None, key


def test_the_secrets_data_is_secret_with_the_programs_keys() -> None:
    """A Secret's data goes to the engine as a secret, never plain, with the same keys."""
    served = face_registrations(_resources(None))
    program = program_registrations(_raw(DEPLOYMENTS))

    def secrets(regs: list[Registration], names: Mapping[str, str]) -> dict[str, Any]:
        out = {}
        for reg in regs:
            if reg.type == "kubernetes:core/v1:Secret":
                out[role(reg.urn, names)] = (secret_paths(reg.inputs), _data_keys(reg.inputs))
        return out

    got, want = secrets(served, FACE_NAMES), secrets(program, {})
    assert got == want
    assert len(got) == 4
    for paths, keys in got.values():
        assert paths == [SECRET_DATA], paths
        assert keys == ["ca.crt", "tls.crt", "tls.key"], keys


# Where the Secrets' PEM values go: ``stringData`` (pmem_components/manifests/secrets.py), so
# callers may pass Pulumi outputs; the API server stores them under ``data``.
SECRET_DATA = "stringData"


def _data_keys(inputs: Mapping[str, Any]) -> list[str]:
    data = inputs.get(SECRET_DATA) or {}
    if data.get(SECRET_SIG[0]) == SECRET_SIG[1]:
        data = data.get("value") or {}
    return sorted(data)


# A PEM private key with its body: a mention of the words (a pickled dynamic provider's code
# constants, say) is not key material.
_PEM_KEY = re.compile(rb"-----BEGIN [A-Z ]*PRIVATE KEY-----\s*[A-Za-z0-9+/=]{16,}")


def plaintext_private_keys(value: Any, path: str = "") -> list[str]:
    """Paths of strings holding a private key, as text or base64 (a Secret's data)."""
    if isinstance(value, Mapping):
        return [p for k, v in value.items() for p in plaintext_private_keys(v, f"{path}.{k}")]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in plaintext_private_keys(v, f"{path}[{i}]")]
    if isinstance(value, str):
        if _PEM_KEY.search(value.encode()):
            return [path]
        try:
            decoded = base64.b64decode(value, validate=True)
        except ValueError:
            return []
        if _PEM_KEY.search(decoded):
            return [path]
    return []


def test_the_key_finder_finds_text_and_base64() -> None:
    """The e2e grep of the export (tests/e2e/test_yaml_drift.py) sees both forms."""
    pem = (
        "-----BEGIN PRIVATE KEY-----\nMIIBVQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----\n"
    )
    b64 = base64.b64encode(pem.encode()).decode()
    words = base64.b64encode(b"if b'PRIVATE KEY' in text").decode()
    assert plaintext_private_keys({"a": [pem], "b": {"tls.key": b64}, "c": words}) == [
        ".a[0]",
        ".b.tls.key",
    ]


TEAM = {
    "manager": "team-labeller",
    "paths": ["metadata.labels.team"],
    "reason": "our controller labels every object with its owning team",
}


def _take_overs(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every take-over the components build (the transform and hooks of one component)."""
    from pmem_components import takeover_transform

    made: list[Any] = []
    real = takeover_transform.TakeOver

    def recording(*args: Any, **kwargs: Any) -> Any:
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(takeover_transform, "TakeOver", recording)
    return made


def test_the_ownership_policy_reaches_the_take_over_as_in_the_program(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``allowedFieldOwners`` (the Python program's ``pmem-csi:allowedFieldOwners``): what a
    manager may own without it being drift is left to it by the served take-over too."""
    made = _take_overs(monkeypatch)
    program_registrations(_raw(DEPLOYMENTS[:1], allowedFieldOwners=[TEAM]))
    program = [t.allowed for t in made if not t.stale_only]
    made.clear()
    face_registrations({"driverA": {**DEPLOYMENTS[0], "allowedFieldOwners": [TEAM]}})
    assert [t.allowed for t in made] == program
    assert [a.manager for a in program[0]] == ["team-labeller"]


def test_a_bad_ownership_entry_is_named_as_the_program_writes_it() -> None:
    with pytest.raises(provider_face.ArgsError) as caught:
        face_registrations(
            {"driverA": {**DEPLOYMENTS[0], "allowedFieldOwners": [{"manager": "x"}]}}
        )
    assert caught.value.problems == [
        "allowedFieldOwners[0].paths: must be a non-empty list of field paths",
        "allowedFieldOwners[0].reason: say why this manager may own these fields",
    ]


def _alias_names(reg: Registration) -> set[tuple[str, str]]:
    """(last type, name) of each alias URN: what ``role`` would fold away."""
    out = set()
    for alias in reg.aliases:
        if alias.startswith("urn:"):
            _, _, types, name = alias.split("::", 3)
            out.add((types.split("$")[-1], name))
    return out


def test_the_served_aliases_are_the_prefixed_layouts_and_the_programs() -> None:
    """What :func:`comparable` cannot see (``role`` folds the prefixes away; review of
    rename19): each served child answers to its name under the old prefixed layout
    (``driverA:<name>``), a stack made by that layout moving with one ``up``; the namespace
    and the component also to the program's URNs (BY_DESIGN). The dynamic certificate set
    inherits its aliases from its parent (the SDK's rule for a child named after it)."""
    regs = face_registrations(_resources(None))
    faces = {reg.urn.split("::")[-1]: reg for reg in regs if reg.type == COMPONENT}
    assert sorted(faces) == sorted(FACE_NAMES)
    for face, driver in FACE_NAMES.items():
        assert _alias_names(faces[face]) == {(COMPONENT, driver)}
    checked = 0
    for reg in regs:
        if reg.type.startswith(("pulumi:", "pulumi-python:")) or reg.type == COMPONENT:
            continue
        name = reg.urn.split("::")[-1]
        (face,) = [f for f in FACE_NAMES if any(n == f"{f}:{name}" for _, n in _alias_names(reg))]
        expected = {(reg.type, f"{face}:{name}")}
        if reg.type == NAMESPACE_TYPE:
            expected.add((reg.type, name))  # the program's, at stack level
        assert _alias_names(reg) == expected, (reg.urn, reg.aliases)
        checked += 1
    assert checked >= 2 * 15  # the Kubernetes objects and sub-components of two deployments
