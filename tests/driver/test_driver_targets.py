"""Target strings, and the NixOS run-script launcher driven through a stand-in run-vm script."""

from __future__ import annotations

import shlex
import socket
from pathlib import Path

import pytest

from vmtests.driver.qemu import QemuMachine
from vmtests.driver.ssh import SshMachine
from vmtests.guest.image import ReferenceImage
from vmtests.guest.targets import TargetError, machine_from_target, parse_ssh_target


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("ssh://host", (None, "host", 22)),
        ("ssh://admin@cfx-llm2:2222", ("admin", "cfx-llm2", 2222)),
        ("ssh://root@[fe80::1]:22", ("root", "fe80::1", 22)),
    ],
)
def test_parse_ssh_target(target: str, expected: tuple[str | None, str, int]) -> None:
    assert parse_ssh_target(target) == expected


@pytest.mark.parametrize("target", ["ssh://", "ssh://a@b:port", "qemu:nope", "http://x"])
def test_bad_targets_are_refused(target: str, tmp_path: Path) -> None:
    with pytest.raises(TargetError):
        machine_from_target(target, tmp_path)


def test_ssh_target_options(tmp_path: Path) -> None:
    machine = machine_from_target(
        "ssh://ops@example.invalid:2200",
        tmp_path,
        identity_file=tmp_path / "key",
        known_hosts=tmp_path / "known_hosts",
        sudo_password="pw",
    )
    assert isinstance(machine, SshMachine)
    assert machine.sudo  # not root: sudo by default
    argv = machine.ssh_argv("true")
    assert argv[argv.index("-p") : argv.index("-p") + 2] == ["-p", "2200"]
    assert "StrictHostKeyChecking=yes" in argv
    assert f"UserKnownHostsFile={tmp_path / 'known_hosts'}" in argv
    assert "ControlMaster=no" in argv
    assert argv[-2:] == ["ops@example.invalid", "true"]
    with pytest.raises(TargetError, match="memory_mb"):
        machine_from_target("ssh://host", tmp_path, memory_mb=1)


# A stand-in for nixpkgs' result/bin/run-NAME-vm: the same environment contract (creates
# $NIX_DISK_IMAGE on first use, -netdev user,...,$QEMU_NET_OPTS, then $QEMU_OPTS "$@", exec) and
# the same qemu-kvm style "-machine accel=kvm:tcg" and -nographic that our options must override.
RUN_VM = """#!/bin/sh
set -e
test -n "$USE_TMPDIR" && test -d "$TMPDIR"
NIX_DISK_IMAGE=$(readlink -f "$NIX_DISK_IMAGE")
if ! test -e "$NIX_DISK_IMAGE"; then
  qemu-img create -q -f qcow2 -F raw -b {disk} "$NIX_DISK_IMAGE"
fi
exec qemu-system-x86_64 -machine accel=kvm:tcg -cpu max -name standin -m 1024 -smp 1 \\
  -nographic -device virtio-rng-pci \\
  -netdev user,id=user.0,"$QEMU_NET_OPTS" -device virtio-net-pci,netdev=user.0 \\
  -drive file="$NIX_DISK_IMAGE",if=virtio,format=qcow2 \\
  -kernel {kernel} -initrd {initrd} -append {append} \\
  $QEMU_OPTS "$@"
"""


@pytest.mark.nightly
@pytest.mark.vm
def test_nixos_mode_boots_through_a_run_vm_script(
    reference_image: ReferenceImage, tmp_path: Path
) -> None:
    script = tmp_path / "run-standin-vm"
    script.write_text(
        RUN_VM.format(
            disk=shlex.quote(str(reference_image.disk)),
            kernel=shlex.quote(str(reference_image.kernel)),
            initrd=shlex.quote(str(reference_image.initrd)),
            append=shlex.quote(reference_image.append),
        )
    )
    script.chmod(0o755)
    machine = machine_from_target(
        f"qemu-nixos:{script}", tmp_path / "state", accel="tcg", forward_ports=(8000,)
    )
    assert isinstance(machine, QemuMachine)
    assert machine.name == "standin"
    with machine:
        assert machine.succeed("echo up") == "up\n"
        assert machine.overlay.exists()  # $NIX_DISK_IMAGE points into our state dir
        # Port forwards from $QEMU_NET_OPTS reach the guest's sshd from the host.
        machine.wait_for_unit("ssh.service", timeout=120)
        with socket.create_connection(("127.0.0.1", machine.ssh_port), timeout=30) as conn:
            conn.settimeout(30)
            assert conn.recv(64).startswith(b"SSH-2.0-")
        new = machine.reboot()
        assert machine.boot_id() == new
