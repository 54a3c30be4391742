"""The accelerator decision around a NixOS run script, without booting anything: the verdict's
key never runs the script, ``auto`` says why it cannot use KVM, and a guest asked to run under
KVM fails at once with QEMU's own words."""

from __future__ import annotations

import grp
import json
import os
import pwd
import shlex
import time
from pathlib import Path

import pytest

from vmtests.driver import accel
from vmtests.driver.errors import MachineGone
from vmtests.driver.qemu import QemuMachine
from vmtests.guest.targets import machine_from_target

# A QEMU stand-in: its version line, and under KVM what QEMU 7.2 prints when it cannot open
# /dev/kvm (QEMU accel/kvm/kvm-all.c, system/vl.c). As in QEMU, the last `-machine accel=`
# (or `-accel`) wins. It never runs a guest: under any other accelerator it exits at once.
FAKE_QEMU = """#!/bin/sh
[ "$1" = --version ] && { echo "QEMU emulator version 9.9.9 (vmtests stand-in)"; exit 0; }
accel= previous=
for arg in "$@"; do
  case "$previous" in
    -machine) case "$arg" in *accel=*) accel=${arg##*accel=}; accel=${accel%%,*} ;; esac ;;
    -accel) accel=${arg%%,*} ;;
  esac
  previous=$arg
done
if [ "$accel" = kvm ]; then
  echo "Could not access KVM kernel module: Permission denied" >&2
  echo "qemu-system-x86_64: failed to initialize kvm: Permission denied" >&2
  exit 1
fi
echo "qemu-system-x86_64: stand-in, would run under ${accel:-the default accelerator}" >&2
exit 3
"""

# What nixpkgs' run-<name>-vm script does before it execs QEMU
# (nixos/modules/virtualisation/qemu-vm.nix): create the disk image and copy the EFI variables
# in the current directory unless told otherwise, make a temporary directory, then
# `exec <qemu>/bin/qemu-system-x86_64 -machine accel=kvm:tcg -cpu max ... $QEMU_OPTS "$@"`.
# It also leaves a mark at an absolute path, so that any run of it shows.
RUN_VM = """#!/bin/sh
set -e
touch {ran}
NIX_DISK_IMAGE=$(readlink -f "${{NIX_DISK_IMAGE:-./vm-test.qcow2}}")
test -e "$NIX_DISK_IMAGE" || echo qcow2 > "$NIX_DISK_IMAGE"
NIX_EFI_VARS=$(readlink -f "${{NIX_EFI_VARS:-vm-test-base-efi-vars.fd}}")
test -e "$NIX_EFI_VARS" || echo efi > "$NIX_EFI_VARS"
if [ -z "$TMPDIR" ] || [ -z "$USE_TMPDIR" ]; then
    TMPDIR=$(mktemp -d nix-vm.XXXXXXXXXX --tmpdir)
fi
mkdir -p "$TMPDIR/xchg"
cd "$TMPDIR"
exec {exec_line} \\
    -name vm-test-base \\
    $QEMU_OPTS \\
    "$@"
"""


def _executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


@pytest.fixture
def fake_qemu(tmp_path: Path) -> Path:
    """The QEMU stand-in, at a store-like path ``.../bin/qemu-system-x86_64``."""
    qemu = tmp_path / "qemu-host-cpu-only-9.9.9" / "bin" / "qemu-system-x86_64"
    return _executable(qemu, FAKE_QEMU)


def _run_script(tmp_path: Path, exec_line: str) -> tuple[Path, Path]:
    """A run-vm script as nixpkgs writes it, ending in ``exec <exec_line>``; and its mark."""
    ran = tmp_path / "the-run-script-ran"
    script = _executable(
        tmp_path / "vm" / "bin" / "run-vm-test-base-vm",
        RUN_VM.format(ran=shlex.quote(str(ran)), exec_line=exec_line),
    )
    return script, ran


@pytest.fixture
def empty_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty current directory (where the run script would litter), and a private cache."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("VMTESTS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TMPDIR", str(cwd))  # mktemp --tmpdir would land here too
    return cwd


def test_the_verdict_key_of_a_run_script_is_its_qemu_and_the_script_never_runs(
    tmp_path: Path, fake_qemu: Path, empty_cwd: Path
) -> None:
    script, ran = _run_script(tmp_path, f"{fake_qemu} -machine accel=kvm:tcg -cpu max")
    key = accel.verdict_key(script, "qemu-system-x86_64")
    assert key.endswith("|QEMU emulator version 9.9.9 (vmtests stand-in)"), key
    assert accel.script_qemu(script) == str(fake_qemu)
    assert list(empty_cwd.iterdir()) == []
    assert not ran.exists()


