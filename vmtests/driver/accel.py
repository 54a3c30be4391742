"""Choosing the accelerator for ``accel=auto``, and remembering what KVM did on this host.

Some hosts offer ``/dev/kvm`` but a guest hangs at kernel entry under KVM (or QEMU aborts on an
MSR). ``accel=auto`` therefore probes: it launches under KVM and waits for the kernel's first
console line; when QEMU dies, the VM stops running, or the line does not come in time, it
restarts the guest under TCG with a warning. The verdict is written to
``<cache>/kvm-verdict.json`` keyed by the host name, the kernel release and the QEMU version,
and trusted for ``VERDICT_TTL`` seconds, so only the first guest on a host pays for a probe
that fails. Delete the file (or change any part of the key) to probe again.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path

from vmtests.contracts.paths import cache_dir

VERDICT_TTL = 24 * 3600.0
"""Seconds a remembered verdict stays valid."""

DIRECT_PROBE_TIMEOUT = 10.0
"""Seconds a directly booted kernel gets under KVM to print its first line (it takes < 1 s)."""

SCRIPT_PROBE_TIMEOUT = 30.0
"""The same for a NixOS run script, whose firmware and boot loader come first."""


@dataclass(frozen=True)
class Verdict:
    """What KVM did on this host: usable or not, why, and when that was seen."""

    key: str
    usable: bool
    reason: str
    seen_at: float


def kvm_usable() -> bool:
    """True when /dev/kvm can be opened read-write (nothing is said yet about it working)."""
    return os.access("/dev/kvm", os.R_OK | os.W_OK)


@cache
def host_key(qemu_binary: str) -> str:
    """The host, kernel and QEMU a verdict holds for."""
    try:
        version = subprocess.run(
            [qemu_binary, "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout.splitlines()[:1]
    except OSError:
        version = []
    return f"{platform.node()}|{platform.release()}|{(version or ['unknown qemu'])[0]}"


def verdict_file() -> Path:
    """Where the verdict is kept."""
    return cache_dir() / "kvm-verdict.json"


def remembered(qemu_binary: str, now: float | None = None) -> Verdict | None:
    """The stored verdict for this host, kernel and QEMU, unless missing, stale or unreadable."""
    try:
        data = json.loads(verdict_file().read_text())
        verdict = Verdict(
            key=str(data["key"]),
            usable=bool(data["usable"]),
            reason=str(data["reason"]),
            seen_at=float(data["seen_at"]),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
    now = time.time() if now is None else now
    if verdict.key != host_key(qemu_binary) or not 0 <= now - verdict.seen_at < VERDICT_TTL:
        return None
    return verdict


def remember(qemu_binary: str, usable: bool, reason: str) -> Verdict:
    """Store a verdict for this host, kernel and QEMU (atomically; other sessions may read)."""
    verdict = Verdict(host_key(qemu_binary), usable, reason, time.time())
    path = verdict_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(json.dumps(asdict(verdict), indent=2) + "\n")
    partial.replace(path)
    return verdict
