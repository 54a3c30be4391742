"""Choosing the accelerator for ``accel=auto``, and remembering what KVM did on this host.

Some hosts offer ``/dev/kvm`` but a guest hangs at kernel entry under KVM (or QEMU aborts on an
MSR). ``accel=auto`` therefore probes: it launches under KVM and waits for the kernel's first
console line; when QEMU dies, the VM stops running, or the line does not come in time, it
restarts the guest under TCG with a warning. The verdict is written to
``<cache>/kvm-verdict.json`` keyed by the host name, the kernel release and the QEMU version,
and trusted for ``VERDICT_TTL`` seconds, so only the first guest on a host pays for a probe
that fails. Delete the file (or change any part of the key) to probe again. Every fallback to
TCG says why, and the machine reports which accelerator ran (``QemuMachine.acceleration``).
"""

from __future__ import annotations

import grp
import json
import os
import platform
import pwd
import re
import stat
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

KVM_DEVICE = Path("/dev/kvm")

SCRIPT_READ_LIMIT = 1 << 20
"""Bytes of a run script read to find its QEMU (nixpkgs' scripts have a few KiB)."""

_EXEC_QEMU = re.compile(r"^\s*exec\s+(/\S+/bin/qemu-(?:system-[\w-]+|kvm))(?=\s|$)", re.MULTILINE)
"""The last command of nixpkgs' run script, nixos/modules/virtualisation/qemu-vm.nix:
``exec <qemu-common.qemuBinaryWith ...>``, i.e. ``exec <qemu>/bin/qemu-system-x86_64 -machine
accel=kvm:tcg -cpu max`` on x86_64 Linux (nixos/lib/qemu-common.nix), then its options."""


@dataclass(frozen=True)
class Verdict:
    """What KVM did on this host: usable or not, why, and when that was seen."""

    key: str
    usable: bool
    reason: str
    seen_at: float


def kvm_usable() -> bool:
    """True when /dev/kvm can be opened read-write (nothing is said yet about it working)."""
    return os.access(KVM_DEVICE, os.R_OK | os.W_OK)


def why_kvm_unusable(device: Path | None = None) -> str:
    """Why this process cannot open ``device`` (default ``KVM_DEVICE``) read-write: missing, or
    its owner and mode and our credentials (a Nix build sandbox drops the builder's supplementary
    groups, so a device open to a group only is closed there: Nix
    src/libstore/unix/build/linux-derivation-builder.cc in Nix 2.30-2.34, earlier
    src/libstore/build/local-derivation-goal.cc, later under src/libstore/linux/build/)."""
    device = device or KVM_DEVICE
    try:
        info = device.stat()
    except FileNotFoundError:
        return f"{device} does not exist (no KVM on this host, or none passed to this sandbox)"
    except OSError as error:
        return f"{device} cannot be examined: {error.strerror}"
    groups = sorted({os.getgid(), *os.getgroups()})
    return (
        f"{device} is {_user(info.st_uid)}:{_group(info.st_gid)} "
        f"{stat.S_IMODE(info.st_mode):04o}, and this process (uid {os.getuid()}, groups "
        f"{groups}) may not open it read-write"
    )


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _group(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def last_line(text: str) -> str:
    """The last non-blank line of ``text`` (what QEMU said last), stripped; "" if none."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _host() -> str:
    return f"{platform.node()}|{platform.release()}"


@cache
def host_key(qemu_binary: str) -> str:
    """The host, kernel and QEMU a verdict holds for (runs ``qemu_binary --version``)."""
    try:
        version = subprocess.run(
            [qemu_binary, "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout.splitlines()[:1]
    except (OSError, subprocess.SubprocessError):
        version = []
    return f"{_host()}|{(version or ['unknown qemu'])[0]}"


def exec_line_qemu(script_text: str) -> str | None:
    """The QEMU binary of a run script's ``exec`` line (``_EXEC_QEMU``), or None."""
    found = _EXEC_QEMU.search(script_text)
    return found.group(1) if found else None


def script_qemu(run_script: Path) -> str | None:
    """The QEMU binary a NixOS run script ``exec``s, read from the script's text (never run);
    None when the script has no such line or the binary is not executable."""
    try:
        with run_script.open("rb") as script:
            qemu = exec_line_qemu(script.read(SCRIPT_READ_LIMIT).decode(errors="replace"))
    except OSError:
        return None
    return qemu if qemu is not None and os.access(qemu, os.X_OK) else None


def verdict_key(run_script: Path | None, qemu_binary: str) -> str:
    """The key of a machine's verdict: host, kernel and the QEMU that runs the guest.

    A directly booted guest runs ``qemu_binary``; a NixOS run script the QEMU it ``exec``s
    (``script_qemu``), else the key names the script's resolved store path, which determines
    its QEMU. The script itself never runs here: it would create the disk image, copy the EFI
    variables and make a temporary directory in the current directory (qemu-vm.nix).
    """
    if run_script is None:
        return host_key(qemu_binary)
    qemu = script_qemu(run_script)
    if qemu is not None:
        return host_key(qemu)
    return f"{_host()}|run script {run_script.resolve()}"


def verdict_file() -> Path:
    """Where the verdict is kept."""
    return cache_dir() / "kvm-verdict.json"


def remembered(key: str, now: float | None = None) -> Verdict | None:
    """The stored verdict for ``key`` (``verdict_key``), unless missing, stale or unreadable."""
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
    if verdict.key != key or not 0 <= now - verdict.seen_at < VERDICT_TTL:
        return None
    return verdict


def remember(key: str, usable: bool, reason: str) -> Verdict:
    """Store a verdict for ``key`` (atomically; other sessions may read)."""
    verdict = Verdict(key, usable, reason, time.time())
    path = verdict_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(json.dumps(asdict(verdict), indent=2) + "\n")
    partial.replace(path)
    return verdict


def planned(requested: str, qemu_binary: str) -> str | None:
    """The accelerator a guest asking for ``requested`` will get, when known without launching:
    ``tcg`` or ``kvm`` as asked, or ``auto``'s choice from ``/dev/kvm`` and the remembered
    verdict; None when only a probe can tell."""
    if requested != "auto":
        return requested
    if not kvm_usable():
        return "tcg"
    verdict = remembered(verdict_key(None, qemu_binary))
    return None if verdict is None else ("kvm" if verdict.usable else "tcg")
