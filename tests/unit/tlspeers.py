"""Mutual TLS between driver pods of possibly different certificate generations, for tests.

A "pod" is what a driver container loads from its Secret: ``ca.crt`` (one CA or a bundle),
``tls.crt`` and ``tls.key``. The handshakes run with Python's ``ssl`` over a socket pair, one
thread per side, as two driver processes would: each side verifies its peer against its own
``ca.crt`` (OpenSSL's chain building, like Go's crypto/tls with a pool of several CAs) and
checks the peer's DNS name: the node driver dials ``pmem-registry``, the controller dials the
node's ``pmem-node-controller``, and each server requires the other's client certificate.

Used by the unit tests (generations from the dynamic provider) and the end-to-end test
(generations read from the live Secrets). Keys are written to the test's tmp directory only.
"""

from __future__ import annotations

import socket
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pmem_components import certs


@dataclass(frozen=True)
class Pod:
    """What one driver container loaded: its Secret's three files."""

    ca: str
    cert: str
    key: str

    def __repr__(self) -> str:
        return "Pod(<material hidden>)"


@dataclass(frozen=True)
class Generation:
    """The material of one generation: the controller's (registry) and the nodes'."""

    registry: Pod
    node: Pod

    @classmethod
    def of(cls, outs: dict[str, Any]) -> Generation:
        """From the dynamic provider's outputs (both Secrets get the same ``ca.crt``)."""
        return cls(
            Pod(outs["ca_cert"], outs["registry_cert"], outs["registry_key"]),
            Pod(outs["ca_cert"], outs["node_controller_cert"], outs["node_controller_key"]),
        )

    @classmethod
    def from_secrets(cls, registry: dict[str, str], node: dict[str, str]) -> Generation:
        """From the two Secrets' decoded data."""
        return cls(
            Pod(registry["ca.crt"], registry["tls.crt"], registry["tls.key"]),
            Pod(node["ca.crt"], node["tls.crt"], node["tls.key"]),
        )


def _context(side: int, pod: Pod, tmp: Path, tag: str) -> ssl.SSLContext:
    ctx = ssl.SSLContext(side)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2  # as the driver
    ctx.load_verify_locations(cadata=pod.ca)
    chain, key = tmp / f"{tag}.crt", tmp / f"{tag}.key"
    chain.write_text(pod.cert)
    key.write_text(pod.key)
    ctx.load_cert_chain(str(chain), str(key))
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def _names(peer: dict[str, Any]) -> list[str]:
    return [v for k, v in peer.get("subjectAltName", ()) if k == "DNS"]


def handshake(server: Pod, client: Pod, server_name: str, client_name: str, tmp: Path) -> str:
    """ "" when both sides accept each other over a real socket pair, else what failed."""
    tmp.mkdir(parents=True, exist_ok=True)
    server_ctx = _context(ssl.PROTOCOL_TLS_SERVER, server, tmp, "server")
    client_ctx = _context(ssl.PROTOCOL_TLS_CLIENT, client, tmp, "client")
    client_ctx.check_hostname = True
    a, b = socket.socketpair()
    a.settimeout(20)
    b.settimeout(20)
    errors: dict[str, str] = {}

    def serve() -> None:
        try:
            with server_ctx.wrap_socket(a, server_side=True) as s:
                if client_name not in _names(s.getpeercert() or {}):
                    errors["server"] = "client certificate has the wrong name"
                s.sendall(b"ok")
        except (ssl.SSLError, OSError) as e:
            errors["server"] = f"server: {e}"

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        with client_ctx.wrap_socket(b, server_hostname=server_name) as c:
            if c.recv(2) != b"ok":
                errors["client"] = "no application data"
    except (ssl.SSLError, OSError) as e:
        errors["client"] = f"client: {e}"
    thread.join(30)
    a.close()
    b.close()
    return "; ".join(errors.values())


def links(controller: Generation, node: Generation, tmp: Path, both: bool = True) -> list[str]:
    """The failures on both links between a controller pod of ``controller`` and a node pod
    of ``node``: the node dials the registry, the controller dials the node. ``both`` also
    checks the roles the other way round (controller of ``node``, node of ``controller``)."""
    out = []
    pairs = [(controller, node), (node, controller)] if both else [(controller, node)]
    for ctl, nd in pairs:
        for server, client, sname, cname in (
            (ctl.registry, nd.node, certs.REGISTRY_NAME, certs.NODE_CONTROLLER_NAME),
            (nd.node, ctl.registry, certs.NODE_CONTROLLER_NAME, certs.REGISTRY_NAME),
        ):
            problem = handshake(server, client, sname, cname, tmp)
            if problem:
                out.append(f"{sname} server / {cname} client: {problem}")
    return out
