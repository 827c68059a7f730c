"""The PMEM-CSI status reporter: writes each ``deployments.pmem-csi.intel.com`` CR's status.

A regular package rather than a namespace package so that ``python -m reporter``, the
``pmem-csi-reporter`` console script and the wheel's package discovery all find exactly this
directory, and a stray ``reporter/`` directory elsewhere on ``sys.path`` cannot merge into it.
Nothing is imported here: the modules are loaded by ``reporter.__main__`` as needed, and
none of them imports pulumi.
"""
