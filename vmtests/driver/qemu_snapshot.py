"""A running QEMU guest saved to files, and restored from them into a fresh QEMU process.

A saved guest is a directory:

- ``memory.lz4``: QEMU's migration stream (memory and device state), written by QMP
  ``migrate`` to ``exec:lz4`` while the guest is paused, and read back with ``-incoming``;
- ``disk.qcow2``: the guest's disk at the same instant, everything above its base image, with
  that image as backing file; every restore gets a fresh qcow2 overlay on it, so any number of
  restores share it read-only;
- ``console.log``: the serial console of the running boot up to the save;
- ``state.json``: the boot ID, the accelerator and the host's wall clock when the guest paused.

A restore is never a reboot: the same boot goes on, with the same boot ID, journal and
processes. What changed while it was saved is put right on the first command: the guest's wall
clock advances by the time it spent paused (its clock stood still with its virtual time), the
backdoor and console reattach to the new QEMU's sockets, and the forwarded ports are the new
QEMU's. Why a migration stream and not ``savevm``, and what it costs: docs/ci-time.md.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from vmtests.driver.console import SerialConsole
from vmtests.driver.errors import DriverError, MachineGone, WaitTimeout
from vmtests.driver.log import log
from vmtests.driver.qemu_process import QemuProcess
from vmtests.driver.shell import ShellChannel
from vmtests.driver.tools import require_tools

MEMORY_FILE = "memory.lz4"
DISK_FILE = "disk.qcow2"
CONSOLE_FILE = "console.log"
STATE_FILE = "state.json"
SAVE_TIMEOUT = 600.0
"""Seconds a save may take; it takes seconds (docs/ci-time.md)."""
POLL = 0.05
UNTHROTTLED = 1 << 40
"""Migration bandwidth in bytes per second: QEMU's default throttles to 128 MiB/s, which is
meant for a network, not for a local file."""
LOADED_STATES = ("paused", "running", "postmigrate")
"""Run states of a QEMU that has finished loading its incoming stream."""
BOOT_ID_COMMAND = "cat /proc/sys/kernel/random/boot_id"


@dataclass(frozen=True)
class SavedGuest:
    """A guest saved by ``save``: its files and what a restore must know."""

    directory: Path
    boot_id: str
    accel: str
    paused_at: float
    """The host's wall clock (``time.time()``) when the guest paused for the save."""

    @property
    def memory(self) -> Path:
        """The migration stream (lz4)."""
        return self.directory / MEMORY_FILE

    @property
    def disk(self) -> Path:
        """The guest's disk above its base image (qcow2, the base image as backing file)."""
        return self.directory / DISK_FILE

    @property
    def incoming_uri(self) -> str:
        """The ``-incoming`` URI that reads the migration stream."""
        return f"exec:lz4 -d -c -q {shlex.quote(str(self.memory))}"

    def console_bytes(self) -> bytes:
        """The console of the saved boot up to the save."""
        return (self.directory / CONSOLE_FILE).read_bytes()

    @classmethod
    def load(cls, directory: Path) -> SavedGuest:
        """The saved guest in ``directory`` (``DriverError`` when a file is missing)."""
        missing = [
            name
            for name in (MEMORY_FILE, DISK_FILE, CONSOLE_FILE, STATE_FILE)
            if not (directory / name).is_file()
        ]
        if missing:
            raise DriverError(f"saved guest {directory} lacks {', '.join(missing)}")
        state = json.loads((directory / STATE_FILE).read_text())
        return cls(directory, str(state["boot_id"]), str(state["accel"]), float(state["paused_at"]))


def clock_step_command(seconds: float) -> str:
    """A guest command that moves the wall clock forward by ``seconds`` from its own reading.

    Relative, so the command's own latency (seconds right after a restore, when every code
    path is translated afresh under TCG) does not count. Arithmetic in nanoseconds (64-bit in
    every POSIX shell the guests run).
    """
    step = int(seconds * 1e9)
    return (
        f"t=$(( $(date +%s%N) + {step} )); "
        'date -u -s "@$((t / 1000000000)).$(printf %09d $((t % 1000000000)))" > /dev/null'
    )


