"""Prepared reference guests, saved once and restored in seconds: the snapshot cache.

A ``Preparation`` takes a reference guest from a fresh boot (or from its ``parent``'s state) to
a state worth coming back to: booted and settled, the base deployment serving, a profile's
target serving. ``prepare_guest`` starts a guest in that state. The first time, the guest boots
(or restores its parent), is prepared and is saved (``vmtests.driver.qemu_snapshot``), and then
goes on as the caller's guest; every later time, a fresh QEMU restores it in a few seconds.

Entries live in ``<cache>/snapshots/<key>/`` next to the images, made like them
(``build_cache``): a complete entry has a ``manifest.json``, written last; one process builds a
key at a time (a file lock; another process that needs the same key meanwhile prepares its own
guest rather than idle a core); the least recently used entries beyond ``KEEP_SNAPSHOTS`` are
removed. The key covers everything that went into the state: the preparation's own inputs (the
units it installs, the stub image, the code that prepares), its parent's key, the QEMU command
line that defines the guest (image, kernel command line, memory, vCPUs, devices; not the run's
sockets, ports or names), the very files it starts from (a rebuilt image is another guest), the
QEMU binary, the instrumentation contract and, under KVM, the host's CPU. Any change to one of
them makes a new entry.

``$VMTESTS_SNAPSHOTS=off`` (``Settings.snapshots``) boots and prepares every guest instead. Only
directly booted reference guests are saved: NixOS VMs and real hosts never are.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from vmtests.contracts import instrumentation as contract
from vmtests.contracts.paths import cache_dir
from vmtests.contracts.settings import Settings, settings
from vmtests.driver import accel as accel_choice
from vmtests.driver import qemu_launch
from vmtests.driver.errors import DriverError
from vmtests.driver.log import log
from vmtests.driver.qemu import QemuMachine
from vmtests.driver.qemu_snapshot import SavedGuest
from vmtests.guest.build_cache import MANIFEST, file_lock, is_complete, partial_build, prune

KEEP_SNAPSHOTS = 16
"""Entries kept (a few hundred MB each): one suite run uses about a dozen (the settled guest,
the base, the target serving and stopped, the certification's sets of stub knobs), and each
input change adds one per preparation; fewer would evict entries within one run."""
ENTRY_FORMAT = 1
"""Part of every key: raise it when an entry's layout changes."""
WITNESS_FILE = "witness.json"


@dataclass(frozen=True)
class Preparation:
    """How a reference guest reaches a state, and what that state depends on.

    ``prepare`` runs on a started guest in the ``parent``'s state (a fresh boot without a
    parent). ``inputs`` must name everything besides the guest itself that decides the state
    (JSON data). ``witness``, when given, describes the state: it runs on the freshly prepared
    guest right after the save, and its result is kept with the entry, so that a restored guest
    can be compared with the guest that was saved.
    """

    name: str
    prepare: Callable[[QemuMachine], None]
    inputs: Mapping[str, object] = field(default_factory=dict)
    parent: Preparation | None = None
    witness: Callable[[QemuMachine], object] | None = None

    @property
    def chain(self) -> list[Preparation]:
        """This preparation and its ancestors, the root first."""
        return [*(self.parent.chain if self.parent else []), self]


@dataclass(frozen=True)
class PreparedGuest:
    """A started guest in a preparation's state, and how it got there."""

    machine: QemuMachine
    restored: bool
    """True when restored from the cache; False when booted and prepared here."""
    key: str
    """The cache key ("" when snapshots are off or cannot be used here)."""
    witness: object | None
    """The witness of the guest that was saved (None without a cache entry or witness)."""
    seconds: float
    how: str
    """How the guest got its state, for reports."""


def snapshots_dir() -> Path:
    """Where entries live: ``<cache>/snapshots``."""
    return cache_dir() / "snapshots"


def snapshots_unavailable() -> str:
    """Why guests cannot come from snapshots here ("" when they can)."""
    if settings().snapshots == "off":
        return f"${Settings.variable('snapshots')}=off"
    if shutil.which("lz4") is None:
        return "lz4 is not installed (scripts/install-deps installs it)"
    return ""


@cache
def qemu_digest(binary: str) -> str:
    """sha256 of the QEMU binary (a saved stream belongs to the QEMU that wrote it)."""
    path = shutil.which(binary)
    if path is None:
        raise DriverError(f"{binary} not found on PATH")
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@cache
def contract_digest() -> str:
    """sha256 of the instrumentation contract (a file of the package: read once)."""
    return hashlib.sha256(contract.CONTRACT_FILE.read_bytes()).hexdigest()


@cache
def host_cpu() -> str:
    """The host CPU's model and feature flags (``/proc/cpuinfo``, its first processor).

    Under KVM the guest's ``-cpu max`` is the host's CPU, so a guest saved on one CPU may use
    instructions another lacks; under TCG QEMU emulates the same CPU on any host.
    """
    wanted = ("vendor_id", "model name", "flags")
    lines = Path("/proc/cpuinfo").read_text().split("\n\n", 1)[0].splitlines()
    return "\n".join(line for line in lines if line.split(":", 1)[0].strip() in wanted)


def code_digest(*sources: object) -> str:
    """sha256 over the source of modules, classes or functions: the code that prepares a state
    is one of its inputs."""
    digest = hashlib.sha256()
    for source in sources:
        digest.update(inspect.getsource(source).encode())  # type: ignore[arg-type]
    return digest.hexdigest()


def file_stamps(machine: QemuMachine) -> dict[str, str]:
    """The size and modification time of every file the guest starts from (kernel, initrd,
    base disk, data disks), by path.

    The image cache names a build by the digest of its inputs, and rebuilds a pruned build at
    the same path; mmdebstrap and mkfs never write the same bytes twice, so a guest saved above
    the old disk would read a filesystem that is not the one it left (``build_cache.prune``).
    """
    files = [machine.kernel, machine.initrd, machine.base_disk, *machine.data_disks.values()]
    stamps: dict[str, str] = {}
    for path in files:
        if path is not None:
            info = path.stat() if path.exists() else None
            stamps[str(path)] = f"{info.st_size} {info.st_mtime_ns}" if info else "absent"
    return stamps


def snapshot_key(machine: QemuMachine, preparation: Preparation, accel: str) -> str:
    """The cache key of ``preparation`` on a guest like ``machine`` under ``accel``: its own
    inputs, its parent's key and the guest's, which the whole chain shares."""
    guest = {
        "format": ENTRY_FORMAT,
        "guest": machine.identity(accel),
        "files": file_stamps(machine),
        "qemu": qemu_digest(qemu_launch.QEMU_BINARY),
        "contract": contract_digest(),
        "host cpu": host_cpu() if accel == "kvm" else None,
    }
    key: str | None = None
    for step in preparation.chain:
        data = {**guest, "preparation": step.name, "inputs": step.inputs, "parent": key}
        key = hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:20]
    assert key is not None  # the chain holds the preparation itself
    return key