def test_a_run_script_whose_qemu_cannot_be_read_is_keyed_by_its_store_path(
    tmp_path: Path, empty_cwd: Path
) -> None:
    script, ran = _run_script(tmp_path, '"$QEMU" -machine accel=kvm:tcg')
    link = tmp_path / "result-run-vm"
    link.symlink_to(script)
    key = accel.verdict_key(link, "qemu-system-x86_64")
    assert key.endswith(f"|run script {script.resolve()}"), key
    assert list(empty_cwd.iterdir()) == []
    assert not ran.exists()


def test_auto_keys_and_probes_a_run_script_without_littering_the_current_directory(
    tmp_path: Path, fake_qemu: Path, empty_cwd: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The path of ``vmtests run --target qemu-nixos:...`` under ``auto``: the verdict's key is
    the script's QEMU, and the probe (QEMU refuses KVM) runs the script with its files in the
    machine's state directory; the current directory stays empty throughout."""
    script, _ = _run_script(tmp_path, f"{fake_qemu} -machine accel=kvm:tcg -cpu max")
    monkeypatch.setattr(accel, "kvm_usable", lambda: True)
    machine = machine_from_target(f"qemu-nixos:{script}", tmp_path / "state", accel="auto")
    assert isinstance(machine, QemuMachine)
    assert machine.choose_accel() == "tcg"
    assert list(empty_cwd.iterdir()) == []
    verdict = json.loads(accel.verdict_file().read_text())
    assert verdict["key"].endswith("|QEMU emulator version 9.9.9 (vmtests stand-in)"), verdict
    assert verdict["usable"] is False
    assert "failed to initialize kvm: Permission denied" in machine.acceleration["why"]

    # A second machine reads that verdict and launches nothing.
    again = machine_from_target(f"qemu-nixos:{script}", tmp_path / "again", accel="auto")
    assert isinstance(again, QemuMachine)
    assert again.choose_accel() == "tcg"
    assert again.acceleration["why"].startswith("KVM failed on this host before (QEMU failed")
    assert not (tmp_path / "again" / "qemu-stderr.log").exists()
    assert list(empty_cwd.iterdir()) == []


@pytest.mark.parametrize("device_exists", [True, False])
def test_auto_says_why_it_cannot_use_kvm(
    tmp_path: Path,
    fake_qemu: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    device_exists: bool,
) -> None:
    """A Nix builder whose sandbox lost the kvm group: TCG, and the log and report say why."""
    device = tmp_path / "dev-kvm"
    if device_exists:
        device.write_text("")
        device.chmod(0o660)
    monkeypatch.setattr(accel, "KVM_DEVICE", device)
    monkeypatch.setattr(accel, "kvm_usable", lambda: False)
    script, ran = _run_script(tmp_path, f"{fake_qemu} -machine accel=kvm:tcg -cpu max")
    machine = QemuMachine("nixos", tmp_path / "state", run_script=script, accel="auto")
    assert machine.choose_accel() == "tcg"
    owner = f"{pwd.getpwuid(os.getuid()).pw_name}:{grp.getgrgid(os.getgid()).gr_name}"
    why = f"{device} is {owner} 0660, and this process" if device_exists else "does not exist"
    logged = capsys.readouterr().err
    assert f"WARNING: nixos: {device}" in logged
    assert why in logged
    assert machine.acceleration == {
        "requested": "auto",
        "used": "",  # nothing launched yet
        "why": machine.accel_reason,
    }
    assert why in machine.accel_reason
    assert machine.accel_reason.endswith(": using TCG")
    assert not ran.exists()


def test_a_guest_asked_to_run_under_kvm_fails_at_once_with_qemus_own_error(
    tmp_path: Path, fake_qemu: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What ``nix flake check`` does on a builder that cannot open /dev/kvm: it asks for KVM
    ($VMTESTS_ACCEL=kvm) and the run ends in seconds, its first line saying what QEMU said."""
    script, _ = _run_script(tmp_path, f"{fake_qemu} -machine accel=kvm:tcg -cpu max")
    monkeypatch.setenv("VMTESTS_ACCEL", "kvm")
    machine = machine_from_target(f"qemu-nixos:{script}", tmp_path / "state")
    assert isinstance(machine, QemuMachine)
    started = time.monotonic()
    with pytest.raises(MachineGone) as caught:
        machine.start()
    assert time.monotonic() - started < 30
    first, _, evidence = str(caught.value).partition("\n")
    assert first == (
        "vm-test-base: QEMU did not start under KVM, which was asked for by $VMTESTS_ACCEL "
        "(accel=kvm); QEMU said: qemu-system-x86_64: failed to initialize kvm: Permission denied"
    )
    assert "Could not access KVM kernel module: Permission denied" in evidence
    assert machine.acceleration["requested"] == "kvm"
    assert not machine.process_running
