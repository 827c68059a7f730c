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

import json
from typing import Any

import pulumi
from pulumi.runtime import config as runtime_config

from pmem_components.config import CONFIG_NAMESPACE, ConfigError, StackConfig, load_config


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
    known = {"deployments", "manageCrd"}
    keys = set(runtime_config.CONFIG.get()) | set(runtime_config.get_config_env())
    ours = (k.removeprefix(prefix) for k in keys if k.startswith(prefix))
    return sorted(k for k in ours if k not in known)


def read_config() -> StackConfig:
    """Load and validate the stack config (raises :class:`ConfigError`)."""
    raw: dict[str, Any] = {key: _raw_value(key) for key in _unknown_keys()}
    raw["deployments"] = _raw_value("deployments")
    raw["manageCrd"] = _raw_value("manageCrd")
    stack = load_config(raw, warn=pulumi.log.warn)
    # Import here: components pull in pulumi_kubernetes, not needed for a config error.
    from pmem_components.components import check_patches

    problems = [p for i, d in enumerate(stack.deployments) for p in check_patches(d, i)]
    if problems:
        raise ConfigError(problems)
    return stack


def deploy(stack: StackConfig) -> dict[str, Any]:
    """Register the CRD (if managed here) and every deployment; returns the stack outputs."""
    from pmem_components.components import PmemCsiDeployment, install_crd

    crd = install_crd() if stack.manage_crd else None
    namespaces: dict[str, pulumi.Resource | None] = {}
    outputs: dict[str, Any] = {}
    for i, dep in enumerate(stack.deployments):
        # Deployments sharing a namespace: the first one creates it, the others depend on it.
        component = PmemCsiDeployment(
            dep, crd=crd, namespace=namespaces.get(dep.namespace), index=i, validate=False
        )
        if namespaces.get(dep.namespace) is None:
            namespaces[dep.namespace] = component.namespace_resource
        outputs[dep.name] = {
            "namespace": component.namespace,
            "objectNames": component.object_names,
            "caCert": component.ca_cert,
        }
    return outputs


def main() -> None:
    """Entry point of ``__main__.py`` and of Automation API inline programs."""
    try:
        stack = read_config()
    except ConfigError as e:
        # Raising fails the update; the message already names each config key.
        raise pulumi.RunError(str(e)) from None
    outputs = deploy(stack)
    pulumi.export("crd", "deployments.pmem-csi.intel.com" if stack.manage_crd else None)
    pulumi.export("deployments", outputs)
