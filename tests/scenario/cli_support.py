"""The ``vmtests`` command run as a person runs it, in a process of its own, for the VM tests of
the commands: its state directories (and so its guests' files) under the test's directory
(``TMPDIR``), so that the guests' processes are told apart from other runs' by the paths on
their command lines (``qemus_under``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CLI_TIMEOUT = 1200.0
"""Seconds one command may take (a cold snapshot cache boots and deploys the base first)."""
CLI = [sys.executable, "-m", "vmtests.cli"]
"""The command line of ``vmtests`` from the package under test."""


def cli_environment(tmp_path: Path) -> dict[str, str]:
    """The environment of a command whose state directories go under ``tmp_path``."""
    return {**os.environ, "TMPDIR": str(tmp_path)}


def vmtests(
    tmp_path: Path, *argv: str, timeout: float = CLI_TIMEOUT
) -> subprocess.CompletedProcess[str]:
    """``vmtests argv`` in a process of its own, its state directories under ``tmp_path``."""
    done = subprocess.run(
        [*CLI, *argv], capture_output=True, text=True, env=cli_environment(tmp_path),
        timeout=timeout, check=False,
    )  # fmt: skip
    print(done.stdout, done.stderr[-4000:], sep="\n")
    return done


def qemus_under(path: Path) -> list[int]:
    """The QEMU processes whose command line names a file under ``path``."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if Path(argv[0].decode()).name.startswith("qemu-system") and str(
            path
        ).encode() in b" ".join(argv):
            found.append(int(proc.name))
    return found
