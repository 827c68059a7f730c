"""Patches (:mod:`pmem_components.patches`): cases that mutation testing found open in
test_patches.py.
"""

from __future__ import annotations

import copy

import pytest
from test_patches import WHERE, patchset

from pmem_components.patches import PatchError, PatchSet, changed_paths


def test_the_late_check_names_every_entry_that_selected_nothing_in_one_line() -> None:
    ps = patchset(
        {"kind": "DaemonSet", "mergePatch": {"spec": {"x": 1}}},
        {"kind": "StatefulSet", "mergePatch": {"spec": {"y": 1}}},
    )
    with pytest.raises(PatchError) as err:
        ps.check_all_matched()
    assert str(err.value) == (f"patch entries selected no object: {WHERE}[0], {WHERE}[1]")


def _apply_error(ops: list[dict], obj: dict) -> str:
    ps = patchset({"kind": "Secret", "jsonPatch": ops})
    with pytest.raises(PatchError) as err:
        ps.entries[0].apply(obj)
    return str(err.value)


SECRET = {
    "apiVersion": "v1",
    "kind": "Secret",
    "metadata": {"name": "s"},
    "data": {"tls.key": "S3CRET", "ca.crt": "x"},
}


def test_a_failing_json_patch_names_the_object_but_never_its_content() -> None:
    failed_test = _apply_error([{"op": "test", "path": "/data/tls.key", "value": "x"}], SECRET)
    assert failed_test == (
        f"{WHERE}[0]: cannot apply jsonPatch to Secret 's': a 'test' operation did not match"
    )
    # jsonpointer appends the document it searched ("... not found in {...}"): cut.
    missing = _apply_error([{"op": "remove", "path": "/data/nope/x"}], SECRET)
    assert missing == f"{WHERE}[0]: cannot apply jsonPatch to Secret 's': member 'nope' not found"
    nameless = {k: v for k, v in SECRET.items() if k != "metadata"}
    assert _apply_error([{"op": "remove", "path": "/data/nope/x"}], nameless) == (
        f"{WHERE}[0]: cannot apply jsonPatch to Secret: member 'nope' not found"
    )


def test_library_errors_lose_every_document_excerpt_and_stay_short() -> None:
    from jsonpatch import JsonPointerException

    from pmem_components.patches import _describe

    assert _describe(JsonPointerException("member 'a' not found in ['S3CRET'] in {'b': 1}")) == (
        "member 'a' not found"
    )
    assert _describe(JsonPointerException("member 'a' not found in {'k': 1} in {'S3CRET': 2}")) == (
        "member 'a' not found"
    )
    assert _describe(JsonPointerException("x" * 300)) == "x" * 200


def test_changed_paths_names_each_changed_leaf_once_and_lists_whole() -> None:
    """``changed_paths``: dotted paths in first-seen order (``before``'s keys, then keys only
    ``after`` has), a key added or removed as one path, a list compared whole."""
    before = {
        "spec": {"podManagementPolicy": "OrderedReady", "replicas": 1, "keep": {"a": 1}},
        "roleRef": {"name": "old"},
        "gone": True,
        "list": [1, 2],
    }
    after = {
        "spec": {"podManagementPolicy": "Parallel", "replicas": 1, "keep": {"a": 1}},
        "roleRef": {"name": "new"},
        "list": [1, 3],
        "added": {"x": None, "y": 2},
    }
    assert changed_paths(before, after) == [
        "spec.podManagementPolicy",
        "roleRef.name",
        "gone",
        "list",
        "added",
    ]
    assert changed_paths(before, before) == []
    assert changed_paths({"a": 1}, {"a": 2}, "metadata") == ["metadata.a"]
    assert changed_paths(1, 2, "x") == ["x"]


# --- fixed fields: what a patch may not change --------------------------------------------------

DIGEST = "pmem-csi.intel.com/deployment-spec-digest"


def _workload(kind: str = "DaemonSet") -> dict:
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": {"name": "w", "namespace": "pmem-csi", "annotations": {DIGEST: "d1"}},
        "spec": {
            "selector": {"matchLabels": {"app": "w"}},
            "template": {"metadata": {"labels": {"app": "w", "extra": "1"}}},
        },
    }


def _patched(before: dict, patch: dict) -> dict:
    from pmem_components.patches import merge_patch

    return merge_patch(before, patch)


