"""pmem_components/config.py, the checks of one section of a deployment entry: labels, resources,
certificates and their renewal, patches, the reporter, name lengths, and the models' own
validators.

Written to pin behaviours that `make mutate` found unpinned (docs/testing.md, "Scores").
"""
