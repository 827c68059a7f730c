"""Whose objects are these: the preflight decides by the stack's own state (issue 14, item 4).

Two teams can run ``pmem-csi-pulumi/prod`` on two backends against one cluster, and ``pulumi
stack rm`` + ``pulumi stack init`` makes a new stack with an old name: the annotation alone
cannot tell them apart. Each row is one situation an administrator meets and the decision.
"""

from __future__ import annotations

from typing import Any

import pytest

from pmem_components import identity, names, preflight
from pmem_components.config import ConfigError, load_config
from pmem_components.preflight import Observed, ObservedObject, Previous, plan

ORG = "organization"
ME = identity.identity(ORG, "pmem-csi-pulumi", "prod")
OLD_FORM = "pmem-csi-pulumi/prod"  # what the program wrote before the organization
CR_API = f"{names.CRD_GROUP}/{names.CRD_STORAGE_VERSION}"
DRIVER = names.DEFAULT_DRIVER_NAME


def stack(*deps: dict[str, Any], **top: Any) -> Any:
    return load_config({"deployments": list(deps), **top}, check_certificates=False)


def ns(name: str = "pmem-csi", owner: str | None = ME, uid: str = "ns-uid") -> ObservedObject:
    return ObservedObject(
        "Namespace",
        name,
        labels={names.LABEL_MANAGED_BY: names.MANAGED_BY},
        annotations={names.STACK_ANNOTATION: owner} if owner else {},
        uid=uid,
        api_version="v1",
    )


def cr(
    name: str = DRIVER, owner: str | None = ME, namespace: str = "pmem-csi", uid: str = "cr-uid"
) -> ObservedObject:
    return ObservedObject(
        names.CRD_KIND,
        name,
        labels={names.LABEL_MANAGED_BY: names.MANAGED_BY},
        annotations={names.STACK_ANNOTATION: owner} if owner else {},
        spec={"namespace": namespace, "deviceMode": "lvm"},
        uid=uid,
        api_version=CR_API,
    )


def held(*objs: ObservedObject, uid: str | None = None) -> identity.StackState:
    """The state of a stack that holds ``objs`` (with another uid when ``uid`` is given)."""
    return identity.StackState(
        {
            o.key: identity.Held(uid if uid is not None else o.uid, "pulumi-kubernetes-1")
            for o in objs
        }
    )


EMPTY = identity.StackState()

# (situation, config, observed, state, expected refs in the problem or None, adopted)
CASES = [
    (
        "retained namespace, new stack of the same name (stack rm + init)",
        {},
        Observed(namespaces={"pmem-csi": ns()}),
        EMPTY,
        ["Namespace pmem-csi", ME, "pmem-csi:adopt", "createNamespace: false"],
        [],
    ),
    (
        "a same-named stack elsewhere wrote the old annotation form",
        {},
        Observed(namespaces={"pmem-csi": ns(owner=OLD_FORM)}),
        EMPTY,
        ["Namespace pmem-csi", OLD_FORM, "this stack's identity", "pmem-csi:adopt"],
        [],
    ),
    (
        "upgrade: the old annotation on a namespace the state holds is this stack's",
        {},
        Observed(namespaces={"pmem-csi": ns(owner=OLD_FORM)}),
        held(ns(owner=OLD_FORM)),
        None,
        [],
    ),
    (
        "the state holds a namespace of that name with another uid (made anew since)",
        {},
        Observed(namespaces={"pmem-csi": ns()}),
        held(ns(), uid="older"),
        ["Namespace pmem-csi", "pmem-csi:adopt"],
        [],
    ),
    (
        "retained namespace adopted by name",
        {},
        Observed(namespaces={"pmem-csi": ns()}),
        EMPTY,
        None,
        ["Namespace pmem-csi"],
    ),
    (
        "another stack's namespace, adopt true",
        {},
        Observed(namespaces={"pmem-csi": ns(owner="organization/other/prod")}),
        EMPTY,
        None,
        ["Namespace pmem-csi"],
    ),
    (
        "another stack's namespace: refused, naming it and the way",
        {},
        Observed(namespaces={"pmem-csi": ns(owner="organization/other/prod")}),
        EMPTY,
        ["managed by stack 'organization/other/prod'", "pmem-csi:adopt", "createNamespace"],
        [],
    ),
    (
        "a same-named stack's CR (the second team's first up)",
        {"createNamespace": False},
        Observed(crs={DRIVER: cr()}),
        EMPTY,
        ["pmem-csi:deployments[0].name", f"Deployment {DRIVER}", ME, "pmem-csi:adopt"],
        [],
    ),
    (
        "a same-named stack's CR, adopted",
        {"createNamespace": False},
        Observed(crs={DRIVER: cr()}),
        EMPTY,
        None,
        [f"Deployment {DRIVER}"],
    ),
    (
        "a renamed stack (pulumi stack rename): its state holds the CR",
        {"createNamespace": False},
        Observed(crs={DRIVER: cr(owner="organization/pmem-csi-pulumi/old")}),
        held(cr(owner="organization/pmem-csi-pulumi/old")),
        None,
        [],
    ),
    (
        "the operator's CR is still the operator's (adoptExisting, unchanged)",
        {"createNamespace": False},
        Observed(crs={DRIVER: ObservedObject(names.CRD_KIND, DRIVER, api_version=CR_API)}),
        EMPTY,
        ["adoptExisting: true", "--cascade=orphan"],
        [],
    ),
    (
        "a namespace nobody's stack made (adoptNamespace, unchanged)",
        {},
        Observed(namespaces={"pmem-csi": ObservedObject("Namespace", "pmem-csi")}),
        EMPTY,
        ["adoptNamespace: true"],
        [],
    ),
]


