"""Invalid stack-config values derived from the config model's JSON schema, for hypothesis.

Why from the schema: the config model (``pmem_components.config``) grows fields; a test that
lists fields by hand silently stops covering the new ones. Here the valid base config, the
places a value can be put ("slots") and the wrong-typed values for each slot all come from
``StackConfig.model_json_schema()``. Only what the schema cannot say (DNS names, label
syntax, quantities, absolute paths, unique names) is listed by hand, in ``SEMANTIC``.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from unittest import mock

import pulumi
from certutil import good_set
from hypothesis import strategies as st
from pulumi_mocks import RecordingMocks

from pmem_components import config as config_module
from pmem_components.config import ConfigError, StackConfig, key_path, load_config

SCHEMA: dict[str, Any] = StackConfig.model_json_schema(by_alias=True, mode="validation")
DEFS: dict[str, Any] = SCHEMA.get("$defs", {})

# Strings pydantic's lax mode reads as booleans (documented conversion table): not invalid.
BOOL_WORDS = {"0", "off", "f", "false", "n", "no", "1", "on", "t", "true", "y", "yes"}
# Documented aliases of enum values (``deviceMode: ndctl`` means direct).
ENUM_ALIASES = {"ndctl"}

Path = tuple[str | int, ...]


def resolve(schema: dict[str, Any]) -> dict[str, Any]:
    """Follow ``$ref`` and drop the ``null`` branch of optional fields."""
    if "$ref" in schema:
        return resolve(DEFS[schema["$ref"].rsplit("/", 1)[-1]])
    branches = [b for b in schema.get("anyOf", []) if b.get("type") != "null"]
    if len(branches) == 1:
        return resolve(branches[0])
    return schema


def _types(schema: dict[str, Any]) -> set[str]:
    s = resolve(schema)
    if "anyOf" in s:
        return {t for b in s["anyOf"] for t in _types(b)}
    return {s.get("type", "any")}


# --------------------------------------------------------------------------- the valid base

_CERTS = good_set()
CERTIFICATES = {
    "caCert": _CERTS.ca_cert,
    "registryCert": _CERTS.registry_cert,
    "registryKey": _CERTS.registry_key,
    "nodeControllerCert": _CERTS.node_controller_cert,
    "nodeControllerKey": _CERTS.node_controller_key,
}
PRIVATE_KEYS = (_CERTS.registry_key, _CERTS.node_controller_key)

# Values the schema has no valid example for (null defaults, empty maps); everything else in
# the base comes from the schema's defaults.
OVERRIDES: dict[str, Any] = {
    "name": "first.example.com",
    "namespace": "first",
    "pmemPercentage": 50,
    "labels": {"example.com/team": "storage"},
    "nodeSelector": {"storage": "pmem", "example.com/zone": "a"},
    "controllerResources": {"limits": {"cpu": "200m", "memory": 1024}, "requests": {"cpu": 1}},
    "nodeResources": {"limits": {"cpu": "100m"}, "requests": {"memory": "64Mi"}},
    "certificates": CERTIFICATES,
    "patches": [
        {
            "kind": "DaemonSet",
            "name": "first-example-com-node",
            "namespace": "first",
            "mergePatch": {"metadata": {"annotations": {"example.com/a": "1"}}},
        },
        {
            "kind": "StatefulSet",
            "name": "first-example-com-controller",
            "namespace": "first",
            # One key: adding "/metadata/annotations" whole would replace the annotations the
            # program sets (the spec digest: refused, review of issue 16).
            "jsonPatch": [
                {"op": "add", "path": "/metadata/annotations/example.com~1b", "value": "2"}
            ],
        },
    ],
}


def example(schema: dict[str, Any]) -> Any:
    """A valid value for ``schema``: its default, or the smallest value of its type."""
    if schema.get("default") is not None:
        return copy.deepcopy(schema["default"])
    s = resolve(schema)
    if "properties" in s:
        return {
            key: example(sub)
            for key, sub in s["properties"].items()
            # Optional settings (default null) stay unset unless OVERRIDES gives a value.
            if "default" not in sub or sub["default"] is not None
        }
    kind = s.get("type")
    if "enum" in s:
        return s["enum"][0]
    if kind == "object" or kind == "array":
        return {} if kind == "object" else []
    if kind == "string":
        return "x" * max(1, s.get("minLength", 1))
    if kind == "integer":
        return s.get("minimum", 0)
    if kind == "boolean":
        return False
    raise AssertionError(f"no example for schema {s}")


def deployment_base() -> dict[str, Any]:
    dep = example(DEFS["DeploymentConfig"])
    dep.update(copy.deepcopy(OVERRIDES))
    return dep


def stack_base() -> dict[str, Any]:
    """Every stack setting; two deployments (the second with defaults but its name), so
    indices are checked too."""
    second = example(DEFS["DeploymentConfig"])
    second.update({"name": "second.example.com", "namespace": "second"})
    stack = example(SCHEMA)
    stack["deployments"] = [deployment_base(), second]
    return stack


# --------------------------------------------------------------------------- slots


@dataclass(frozen=True)
class Slot:
    """A place in the raw config; ``schema`` says what is valid there (None: nothing is)."""

    path: Path
    schema: dict[str, Any] | None

    @property
    def key(self) -> str:
        return key_path(self.path)

    def __str__(self) -> str:  # pytest ids
        return self.key.removeprefix("pmem-csi:") or "<root>"


UNKNOWN_KEY = "notASetting"


def slots(schema: dict[str, Any], value: Any, path: Path = ()) -> Iterator[Slot]:
    """Every place in ``value`` (shaped by ``schema``) where an invalid value can go."""
    s = resolve(schema)
    if path:
        yield Slot(path, schema)
    if "properties" in s and isinstance(value, dict):
        if s.get("additionalProperties") is False:
            yield Slot((*path, UNKNOWN_KEY), None)
        for key, sub in s["properties"].items():
            if key in value:
                yield from slots(sub, value[key], (*path, key))
    elif isinstance(s.get("additionalProperties"), dict) and isinstance(value, dict):
        for key in value:
            yield from slots(s["additionalProperties"], value[key], (*path, key))
    elif isinstance(s.get("items"), dict) and isinstance(value, list):
        for i, item in enumerate(value):
            yield from slots(s["items"], item, (*path, i))


def put(raw: dict[str, Any], path: Path, value: Any) -> dict[str, Any]:
    """A deep copy of ``raw`` with ``value`` at ``path``."""
    out = copy.deepcopy(raw)
    here: Any = out
    for part in path[:-1]:
        here = here[part]
    here[path[-1]] = value
    return out


def _accepted(raw: dict[str, Any]) -> bool:
    """Does the program's validation (certificates aside) accept ``raw``?"""
    from pmem_components.components import check_patches

    try:
        stack = load_config(raw, check_certificates=False)
    except ConfigError:
        return False
    return not any(check_patches(d, i) for i, d in enumerate(stack.deployments))


