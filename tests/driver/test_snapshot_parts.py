"""The parts of saving and restoring a guest that need no guest: the clock step, the command
line that identifies a guest, a saved guest's files, and the console a restore starts from."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import pytest

from vmtests.driver.console import SerialConsole
from vmtests.driver.errors import DriverError
from vmtests.driver.qemu import QemuMachine
from vmtests.driver.qemu_launch import identity_argv
from vmtests.driver.qemu_snapshot import SavedGuest, clock_step_command


def _clock_step_in_a_shell(seconds: float, now_ns: int, tmp_path: Path) -> str:
    """What ``clock_step_command(seconds)`` asks ``date`` to set, with the guest's clock at
    ``now_ns`` (a shell function stands in for ``date``: the host's clock stays alone)."""
    record = tmp_path / "set"
    fake = (
        f'date() {{ if [ "$1" = "+%s%N" ]; then echo {now_ns}; else echo "$@" > {record}; fi; }}; '
    )
    subprocess.run(["bash", "-c", fake + clock_step_command(seconds)], check=True)
    return record.read_text().strip()


@pytest.mark.parametrize(
    ("seconds", "now_ns", "expected"),
    [
        (5.0, 1_000_000_000_123_456_789, "-u -s @1000000005.123456789"),
        (0.9, 1_796_193_359_413_358_570, "-u -s @1796193360.313358570"),
        (86400.000001, 1_000_000_000_000_000_001, "-u -s @1000086400.000001001"),
    ],
)
def test_the_clock_moves_on_from_the_guests_own_reading(
    seconds: float, now_ns: int, expected: str, tmp_path: Path
) -> None:
    assert _clock_step_in_a_shell(seconds, now_ns, tmp_path) == expected


def _guest(tmp_path: Path, name: str, **options: object) -> QemuMachine:
    files = {part: tmp_path / part for part in ("vmlinuz", "initrd", "disk.raw")}
    return QemuMachine(
        name,
        tmp_path / name,
        kernel=files["vmlinuz"],
        initrd=files["initrd"],
        base_disk=files["disk.raw"],
        append="console=ttyS0",
        **options,  # type: ignore[arg-type]
    )


def test_a_guests_identity_leaves_out_what_each_run_chooses(tmp_path: Path) -> None:
    one = _guest(tmp_path, "one", forward_ports=(8000,))
    other = _guest(tmp_path, "other", memory_mb=4096)
    identity = one.identity("tcg")
    assert identity == _guest(tmp_path, "one-again").identity("tcg")
    text = " ".join(identity)
    for chosen in (one.marker, str(one.state_dir), "thread=", "hostfwd", "/tmp/vmt-"):
        assert chosen not in text
    assert "-incoming" not in identity
    assert f"<overlay of {tmp_path / 'disk.raw'}>" in text  # the base image (content-addressed)
    assert identity != other.identity("tcg")  # other memory
    assert identity != one.identity("kvm")


def test_identity_argv_drops_only_the_thread_mode() -> None:
    argv = ["qemu", "-accel", "tcg,thread=single", "-cpu", "max", "-name", "tcg,thread=multi"]
    assert identity_argv(argv) == ["qemu", "-accel", "tcg", "-cpu", "max", "-name", "tcg"]


def test_a_saved_guest_names_the_files_it_lacks(tmp_path: Path) -> None:
    (tmp_path / "disk.qcow2").write_bytes(b"")
    with pytest.raises(DriverError) as caught:
        SavedGuest.load(tmp_path)
    message = str(caught.value)
    assert "memory.lz4" in message
    assert "console.log" in message
    assert "state.json" in message
    assert "disk.qcow2" not in message


def test_the_console_of_a_boot_comes_back_whole(tmp_path: Path) -> None:
    console = SerialConsole(tmp_path / "saved")
    first = b"firmware\r\n[    0.000000] Linux version 6.1 (one)\r\nbackdoor ready\r\n"
    second = b"[    0.000000] Linux version 6.1 (two)\r\nagain\r\n"
    console.feed(first)
    console.feed(second)
    assert console.raw(0) == first
    assert console.raw(1) == second
    assert console.raw(2) == b""
    restored = SerialConsole(tmp_path / "restored")
    restored.feed(console.raw(1))
    restored.feed(b"after the restore\r\n")
    assert restored.boot_count == 1
    assert restored.text(0) == "[    0.000000] Linux version 6.1 (two)\nagain\nafter the restore\n"


def test_waiting_for_a_quiet_console_is_bounded(tmp_path: Path) -> None:
    console = SerialConsole(tmp_path)
    assert console.wait_quiet(0.05, timeout=1.0)
    start = time.monotonic()
    stop = start + 0.6

    def chatter() -> None:
        while time.monotonic() < stop:
            console.feed(b"x")
            time.sleep(0.01)

    thread = threading.Thread(target=chatter)
    thread.start()
    try:
        assert not console.wait_quiet(0.2, timeout=0.3)
    finally:
        thread.join()
    assert time.monotonic() - start < 1.0
