"""pmem_components/config.py, the deployment entry's checks as a whole: `_check_deployment`,
`_check_await`, `_check_unique`, `load_config`, `deployment_problems`, `certificate_problems`.

Written to pin behaviours that `make mutate` found unpinned (docs/testing.md, "Scores").
"""
