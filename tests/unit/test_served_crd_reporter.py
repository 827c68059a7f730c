"""The CRD and the status reporter served to other languages (issue 19).

``pmem-csi:index:PmemCsiCrd`` installs the CRD as the Python program's ``manageCrd`` does
(``components.install_crd``, ``retain`` as ``retainCrd``); ``pmem-csi:index:PmemCsiReporter``
deploys one reporter for several deployments, named by plain values (the SDK's schema
inference has no references to this package's own resources), with the very objects the
Python program registers for the same deployments (``program.reporter_objects``). Bad args
fail naming the field as the other language writes it. ``tests/e2e/test_yaml_crd_reporter.py``
runs both from YAML with the real CLI.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pulumi
import pytest
import yaml
from pulumi.provider.experimental.component import ComponentProvider
from pulumi_mocks import project_config
from test_components import Mocks, run

from pmem_components import components, fieldowners, names, program, provider_face, registry
from pmem_components.config import load_config
from pmem_components.manifests.crd import load_crd

IMAGE = "registry.example/pmem-csi-reporter:1"
PROJECT_DIR = Path(__file__).resolve().parents[2]
CRD_TYPE = "kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition"


@pytest.fixture
def mocks() -> Iterator[Mocks]:
    m = Mocks()
    pulumi.runtime.set_mocks(m, project="pmem-csi-pulumi", stack="unit", preview=False)
    with project_config():
        yield m


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    provider = ComponentProvider(
        provider_face.SERVED_COMPONENTS, provider_face.PACKAGE_NAME, None, "0.0.0"
    )
    return json.loads(provider.schema or "{}")


def _reporter_args(**extra: Any) -> dict[str, Any]:
    return {
        "deployments": [
            {"name": "a.example.org", "namespace": "one"},
            {"name": "b.example.org", "namespace": "two"},
        ],
        "image": IMAGE,
        **extra,
    }


def _reporter_problems(args: dict[str, Any]) -> list[str]:
    with pytest.raises(provider_face.ArgsError) as caught:
        provider_face.reporter_settings("rep", args)
    problems = caught.value.problems
    assert str(caught.value).startswith(
        f"invalid args of PmemCsiReporter 'rep' ({len(problems)} problem(s)):"
    )
    return problems


# ------------------------------------------------------------------------------- the schema


def test_the_crd_and_the_reporter_are_served_beside_the_deployment(
    schema: dict[str, Any],
) -> None:
    assert sorted(schema["resources"]) == [
        "pmem-csi:index:PmemCsiCrd",
        components.COMPONENT_TYPE,
        "pmem-csi:index:PmemCsiReporter",
    ]
    assert all(r["isComponent"] for r in schema["resources"].values())


def test_the_crds_input_is_retain_and_its_output_the_crd_name(schema: dict[str, Any]) -> None:
    crd = schema["resources"]["pmem-csi:index:PmemCsiCrd"]
    assert set(crd["inputProperties"]) == {"retain"}
    assert crd["inputProperties"]["retain"]["type"] == "boolean"
    assert not crd.get("requiredInputs")
    assert set(crd["properties"]) == {"crdName"}


def test_the_reporter_takes_deployments_by_name_and_namespace(schema: dict[str, Any]) -> None:
    rep = schema["resources"]["pmem-csi:index:PmemCsiReporter"]
    assert set(rep["inputProperties"]) == {
        "deployments",
        "image",
        "replicas",
        "logLevel",
        "imagePullPolicy",
        "namespace",
        "labels",
        "await",
        "allowedFieldOwners",
    }
    assert sorted(rep["requiredInputs"]) == ["deployments", "image"]
    ref = rep["inputProperties"]["deployments"]["items"]["$ref"]
    served = schema["types"][ref.removeprefix("#/types/")]
    assert set(served["properties"]) == {"name", "namespace"}
    assert sorted(served["required"]) == ["name", "namespace"]
    assert rep["inputProperties"]["await"]["$ref"] == "#/types/pmem-csi:index:AwaitArgs"
    assert set(rep["properties"]) == {"namespace", "deploymentName"}


# ---------------------------------------------------------- PmemCsiDeployment's own reporter


def test_a_deployments_reporter_image_is_refused_pointing_to_the_reporter_component() -> None:
    with pytest.raises(provider_face.ArgsError) as caught:
        provider_face.deployment_config("driver", {"reporter": {"image": IMAGE}})
    (problem,) = caught.value.problems
    assert problem.startswith("reporter.image: ")
    assert "pmem-csi:index:PmemCsiReporter" in problem
    assert "name this one (name and namespace) in its deployments" in problem


# ----------------------------------------------------------------------- reporter validation


def test_valid_reporter_args_become_a_stack_whose_deployments_enable_the_reporter() -> None:
    served = provider_face.reporter_settings(
        "rep", _reporter_args(replicas=3, log_level=4, image_pull_policy="Always")
    )
    assert served.namespace == "one"
    assert [(d.name, d.namespace) for d in served.stack.deployments] == [
        ("a.example.org", "one"),
        ("b.example.org", "two"),
    ]
    for dep in served.stack.deployments:
        assert dep.reporter.enabled and dep.reporter.image == IMAGE
        assert (dep.reporter.replicas, dep.reporter.log_level) == (3, 4)
    assert served.stack.deployments[0].image_pull_policy == "Always"
    assert program.reporter_problems(served.stack) == []


def test_no_deployments_and_no_image_are_refused_saying_what_to_write() -> None:
    problems = _reporter_problems({"deployments": []})
    assert problems[0].startswith("deployments: is required: list each PmemCsiDeployment")
    assert problems[1].startswith("image: is required: there is no public reporter image")
    assert "make image" in problems[1]


def test_a_deployment_without_name_or_namespace_is_refused_by_field() -> None:
    problems = _reporter_problems(
        {"deployments": [{"name": "a.example.org"}, {"namespace": "two"}], "image": IMAGE}
    )
    assert [p.split(":")[0] for p in problems] == [
        "deployments[0].namespace",
        "deployments[1].name",
    ]
    assert "the namespace argument of the PmemCsiDeployment it serves" in problems[0]


def test_a_deployment_the_reporter_cannot_serve_is_refused_naming_its_field() -> None:
    problems = _reporter_problems(
        {
            "deployments": [
                {"name": "a.example.org", "namespace": "one"},
                {"name": "Bad_Name", "namespace": "two"},
                {"name": "c.example.org", "namespace": "kube-system"},
                {"name": "a-example.org", "namespace": "one"},
            ],
            "image": IMAGE,
        }
    )
    assert problems[0].startswith("deployments[1].name: must be a DNS subdomain")
    assert problems[1].startswith('deployments[2].namespace: "kube-system" belongs to Kubernetes')
    assert problems[2].startswith(
        'deployments[3].name: "a-example.org" clashes with deployments[0].name'
    )
    assert len(problems) == 3
    assert not any("pmem-csi:" in p for p in problems)


def test_the_reporters_own_settings_are_refused_once_by_their_field() -> None:
    problems = _reporter_problems(
        _reporter_args(
            image=" registry.example/r:1",
            replicas=11,
            image_pull_policy="Sometimes",
            namespace="Not A Namespace",
            labels={"app.kubernetes.io/name": "x"},
            **{"await": {"enabled": False, "timeout": "5m"}},
        )
    )
    fields = [p.split(":")[0] for p in problems]
    # Once each, though every served deployment's entry carries the reporter settings.
    assert sorted(fields) == sorted(
        ["image", "replicas", "imagePullPolicy", 'labels["app.kubernetes.io/name"]',
         "await.timeout", "namespace"]
    ), problems  # fmt: skip
    assert not any("deployments[" in p or "Pulumi.<stack>.yaml" in p for p in problems)


def test_an_unknown_key_of_a_served_deployment_is_refused() -> None:
    problems = _reporter_problems(
        {"deployments": [{"name": "a.example.org", "namespace": "one", "x": 1}], "image": IMAGE}
    )
    assert problems == ["deployments[0].x: is not a known setting (name and namespace only)"]


def test_another_resources_output_is_refused_by_field() -> None:
    args = _reporter_args(namespace=pulumi.Output.from_input("one"))
    (problem,) = _reporter_problems(args)
    assert problem.startswith("namespace: must be a plain value known when the program runs")


def test_a_crd_retain_that_is_no_boolean_is_refused() -> None:
    assert provider_face.crd_retain("crd", {}) is True
    assert provider_face.crd_retain("crd", {"retain": False}) is False
    with pytest.raises(provider_face.ArgsError) as caught:
        provider_face.crd_retain("crd", {"retain": "no"})
    assert caught.value.problems == ["retain: must be true or false (got 'no')"]
    assert str(caught.value).startswith("invalid args of PmemCsiCrd 'crd' (1 problem(s))")


# ----------------------------------------------------- the objects: the program's, the same


def _reporter_objects(mocks: Mocks) -> list[tuple[str, str, Any]]:
    """The reporter objects registered (the program's and the served reporter's are named
    alike since issue 19, children named after the objects: the test runs them apart)."""
    out = [
        (r.typ, r.name, r.inputs)
        for r in mocks.resources
        if ((r.inputs.get("metadata") or {}).get("labels") or {}).get(names.LABEL_COMPONENT)
        == "reporter"
    ]
    return sorted(out, key=lambda t: (t[0], t[1]))


def test_the_reporter_registers_the_objects_the_program_registers(mocks: Mocks) -> None:
    """The program's reporter for deployments a (labels) and b, the first with pull policy
    Always, beside the served reporter naming the same deployments: object for object."""
    raw = [
        {
            "name": "a.example.org",
            "namespace": "one",
            "labels": {"team": "storage"},
            "imagePullPolicy": "Always",
            "reporter": {"image": IMAGE, "replicas": 3, "logLevel": 4},
        },
        {
            "name": "b.example.org",
            "namespace": "two",
            "reporter": {"image": IMAGE, "replicas": 3, "logLevel": 4},
        },
    ]

    def body() -> None:
        stack = load_config({"deployments": raw, "manageCrd": False, "takeOverFields": False})
        program.deploy(stack)

    def served_body() -> None:
        provider_face.PmemCsiReporter(
            "rep",
            _reporter_args(
                replicas=3, log_level=4, image_pull_policy="Always", labels={"team": "storage"}
            ),
        )

    run(body)
    expected = _reporter_objects(mocks)
    mocks.resources.clear()
    run(served_body)
    served = _reporter_objects(mocks)
    assert [(t, n) for t, n, _ in expected] == [(t, n) for t, n, _ in served]
    assert len(expected) == 1 + 2 + 2 * 3 + 1  # SA, ClusterRole(+B), 3 Roles(+B), Deployment
    for (_, name, want), (_, _, got) in zip(expected, served, strict=True):
        assert got == want, name


def test_the_reporters_namespace_moves_its_objects_and_lease_there() -> None:
    served = provider_face.reporter_settings("rep", _reporter_args(namespace="reporting"))
    objects = program.reporter_objects(served.stack, served.namespace)
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    assert deployment["metadata"]["namespace"] == "reporting"
    roles = {o["metadata"]["namespace"] for o in objects if o["kind"] == "Role"}
    assert roles == {"one", "two", "reporting", "default"}


def test_the_reporters_deployment_depends_on_its_grants() -> None:
    """The program's order (review of issue 16): the Deployment after every grant."""
    calls: list[tuple[str, int]] = []

    def record(obj: dict[str, Any], deps: list[Any]) -> str:
        calls.append((obj["kind"], len(deps)))
        return obj["kind"]

    served = provider_face.reporter_settings("rep", _reporter_args())
    objects = program.reporter_objects(served.stack)
    program.register_reporter_objects(objects, record, [])
    assert calls[-1] == ("Deployment", len(objects) - 1)
    assert all(n == 0 for _kind, n in calls[:-1])