@pytest.mark.parametrize(
    ("kind", "patch", "problems"),
    [
        ("DaemonSet", {"spec": {"template": {"spec": {"x": 1}}}}, []),
        (
            "DaemonSet",
            {"metadata": {"name": "other", "namespace": "kube-system"}},
            [
                "metadata.name cannot be patched ('w' -> 'other')",
                "metadata.namespace cannot be patched ('pmem-csi' -> 'kube-system')",
            ],
        ),
        (
            "ConfigMap",
            {"apiVersion": "v2", "kind": "Other"},
            [
                "apiVersion cannot be patched ('apps/v1' -> 'v2')",
                "kind cannot be patched ('ConfigMap' -> 'Other')",
            ],
        ),
        (
            "StatefulSet",
            {"metadata": {"annotations": {DIGEST: "d2"}}},
            [
                f"metadata.annotations[{DIGEST}] cannot be patched ('d1' -> 'd2'): the status "
                "reporter reads it to tell which spec the workload has rolled out"
            ],
        ),
        # Only the kinds the program stamps carry the digest.
        ("Deployment", {"metadata": {"annotations": {DIGEST: "d2"}}}, []),
        (
            "DaemonSet",
            {"spec": {"selector": {"matchLabels": {"app": "x"}}}},
            ["spec.selector cannot be patched on a DaemonSet (immutable)"],
        ),
        (
            "ReplicaSet",
            {"spec": {"template": {"metadata": {"labels": {"app": "y"}}}}},
            ["spec.template.metadata.labels must keep matching spec.selector"],
        ),
        (
            "Deployment",
            {"spec": {"template": {"metadata": {"labels": None}}}},
            ["spec.template.metadata.labels must keep matching spec.selector"],
        ),
        ("Deployment", {"spec": {"template": {"metadata": {"labels": {"extra": None}}}}}, []),
        # Not a workload: its spec.selector is nobody's business here (a Service's is mutable).
        ("Service", {"spec": {"selector": {"matchLabels": {"app": "x"}}}}, []),
    ],
)
def test_a_patch_may_not_change_identity_digest_or_selector_of_a_workload(
    kind: str, patch: dict, problems: list[str]
) -> None:
    """Identity and selector are immutable in the API, the digest drives the reporter: the
    dry run says which one a patch broke, with old and new value, and lets the rest pass."""
    from pmem_components.patches import fixed_field_changes

    before = _workload(kind)
    assert fixed_field_changes(before, _patched(before, patch)) == problems


def test_selector_checks_tolerate_odd_shapes() -> None:
    """A selector without matchLabels (matchExpressions only) or labels that are not a mapping
    are judged by what can be compared, never crash the dry run."""
    from pmem_components.patches import fixed_field_changes

    before = _workload()
    before["spec"]["selector"] = {"matchExpressions": []}
    after = _patched(before, {"spec": {"template": {"metadata": {"labels": None}}}})
    assert fixed_field_changes(before, after) == []
    before = _workload()
    after = copy.deepcopy(before)
    after["spec"]["template"]["metadata"]["labels"] = ["app"]
    assert fixed_field_changes(before, after) == [
        "spec.template.metadata.labels must keep matching spec.selector"
    ]
    before["spec"]["selector"] = "app=w"
    assert fixed_field_changes(before, copy.deepcopy(before)) == []


# --- apiVersion of a resource being registered -------------------------------------------------


@pytest.mark.parametrize(
    ("type_", "props", "expected"),
    [
        ("kubernetes:apps/v1:DaemonSet", {}, "apps/v1"),
        ("kubernetes:core/v1:Secret", {}, "v1"),
        ("kubernetes:core/v1/beta:Secret", {}, "v1/beta"),
        ("kubernetes:storage.k8s.io/v1:CSIDriver", {"apiVersion": ""}, "storage.k8s.io/v1"),
        ("kubernetes:apps/v1:DaemonSet", {"apiVersion": 1}, "apps/v1"),
        ("kubernetes:apps/v1:DaemonSet", {"apiVersion": "apps/v2"}, "apps/v2"),
        ("pulumi:providers:kubernetes", {}, None),
        ("kubernetes:v1:Secret", {}, None),
        ("kubernetes:apps/v1", {}, None),
        ("kubernetes:apps/v1:DaemonSet:x", {}, None),
        ("other:apps/v1:DaemonSet", {}, None),
        (
            "pmem-csi:index:Deployment",
            {"apiVersion": "pmem-csi.intel.com/v1beta1"},
            "pmem-csi.intel.com/v1beta1",
        ),
    ],
)
def test_api_version_comes_from_props_then_the_type_token(
    type_: str, props: dict, expected: str | None
) -> None:
    """An entry's apiVersion selector compares against this: the props' own value, else the
    Kubernetes type token (core/v1 is plain v1), else none."""
    from pmem_components.patches import api_version_of

    assert api_version_of(type_, props) == expected