def save(
    process: QemuProcess,
    console: tuple[SerialConsole, int],
    disks: tuple[Path, Path],
    accel: str,
    directory: Path,
) -> SavedGuest:
    """Save the guest of ``process`` into ``directory`` (created) and let it go on.

    ``console`` is its capture and the running boot's index in it; ``disks`` its overlay and the
    base image below. The guest pauses; its memory and devices go to the stream, its disk to a
    qcow2 of its own above the base image; then it continues, its clock moved on by the pause.
    """
    require_tools("lz4", "qemu-img")
    channel = _channel(process)
    capture, boot_index = console
    overlay, base_disk = disks
    directory.mkdir(parents=True, exist_ok=True)
    boot_id = channel.run(BOOT_ID_COMMAND, 30).stdout_text.strip()
    memory = directory / MEMORY_FILE
    with log.nested(f"saving the guest into {directory}"):
        process.qmp_call("migrate-set-parameters", **{"max-bandwidth": UNTHROTTLED})
        paused_at = time.time()
        process.qmp_call("stop")
        try:
            # The last console bytes before the pause belong to the saved boot.
            capture.wait_quiet(0.2, timeout=2.0)
            process.qmp_call("migrate", uri=f"exec:lz4 -1 -q > {shlex.quote(str(memory))}")
            _wait_for_migration(process, SAVE_TIMEOUT)
            # QEMU flushed and released the disk at the end of the migration: it is the state.
            _copy_above(overlay, base_disk, directory / DISK_FILE)
        finally:
            process.qmp_call("cont")
            channel.run(clock_step_command(time.time() - paused_at), 30)
        (directory / CONSOLE_FILE).write_bytes(capture.raw(boot_index))
        state = {"boot_id": boot_id, "accel": accel, "paused_at": paused_at}
        (directory / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")
    return SavedGuest(directory, boot_id, accel, paused_at)


def _copy_above(overlay: Path, base_disk: Path, target: Path) -> None:
    """Write the disk of ``overlay`` (through its whole chain) as a qcow2 above ``base_disk``.

    The copy names only the base image as backing file, whichever chain the guest ran on: a
    guest restored from another saved guest runs on an overlay of that guest's disk, and the
    copy then takes in what that disk held (``qemu-img rebase`` in its safe mode, which writes
    every cluster that differs from the new backing file).
    """
    shutil.copyfile(overlay, target)
    info = _qemu_img("info", "-U", "--output=json", str(target))
    if Path(json.loads(info).get("backing-filename", "")) != base_disk:
        _qemu_img("rebase", "-U", "-f", "qcow2", "-b", str(base_disk), "-F", "raw", str(target))


def _qemu_img(*arguments: str) -> str:
    """Run ``qemu-img`` (bounded by ``SAVE_TIMEOUT``); its stdout, or ``DriverError``."""
    command = ["qemu-img", *arguments]
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=SAVE_TIMEOUT, check=False
    )
    if result.returncode != 0:
        raise DriverError(f"saving the guest's disk failed: {command}\n{result.stderr[-2000:]}")
    return result.stdout


def _wait_for_migration(process: QemuProcess, timeout: float) -> None:
    """Poll ``query-migrate`` until the stream is written; raise with QEMU's reason if not."""
    start = time.monotonic()
    status: dict[str, object] = {}
    while time.monotonic() - start < timeout:
        status = process.qmp_call("query-migrate")
        if status.get("status") == "completed":
            return
        if status.get("status") in ("failed", "cancelled"):
            raise DriverError(
                f"saving the guest failed: {status.get('error-desc', status)}\n"
                f"--- QEMU stderr ---\n{process.stderr_tail() or '(empty)'}"
            )
        time.sleep(POLL)
    raise WaitTimeout("the guest's memory to be written to its file", timeout, str(status))


def resume(process: QemuProcess, saved: SavedGuest, deadline: float) -> str:
    """Finish a restore: wait until QEMU has loaded ``saved``, let the guest run, put its
    clock right and check that the saved boot answers; return its boot ID."""
    start = time.monotonic()
    state = ""
    with log.nested("loading the saved memory"):
        while (state := process.run_state()) not in LOADED_STATES:
            if not process.running:
                raise MachineGone(
                    f"QEMU exited while loading {saved.memory}\n--- QEMU stderr ---\n"
                    f"{process.stderr_tail() or '(empty)'}"
                )
            if time.monotonic() >= deadline:
                raise WaitTimeout(
                    f"QEMU to load the saved guest {saved.directory}",
                    time.monotonic() - start,
                    f"run state {state or '(unknown)'}\n{process.stderr_tail()}",
                )
            time.sleep(POLL)
    if state != "running":  # the guest was paused when it was saved
        process.qmp_call("cont")
    step = time.time() - saved.paused_at
    with log.nested(f"first command: the clock moves on by {step:.1f} s"):
        result = _channel(process).run(
            f"{clock_step_command(step)} && {BOOT_ID_COMMAND}",
            max(1.0, deadline - time.monotonic()),
        )
    boot_id = result.stdout_text.strip()
    if result.rc != 0 or boot_id != saved.boot_id:
        raise DriverError(
            f"the restored guest is not the saved boot {saved.boot_id}: rc={result.rc}, "
            f"boot ID {boot_id!r}, stderr {result.stderr_text.strip()!r}"
        )
    return boot_id


def _channel(process: QemuProcess) -> ShellChannel:
    if process.channel is None:
        raise MachineGone("QEMU's backdoor is not connected")
    return process.channel