@pytest.mark.parametrize(
    ("situation", "dep", "observed", "state", "expected", "adopted"),
    CASES,
    ids=[c[0] for c in CASES],
)
def test_whose_objects(
    situation: str,
    dep: dict[str, Any],
    observed: Observed,
    state: identity.StackState,
    expected: list[str] | None,
    adopted: list[str],
) -> None:
    top: dict[str, Any] = {}
    if adopted:
        top["adopt"] = True if "adopt true" in situation else adopted
    result = plan(stack(dep, **top), observed, ME, state)
    if expected is None:
        assert result.problems == []
    else:
        (problem,) = result.problems
        for part in expected:
            assert part in problem, (situation, part, problem)
    assert result.adopted == adopted


def test_an_adopted_cr_is_judged_as_this_stacks() -> None:
    """Adopting a CR in another namespace is a reinstall: allowReinstall still decides."""
    observed = Observed(crs={DRIVER: cr(namespace="old")})
    config = stack({"createNamespace": False}, adopt=[f"Deployment {DRIVER}"])
    (problem,) = plan(config, observed, ME, EMPTY).problems
    assert "allowReinstall: true" in problem
    config = stack({"createNamespace": False, "allowReinstall": True}, adopt=True)
    result = plan(config, observed, ME, EMPTY)
    assert result.problems == [] and result.previous == {0: Previous(DRIVER, "old")}


def test_only_namespaces_the_state_holds_are_kept() -> None:
    """A namespace annotated with this identity but not in the state is not the engine's to
    delete, so it needs no keeping (and keeping it would register another stack's)."""
    live = ns("shared")
    config = stack({"namespace": "shared", "createNamespace": False})
    observed = Observed(namespaces={"shared": live})
    assert plan(config, observed, ME, EMPTY).keep_namespaces == set()
    assert plan(config, observed, ME, held(live)).keep_namespaces == {"shared"}
    # Annotated with the name the stack had before `pulumi stack rename`: still kept.
    renamed = ns("shared", owner="organization/pmem-csi-pulumi/old")
    observed = Observed(namespaces={"shared": renamed})
    assert plan(config, observed, ME, held(renamed)).keep_namespaces == {"shared"}
    # Released by the last update (registered once more without the annotation): dropped.
    released = ns("shared", owner=None)
    observed = Observed(namespaces={"shared": released})
    assert plan(config, observed, ME, held(released)).keep_namespaces == set()


def test_without_the_state_the_annotation_decides_in_both_forms() -> None:
    """Library use and old callers: the annotation, in the new and the old form."""
    for owner in (ME, OLD_FORM):
        assert (
            plan(stack({}), Observed(namespaces={"pmem-csi": ns(owner=owner)}), ME).problems == []
        )


