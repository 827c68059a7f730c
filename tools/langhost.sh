#!/bin/sh
# pulumi-language-python, the stand-in language host of pmem-csi-pulumi (tools/langhost.py).
# The CLI may stop a plugin while it is still starting, and Python interrupted during its
# start-up prints a traceback. So Python starts with stderr on /dev/null and the real stderr
# on fd 3; the host moves it back as soon as its own quiet signal handlers are installed.
# The tools cache holding this launcher is shared by checkouts: PMEM_CSI_LANGUAGE_HOST_DIR
# (set by tools/localenv.py) names the host installed for the checkout running the CLI; when
# nothing is installed there yet, the copy next to this launcher runs.
host_dir="${PMEM_CSI_LANGUAGE_HOST_DIR:-$(dirname "$0")}"
[ -f "$host_dir/pulumi-language-python-host" ] || host_dir="$(dirname "$0")"
PMEM_CSI_PARKED_STDERR=3 exec python3 "$host_dir/pulumi-language-python-host" "$@" \
  3>&2 2>/dev/null
