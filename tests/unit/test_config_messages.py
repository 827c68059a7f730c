"""pmem_components/config.py, how a config problem is worded: `parse_adopt`, key paths,
`string_fix`, `_describe`, `_pydantic_problems`, `_join_alternatives`.

Written to pin behaviours that `make mutate` found unpinned (docs/testing.md, "Scores").
"""