def prepare_guest(machine: QemuMachine, preparation: Preparation) -> PreparedGuest:
    """Start ``machine`` (not started yet) in ``preparation``'s state: restored from the cache,
    else booted, prepared and saved for the next time. ``machine`` is closed if this fails."""
    start = time.monotonic()
    why_not = snapshots_unavailable()
    accel = accel_choice.planned(machine.requested_accel, qemu_launch.QEMU_BINARY)
    if not why_not and machine.base_disk is None:
        why_not = "a NixOS VM: its run script shares the store over 9p, which QEMU cannot save"
    if not why_not and accel is None:
        why_not = "accel=auto without a KVM verdict yet: the probe decides at boot"
    try:
        if why_not or accel is None:
            names = " -> ".join(step.name for step in preparation.chain)
            with log.nested(f"booting and preparing {machine.name}: {names} ({why_not})"):
                machine.start()
                for step in preparation.chain:
                    step.prepare(machine)
            how = f"booted and prepared here (no snapshot: {why_not})"
            return PreparedGuest(machine, False, "", None, time.monotonic() - start, how)
        restored, key = _from_cache(machine, preparation, accel)
    except BaseException:
        machine.close()
        raise
    witness_file = snapshots_dir() / key / WITNESS_FILE
    witness = json.loads(witness_file.read_text()) if witness_file.is_file() else None
    how = (
        f"restored from the snapshot {key} of this preparation"
        if restored
        else f"booted and prepared here, then saved as the snapshot {key}"
    )
    return PreparedGuest(machine, restored, key, witness, time.monotonic() - start, how)


def _from_cache(machine: QemuMachine, preparation: Preparation, accel: str) -> tuple[bool, str]:
    """Bring ``machine`` into ``preparation``'s state through the cache; (restored?, key)."""
    key = snapshot_key(machine, preparation, accel)
    entry = snapshots_dir() / key
    if is_complete(entry):
        _restore(machine, preparation, entry)
        return True, key
    with file_lock(snapshots_dir() / f".lock-{key}", wait=False) as held:
        if held and is_complete(entry):  # another process saved it while we looked
            _restore(machine, preparation, entry)
            return True, key
        if preparation.parent is not None:
            _from_cache(machine, preparation.parent, accel)
        else:
            machine.start()
        with log.nested(f"preparing {machine.name}: {preparation.name}"):
            preparation.prepare(machine)
        if held:
            _save(machine, preparation, entry)
        else:
            log.info(f"another process is saving {preparation.name} ({key}); not saved here")
    return False, key


def _restore(machine: QemuMachine, preparation: Preparation, entry: Path) -> None:
    """Start ``machine`` from the saved guest in ``entry``."""
    with log.nested(f"restoring {machine.name}: {preparation.name} (snapshot {entry.name})"):
        os.utime(entry / MANIFEST)  # recently used: pruned last
        machine.restore_from = SavedGuest.load(entry)
        try:
            machine.start()
        except DriverError as error:
            raise DriverError(
                f"{machine.name} could not be restored from the snapshot {entry} "
                f"({preparation.name}); delete that directory to prepare it afresh: {error}"
            ) from error


def _save(machine: QemuMachine, preparation: Preparation, entry: Path) -> None:
    """Save ``machine`` into ``entry`` (atomically), with the witness of the saved state."""
    partial = partial_build(entry.parent, entry.name)
    shutil.rmtree(partial, ignore_errors=True)
    try:
        started = time.monotonic()
        machine.save(partial)
        seconds = time.monotonic() - started
        if preparation.witness is not None:
            witness = preparation.witness(machine)
            (partial / WITNESS_FILE).write_text(json.dumps(witness, indent=1, sort_keys=True))
        manifest = {"preparation": preparation.name, "save_seconds": round(seconds, 2)}
        (partial / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        os.replace(partial, entry)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    log.info(f"saved {preparation.name} as snapshot {entry.name} in {seconds:.1f}s")
    prune(snapshots_dir(), KEEP_SNAPSHOTS)