# --- malformed entries: the exact line an administrator reads -----------------------------------


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"mergePatch": {}}, "[0].kind: must be a non-empty string"),
        ({"kind": "", "mergePatch": {}}, "[0].kind: must be a non-empty string"),
        ({"kind": 3, "mergePatch": {}}, "[0].kind: must be a non-empty string"),
        (
            {"kind": "X", "apiVersion": "", "mergePatch": {}},
            "[0].apiVersion: must be a non-empty string like apps/v1",
        ),
        (
            {"kind": "X", "apiVersion": 1, "mergePatch": {}},
            "[0].apiVersion: must be a non-empty string like apps/v1",
        ),
        ({"kind": "X"}, "[0]: set exactly one of mergePatch and jsonPatch"),
        (
            {"kind": "X", "mergePatch": {}, "jsonPatch": []},
            "[0]: set exactly one of mergePatch and jsonPatch",
        ),
        ({"kind": "X", "mergePatch": "a: 1"}, "[0].mergePatch: must be an object"),
        ({"kind": "X", "jsonPatch": "add /a"}, "[0].jsonPatch: must be a list of operations"),
        ({"kind": "X", "jsonPatch": b"add"}, "[0].jsonPatch: must be a list of operations"),
        ({"kind": "X", "jsonPatch": {"op": "add"}}, "[0].jsonPatch: must be a list of operations"),
        ({"kind": "X", "jsonPatch": [1]}, "[0].jsonPatch: each operation must be an object"),
        (
            {"kind": "X", "jsonPatch": [{"op": "frobnicate", "path": "/a"}]},
            "[0].jsonPatch: Unknown operation 'frobnicate'",
        ),
    ],
)
def test_each_malformed_entry_gets_one_exact_line(entry: dict, message: str) -> None:
    """The preview fails with the config path of the entry and what is wrong, one line each."""
    with pytest.raises(PatchError) as err:
        patchset(entry)
    assert str(err.value) == f"invalid patches:\n  {WHERE}{message}"


def test_all_malformed_entries_are_reported_together() -> None:
    """One preview names every broken entry, not just the first."""
    with pytest.raises(PatchError) as err:
        patchset({"kind": "X", "mergePatch": {}}, {"kind": ""}, {"kind": "Y"})
    assert str(err.value) == (
        "invalid patches:\n"
        f"  {WHERE}[1].kind: must be a non-empty string\n"
        f"  {WHERE}[2]: set exactly one of mergePatch and jsonPatch"
    )


def test_an_entry_keeps_its_selectors_and_a_private_copy_of_its_patch() -> None:
    """camelCase and snake_case keys both work (a null key falls through to the other
    spelling); the entry keeps name, namespace and apiVersion, and later edits of the config
    object do not change what is applied."""
    merge = {"spec": {"a": {"b": 1}}}
    ops = [{"op": "add", "path": "/spec/x", "value": {"y": 1}}]
    ps = patchset(
        {
            "kind": "X",
            "name": "n",
            "namespace": "ns",
            "api_version": None,
            "apiVersion": "apps/v1",
            "merge_patch": None,
            "mergePatch": merge,
        },
        {"kind": "Y", "api_version": "v1", "json_patch": ops},
    )
    merge["spec"]["a"]["b"] = 2
    ops[0]["value"]["y"] = 2
    first, second = ps.entries
    assert (first.label, first.kind, first.name, first.namespace, first.api_version) == (
        f"{WHERE}[0]",
        "X",
        "n",
        "ns",
        "apps/v1",
    )
    assert first.merge_patch == {"spec": {"a": {"b": 1}}} and first.json_patch is None
    assert (second.name, second.namespace, second.api_version, second.merge_patch) == (
        None,
        None,
        "v1",
        None,
    )
    assert second.json_patch == [{"op": "add", "path": "/spec/x", "value": {"y": 1}}]
    # Applying twice gives the same result: the entry's own operations are never consumed.
    out = second.apply({"spec": {}})
    out["spec"]["x"]["y"] = 3
    assert second.apply({"spec": {}}) == {"spec": {"x": {"y": 1}}}


