#!/usr/bin/env python3
"""Executor of the stand-in language host: runs one Pulumi Python program in this process.

Installed next to the CLI as ``pulumi-language-python-exec`` and started by
``pulumi-language-python`` (``tools/langhost.py``) with the project's interpreter, one process
per ``Run`` as the official plugin does, so every preview and update starts from a clean
interpreter. It takes the official executor's flags and reads the config from
``PULUMI_CONFIG`` / ``PULUMI_CONFIG_SECRET_KEYS``.

Errors are shown once: a ``pulumi.RunError`` (this project's config errors, which already name
every bad key) is logged to the engine as one error diagnostic and the process exits with 32,
which the host answers with ``bail`` so the CLI adds no second copy of it. Any other exception
is logged with the traceback of the program's frames, also with 32.

Runs standalone under the project's interpreter: imports only the ``pulumi`` SDK.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import logging
import os
import runpy
import signal
import sys
import traceback
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

USER_ACTIONABLE_EXIT = 32


class MissingProgramError(Exception):
    """The program directory has no ``__main__.py``."""


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="pulumi-language-python-exec")
    for flag in (
        "project",
        "root_directory",
        "stack",
        "parallel",
        "dry_run",
        "pwd",
        "monitor",
        "engine",
        "tracing",
        "organization",
    ):
        ap.add_argument(f"--{flag}")
    ap.add_argument("PROGRAM")
    ap.add_argument("ARGS", nargs="*")
    return ap.parse_args(argv)


def program_file(program: str) -> str:
    """``.`` or a directory means its ``__main__.py``; a file is run as given."""
    path = os.path.abspath(program)
    if os.path.isdir(path):
        main = os.path.join(path, "__main__.py")
        if not os.path.exists(main):
            raise MissingProgramError(
                f"unable to find main python program `__main__.py` in `{path}`"
            )
        return main
    return path


def _user_traceback(program: str) -> str:
    """The traceback from the program's own frames on (the executor's are noise)."""
    frames = traceback.extract_tb(sys.exc_info()[2])
    for index, frame in enumerate(frames):
        if os.path.abspath(frame.filename) == program:
            return traceback.format_exc(limit=-(len(frames) - index))
    return traceback.format_exc()


def _exit_quietly(signum: int, frame: object) -> None:
    """Ctrl-C or the host's stop: leave at once, without a KeyboardInterrupt traceback.

    The CLI owns the operation: on Ctrl-C it cancels the update itself and lets the steps in
    flight finish, so the program has nothing left to clean up; a traceback (from wherever
    the signal happened to land, often interpreter shutdown) would only alarm the user.
    Through _exit_now, so the ``atexit`` handlers run: one removes the temporary files that
    hold kubeconfig credentials.
    """
    _exit_now(128 + signum)


def _restore_stderr() -> None:
    """The host starts us with stderr parked (a stop during start-up stays silent)."""
    fd = os.environ.pop("PMEM_CSI_PARKED_STDERR", None)
    if fd is None:
        return
    try:
        os.dup2(int(fd), 2)
        os.close(int(fd))
    except (OSError, ValueError):
        pass


def main(argv: Sequence[str] | None = None) -> int:
    signal.signal(signal.SIGINT, _exit_quietly)
    signal.signal(signal.SIGTERM, _exit_quietly)
    _restore_stderr()
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        import pulumi
        import pulumi.runtime
    except ImportError:
        print(
            f"The Pulumi SDK is not installed for {sys.executable}; "
            "run pip install -r requirements.txt in the project's virtualenv.",
            file=sys.stderr,
        )
        return 1

    pulumi.runtime.set_all_config(
        pulumi.runtime.get_config_env(), pulumi.runtime.get_config_secret_keys_env()
    )
    parallel = int(args.parallel) if args.parallel else None
    pulumi.runtime.configure(
        pulumi.runtime.Settings(
            monitor=args.monitor,
            engine=args.engine,
            project=args.project,
            stack=args.stack,
            parallel=parallel,
            dry_run=args.dry_run == "true",
            organization=args.organization,
            root_directory=args.root_directory,
        )
    )
    if args.pwd:
        os.chdir(args.pwd)

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    executor = ThreadPoolExecutor(max_workers=max(parallel or 1, 1) * 4)
    loop.set_default_executor(executor)
    # Unobserved futures of a failed program are expected; asyncio's warnings about them
    # would only bury the real error.
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)

    exit_code = 0
    program = ""
    try:
        program = program_file(args.PROGRAM)
        # As `python __main__.py` would: the program's directory first on sys.path, for good
        # (modules the program imports lazily, later, must still resolve).
        sys.path.insert(0, os.path.dirname(program))
        sys.argv = [program, *args.ARGS]
        loop.run_until_complete(
            pulumi.runtime.run_in_stack(lambda: runpy.run_path(program, run_name="__main__"))
        )
    except pulumi.RunError as err:
        pulumi.log.error(str(err))
        exit_code = USER_ACTIONABLE_EXIT
    except MissingProgramError as err:
        pulumi.log.error(str(err))
        exit_code = USER_ACTIONABLE_EXIT
    except Exception:  # any program failure is reported to the user
        pulumi.log.error(
            "Program failed with an unhandled exception:\n" + _user_traceback(program)
        )
        exit_code = USER_ACTIONABLE_EXIT
    finally:
        executor.shutdown(wait=True)
        loop.close()
        sys.stdout.flush()
        sys.stderr.flush()
    return exit_code


def _exit_now(code: int) -> None:
    """Exit without the interpreter's teardown, after what must still run.

    Tearing down the SDK's gRPC channels, threads and modules took 0.4 s, a sixth of a no-op
    ``pulumi up``, after every RPC had completed. ``atexit`` handlers still run: the
    Kubernetes client removes there the temporary files holding kubeconfig credentials.
    """
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    _exit_now(main())
