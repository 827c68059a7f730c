"""Port numbers of the reference driver (``controller_driver.go`` constants)."""

CONTROLLER_SERVICE_PORT = 10000
CONTROLLER_METRICS_PORT = 10010
NODE_CONTROLLER_PORT = 10001
NODE_METRICS_PORT = 10010
PROVISIONER_METRICS_PORT = 10011

METRICS_PORT_NAME = "metrics"
# Port names must be unique within a pod (the API server warns on every apply otherwise), so
# the controller pod's second container names its metrics port differently (IANA service
# names: at most 15 characters).
PROVISIONER_METRICS_PORT_NAME = "prov-metrics"


def metrics_ports(port: int, name: str = METRICS_PORT_NAME) -> list[dict[str, object]]:
    """The single named metrics container port that Prometheus scraping relies on."""
    return [{"name": name, "containerPort": port, "protocol": "TCP"}]