def test_a_config_model_is_read_by_attribute() -> None:
    """pmem_components.config.Patch models carry snake_case attributes."""

    class Model:
        kind = "Secret"
        api_version = "v1"
        name = "s"
        namespace = None
        merge_patch = None
        json_patch = [{"op": "remove", "path": "/data/x"}]  # noqa: RUF012

    entry = PatchSet.from_config([Model()], WHERE).entries[0]
    assert (entry.kind, entry.api_version, entry.name, entry.namespace) == (
        "Secret",
        "v1",
        "s",
        None,
    )
    assert entry.apply({"data": {"x": "1", "y": "2"}}) == {"data": {"y": "2"}}


# --- applying one entry ---------------------------------------------------------------------------


def test_a_patch_that_leaves_no_object_or_hits_a_leaf_is_refused_by_name() -> None:
    """A JSON patch replacing the whole document by a list, or walking into a string, is a
    PatchError naming entry and object (never a bare library exception); the input stays."""
    ds = {"kind": "DaemonSet", "metadata": {"name": "d"}, "spec": {"s": "x"}}
    keep = copy.deepcopy(ds)
    whole = patchset(
        {"kind": "DaemonSet", "jsonPatch": [{"op": "replace", "path": "", "value": [1]}]}
    )
    with pytest.raises(PatchError) as err:
        whole.entries[0].apply(ds)
    assert str(err.value) == f"{WHERE}[0]: patch replaced DaemonSet 'd' by a non-object"
    merged = patchset({"kind": "DaemonSet", "mergePatch": {"spec": {"s": None}}})
    assert merged.entries[0].apply(ds) == {
        "kind": "DaemonSet",
        "metadata": {"name": "d"},
        "spec": {},
    }
    assert ds == keep


# --- the dry run's lines --------------------------------------------------------------------------