def with_optional_settings(raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` plus an example value for every optional (default null) setting it lacks,
    wherever that keeps it valid: such settings then get slots too, new ones included.
    (Some cannot be added: a patch entry takes mergePatch or jsonPatch, not both.)"""

    def walk(schema: dict[str, Any], path: Path) -> None:
        nonlocal raw
        s = resolve(schema)
        if "properties" in s and isinstance(_get(raw, path), dict):
            for key, sub in s["properties"].items():
                if key not in _get(raw, path) and "default" in sub and sub["default"] is None:
                    candidate = put(raw, (*path, key), example(sub))
                    if _accepted(candidate):
                        raw = candidate
            for key, sub in s["properties"].items():
                if key in _get(raw, path):
                    walk(sub, (*path, key))
        elif isinstance(s.get("items"), dict) and isinstance(_get(raw, path), list):
            for i in range(len(_get(raw, path))):
                walk(s["items"], (*path, i))

    walk(SCHEMA, ())
    return raw


def _get(raw: Any, path: Path) -> Any:
    for part in path:
        raw = raw[part]
    return raw


BASE = with_optional_settings(stack_base())
SLOTS: list[Slot] = list(slots(SCHEMA, BASE))


# --------------------------------------------------------------------------- invalid values

_words = st.text(alphabet="abcdefghijklmnopqrstuvwxyzXYZ-_ ", min_size=1, max_size=12)
_lists = st.lists(st.integers(), min_size=0, max_size=2)
_maps = st.dictionaries(st.sampled_from(["a", "b"]), st.integers(), max_size=2)
_fractions = st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: f != int(f))


def wrong_values(schema: dict[str, Any] | None) -> st.SearchStrategy[Any]:
    """Values that are not of the schema's type (nor coercible to it), or out of its range."""
    if schema is None:  # an unknown key: any value is wrong
        return st.one_of(st.integers(), _words, st.booleans())
    s = resolve(schema)
    types = _types(schema)
    if "enum" in s:
        return _words.filter(lambda w: w not in s["enum"] and w not in ENUM_ALIASES)
    options: list[st.SearchStrategy[Any]] = []
    if "boolean" not in types:
        options.append(st.booleans())
    if not types & {"object", "any"}:
        options.append(_maps)
    if "array" not in types:
        options.append(_lists)
    if "string" not in types:
        options.append(_words.filter(lambda w: w.strip().lower() not in BOOL_WORDS))
    if not types & {"integer", "string", "boolean"}:
        options.append(st.integers())
    if "integer" in types and "string" not in types:
        options.append(_fractions)
        if "minimum" in s:
            options.append(st.integers(max_value=s["minimum"] - 1))
        if "maximum" in s:
            options.append(st.integers(min_value=s["maximum"] + 1))
    if "boolean" in types:
        options.append(st.integers().filter(lambda i: i not in (0, 1)))
    if types == {"string"}:
        options.append(st.integers())
        if s.get("minLength", 0) > 0:
            options.append(st.just(""))
    return st.one_of(options)


def canonical_wrong_value(schema: dict[str, Any] | None) -> Any:
    """One wrong value per slot, for the exhaustive (non-random) pass."""
    if schema is None:
        return 1
    s = resolve(schema)
    if "enum" in s:
        return "no-such-value"
    return [["not", "this"]] if "array" not in _types(schema) else {"not": "a list"}


# Rules beyond the schema's types, per field of a deployment: (valid-typed) wrong values.
_DNS_BAD = ["UPPER.example.com", "under_score", "-leading", "trailing-", "a..b", "x" * 254]
SEMANTIC: dict[str, st.SearchStrategy[Any]] = {
    "name": st.sampled_from(_DNS_BAD),
    "namespace": st.sampled_from(["dotted.name", "UPPER", "x" * 64, "-x", "under_score"]),
    "kubeletDir": st.sampled_from(["var/lib/kubelet", "relative", "./kubelet"]),
    "labels": st.sampled_from(
        [
            {"bad key!": "x"},
            {"example.com/": "x"},
            {"UPPER_domain.COM/x": "x"},
            {"ok": "bad value!"},
            {"ok": "x" * 64},
            {"app": "mine"},
            {"app.kubernetes.io/name": "mine"},
        ]
    ),
    "nodeSelector": st.sampled_from([{"bad key!": "x"}, {"ok": "-bad-"}, {"k" * 64: "x"}]),
    "controllerResources": st.sampled_from(
        [{"limits": {"cpu": "lots"}}, {"requests": {"memory": "1 Gi"}}, {"limits": {"cpu": True}}]
    ),
    "nodeResources": st.sampled_from([{"limits": {"memory": "12XB"}}, {"requests": {"cpu": "-"}}]),
}


# --------------------------------------------------------------------------- running the program


@contextlib.contextmanager
def stack_config(raw: dict[str, Any]) -> Iterator[None]:
    """The program reads ``raw`` as its Pulumi config: every top-level key as JSON text."""
    from pmem_components import program

    config = {f"pmem-csi:{k}": json.dumps(v) for k, v in raw.items()}
    config["kubernetes:enableSecretMutable"] = "true"  # Pulumi.yaml's, as every stack has it
    known = getattr(config_module, "STACK_KEYS", ("deployments", "manageCrd"))
    others = sorted(k for k in raw if k not in known)
    with (
        mock.patch.object(program.runtime_config, "get_config", config.get),
        mock.patch.object(program, "_unknown_keys", lambda: others),
        contextlib.ExitStack() as stack,
    ):
        if hasattr(program, "preflight"):  # reads the cluster; mocks have none
            from pmem_components.preflight import Plan

            stack.enter_context(mock.patch.object(program, "preflight", lambda _s: Plan()))
        yield


def problems(raw: dict[str, Any]) -> list[str]:
    """The problems the program's validation (config, certificates, patch dry run) reports."""
    from pmem_components import program

    with stack_config(raw):
        try:
            program.read_config()
        except ConfigError as err:
            return err.problems
    raise AssertionError(f"accepted: {json.dumps(raw)[:300]}")


def run_program(raw: dict[str, Any]) -> tuple[str, list[Any]]:
    """Run ``program.main`` under recording Pulumi mocks with ``raw`` as the stack config.

    Returns the error the program raised and the resources it registered.
    """
    from pmem_components import program

    mocks = RecordingMocks({})
    pulumi.runtime.set_mocks(mocks, project="pmem-csi-pulumi", stack="bad-input", preview=True)
    error: list[str] = []

    @pulumi.runtime.test  # waits for every registration the program started
    def body() -> None:
        try:
            program.main()
        except pulumi.RunError as err:
            error.append(str(err))

    with stack_config(raw):
        body()
    return (error[0] if error else ""), mocks.resources


@contextlib.contextmanager
def certificates_verified_once() -> Iterator[None]:
    """The same certificates recur in many examples; verify each set (TLS handshake
    included) once instead of once per example that breaks something else."""
    from pmem_components import certs

    real = certs.validate_driver_certificates
    with mock.patch.object(certs, "validate_driver_certificates", functools.cache(real)):
        yield


def assert_one_error_naming(raw: dict[str, Any], key: str) -> str:
    """Exactly one problem, naming ``key``; the program fails with it, registering nothing."""
    found = problems(raw)
    assert len(found) == 1, found
    (line,) = found
    assert line.startswith(key) and line[len(key)] in ":.[", (key, line)
    message, registered = run_program(raw)
    assert line in message, message
    assert registered == [], [r.name for r in registered]
    for private_key in PRIVATE_KEYS:
        body = private_key.splitlines()[2]
        assert body not in message
    return line
