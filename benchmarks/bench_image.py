"""Build time and size of the reporter image (``tools.image``), and that builds agree.

Why: ``make test`` builds the image when its inputs change, and an administrator pushes it;
both want to know what that costs. Per repetition, in a fresh cache directory (so nothing of
an earlier build is reused; the host packages are already installed):

- *cold*: the first build: wheels downloaded from PyPI, Debian packages from the mirror;
- *rebuild*: ``--force`` in the same directory: wheels cached, Debian packages fetched again
  (what a source change costs);
- *warm*: the cache hit ``make image`` sees when nothing changed.

Sizes: the compressed layer (what a registry stores and a node pulls), the ``oci-archive``,
and the unpacked root filesystem. Every build's digest is printed: they must all be equal.

    .venv/bin/python -m benchmarks.bench_image [--reps 2]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import tarfile
import tempfile
import time

from tools import image


def _unpacked_size(built: image.BuiltImage) -> tuple[int, int]:
    """Bytes and regular files in the image's only layer."""
    index = json.loads((built.layout / "index.json").read_text(encoding="utf-8"))
    digest = index["manifests"][0]["digest"].split(":", 1)[1]
    blobs = built.layout / "blobs" / "sha256"
    manifest = json.loads((blobs / digest).read_text(encoding="utf-8"))
    total = files = 0
    for layer in manifest["layers"]:
        with (
            gzip.open(blobs / layer["digest"].split(":", 1)[1]) as raw,
            tarfile.open(fileobj=raw, mode="r|") as tar,
        ):
            for member in tar:
                if member.isreg():
                    total += member.size
                    files += 1
    return total, files


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()
    times: dict[str, list[float]] = {"cold": [], "rebuild": [], "warm": []}
    digests: set[str] = set()
    built: image.BuiltImage | None = None
    for rep in range(args.reps):
        with tempfile.TemporaryDirectory(prefix="bench-image-") as tmp:
            os.environ["PMEM_CSI_IMAGE_CACHE"] = tmp
            for kind, force in (("cold", False), ("rebuild", True), ("warm", False)):
                start = time.monotonic()
                built = image.build(force=force)
                times[kind].append(time.monotonic() - start)
                digests.add(built.digest)
                print(f"rep {rep + 1} {kind:8s} {times[kind][-1]:6.1f} s  {built.digest}")
            sizes = image.size_bytes(built)
            unpacked, files = _unpacked_size(built)
    for kind, values in times.items():
        print(
            f"{kind:8s} median {statistics.median(values):6.1f} s  "
            f"min {min(values):6.1f} s  max {max(values):6.1f} s  (n={len(values)})"
        )
    print(f"compressed layer {sizes['compressed'] / 2**20:.1f} MiB, "
          f"oci-archive {sizes['archive'] / 2**20:.1f} MiB, "
          f"unpacked {unpacked / 2**20:.1f} MiB in {files} files")  # fmt: skip
    print(f"distinct digests over {3 * args.reps} builds: {len(digests)} {sorted(digests)}")


if __name__ == "__main__":
    main()