def test_dry_run_names_every_selector_of_an_entry_that_selects_nothing() -> None:
    """The line repeats the entry's selectors (only those set) so the typo is visible."""
    ps = patchset(
        {
            "kind": "DaemonSet",
            "apiVersion": "apps/v2",
            "name": "n",
            "namespace": "ns",
            "mergePatch": {},
        },
        {"kind": "Job", "mergePatch": {}},
        {"kind": "Job", "mergePatch": {}},
    )
    with pytest.raises(PatchError) as err:
        ps.dry_run([{"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "n"}}])
    assert str(err.value) == (
        "patches cannot be applied:\n"
        f"  {WHERE}[0]: selects no object (kind='DaemonSet', apiVersion='apps/v2', name='n', "
        "namespace='ns')\n"
        f"  {WHERE}[1]: selects no object (kind='Job')\n"
        f"  {WHERE}[2]: selects no object (kind='Job')"
    )


def test_dry_run_reports_a_broken_patch_once_and_an_ambiguous_kind_with_its_versions() -> None:
    """An entry failing on several objects is one line; a kind seen under two apiVersions
    names both, sorted; an entry with apiVersion set is never called ambiguous."""
    objs = [
        {"apiVersion": "v2", "kind": "Job", "metadata": {"name": "a"}},
        {"apiVersion": "v1", "kind": "Job", "metadata": {"name": "a"}},
    ]
    ps = patchset(
        {"kind": "Job", "jsonPatch": [{"op": "remove", "path": "/spec"}]},
        {"kind": "Job", "apiVersion": "v1", "mergePatch": {}},
    )
    with pytest.raises(PatchError) as err:
        ps.dry_run(objs)
    assert str(err.value) == (
        "patches cannot be applied:\n"
        f"  {WHERE}[0]: kind 'Job' selects objects of several apiVersions (v1, v2); "
        "add apiVersion to choose\n"
        f"  {WHERE}[0]: cannot apply jsonPatch to Job 'a': "
        "can't remove a non-existent object 'spec'"
    )
    patchset({"kind": "Job", "apiVersion": "v1", "mergePatch": {}}).dry_run(objs)


# --- the transform's bookkeeping ------------------------------------------------------------------


def test_the_transform_counts_each_object_an_entry_patched() -> None:
    """unmatched() relies on these counts; an object no entry selects is passed through."""
    ps = patchset(
        {"kind": "Job", "mergePatch": {"spec": {"a": 1}}},
        {"kind": "Pod", "mergePatch": {}},
        {"kind": "Job", "apiVersion": "batch/v2", "mergePatch": {}},
    )
    job = {"kind": "Job", "metadata": {"name": "j"}}
    assert ps.apply("kubernetes:batch/v1:Job", job) == {**job, "spec": {"a": 1}}
    assert ps.apply("kubernetes:batch/v1:Job", job) == {**job, "spec": {"a": 1}}
    assert ps.apply("kubernetes:batch/v1:CronJob", {"kind": "Job"}) is None
    assert ps.apply("custom:thing", {"metadata": {}}) is None
    assert ps.matches == {0: 2}
    assert ps.unmatched() == [f"{WHERE}[1]", f"{WHERE}[2]"]


def test_a_label_prefix_loses_only_a_trailing_dot() -> None:
    """``where`` given as ``...patches.`` still labels entries ``...patches[j]``."""
    assert PatchSet.from_config([{"kind": "X", "mergePatch": {}}], "a.patches.").entries[
        0
    ].label == ("a.patches[0]")
    assert PatchSet.from_config([{"kind": "X", "mergePatch": {}}], ".p ").entries[0].label == (
        ".p [0]"
    )


def test_only_an_entry_with_apiversion_skips_the_ambiguity_check() -> None:
    """An entry naming its apiVersion does not hide a later, ambiguous entry."""
    objs = [{"apiVersion": "v2", "kind": "Job"}, {"apiVersion": "v1", "kind": "Job"}]
    ps = patchset(
        {"kind": "Job", "apiVersion": "v1", "mergePatch": {}},
        {"kind": "Job", "mergePatch": {}},
    )
    with pytest.raises(PatchError, match=r"\[1\]: kind 'Job' selects objects of several"):
        ps.dry_run(objs)


def test_every_entry_that_breaks_a_fixed_field_is_named() -> None:
    """Two entries renaming one object: both lines, not only the last."""
    ps = patchset(
        {"kind": "ConfigMap", "mergePatch": {"metadata": {"name": "b"}}},
        {"kind": "ConfigMap", "mergePatch": {"metadata": {"name": "c"}}},
    )
    with pytest.raises(PatchError) as err:
        ps.dry_run([{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}}])
    assert str(err.value) == (
        "patches cannot be applied:\n"
        f"  {WHERE}[0]: metadata.name cannot be patched ('a' -> 'b')\n"
        f"  {WHERE}[1]: metadata.name cannot be patched ('b' -> 'c')"
    )


def test_selectors_read_secret_metadata_and_missing_metadata() -> None:
    """Metadata wrapped as a secret by the SDK is still matched by name; an object without
    metadata matches no named entry."""
    from pulumi.runtime.rpc import wrap_rpc_secret

    ps = patchset({"kind": "Job", "name": "n", "mergePatch": {"spec": {"a": 1}}})
    props = {"kind": "Job", "metadata": wrap_rpc_secret({"name": "n"})}
    assert ps.apply("kubernetes:batch/v1:Job", props) == {**props, "spec": {"a": 1}}
    assert ps.entries[0].selects("Job", props)  # called directly, without the transform
    assert not ps.entries[0].selects("Job", {"metadata": wrap_rpc_secret({"name": "m"})})
    assert ps.apply("kubernetes:batch/v1:Job", {"kind": "Job"}) is None
    assert ps.apply("kubernetes:batch/v1:Job", {"kind": "Job", "metadata": "n"}) is None


def test_a_kind_that_is_not_a_string_selects_nothing() -> None:
    """Props with a non-string kind (and no Kubernetes type token) are no object of any kind."""
    from pmem_components.patches import kind_of

    assert kind_of("pmem-csi:index:X", {"kind": 1}) is None


def test_merge_patch_shares_no_nested_list_with_the_patch() -> None:
    """The entry's patch is applied to many objects: editing one result must not edit it."""
    from pmem_components.patches import merge_patch

    patch = {"a": [{"b": 1}]}
    result = merge_patch({}, patch)
    result["a"][0]["b"] = 2
    assert patch == {"a": [{"b": 1}]}


def test_the_transform_keeps_the_resource_options() -> None:
    """Patching props must not drop the resource's options (parent, provider, protect...)."""
    import pulumi

    ps = patchset({"kind": "Job", "mergePatch": {"spec": {"a": 1}}})
    opts = pulumi.ResourceOptions(protect=True)
    args = pulumi.ResourceTransformArgs(
        custom=True, type_="kubernetes:batch/v1:Job", name="j", props={"kind": "Job"}, opts=opts
    )
    result = ps.transform(args)
    assert result is not None and result.opts is opts


# --- mutation run of 2 December 2026, 16:00: blame of wrong types, labels, library errors --------


def test_a_where_ending_in_a_letter_keeps_it_only_dots_are_stripped() -> None:
    """``_label_prefix`` strips trailing dots only: a list path ending in ``X`` is no dot."""
    entry = PatchSet.from_config([{"kind": "X", "mergePatch": {}}], "cfg.fixupX.").entries[0]
    assert entry.label == "cfg.fixupX[0]"


class _Uncopyable:
    """A leaf ``copy.deepcopy`` refuses with a TypeError, as jsonpatch's ``copy`` needs one."""

    def __deepcopy__(self, memo: dict[int, object]) -> object:
        raise TypeError("cannot copy this leaf")


def test_a_library_failure_outside_its_own_errors_names_entry_object_and_error_type() -> None:
    """jsonpatch's ``copy`` deep-copies the value it copies and lets a TypeError through: the
    administrator still gets a PatchError naming entry, object and the error, not a traceback."""
    ps = patchset({"kind": "Job", "jsonPatch": [{"op": "copy", "from": "/spec/x", "path": "/y"}]})
    job = {"kind": "Job", "metadata": {"name": "j"}, "spec": {"x": _Uncopyable()}}
    with pytest.raises(PatchError) as err:
        ps.entries[0].apply(job)
    assert str(err.value) == (
        f"{WHERE}[0]: cannot apply patch to Job 'j': TypeError: cannot copy this leaf"
    )


def _secret(name: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": "ns"},
        "stringData": {"k": "v"},
    }


def test_one_wrong_type_hitting_two_objects_names_both_comma_separated() -> None:
    """One mistake, one line: the objects it hits are listed ``A, B`` inside the parentheses
    (and a Secret's value is not shown)."""
    ps = patchset({"kind": "Secret", "mergePatch": {"stringData": {"k": 5}}})
    with pytest.raises(PatchError) as err:
        ps.dry_run([_secret("a"), _secret("b")])
    key = f"{WHERE}[0].mergePatch.stringData.k"
    assert str(err.value) == (
        "patches cannot be applied:\n"
        f"  {key}: must be a string, not a number (Secret ns/a, Secret ns/b, field "
        "stringData.k); quote it in Pulumi.<stack>.yaml, or set it with pulumi config set "
        f"--type string --path '{key}' -- <value>"
    )


ENV = "/spec/template/spec/containers/0/env"


def _daemonset() -> dict:
    """A DaemonSet whose own values all have the right types (as the builders' have)."""
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "d", "namespace": "ns"},
        "spec": {
            "selector": {"matchLabels": {"app": "d"}},
            "template": {
                "metadata": {"labels": {"app": "d"}},
                "spec": {
                    "containers": [
                        {"name": "a", "image": "x", "env": [{"name": "E", "value": "ok"}]}
                    ]
                },
            },
        },
    }


