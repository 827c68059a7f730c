"""Pure manifest builders: a validated ``DeploymentConfig`` in, Kubernetes object dicts out.

They import neither pulumi nor pulumi_kubernetes, so unit tests check every field without an
engine, and the Pulumi components in ``pmem_components.components`` stay thin wrappers that
only register what these functions return. Field values follow the reference operator
(intel/pmem-csi d01bc59, ``controller_driver.go``).
"""
