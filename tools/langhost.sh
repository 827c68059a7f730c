#!/bin/sh
# pulumi-language-python, the stand-in language host of pmem-csi-pulumi (tools/langhost.py).
# The CLI may stop a plugin while it is still starting, and Python interrupted during its
# start-up prints a traceback. So Python starts with stderr on /dev/null and the real stderr
# on fd 3; the host moves it back as soon as its own quiet signal handlers are installed.
PMEM_CSI_PARKED_STDERR=3 exec python3 "$(dirname "$0")/pulumi-language-python-host" "$@" \
  3>&2 2>/dev/null