def test_state_from_the_engines_answer() -> None:
    answer = {
        "name": ME,
        "outputs": {
            "urn:pulumi:prod::pmem-csi-pulumi::kubernetes:core/v1:Namespace::pmem-csi": {
                "type": "kubernetes:core/v1:Namespace",
                "outputs": {
                    "apiVersion": "v1",
                    "kind": "Namespace",
                    "metadata": {"name": "pmem-csi", "uid": "u1"},
                    "__fieldManager": "pulumi-kubernetes-abc",
                },
            },
            "urn:pulumi:prod::pmem-csi-pulumi::kubernetes:pmem-csi.intel.com/v1beta1:"
            "Deployment::x": {
                "type": "kubernetes:pmem-csi.intel.com/v1beta1:Deployment",
                "outputs": {"apiVersion": CR_API, "kind": "Deployment", "metadata": {"name": "x"}},
            },
            "urn:pulumi:prod::pmem-csi-pulumi::pulumi:providers:kubernetes::default": {
                "type": "pulumi:providers:kubernetes",
                "outputs": {"kind": "x", "metadata": {"name": "y"}},
            },
            "urn:pulumi:prod::pmem-csi-pulumi::pulumi-python:dynamic/pmem-csi:Certificates::c": {
                "type": "pulumi-python:dynamic/pmem-csi:Certificates",
                "outputs": {"ca_cert": "..."},
            },
        },
    }
    state = identity.state_from_outputs(answer)
    assert set(state.objects) == {
        ("", "Namespace", "", "pmem-csi"),
        (names.CRD_GROUP, "Deployment", "", "x"),
    }
    key = ("", "Namespace", "", "pmem-csi")
    assert state.holds(key, "u1") and not state.holds(key, "u2")
    assert state.field_manager(key) == "pulumi-kubernetes-abc"
    # A CR the state recorded without a uid matches by name.
    assert state.holds((names.CRD_GROUP, "Deployment", "", "x"), "any")


