"""Port numbers of the reference driver (``controller_driver.go`` constants)."""

CONTROLLER_SERVICE_PORT = 10000
CONTROLLER_METRICS_PORT = 10010
NODE_CONTROLLER_PORT = 10001
NODE_METRICS_PORT = 10010
PROVISIONER_METRICS_PORT = 10011


def metrics_ports(port: int) -> list[dict[str, object]]:
    """The single named ``metrics`` container port that Prometheus scraping relies on."""
    return [{"name": "metrics", "containerPort": port, "protocol": "TCP"}]
