"""The SSH backend against the reference guest: framing, host keys, sudo, no leftovers."""

from __future__ import annotations

import hashlib
import shlex
import subprocess
from pathlib import Path

import pytest
from driver_support import processes_matching

from vmtests.driver.errors import DriverError, WaitTimeout
from vmtests.driver.qemu import QemuMachine
from vmtests.driver.ssh import SshMachine, write_known_hosts
from vmtests.guest.access import record_known_hosts

pytestmark = pytest.mark.vm


@pytest.mark.parametrize("code", [0, 1, 127, 255])
def test_ssh_exit_codes_and_separate_streams(guest_ssh: SshMachine, code: int) -> None:
    result = guest_ssh.execute(f"echo out; echo err >&2; exit {code}")
    assert (result.rc, result.stdout, result.stderr) == (code, b"out\n", b"err\n")


def test_ssh_one_mebibyte_and_timeout(guest_ssh: SshMachine) -> None:
    result = guest_ssh.execute(
        "head -c 1048576 /dev/urandom > /tmp/mib; sha256sum < /tmp/mib | cut -d' ' -f1 >&2;"
        " cat /tmp/mib"
    )
    assert hashlib.sha256(result.stdout).hexdigest() == result.stderr.decode().strip()
    with pytest.raises(WaitTimeout):
        guest_ssh.execute("sleep 317", timeout=2)
    assert guest_ssh.succeed("echo usable") == "usable\n"


def test_ssh_refuses_a_host_whose_key_does_not_match(
    shared_guest: QemuMachine, tmp_path: Path
) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "impostor")],
        check=True,
    )
    impostor = (tmp_path / "impostor.pub").read_text()
    known_hosts = write_known_hosts(
        tmp_path / "known_hosts", "127.0.0.1", shared_guest.ssh_port, [impostor]
    )
    machine = SshMachine(
        "127.0.0.1",
        shared_guest.ssh_port,
        identity_file=shared_guest.ssh_key,
        known_hosts=known_hosts,
        start_timeout=20,
    )
    with pytest.raises(DriverError, match="not retrying") as caught:
        machine.start()  # at once: a wrong host key is not a reason to keep trying
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in str(caught.value) or (
        "Host key verification failed" in str(caught.value)
    )
    assert not processes_matching(str(known_hosts))


def test_turning_host_key_checking_off_is_explicit_and_logged(
    shared_guest: QemuMachine, capsys: pytest.CaptureFixture[str]
) -> None:
    machine = SshMachine(
        "127.0.0.1",
        shared_guest.ssh_port,
        identity_file=shared_guest.ssh_key,
        strict_host_key_checking=False,
    )
    assert "host key checking is OFF" in capsys.readouterr().err
    with machine:
        assert machine.succeed("id -u") == "0\n"


def test_no_ssh_process_is_left_after_close(shared_guest: QemuMachine, tmp_path: Path) -> None:
    known_hosts = record_known_hosts(shared_guest, tmp_path / "known_hosts")
    machine = SshMachine(
        "127.0.0.1",
        shared_guest.ssh_port,
        identity_file=shared_guest.ssh_key,
        known_hosts=known_hosts,
    )
    seen_inside: list[bool] = []

    def fail_inside_a_session() -> None:
        with machine:
            seen_inside.append(bool(processes_matching(str(known_hosts))))
            raise RuntimeError("a failure inside the block")

    # The Machine context manager starts the session and closes it, even when the block raises.
    with pytest.raises(RuntimeError, match="inside the block"):
        fail_inside_a_session()
    assert seen_inside == [True]  # the session really was an ssh process
    assert not processes_matching(str(known_hosts))


@pytest.mark.parametrize("password", [None, "vmtests-sudo-pw"], ids=["nopasswd", "password"])
def test_sudo_runs_commands_as_root(
    shared_guest: QemuMachine, tmp_path: Path, password: str | None
) -> None:
    user = "vmtsudo"
    rule = f"{user} ALL=(ALL) " + ("NOPASSWD: ALL" if password is None else "ALL")
    shared_guest.succeed(
        f"id {user} >/dev/null 2>&1 || useradd -m {user};"
        f" echo {user}:{password or 'unused-pw'} | chpasswd;"
        f" mkdir -p /home/{user}/.ssh && cp /root/.ssh/authorized_keys /home/{user}/.ssh/ &&"
        f" chown -R {user} /home/{user}/.ssh;"
        f" echo {shlex.quote(rule)} > /etc/sudoers.d/vmtests && chmod 440 /etc/sudoers.d/vmtests"
    )
    machine = SshMachine(
        "127.0.0.1",
        shared_guest.ssh_port,
        user=user,
        identity_file=shared_guest.ssh_key,
        known_hosts=record_known_hosts(shared_guest, tmp_path / "known_hosts"),
        sudo_password=password,
    )
    try:
        with machine:
            assert machine.sudo
            assert machine.succeed("id -u") == "0\n"
            result = machine.execute("echo as-root >&2; exit 4")
            assert (result.rc, result.stderr) == (4, b"as-root\n")
    finally:
        shared_guest.succeed("rm -f /etc/sudoers.d/vmtests")