def test_identity_forms() -> None:
    assert ME == "organization/pmem-csi-pulumi/prod"
    assert identity.names_this_stack(ME, ME)
    assert identity.names_this_stack(OLD_FORM, ME)
    assert not identity.names_this_stack("other-org/pmem-csi-pulumi/prod", ME)
    assert not identity.names_this_stack("pmem-csi-pulumi/dev", ME)
    assert not identity.names_this_stack(None, ME)


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ("yes", 'pmem-csi:adopt: must be true or a list of objects such as "Namespace pmem-csi"'),
        (["Namespce x"], 'pmem-csi:adopt[0]: must be "<Kind> <name>" with Kind one of'),
        (["Namespace Not_A_Name"], "pmem-csi:adopt[0]: 'Not_A_Name' is not a valid Namespace"),
        ([3], "pmem-csi:adopt[0]: must be"),
    ],
)
def test_adopt_setting_is_validated_by_key(raw: Any, problem: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config({"adopt": raw}, check_certificates=False)
    assert any(p.startswith(problem) for p in err.value.problems), err.value.problems


def test_adopt_setting_values() -> None:
    assert load_config({"adopt": True}).adopts("Namespace any")
    assert load_config({"adopt": "true"}).adopts("Namespace any")
    assert not load_config({}).adopts("Namespace any")
    refs = load_config({"adopt": ["Namespace a", f"Deployment {DRIVER}"]})
    assert refs.adopts(f"Deployment {DRIVER}") and not refs.adopts("Namespace b")


def test_an_object_another_stack_took_over_since_is_not_applied_again_unasked() -> None:
    """Team B adopted team A's namespace and CR (same names, other backend): A's state still
    holds them, but A's field manager is gone from them. A's next update is refused."""
    live_ns = ns()
    live_cr = cr()
    state = identity.StackState(
        {o.key: identity.Held(o.uid, "pulumi-kubernetes-aaaa") for o in (live_ns, live_cr)}
    )

    def taken(obj: ObservedObject, managers: tuple[str, ...]) -> ObservedObject:
        return ObservedObject(**{**obj.__dict__, "pulumi_managers": managers})

    observed = Observed(
        namespaces={"pmem-csi": taken(live_ns, ("pulumi-kubernetes-bbbb",))},
        crs={DRIVER: taken(live_cr, ("pulumi-kubernetes-bbbb",))},
    )
    problems = plan(stack({}), observed, ME, state).problems
    assert len(problems) == 2, problems
    assert all("another stack has taken it over since" in p for p in problems)
    assert any(
        p.startswith("pmem-csi:deployments[0].createNamespace: namespace 'pmem-csi'")
        and "pulumi-kubernetes-bbbb" in p
        and 'pmem-csi:adopt: ["Namespace pmem-csi"]' in p
        for p in problems
    )
    assert any(f'pmem-csi:adopt: ["Deployment {DRIVER}"]' in p for p in problems)
    taking_back = plan(stack({}, adopt=True), observed, ME, state)
    assert taking_back.problems == []
    assert sorted(taking_back.adopted) == [f"Deployment {DRIVER}", "Namespace pmem-csi"]
    # Its own manager still there (next to another's, or alone): this stack's, no question.
    for managers in (
        ("pulumi-kubernetes-aaaa",),
        ("pulumi-kubernetes-aaaa", "pulumi-kubernetes-bbbb"),
        (),
    ):
        observed = Observed(namespaces={"pmem-csi": taken(live_ns, managers)})
        assert plan(stack({}), observed, ME, state).problems == [], managers


def _unheld(live: ObservedObject, adopt: Any = False) -> tuple[str | None, list[str]]:
    out = preflight.Plan()
    refusal = preflight._unheld(stack({}, adopt=adopt), out, live, ME, "key", "ALTERNATIVE")
    return refusal, out.adopted


ADOPT_HINT = (
    ". If no other stack manages it any more (or it is to move to this one), set "
    'pmem-csi:adopt: ["{ref}"] (or true) to take it over (its fields and field managers '
    "become this stack's); otherwise use ALTERNATIVE"
)


@pytest.mark.parametrize(
    ("owner", "whose"),
    [
        (
            ME,
            f"carries this stack's identity {ME!r} ({names.STACK_ANNOTATION}), but this "
            "stack's state does not hold it: an earlier stack of this name kept it (pulumi "
            "stack rm after destroy with retainNamespaces, or without destroy), a stack "
            "of the same name on another backend manages it, or a pulumi up of this stack "
            "that was interrupted (Ctrl-C, killed) created it and did not record it; that "
            "run's recovery takes it over with pmem-csi:adopt as well",
        ),
        (
            "org/other/prod",
            f"is managed by stack 'org/other/prod' ({names.STACK_ANNOTATION}), and this "
            "stack's state does not hold it",
        ),
        (
            None,
            f"was made by {names.MANAGED_BY} ({names.LABEL_MANAGED_BY}) but carries no stack "
            "identity, and this stack's state does not hold it",
        ),
    ],
    ids=["this-stacks-identity", "another-stack", "no-identity"],
)
def test_an_unheld_object_is_refused_naming_it_whose_it_is_and_the_settings(
    owner: str | None, whose: str
) -> None:
    """The whole refusal text, for the namespace and for the Deployment CR."""
    for live, what, ref in (
        (ns(owner=owner), "namespace 'pmem-csi'", "Namespace pmem-csi"),
        (cr(owner=owner), f"the Deployment CR {DRIVER!r}", f"{names.CRD_KIND} {DRIVER}"),
    ):
        assert _unheld(live) == (f"key: {what} {whose}" + ADOPT_HINT.format(ref=ref), [])


def test_an_unheld_object_named_by_adopt_is_adopted_and_others_are_not() -> None:
    assert _unheld(ns(), adopt=["Namespace pmem-csi"]) == (None, ["Namespace pmem-csi"])
    refusal, adopted = _unheld(ns(), adopt=["Namespace other"])
    assert refusal is not None and adopted == []


def test_an_object_another_stack_took_is_refused_by_its_managers_or_adopted_when_named() -> None:
    """``_taken_away``: the refusal names the object and every Pulumi manager it has now; an
    adopt list naming it takes it back; this stack's own manager among them is no take-away."""
    mine, theirs = "pulumi-kubernetes-1", ("pulumi-kubernetes-b", "pulumi-kubernetes-c")
    live = ObservedObject(**{**cr().__dict__, "pulumi_managers": theirs})
    state = held(live)
    ref = f"{names.CRD_KIND} {DRIVER}"
    out = preflight.Plan()
    refusal = preflight._taken_away(stack({}), out, live, state, "key")
    assert refusal == (
        f"key: the Deployment CR {DRIVER!r} is in this stack's state, but another stack has "
        f"taken it over since: its field manager is pulumi-kubernetes-b, pulumi-kubernetes-c, "
        f"not this stack's {mine} (a stack of the same name on another backend, or one that "
        f"adopted it with pmem-csi:adopt). To leave it to that stack, remove it from this "
        f"stack's config (pulumi up then names the pulumi state delete that forgets it without "
        f"deleting anything); if this stack is to manage it again, set "
        f'pmem-csi:adopt: ["{ref}"] (and remove it from the other stack)'
    )
    assert out.adopted == []
    assert preflight._taken_away(stack({}, adopt=[ref]), out, live, state, "key") is None
    assert out.adopted == [ref]
    back = ObservedObject(**{**live.__dict__, "pulumi_managers": (mine, *theirs)})
    assert preflight._taken_away(stack({}), preflight.Plan(), back, state, "key") is None


def taken(obj: ObservedObject, managers: tuple[str, ...]) -> ObservedObject:
    """``obj`` as another stack's adoption left it: only that stack's Pulumi manager."""
    return ObservedObject(**{**obj.__dict__, "pulumi_managers": managers})


NS_URN = "urn:pulumi:prod::pmem-csi-pulumi::kubernetes:core/v1:Namespace::pmem-csi"
CR_URN = (
    "urn:pulumi:prod::pmem-csi-pulumi::pmem-csi:index:PmemCsiDeployment$"
    f"kubernetes:{CR_API}:Deployment::{DRIVER}"
)
COMPONENT_URN = f"urn:pulumi:prod::pmem-csi-pulumi::pmem-csi:index:PmemCsiDeployment::{DRIVER}"
OTHER = {"name": "other.example.org", "namespace": "other"}


def state_with_urns(own: str = "pulumi-kubernetes-aaaa") -> identity.StackState:
    return identity.StackState(
        {
            ns().key: identity.Held("ns-uid", own, NS_URN),
            cr().key: identity.Held("cr-uid", own, CR_URN),
        }
    )


def test_a_dropped_deployment_another_stack_took_over_is_not_deleted() -> None:
    """Review of issue 14 item 4, D1: team B adopted team A's deployment; A's state still
    holds it. A told to drop it would delete B's objects by name (the provider deletes by
    name): refused, naming the state delete that leaves them to B."""
    observed = Observed(
        namespaces={"pmem-csi": taken(ns(), ("pulumi-kubernetes-bbbb",))},
        crs={DRIVER: taken(cr(), ("pulumi-kubernetes-bbbb",))},
    )
    problems = plan(stack(), observed, ME, state_with_urns()).problems
    assert len(problems) == 2, problems
    dep, namespace = problems
    assert dep.startswith(f"pmem-csi:deployments: {DRIVER!r} (in this stack's state) is no")
    assert "pulumi-kubernetes-bbbb" in dep and "pulumi-kubernetes-aaaa" in dep
    assert f"pulumi state delete --target-dependents --yes '{COMPONENT_URN}'" in dep
    assert namespace.startswith("pmem-csi:deployments: namespace 'pmem-csi' (in this stack's")
    assert f"pulumi state delete --yes '{NS_URN}'" in namespace
    # Kept as a namespace a configured deployment uses without creating it: not registered
    # again either (that would write the other stack's namespace).
    uses = stack({**OTHER, "namespace": "pmem-csi", "createNamespace": False})
    result = plan(uses, observed, ME, state_with_urns())
    assert [p for p in result.problems if "namespace 'pmem-csi'" in p], result.problems
    assert result.keep_namespaces == set()


def test_the_component_urn_of_a_cr() -> None:
    assert preflight._component_urn(CR_URN) == COMPONENT_URN
    library = CR_URN.replace(f"::{DRIVER}", f"::east:{DRIVER}")
    assert preflight._component_urn(library) == COMPONENT_URN.replace(f"::{DRIVER}", "::east")
    assert preflight._component_urn(NS_URN) is None


def test_a_dropped_deployment_still_this_stacks_is_removed_as_before() -> None:
    for managers in (("pulumi-kubernetes-aaaa",), ()):
        observed = Observed(
            namespaces={"pmem-csi": taken(ns(), managers)}, crs={DRIVER: taken(cr(), managers)}
        )
        assert plan(stack(), observed, ME, state_with_urns()).problems == [], managers


def test_adopting_without_taking_over_fields_is_refused_naming_both_settings() -> None:
    """D4: with takeOverFields: false the adoption's hooks are not registered, so the earlier
    stack's field manager would stay next to this stack's: two stacks managing one object."""
    observed = Observed(namespaces={"pmem-csi": ns()}, crs={DRIVER: cr()})
    result = plan(stack({}, adopt=True, takeOverFields=False), observed, ME, EMPTY)
    (problem,) = result.problems
    assert problem.startswith("pmem-csi:adopt: ")
    assert "Namespace pmem-csi" in problem and f"Deployment {DRIVER}" in problem
    assert "pmem-csi:takeOverFields: false" in problem
    # Nothing to adopt: takeOverFields: false is fine with the consent left set.
    assert plan(stack({}, adopt=True, takeOverFields=False), Observed(), ME, EMPTY).problems == []


def test_the_refusal_of_an_unrecorded_object_names_a_cut_short_create() -> None:
    """D6: an interrupted `pulumi up` can create a namespace or CR and not record it; the next
    run's refusal says that this is one of the cases and that pmem-csi:adopt recovers it."""
    (problem,) = plan(stack({}), Observed(namespaces={"pmem-csi": ns()}), ME, EMPTY).problems
    assert "a pulumi up of this stack that was interrupted" in problem, problem
    assert 'pmem-csi:adopt: ["Namespace pmem-csi"]' in problem


LEGACY_REFUSAL = (
    "a stack name may only contain alphanumeric, hyphens, underscores, or periods: "
    "invalid character '/' at position 12"
)


def test_the_state_is_read_on_a_legacy_layout_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    """D5: a DIY backend in the legacy layout (meta.yaml version 0, no project in the path)
    parses a stack reference as a bare stack name and refuses ``org/project/stack``; the
    state is then read by the bare name, as the backend names its stacks."""
    import pulumi

    asked: list[str] = []
    answer = {"outputs": {NS_URN: {"type": "kubernetes:core/v1:Namespace", "outputs": {
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "pmem-csi"}}}}}  # fmt: skip

    def invoke(token: str, args: dict[str, Any]) -> Any:
        assert token == identity.READ_STATE_TOKEN
        asked.append(args["stackName"])
        if "/" in args["stackName"]:
            # Word for word what CLI 3.260 gave on such a backend (tried by hand).
            raise Exception(
                f"invoke of {token} failed: invocation of {token} returned an error: "
                + LEGACY_REFUSAL
            )
        return answer

    monkeypatch.setattr(pulumi.runtime, "invoke", invoke)
    state = identity.read_state(ME)
    assert asked == [ME, "prod"]
    assert state.namespaces() == ["pmem-csi"]


def test_another_failure_is_not_retried_by_the_bare_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """On Pulumi Cloud a bare name means the user's default organization, maybe another
    stack's: only the legacy layout's refusal leads to it."""
    import pulumi

    asked: list[str] = []

    def invoke(token: str, args: dict[str, Any]) -> Any:
        asked.append(args["stackName"])
        raise Exception("unknown stack")

    monkeypatch.setattr(pulumi.runtime, "invoke", invoke)
    monkeypatch.setattr(identity, "READ_STATE_TRIES", 2)
    monkeypatch.setattr("time.sleep", lambda _s: None)
    with pytest.raises(identity.StateError):
        identity.read_state(ME)
    assert asked == [ME, ME]
