"""Reading ``managedFields``: which managers changed an object behind Pulumi's back, and where."""

from __future__ import annotations

from pmem_components.fieldowners import (
    ForeignOwner,
    describe,
    field_paths,
    foreign_owners,
    is_foreign,
)

ARGS_EDIT = {
    "f:spec": {
        "f:template": {
            "f:spec": {
                "f:containers": {
                    'k:{"name":"pmem-driver"}': {".": {}, "f:args": {}},
                }
            }
        }
    }
}


def entry(manager: str, fields: dict, operation: str = "Update", **extra: str) -> dict:
    return {"manager": manager, "operation": operation, "fieldsV1": fields, **extra}


def test_paths_name_fields_list_entries_by_key_set_entries_and_indices() -> None:
    fields = {
        **ARGS_EDIT,
        "f:metadata": {"f:labels": {"f:team": {}}, "f:finalizers": {'v:"keep"': {}}},
        "f:rules": {"i:0": {"f:verbs": {}}},
        "f:ports": {'k:{"port":10000,"protocol":"TCP"}': {".": {}, "f:port": {}}},
    }
    assert field_paths(fields) == [
        "metadata.finalizers[=keep]",
        "metadata.labels.team",
        "ports[port=10000,protocol=TCP].port",
        "rules[0].verbs",
        "spec.template.spec.containers[name=pmem-driver].args",
    ]


def test_a_node_owned_as_a_whole_is_its_own_path() -> None:
    assert field_paths({"f:data": {".": {}}}) == ["data"]
    assert field_paths({}) == []


def test_pulumi_control_plane_and_status_writers_are_not_foreign() -> None:
    assert not is_foreign(entry("pulumi-kubernetes-3c4d9a1f", ARGS_EDIT, "Apply"))
    assert not is_foreign(entry("pulumi-kubernetes", ARGS_EDIT))
    assert not is_foreign(entry("kube-controller-manager", ARGS_EDIT))
    assert not is_foreign(entry("kubectl-edit", {"f:status": {}}, subresource="status"))
    assert is_foreign(entry("kubectl-edit", ARGS_EDIT))
    assert is_foreign(entry("pmem-csi-operator", ARGS_EDIT))


def test_foreign_owners_keeps_order_and_drops_managers_owning_nothing() -> None:
    managed = [
        entry("pulumi-kubernetes-1", {"f:metadata": {"f:labels": {"f:app": {}}}}, "Apply"),
        entry("kubectl-patch", {"f:metadata": {"f:labels": {"f:team": {}}}}),
        entry("kubectl-edit", {}),
        entry("kubectl-edit", ARGS_EDIT),
        "not an entry",
    ]
    assert foreign_owners(managed) == [
        ForeignOwner("kubectl-patch", "Update", ("metadata.labels.team",)),
        ForeignOwner(
            "kubectl-edit", "Update", ("spec.template.spec.containers[name=pmem-driver].args",)
        ),
    ]
    assert foreign_owners(None) == []


def test_describe_caps_the_paths_per_manager() -> None:
    owner = ForeignOwner("e2e.test", "Update", ("a", "b", "c", "d", "e"))
    assert describe([owner]) == "e2e.test (a, b, c and 2 more)"
    assert describe([owner], max_paths=5) == "e2e.test (a, b, c, d, e)"


# --------------------------------------------------------------------------------------------
# the ownership policy: what others may own without it being drift (issue 14, 3)

RESTARTED_AT = {
    "f:spec": {
        "f:template": {
            "f:metadata": {
                "f:annotations": {".": {}, "f:kubectl.kubernetes.io/restartedAt": {}}
            }
        }
    }
}


def test_kubectl_rollout_restart_is_not_drift() -> None:
    rollout = entry("kubectl-rollout", RESTARTED_AT)
    assert not is_foreign(rollout, ())
    assert foreign_owners([rollout], ()) == []


def test_the_rollout_stamp_is_allowed_but_nothing_else_of_that_manager() -> None:
    fields = {"f:spec": {**RESTARTED_AT["f:spec"], "f:replicas": {}}}
    rollout = entry("kubectl-rollout", fields)
    assert is_foreign(rollout, ())
    assert foreign_owners([rollout], ()) == [
        ForeignOwner("kubectl-rollout", "Update", ("spec.replicas",))
    ]


