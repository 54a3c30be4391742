"""Content-addressed build cache for the guest image and the stub image.

Each build lives in ``<cache>/<kind>/<digest>/`` with a ``manifest.json`` written last, so a
directory with a manifest is complete. Builds of one digest are serialised with a file lock
(parallel test workers), and only the newest few builds of a kind are kept. These directories
are the content-addressed part of the cache (``vmtests cache-key`` names them for CI caches).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from vmtests.driver.errors import DriverError
from vmtests.driver.log import log

BUILD_TIMEOUT = 1800.0
"""Seconds one build step may take (mmdebstrap of the guest with docker.io takes minutes)."""
KEEP_BUILDS = 3
"""Builds kept per kind: each input change adds one."""
MANIFEST = "manifest.json"
"""Written last into a build's directory: a directory that has it is complete."""


def is_complete(build: Path) -> bool:
    """Whether the build directory ``build`` is complete (has its manifest)."""
    return (build / MANIFEST).exists()


@contextmanager
def file_lock(path: Path, *, wait: bool = True) -> Iterator[bool]:
    """Hold an exclusive ``flock`` on ``path`` while the block runs; yield whether held.
    ``wait=False`` does not wait for another holder: the block then runs without the lock."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def run_step(command: Sequence[str], what: str, timeout: float = BUILD_TIMEOUT) -> None:
    """Run a build step; raise ``DriverError`` with its output tail if it fails."""
    with log.nested(what):
        result = subprocess.run(
            list(command), capture_output=True, text=True, timeout=timeout, check=False
        )
        if result.returncode != 0:
            tail = (result.stdout + result.stderr)[-4000:]
            raise DriverError(f"{what} failed (rc={result.returncode}): {command}\n{tail}")


def partial_build(builds: Path, digest: str) -> Path:
    """Where this process builds ``digest`` before renaming it into place."""
    return builds / f"tmp-{digest}-{os.getpid()}"


def prune(builds: Path, keep: int = KEEP_BUILDS) -> None:
    """Delete all but the ``keep`` newest complete builds in ``builds`` (by their manifest's
    time), and the partial builds of processes that no longer run (killed while building).

    Guests already running from a pruned build keep working: QEMU holds the files open.
    """
    for partial in builds.glob("tmp-*-*"):
        pid = partial.name.rsplit("-", 1)[1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(partial, ignore_errors=True)
    built = sorted(
        (path for path in builds.iterdir() if is_complete(path)),
        key=lambda path: (path / MANIFEST).stat().st_mtime,
        reverse=True,
    )
    for stale in built[keep:]:
        shutil.rmtree(stale, ignore_errors=True)


def cached_build(
    builds: Path, digest: str, what: str, build: Callable[[Path], dict[str, Any]]
) -> tuple[Path, dict[str, Any]]:
    """The build ``builds/<digest>`` and its manifest, built first by ``build(directory)`` if
    no complete copy exists.

    ``build`` fills the directory and returns the manifest's data; ``hash`` and
    ``build_seconds`` are added here. A failed build leaves nothing behind and raises
    ``DriverError``.
    """
    final = builds / digest
    if not is_complete(final):
        with file_lock(builds / f".lock-{digest}"):
            if not is_complete(final):  # another process may have built it while we waited
                with log.nested(f"building {what} ({digest})"):
                    tmp = partial_build(builds, digest)
                    shutil.rmtree(tmp, ignore_errors=True)
                    tmp.mkdir(parents=True)
                    start = time.monotonic()
                    try:
                        built = build(tmp)
                        built.update(hash=digest, build_seconds=time.monotonic() - start)
                        (tmp / MANIFEST).write_text(json.dumps(built, indent=2))
                        os.replace(tmp, final)
                    except (OSError, subprocess.SubprocessError) as error:
                        raise DriverError(f"building {what} failed: {error}") from error
                    finally:
                        shutil.rmtree(tmp, ignore_errors=True)
                    prune(builds)
    data: dict[str, Any] = json.loads((final / MANIFEST).read_text())
    return final, data