def _type_lines(*entries: dict) -> list[str]:
    """The dry run's problem lines for ``entries`` against one :func:`_daemonset`."""
    with pytest.raises(PatchError) as err:
        patchset(*entries).dry_run([_daemonset()])
    return [line.strip() for line in str(err.value).splitlines()[1:]]


def _number_line(key: str, field: str, n: int = 1) -> str:
    """The line for the number ``n`` where a string belongs, written at ``key``."""
    return (
        f"{key}: must be a string, not the number {n} (DaemonSet ns/d, field {field}); quote "
        f'it ("{n}") in Pulumi.<stack>.yaml, or set it with pulumi config set --type string '
        f"--path '{key}' -- {n}"
    )


C0 = "spec.template.spec.containers[0]"


def test_values_added_at_given_list_indices_are_each_blamed_on_their_own_operation() -> None:
    """Two operations adding the same wrong value at explicit indices: the second is blamed
    for the value at the index it names, not for the one the first added before it."""
    ops = [
        {"op": "add", "path": f"{ENV}/1", "value": {"name": "A", "value": 1}},
        {"op": "add", "path": f"{ENV}/2", "value": {"name": "B", "value": 1}},
    ]
    assert _type_lines({"kind": "DaemonSet", "jsonPatch": ops}) == [
        _number_line(f"{WHERE}[0].jsonPatch[0].value.value", f"{C0}.env[1].value"),
        _number_line(f"{WHERE}[0].jsonPatch[1].value.value", f"{C0}.env[2].value"),
    ]


