"""The real node's pure parts: cluster settings, address ranges, placement patch, guard rules."""

from __future__ import annotations

import ipaddress
import json

from pmem_components.config import DeploymentConfig
from pmem_components.manifests.bundle import build_deployment_objects
from pmem_components.patches import PatchEntry, PatchSet
from tools import cluster, realnode

KWOK_FAKE_POD_CIDR = "10.0.0.0/24"  # kwok's default, which tools.cluster leaves alone


def test_kwok_manages_only_annotated_nodes_and_the_api_server_names_the_service_ip() -> None:
    config = json.loads(cluster.kwokctl_config())
    assert config["options"]["kubeApiserverCertSANs"] == [realnode.KUBERNETES_SERVICE_IP]
    patches = {p["name"]: {a["key"]: a["value"] for a in p["extraArgs"]}
               for p in config["componentsPatches"]}  # fmt: skip
    assert patches["kwok-controller"] == {
        "manage-all-nodes": "false",
        "manage-nodes-with-annotation-selector": "kwok.x-k8s.io/node=fake",
    }
    assert patches["kube-apiserver"] == {
        "service-cluster-ip-range": realnode.SERVICE_CIDR,
        # Never a lookup of the node's name (a DNS query off the machine) for logs or exec.
        "kubelet-preferred-address-types": "InternalIP",
    }
    # The controllers ride out an API server busy for less than 45 s (they exit after that).
    for name in ("kube-controller-manager", "kube-scheduler"):
        assert patches[name] == {
            "leader-elect-lease-duration": "60s",
            "leader-elect-renew-deadline": "45s",
            "leader-elect-retry-period": "2s",
        }
    # Every fake node carries the annotation kwok selects by; the real node does not.
    fake = cluster.node_manifest("n", {})
    assert fake["metadata"]["annotations"] == {"kwok.x-k8s.io/node": "fake"}


def test_address_ranges_do_not_overlap_and_the_node_owns_its_pods() -> None:
    services = ipaddress.ip_network(realnode.SERVICE_CIDR)
    node = ipaddress.ip_network(realnode.NODE_CIDR)
    fake_pods = ipaddress.ip_network(KWOK_FAKE_POD_CIDR)
    for a, b in ((services, node), (services, fake_pods), (node, fake_pods)):
        assert not a.overlaps(b), (a, b)
    assert ipaddress.ip_address(realnode.KUBERNETES_SERVICE_IP) == services[1]
    pods = ipaddress.ip_network(realnode.POD_CIDR)
    assert pods.subnet_of(node)
    assert ipaddress.ip_address(realnode.NODE_IP) in pods
    # All private: a packet to these never has a reason to leave the machine.
    assert services.is_private and node.is_private


def test_reporter_patch_puts_only_the_reporter_on_the_real_node() -> None:
    cfg = DeploymentConfig(name="x.pmem-csi.intel.com", namespace="x", reporter={"image": "i"})
    objects = build_deployment_objects(cfg).all()
    patches = PatchSet.from_config([realnode.reporter_patch()])
    patches.dry_run(objects)  # selects something, applies cleanly
    entry = PatchEntry.from_config(realnode.reporter_patch(), "p")
    selected = [o for o in objects if entry.selects(o["kind"], o)]
    assert [(o["kind"], o["metadata"]["name"]) for o in selected] == [
        ("Deployment", cfg.names.reporter)
    ]
    spec = entry.apply(selected[0])["spec"]["template"]["spec"]
    key, value = realnode.NODE_LABEL
    assert spec["nodeSelector"] == {key: value}
    assert spec["tolerations"] == [
        {"key": key, "operator": "Equal", "value": value, "effect": "NoSchedule"}
    ]
    assert f"{key}={value}:NoSchedule" == realnode.NODE_TAINT
    # The driver's workloads do not tolerate the node's taint: they stay on kwok nodes.
    for obj in objects:
        if obj["kind"] in ("StatefulSet", "DaemonSet"):
            for tol in obj["spec"]["template"]["spec"].get("tolerations") or []:
                assert tol.get("key") not in (key, None), (obj["kind"], tol)


def test_guard_rules_drop_what_leaves_by_anything_but_lo_or_the_bridge() -> None:
    rules = realnode._guard_ruleset()
    output = rules.split("chain output")[1].split("}")[0]
    forward = rules.split("chain forward")[1].split("}")[0]
    assert "policy drop;" in output and "policy drop;" in forward
    assert [line.strip() for line in output.splitlines() if "accept" in line] == [
        'oif "lo" accept',
        f'oifname "{realnode.BRIDGE}" accept',
    ]
    assert f"dnat ip to {realnode.NODE_IP}:{realnode.FORWARD_PORT}" in rules
    assert set(realnode._netns_blackholes()) == {"default", realnode.SERVICE_CIDR,
                                                 realnode.NODE_CIDR}  # fmt: skip
    # kwok's fake pods' addresses too: the API server (kubectl logs of a fake pod's node
    # address aside) has no reason to send there, and nothing may leave if it tries.
    assert set(realnode._host_blackholes()) == {realnode.SERVICE_CIDR, realnode.NODE_CIDR,
                                                KWOK_FAKE_POD_CIDR}  # fmt: skip


def test_a_host_route_overlapping_a_blackholed_range_stops_the_start() -> None:
    # `ip route replace blackhole` would replace a connected route of the same prefix.
    routes = [{"dst": "default", "dev": "eth0"}, {"dst": "10.0.0.0/16", "dev": "eth1"},
              {"dst": realnode.NODE_CIDR, "type": "blackhole"}]  # fmt: skip
    assert realnode._route_conflicts(routes) == [
        f"a host route to 10.0.0.0/16 (dev eth1) overlaps the range {KWOK_FAKE_POD_CIDR}"
    ]
    assert realnode._route_conflicts(routes[:1] + routes[2:]) == []


def test_pods_get_a_route_to_the_services_only_and_no_masquerading() -> None:
    (bridge, _portmap) = realnode._cni_config()["plugins"]
    assert bridge["bridge"] == realnode.BRIDGE and bridge["ipMasq"] is False
    assert bridge["ipam"]["routes"] == [{"dst": realnode.SERVICE_CIDR}]


def test_the_forwarder_refuses_a_target_off_loopback() -> None:
    import pytest

    with pytest.raises(realnode.RealNodeError, match="not a loopback"):
        realnode.forward("192.0.2.1", 6443)
