"""The SSH backend: the same Machine API over the system ssh client, driven with pexpect.

One long-lived ``ssh -T host sh`` session carries the framed command protocol of
``vmtests.driver.shell`` (so rc, stdout and stderr come back separately, binary-safe, with a
guest-side timeout). Host key checking is on unless turned off explicitly (and logged). No
ControlMaster is used, and the ssh process dies with us (PR_SET_PDEATHSIG) or is closed.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shlex
import time
import tty
from pathlib import Path
from typing import Any

import pexpect

from vmtests.contracts.settings import settings
from vmtests.driver import procs
from vmtests.driver.errors import CommandFailed, DriverError, MachineGone, WaitTimeout
from vmtests.driver.log import log
from vmtests.driver.machine import (
    CommandResult,
    Machine,
)
from vmtests.driver.shell import POWEROFF_COMMAND, REBOOT_COMMAND, ShellChannel
from vmtests.driver.tools import require_tools

SUDO_PROMPT = "vmtests-sudo-password:"
DEFAULT_START_TIMEOUT = 120.0
FATAL_SSH_ERRORS = (
    "Host key verification failed",
    "REMOTE HOST IDENTIFICATION HAS CHANGED",
    "Permission denied",
)
"""ssh failures that retrying cannot fix: fail at once instead of waiting for the deadline."""


class _PexpectTransport:
    """``Transport`` over a pexpect-spawned ssh process (its pty is in raw mode)."""

    def __init__(self, child: Any, name: str) -> None:
        self.child = child
        self._name = name

    def send(self, data: bytes) -> None:
        """Write all of ``data`` to ssh's stdin."""
        view = memoryview(data)
        while view:
            try:
                written = os.write(self.child.child_fd, view)
            except OSError as error:
                raise MachineGone(f"{self._name}: ssh session closed ({error})") from error
            view = view[written:]

    def recv(self, timeout: float) -> bytes:
        """Return what ssh printed within ``timeout``; ``MachineGone`` when it exited."""
        try:
            data: bytes = self.child.read_nonblocking(1 << 20, timeout=max(0.0, timeout))
        except pexpect.TIMEOUT:
            return b""
        except pexpect.EOF as error:
            raise MachineGone(f"{self._name}: the ssh session ended") from error
        return data

    def describe_failure(self) -> str:
        """Whether ssh is still running (its own messages arrive in the stream tail)."""
        alive = self.child.isalive()
        return f"ssh process {'running' if alive else f'exited ({self.child.exitstatus})'}"