def test_an_appended_container_is_blamed_for_its_own_value_not_an_older_one_it_covers() -> None:
    """``containers/-`` covers every container's path; the value the append wrote is the one
    that was not there before it (``value.env[1].value``), not the first container's."""
    ops = [
        {"op": "add", "path": ENV, "value": [{"name": "A", "value": 1}]},
        {
            "op": "add",
            "path": "/spec/template/spec/containers/-",
            "value": {
                "name": "b",
                "image": "y",
                "env": [{"name": "X", "value": "ok"}, {"name": "A", "value": 1}],
            },
        },
    ]
    assert _type_lines({"kind": "DaemonSet", "jsonPatch": ops}) == [
        _number_line(f"{WHERE}[0].jsonPatch[0].value[0].value", f"{C0}.env[0].value"),
        _number_line(
            f"{WHERE}[0].jsonPatch[1].value.env[1].value",
            "spec.template.spec.containers[1].env[1].value",
        ),
    ]


def test_of_two_wrong_values_one_operation_wrote_the_one_left_is_blamed() -> None:
    """An operation writes the same wrong value twice, a later patch removes the second: the
    line names the patch key of the one that is left (``value[0]``)."""
    two = [{"name": "A", "value": 1}, {"name": "B", "value": 1}]
    add = {"op": "add", "path": ENV, "value": two}
    assert _type_lines(
        {"kind": "DaemonSet", "jsonPatch": [add]},
        {"kind": "DaemonSet", "jsonPatch": [{"op": "remove", "path": f"{ENV}/1"}]},
    ) == [_number_line(f"{WHERE}[0].jsonPatch[0].value[0].value", f"{C0}.env[0].value")]


def test_a_replaced_wrong_value_is_blamed_on_the_replace_not_an_equal_older_value() -> None:
    """A later patch replaces one wrong value by another that an older one already equals:
    each line names the operation that wrote the value at its field."""
    two = [{"name": "A", "value": 2}, {"name": "B", "value": 1}]
    add = {"op": "add", "path": ENV, "value": two}
    replace = {"op": "replace", "path": f"{ENV}/1/value", "value": 2}
    assert _type_lines(
        {"kind": "DaemonSet", "jsonPatch": [add]},
        {"kind": "DaemonSet", "jsonPatch": [replace]},
    ) == [
        _number_line(f"{WHERE}[0].jsonPatch[0].value[0].value", f"{C0}.env[0].value", 2),
        _number_line(f"{WHERE}[1].jsonPatch[0].value", f"{C0}.env[1].value", 2),
    ]


def test_a_merge_patch_that_changes_the_kind_is_blamed_for_the_values_it_retyped() -> None:
    """As a Service, the DaemonSet's selector must map strings; the merge patch holds no key
    for that value, so the line names the merge patch itself (with the refused kind change)."""
    assert _type_lines({"kind": "DaemonSet", "mergePatch": {"kind": "Service"}}) == [
        f"{WHERE}[0]: kind cannot be patched ('DaemonSet' -> 'Service')",
        f"{WHERE}[0].mergePatch: must be a string, not an object (DaemonSet ns/d, field "
        "spec.selector.matchLabels)",
    ]


