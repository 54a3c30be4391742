"""File transfer over a machine's command channel (tar + base64), shared by both backends.

Going through ``execute`` keeps one code path for the backdoor and ssh, needs only ``tar``,
``gzip``, ``base64`` and ``cp`` in the guest, and inherits the channel's framing and timeouts.
The archive is gzipped: every chunk is one command round trip, a second or more under TCG.
"""

from __future__ import annotations

import base64
import io
import shutil
import tarfile
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from vmtests.driver.errors import CommandFailed, WaitTimeout

if TYPE_CHECKING:
    from vmtests.driver.machine import Machine

CHUNK_BYTES = 64 * 1024
"""Raw bytes per command: their base64 must stay under Linux's 128 KiB limit per argument."""
PAYLOAD = "payload"


def copy_to(machine: Machine, source: Path, destination: str, timeout: float) -> None:
    """Copy host file or directory ``source`` to path ``destination`` on ``machine``.

    A directory's contents are merged into ``destination`` (created if needed); a file is
    written to ``destination`` itself.
    """
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=6) as archive:
        archive.add(str(source), arcname=PAYLOAD)
    data = buffer.getvalue()
    deadline = time.monotonic() + timeout
    staging = machine.succeed("mktemp -d", timeout=30).strip()
    try:
        tar = f"{staging}/x.tar.gz"
        for offset in range(0, len(data), CHUNK_BYTES):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WaitTimeout(
                    f"copy of {source} to {machine.name}:{destination}",
                    timeout,
                    f"{offset} of {len(data)} bytes sent",
                )
            chunk = base64.b64encode(data[offset : offset + CHUNK_BYTES]).decode()
            machine.succeed("printf %%s %s | base64 -d >> %s", chunk, tar, timeout=remaining)
        payload = f"{staging}/{PAYLOAD}"
        if source.is_dir():
            place = "mkdir -p %s && cp -a %s/. %s/"
            where = (destination, payload, destination)
        else:
            place = 'mkdir -p "$(dirname %s)" && cp -a %s %s'
            where = (destination, payload, destination)
        machine.succeed(
            f"tar -x -z -f %s -C %s && {place}",
            tar,
            staging,
            *where,
            timeout=max(30.0, deadline - time.monotonic()),
        )
    finally:
        machine.execute("rm -rf %s", staging, timeout=30)


def copy_from(machine: Machine, source: str, destination: Path, timeout: float) -> None:
    """Copy file or directory ``source`` on ``machine`` to host path ``destination``."""
    src = source.rstrip("/") or "/"
    parent, _, name = src.rpartition("/")
    result = machine.execute(
        "tar -c -f - -C %s --transform %s %s",
        parent or "/",
        f"s,^{name},{PAYLOAD},",
        name,
        timeout=timeout,
    )
    if result.rc != 0:
        raise CommandFailed(result)
    with tempfile.TemporaryDirectory(prefix="vmtests-copy-") as tmp:
        with tarfile.open(fileobj=io.BytesIO(result.stdout), mode="r") as archive:
            archive.extractall(tmp, filter="fully_trusted")
        extracted = Path(tmp) / PAYLOAD
        destination.parent.mkdir(parents=True, exist_ok=True)
        if extracted.is_dir():
            shutil.copytree(extracted, destination, symlinks=True, dirs_exist_ok=True)
        else:
            shutil.copy2(extracted, destination)
