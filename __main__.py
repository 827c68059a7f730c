"""Pulumi entry point (``runtime: python``); the program itself is pmem_components.program."""

from pmem_components.program import main

main()