@pytest.mark.parametrize(("args", "retained"), [({}, True), ({"retain": False}, False)])
def test_the_crd_component_installs_the_programs_crd(
    mocks: Mocks, monkeypatch: pytest.MonkeyPatch, args: dict[str, Any], retained: bool
) -> None:
    seen: list[bool | None] = []
    real = registry.register

    def spy(obj: dict[str, Any], opts: pulumi.ResourceOptions, **kw: Any) -> Any:
        if obj["kind"] == "CustomResourceDefinition":
            seen.append(opts.retain_on_delete)
        return real(obj, opts, **kw)

    monkeypatch.setattr(registry, "register", spy)

    def body() -> None:
        provider_face.PmemCsiCrd("crd", args)  # type: ignore[arg-type]

    run(body)
    (crd,) = mocks.of_type(CRD_TYPE)
    want = load_crd()
    want["metadata"]["annotations"] = {
        **(want["metadata"].get("annotations") or {}),
        components.PATCH_FORCE_ANNOTATION: "true",
    }
    assert crd.inputs == json.loads(json.dumps(want))
    assert seen == [retained]


# ------------------------------------------------------------------------------- the docs


def _documented_program() -> dict[str, Any]:
    text = (PROJECT_DIR / "docs" / "yaml-and-other-languages.md").read_text()
    section = text.split("## The CRD and the status reporter", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```yaml\n(.*?)```", section, re.S)
    return yaml.safe_load(block)


def test_the_documented_yaml_program_is_valid_and_its_reporter_names_its_deployments() -> None:
    """The docs' example: each resource's properties pass the component's own checks, and
    the reporter names exactly the program's deployments, by name and namespace."""
    resources = _documented_program()["resources"]
    types = {key: r["type"] for key, r in resources.items()}
    assert sorted(types.values()) == sorted(
        [
            "pmem-csi:index:PmemCsiCrd",
            components.COMPONENT_TYPE,
            components.COMPONENT_TYPE,
            "pmem-csi:index:PmemCsiReporter",
        ]
    )
    drivers = [r for r in resources.values() if r["type"] == components.COMPONENT_TYPE]
    for driver in drivers:
        assert driver["options"]["dependsOn"] == ["${crd}"]
        provider_face.deployment_config("driver", _python_names(driver["properties"]))
    (reporter,) = [r for r in resources.values() if r["type"].endswith("PmemCsiReporter")]
    served = provider_face.reporter_settings("reporter", _python_names(reporter["properties"]))
    assert [(d.name, d.namespace) for d in served.stack.deployments] == [
        (d["properties"]["name"], d["properties"]["namespace"]) for d in drivers
    ]
    provider_face.crd_retain("crd", resources["crd"]["properties"])


def _python_names(props: dict[str, Any]) -> dict[str, Any]:
    """Top-level camelCase args as the SDK hands them to the component (snake_case)."""
    return {re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), k): v for k, v in props.items()}


