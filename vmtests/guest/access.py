"""Reaching a booted QEMU guest over ssh with host key checking on.

The guest's host keys are read over the backdoor (an authenticated channel) and pinned in a
known_hosts file for the forwarded port, so the ssh backend is tested exactly as it runs on a
real host: strict host key checking, the suite's key, no shortcuts.
"""

from __future__ import annotations

from pathlib import Path

from vmtests.driver.qemu import QemuMachine
from vmtests.driver.ssh import SshMachine, write_known_hosts


def record_known_hosts(guest: QemuMachine, path: Path) -> Path:
    """Pin the guest's sshd host keys for ``127.0.0.1:<forwarded ssh port>`` in ``path``."""
    keys = guest.succeed("cat /etc/ssh/ssh_host_*_key.pub").splitlines()
    return write_known_hosts(path, "127.0.0.1", guest.ssh_port, keys)


def ssh_to_guest(
    guest: QemuMachine, state_dir: Path, user: str = "root", identity_file: Path | None = None
) -> SshMachine:
    """An ``SshMachine`` for ``guest``'s forwarded sshd, not yet started, logging in with
    ``identity_file`` (default: the guest's own ssh key)."""
    key = identity_file or guest.ssh_key
    if key is None:
        raise ValueError(f"{guest.name} has no ssh key configured")
    state_dir.mkdir(parents=True, exist_ok=True)
    known_hosts = record_known_hosts(guest, state_dir / "known_hosts")
    return SshMachine(
        host="127.0.0.1",
        port=guest.ssh_port,
        user=user,
        identity_file=key,
        known_hosts=known_hosts,
        name=f"{guest.name}-ssh",
    )
