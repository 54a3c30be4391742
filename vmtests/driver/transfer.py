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
    written to ``destination`` itself. One command per chunk: the first also makes the staging
    directory, the last also unpacks, places and removes it, so a copy that fits in one chunk
    is one round trip.
    """
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=6) as archive:
        archive.add(str(source), arcname=PAYLOAD)
    data = buffer.getvalue()
    chunks = [data[offset : offset + CHUNK_BYTES] for offset in range(0, len(data), CHUNK_BYTES)]
    if source.is_dir():
        place, where = f'mkdir -p %s && cp -a "$d/{PAYLOAD}/." %s/', (destination, destination)
    else:
        place = f'mkdir -p "$(dirname %s)" && cp -a "$d/{PAYLOAD}" %s'
        where = (destination, destination)
    unpack = f'tar -x -z -f "$d/x.tar.gz" -C "$d" && {place}; rc=$?; rm -rf "$d"; exit $rc'
    deadline = time.monotonic() + timeout
    staging = ""  # the staging directory while it outlives a command
    try:
        for index, chunk in enumerate(chunks):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WaitTimeout(
                    f"copy of {source} to {machine.name}:{destination}",
                    timeout,
                    f"{index * CHUNK_BYTES} of {len(data)} bytes sent",
                )
            encoded = base64.b64encode(chunk).decode()
            if staging:
                command = 'd=%s && printf %%s %s | base64 -d >> "$d/x.tar.gz"'
                args = [staging, encoded]
            else:
                command = 'd=$(mktemp -d) && echo "$d" && printf %%s %s | base64 -d > "$d/x.tar.gz"'
                args = [encoded]
            last = index == len(chunks) - 1
            if last:
                command, args = f"{command} && {unpack}", [*args, *where]
                remaining = max(30.0, remaining)
            result = machine.execute(command, *args, timeout=remaining)
            if not staging and not last:
                staging = result.stdout_text.strip()
            if result.rc != 0:
                raise CommandFailed(result)
        staging = ""  # the last command removed it
    finally:
        if staging:
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
