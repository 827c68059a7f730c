"""One raw request to the Kubernetes API, through the official client's auth and TLS.

The program reads the cluster before it registers anything (``preflight``) and takes field
ownership back right before the provider applies (``takeover_transform``); both need plain
JSON requests with a timeout, not the client's generated model classes. Kept free of
``pulumi`` so the preflight stays importable without it.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class Response(NamedTuple):
    status: int
    reason: str
    body: bytes


def request(
    api_client: Any,
    method: str,
    path: str,
    *,
    timeout: float,
    body: Any = None,
    content_type: str | None = None,
    query: list[tuple[str, str]] | None = None,
    accept: str = "application/json",
) -> Response:
    """Send one request; its status, reason phrase and raw body, whatever the status.

    ``accept``: e.g. a metadata-only list (``PartialObjectMetadataList``), which the API
    server sends without the objects' specs and statuses."""
    headers = {"Accept": accept}
    if content_type:
        headers["Content-Type"] = content_type
    req = api_client.param_serialize(
        method=method,
        resource_path=path,
        query_params=query or [],
        header_params=headers,
        body=body,
        auth_settings=["BearerToken"],
    )
    resp = api_client.call_api(*req, _request_timeout=timeout)
    body = resp.read()
    return Response(resp.status, str(resp.reason or ""), body)