def test_a_json_operation_that_changes_the_kind_is_named_for_the_values_it_retyped() -> None:
    """No operation holds the retyped value; the one that changed the kind is the key named."""
    replace = {"op": "replace", "path": "/kind", "value": "Service"}
    lines = _type_lines({"kind": "DaemonSet", "jsonPatch": [replace]})
    assert lines[0] == f"{WHERE}[0]: kind cannot be patched ('DaemonSet' -> 'Service')"
    assert lines[1].startswith(
        f"{WHERE}[0].jsonPatch[0]: must be a string, not an object (DaemonSet ns/d, field "
        "spec.selector.matchLabels)"
    ), lines
    assert len(lines) == 2, lines


def test_a_copied_subtree_names_the_patch_that_wrote_the_value_inside_it() -> None:
    """Copying ``/metadata/labels`` whole: the wrong value inside it is traced to the label
    key the merge patch wrote."""
    copy_all = {"op": "copy", "from": "/metadata/labels", "path": "/metadata/annotations"}
    assert _type_lines(
        {"kind": "DaemonSet", "mergePatch": {"metadata": {"labels": {"a": 1}}}},
        {"kind": "DaemonSet", "jsonPatch": [copy_all]},
    ) == [
        _number_line(f"{WHERE}[0].mergePatch.metadata.labels.a", "metadata.labels.a"),
        f"{WHERE}[1].jsonPatch[0]: must be a string, not the number 1 (DaemonSet ns/d, field "
        f"metadata.annotations.a); copied from /metadata/labels, where "
        f"{WHERE}[0].mergePatch.metadata.labels.a wrote it",
    ]


def test_a_copy_names_the_patch_that_wrote_its_source_not_an_unrelated_step_between() -> None:
    """An operation between the write and the copy changes nothing of the value: the copy's
    line names the merge patch that wrote it."""
    ops = [
        {"op": "add", "path": "/metadata/annotations", "value": {"x": "ok"}},
        {"op": "copy", "from": "/metadata/labels/a", "path": "/metadata/labels/b"},
    ]
    assert _type_lines(
        {"kind": "DaemonSet", "mergePatch": {"metadata": {"labels": {"a": 1}}}},
        {"kind": "DaemonSet", "jsonPatch": ops},
    ) == [
        _number_line(f"{WHERE}[0].mergePatch.metadata.labels.a", "metadata.labels.a"),
        f"{WHERE}[1].jsonPatch[1]: must be a string, not the number 1 (DaemonSet ns/d, field "
        f"metadata.labels.b); copied from /metadata/labels/a, where "
        f"{WHERE}[0].mergePatch.metadata.labels.a wrote it",
    ]


def test_a_copy_of_a_copy_names_the_copy_it_was_taken_from() -> None:
    """A chain of three operations: each copy's line names the step that wrote its source."""
    ops = [
        {"op": "add", "path": "/metadata/labels", "value": {"a": 1}},
        {"op": "copy", "from": "/metadata/labels/a", "path": "/metadata/labels/b"},
        {"op": "copy", "from": "/metadata/labels/b", "path": "/metadata/labels/c"},
    ]
    p = f"{WHERE}[0].jsonPatch"
    assert _type_lines({"kind": "DaemonSet", "jsonPatch": ops}) == [
        _number_line(f"{p}[0].value.a", "metadata.labels.a"),
        f"{p}[1]: must be a string, not the number 1 (DaemonSet ns/d, field metadata.labels.b); "
        f"copied from /metadata/labels/a, where {p}[0].value.a wrote it",
        f"{p}[2]: must be a string, not the number 1 (DaemonSet ns/d, field metadata.labels.c); "
        f"copied from /metadata/labels/b, where {p}[1] wrote it",
    ]


def test_an_operation_inside_a_wrong_value_an_earlier_patch_wrote_says_so() -> None:
    """A label that is an object (a string belongs there) comes from the merge patch; the
    later operation only adds a key inside it, so its line says the value came from earlier."""
    add = {"op": "add", "path": "/metadata/labels/b/c", "value": 2}
    assert _type_lines(
        {"kind": "DaemonSet", "mergePatch": {"metadata": {"labels": {"b": {"c": "x"}}}}},
        {"kind": "DaemonSet", "jsonPatch": [add]},
    ) == [
        f"{WHERE}[1].jsonPatch[0]: must be a string, not an object (DaemonSet ns/d, field "
        "metadata.labels.b); the value came from an earlier patch"
    ]