class SshMachine(Machine):
    """A host reached over ssh: a real P150 host or a guest's forwarded sshd."""

    def __init__(
        self,
        host: str,
        port: int = 22,
        user: str = "root",
        *,
        identity_file: Path | str | None = None,
        known_hosts: Path | str | None = None,
        strict_host_key_checking: bool = True,
        sudo: bool | None = None,
        sudo_password: str | None = None,
        connect_timeout: float | None = None,
        start_timeout: float = DEFAULT_START_TIMEOUT,
        name: str | None = None,
    ) -> None:
        self.host, self.port, self.user = host, port, user
        self.name = name or f"{user}@{host}:{port}"
        self.identity_file = Path(identity_file) if identity_file else None
        self.known_hosts = Path(known_hosts) if known_hosts else None
        self.strict_host_key_checking = strict_host_key_checking
        self.sudo = (user != "root") if sudo is None else sudo
        self.sudo_password = sudo_password
        self.connect_timeout = (
            settings().connect_timeout if connect_timeout is None else connect_timeout
        )
        self.start_timeout = start_timeout
        self._child: Any = None
        self._channel: ShellChannel | None = None
        self._pre_reboot_boot_id: str | None = None
        """The boot a pending reboot must end (None: no reboot pending)."""
        if not strict_host_key_checking:
            log.warning(
                f"{self.name}: host key checking is OFF (explicitly requested); "
                "the host's identity is not verified"
            )

    # ---- connection --------------------------------------------------------------------------

    def ssh_argv(self, remote_command: str) -> list[str]:
        """The ssh command line for ``remote_command`` (no ControlMaster, bounded waits)."""
        argv = [
            "ssh",
            "-T",
            "-p",
            str(self.port),
            "-o",
            "ControlMaster=no",
            "-o",
            "ControlPath=none",
            "-o",
            f"ConnectTimeout={max(1, int(self.connect_timeout))}",
            "-o",
            "ServerAliveInterval=5",
            "-o",
            "ServerAliveCountMax=3",
            "-o",
            "LogLevel=ERROR",
            "-o",
            "BatchMode=yes",
        ]
        if self.strict_host_key_checking:
            argv += ["-o", "StrictHostKeyChecking=yes"]
            if self.known_hosts is not None:
                argv += ["-o", f"UserKnownHostsFile={self.known_hosts}"]
        else:
            argv += ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"]
        if self.identity_file is not None:
            argv += ["-o", "IdentitiesOnly=yes", "-i", str(self.identity_file)]
        return [*argv, f"{self.user}@{self.host}", remote_command]

    def _remote_shell(self) -> str:
        """The remote command: a root ``sh`` reading our framed commands on stdin.

        Its own stderr is discarded: ssh merges it into our stream, where it could land in
        the middle of a frame (command stderr goes to files and comes back framed).
        """
        if not self.sudo:
            return "exec sh 2>/dev/null"
        inner = shlex.quote("exec sh 2>/dev/null")
        if self.sudo_password is None:
            return f"exec sudo -n sh -c {inner}"
        return f"exec sudo -S -p {shlex.quote(SUDO_PROMPT)} sh -c {inner}"

    def _connect_once(self, deadline: float) -> None:
        """Open one ssh session and prove it runs commands; raise ``DriverError`` otherwise."""
        self._disconnect()
        argv = self.ssh_argv(self._remote_shell())
        child = pexpect.spawn(
            argv[0], argv[1:], preexec_fn=procs.child_setup, echo=False, encoding=None
        )
        procs.register(child.pid, f"ssh {self.name}")
        tty.setraw(child.child_fd)  # no line discipline between us and ssh: bytes pass as-is
        self._child = child
        transport = _PexpectTransport(child, self.name)
        channel = ShellChannel(transport, f"{self.name} ssh")
        if self.sudo and self.sudo_password is not None:
            prompt = re.compile(re.escape(SUDO_PROMPT).encode())
            channel.wait_for(prompt, min(deadline, time.monotonic() + 30), "the sudo prompt")
            transport.send(self.sudo_password.encode() + b"\n")
        nonce = secrets.token_hex(8)
        transport.send(f"echo vmtests-ssh-ready-{nonce}\n".encode())
        ready = re.compile(f"vmtests-ssh-ready-{nonce}\r?\n".encode())
        channel.wait_for(ready, deadline, "the remote shell to answer")
        self._channel = channel

    def _connect(self, deadline: float, not_boot_id: str | None = None) -> None:
        """Connect, retrying until ``deadline``; skip a boot equal to ``not_boot_id``."""
        start = time.monotonic()
        last = "(no attempt finished)"
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WaitTimeout(f"ssh to {self.name} to answer", time.monotonic() - start, last)
            try:
                # slirp (and some proxies) accept TCP at once and then stall the banner while
                # the host is down, so bound the whole attempt, not just the TCP connect.
                self._connect_once(min(deadline, time.monotonic() + self.connect_timeout))
                if not_boot_id is None or self.boot_id() != not_boot_id:
                    return
                last = f"the old boot {not_boot_id} still answers"
            except DriverError as error:
                last = str(error)
                if any(marker in last for marker in FATAL_SSH_ERRORS):
                    self._disconnect()
                    raise DriverError(
                        f"ssh to {self.name} refused, not retrying:\n{last}"
                    ) from error
            self._disconnect()
            time.sleep(1.0)

    def _disconnect(self) -> None:
        """Close the ssh session (and its process) if one is open."""
        self._channel = None
        if self._child is not None:
            pid = self._child.pid
            with contextlib.suppress(Exception):  # a dead pty may raise on close
                self._child.close(force=True)
            procs.kill_group(pid)
            procs.unregister(pid)
            self._child = None

    # ---- Machine primitives ------------------------------------------------------------------

    def _start(self) -> None:
        """Connect (retrying for ``start_timeout``) and wait until commands run."""
        if self._channel is not None:
            return
        require_tools("ssh")
        with log.nested(f"connecting to {self.name} over ssh"):
            self._connect(time.monotonic() + self.start_timeout)

    @property
    def reboot_pending(self) -> bool:
        """True from a reboot request until a new boot answered (or the old session outlived
        the wait: the host did not go down): a Ctrl-C during the wait leaves it set (the old
        session may still answer while the host goes down)."""
        return self._pre_reboot_boot_id is not None

    def reconnect(self, timeout: float | None = None) -> None:
        """Open the session again after it dropped (at most ``timeout``, by default
        ``start_timeout``): the host keeps running what the old session started. With a reboot
        pending, only a new boot counts, as in ``reboot``."""
        deadline = time.monotonic() + (self.start_timeout if timeout is None else timeout)
        with log.nested(f"reconnecting to {self.name} over ssh"):
            self._disconnect()
            self._connect(deadline, not_boot_id=self._pre_reboot_boot_id)
        self._pre_reboot_boot_id = None

    def _run(self, command: str, timeout: float) -> CommandResult:
        """Run ``command`` as root (directly or via sudo); rc, stdout and stderr separately."""
        if self._channel is None:
            raise MachineGone(f"{self.name}: not connected (call start())")
        try:
            result = self._channel.run(command, timeout)
        except MachineGone:
            self._disconnect()
            raise
        log.info(f"{self.name}$ {command[:120]!s} -> rc={result.rc} ({result.duration:.2f}s)")
        return result

    def _shutdown(self, timeout: float) -> None:
        """Power the host off and wait until the session drops."""
        with log.nested(f"powering off {self.name}"):
            self.succeed(POWEROFF_COMMAND, timeout=30)
            self._wait_session_end(time.monotonic() + timeout)
            self._disconnect()

    def _crash(self) -> None:
        """Power off hard through magic SysRq ``o`` (no clean shutdown)."""
        with log.nested(f"crashing {self.name}"):
            channel = self._channel
            if channel is not None:
                channel.transport.send(
                    b"echo 1 > /proc/sys/kernel/sysrq; echo o > /proc/sysrq-trigger\n"
                )
            self._disconnect()

    def _wait_until_down(self, deadline: float) -> None:
        """Wait until the ssh session ends (the host went down), then close it."""
        self._wait_session_end(deadline)
        self._disconnect()

    def _issue_reboot(self) -> None:
        """Ask systemd to reboot (returns at once), remembering the boot that must end.

        The reboot is pending from before the request (an interrupted request may have reached
        the host) until a new boot answers; a request the host refused ends it."""
        self._pre_reboot_boot_id = self.boot_id()
        try:
            self.succeed(REBOOT_COMMAND, timeout=30)  # a refusal fails now, not at the timeout
        except CommandFailed:
            self._pre_reboot_boot_id = None
            raise

    def _wait_until_answering(self, deadline: float) -> None:
        """Wait for the old session to drop, then reconnect to a new boot by ``deadline``.

        An old session still open at ``deadline`` means the host did not go down (the session
        of a host going down ends within 15 s: ``ServerAliveInterval``, ``ServerAliveCountMax``):
        no reboot is pending then, and the old boot is the one a rollback must reach."""
        try:
            self._wait_session_end(deadline)
        except WaitTimeout:
            self._pre_reboot_boot_id = None
            raise
        self.reconnect(timeout=deadline - time.monotonic())

    def _wait_session_end(self, deadline: float) -> None:
        """Block until the current ssh session ends (the host went down) or ``deadline``."""
        child = self._child
        if child is None:
            return
        start = time.monotonic()
        while child.isalive():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WaitTimeout(
                    f"the ssh session to {self.name} to end (host going down)",
                    time.monotonic() - start,
                    "the session stayed open: the host did not go down",
                )
            try:
                child.read_nonblocking(1 << 16, timeout=min(remaining, 1.0))
            except pexpect.TIMEOUT:
                continue
            except pexpect.EOF:
                break

    # ---- lifecycle helpers -------------------------------------------------------------------

    def _close(self) -> None:
        """Close the ssh session; the host keeps running."""
        self._disconnect()


def write_known_hosts(path: Path, host: str, port: int, public_keys: list[str]) -> Path:
    """Write a known_hosts file pinning ``public_keys`` (``type base64``) for host:port."""
    name = host if port == 22 else f"[{host}]:{port}"
    lines = [f"{name} {' '.join(key.split()[:2])}" for key in public_keys if key.strip()]
    if not lines:
        raise DriverError(f"no host keys to pin for {name}")
    path.write_text("\n".join(lines) + "\n")
    return path
