"""The external programs the driver runs, and a clear error when one is missing."""

from __future__ import annotations

import shutil

from vmtests.driver.errors import DriverError

# The Debian package that provides each program (what `.ci/run` installs), for the message.
DEBIAN_PACKAGES = {
    "qemu-system-x86_64": "qemu-system-x86",
    "qemu-img": "qemu-utils",
    "mmdebstrap": "mmdebstrap",
    "mkfs.ext4": "e2fsprogs",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
}


class MissingTool(DriverError):
    """A program the driver needs is not on PATH."""


def require_tools(*programs: str) -> None:
    """Raise ``MissingTool`` naming every program of ``programs`` not on PATH, with its package."""
    missing = [program for program in programs if shutil.which(program) is None]
    if missing:
        hints = ", ".join(
            f"{program} (apt-get install {DEBIAN_PACKAGES.get(program, program)})"
            for program in missing
        )
        raise MissingTool(f"required programs are not on PATH: {hints}")