ALLOWED = [{"manager": "team-labeller", "paths": ["metadata.labels.team"], "reason": "ours"}]


def _env(objects: list[dict[str, Any]]) -> dict[str, str]:
    (dep,) = [o for o in objects if o["kind"] == "Deployment"]
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def test_the_reporter_judges_drift_by_the_allowed_field_owners_as_the_programs_does() -> None:
    """Review of rename19: the program's reporter gets the stack's allowedFieldOwners in its
    environment (the take-over and the reporter judge by one list); the served one had no such
    argument, so a label another manager may own was reported as ObjectsModified."""
    served = provider_face.reporter_settings(
        "rep", _reporter_args(allowed_field_owners=[dict(a) for a in ALLOWED])
    )
    objects = program.reporter_objects(served.stack, served.namespace)
    stack = load_config(
        {
            "deployments": [
                {**d, "reporter": {"image": IMAGE}}
                for d in _reporter_args()["deployments"]
            ],
            "allowedFieldOwners": ALLOWED,
        },
        check_certificates=False,
    )
    expected = program.reporter_objects(stack, "one")
    assert _env(objects) == _env(expected)
    assert "team-labeller" in _env(objects)[fieldowners.ALLOWED_ENV]


def test_a_bad_allowed_field_owner_of_the_reporter_is_refused_by_its_field() -> None:
    problems = _reporter_problems(_reporter_args(allowed_field_owners=[{"manager": "m"}]))
    assert problems and all(p.startswith("allowedFieldOwners[0]") for p in problems), problems