def test_the_stamp_by_another_manager_is_drift() -> None:
    assert is_foreign(entry("kubectl-edit", RESTARTED_AT), ())


def test_an_administrator_extends_the_policy() -> None:
    from pmem_components.fieldowners import parse_allowed

    raw = [{"manager": "team-labeller", "paths": ["metadata.labels.team"], "reason": "ours"}]
    allowed, problems = parse_allowed(raw, "pmem-csi:allowedFieldOwners")
    assert problems == []
    labeller = entry("team-labeller", {"f:metadata": {"f:labels": {"f:team": {}, "f:x": {}}}})
    assert foreign_owners([labeller], allowed) == [
        ForeignOwner("team-labeller", "Update", ("metadata.labels.x",))
    ]
    only_team = entry("team-labeller", {"f:metadata": {"f:labels": {"f:team": {}}}})
    assert foreign_owners([only_team], allowed) == []
    assert foreign_owners([only_team], ()) != []


def test_the_reporter_reads_the_administrators_entries_from_its_environment(
    monkeypatch: object,
) -> None:
    import json

    from pmem_components.fieldowners import ALLOWED_ENV

    only_team = entry("team-labeller", {"f:metadata": {"f:labels": {"f:team": {}}}})
    monkeypatch.delenv(ALLOWED_ENV, raising=False)  # type: ignore[attr-defined]
    assert is_foreign(only_team)
    raw = [{"manager": "team-labeller", "paths": ["metadata.labels.team"], "reason": "r"}]
    monkeypatch.setenv(ALLOWED_ENV, json.dumps(raw))  # type: ignore[attr-defined]
    assert not is_foreign(only_team)
    assert not is_foreign(entry("kubectl-rollout", RESTARTED_AT))


def test_bad_policy_entries_name_the_key() -> None:
    from pmem_components.fieldowners import parse_allowed

    key = "pmem-csi:allowedFieldOwners"
    assert parse_allowed("x", key)[1] == [f"{key}: must be a list of {{manager, paths, reason}}"]
    _, problems = parse_allowed(
        [{"manager": "pulumi-kubernetes-1", "paths": [], "reason": "", "extra": 1}], key
    )
    assert problems == [
        f"{key}[0]: unknown key(s) extra",
        f"{key}[0].manager: 'pulumi-kubernetes-1' is Pulumi's own manager",
        f"{key}[0].paths: must be a non-empty list of field paths",
        f"{key}[0].reason: say why this manager may own these fields",
    ]


def test_every_built_in_entry_says_why() -> None:
    from pmem_components.fieldowners import BUILT_IN_ALLOWED

    assert BUILT_IN_ALLOWED and all(a.reason and a.paths for a in BUILT_IN_ALLOWED)


def test_the_stack_setting_reaches_the_program_and_the_reporter() -> None:
    import json

    from pmem_components.config import ConfigError, load_config
    from pmem_components.fieldowners import ALLOWED_ENV, Allowance
    from pmem_components.manifests import bundle
    from pmem_components.manifests.reporter import with_allowed_field_owners

    raw = [{"manager": "team-labeller", "paths": ["metadata.labels.team"], "reason": "ours"}]
    stack = load_config(
        {"allowedFieldOwners": raw, "deployments": [{"reporter": {"image": "r:1"}}]}
    )
    assert stack.allowed_field_owners == (
        Allowance("team-labeller", ("metadata.labels.team",), "ours"),
    )
    deployment = next(
        o for o in bundle.reporter_objects(stack.deployments[0]) if o["kind"] == "Deployment"
    )
    container = with_allowed_field_owners(deployment, stack.allowed_field_owners)["spec"][
        "template"
    ]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert json.loads(env[ALLOWED_ENV]) == raw
    assert with_allowed_field_owners(deployment, ()) is deployment
    try:
        load_config({"allowedFieldOwners": [{"manager": "x"}]})
    except ConfigError as err:
        assert err.problems[0].startswith("pmem-csi:allowedFieldOwners[0].paths: ")
    else:
        raise AssertionError("a bad entry must be a config error")
