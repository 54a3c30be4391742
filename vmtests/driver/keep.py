"""Keeping a failed run's QEMU guest for a person to look at: ``--keep``, ``attach``, ``stop``.

Every QEMU dies with the session (``vmtests.driver.procs``), and its parent-death signal cannot
be taken back once QEMU runs. So a run that may keep its guest (``requested``) starts each QEMU
under a keeper (``vmtests.driver.keeper``): a small process of its own session that is QEMU's
parent. The keeper kills QEMU as soon as its control pipe from the run closes without a ``keep``
line (the run ended, was interrupted or was SIGKILLed): nothing outlives the session unless the
person asked for it. Told to keep (``hand_over``), it lets the session go, and it powers the
guest off itself when the time limit passes (``stop_kept``), even when the person's shell is
gone. Host side on purpose: it works with a hung guest, a guest without systemd, and a guest
whose clock is wrong, where a ``systemd-run --on-active=... poweroff`` inside it would not.

The state file (``STATE_FILE``, JSON) names everything: the keeper and QEMU processes, the QMP
socket, the forwarded ports, the ssh key, the time limit and the paths ``stop_kept`` removes.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from vmtests.driver import procs
from vmtests.driver.errors import DriverError

STATE_FILE = "kept.json"
"""The name of the state file in a kept run's state directory."""
DEFAULT_KEEP_FOR = 3600.0
"""Seconds a kept guest runs before its keeper powers it off (``--keep-for``)."""
POWERDOWN_GRACE = 60.0
"""Seconds the guest gets to power off after QMP ``system_powerdown`` before ``quit``."""
POWEROFF_REQUEST_TIMEOUT = 30.0
"""Seconds the ssh ``systemctl poweroff`` request may take (``stop_kept``)."""
QUIT_GRACE = 10.0
"""Seconds QEMU gets to exit after QMP ``quit`` before it is killed."""
KEEP_LINE = "keep"
"""The control line's first word (``keep SECONDS STATE_FILE``) the keeper waits for."""

_requested = False


@dataclass
class KeptState:
    """What a kept guest left running and where (the state file's content)."""

    name: str
    target: str
    keeper_pid: int
    keeper_start: str
    qemu_pid: int
    qemu_start: str
    qmp_socket: str
    forwards: dict[str, int]
    ssh_port: int
    ssh_key: str | None
    known_hosts: str | None
    keep_for: float
    until: float
    """Wall-clock time (seconds since the epoch) at which the keeper powers the guest off."""
    remove: list[str] = field(default_factory=list)
    """Paths ``stop_kept`` removes once QEMU has ended (the state directory among them)."""
    user: str = "root"


def requested() -> bool:
    """True while a run that may keep its guest is going on (QEMU starts under a keeper)."""
    return _requested


@contextlib.contextmanager
def keeping(wanted: bool = True) -> Iterator[None]:
    """Within this block, QEMU starts under a keeper when ``wanted`` (``--keep``)."""
    global _requested  # noqa: PLW0603  (process-wide, like procs' registry)
    before, _requested = _requested, wanted or _requested
    try:
        yield
    finally:
        _requested = before


def keeper_argv(argv: Sequence[str]) -> list[str]:
    """The command line that runs ``argv`` (QEMU) under a keeper."""
    return [sys.executable, "-m", "vmtests.driver.keeper", "--", *argv]


def spawn_kept(argv: Sequence[str], what: str, **popen_kwargs: Any) -> subprocess.Popen[bytes]:
    """Start ``argv`` under a keeper whose control pipe is the returned process's stdin.

    The keeper has no parent-death signal (it must be able to outlive the run); the closing
    control pipe is what ends it and QEMU with the run instead. It is registered like every
    child, so the exit-time cleanup kills its process group (QEMU with it).
    """
    popen_kwargs["stdin"] = subprocess.PIPE
    # The keeper imports this package from where the run imported it, whatever the cwd.
    env = dict(popen_kwargs.pop("env", None) or os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, (str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH")))
    )
    popen_kwargs["env"] = env
    return procs.spawn(keeper_argv(argv), what, die_with_parent=False, **popen_kwargs)


def is_kept_process(proc: subprocess.Popen[bytes]) -> bool:
    """True if ``proc`` is a keeper started by ``spawn_kept``."""
    args = proc.args
    return isinstance(args, list) and args[:3] == keeper_argv([])[:3]


def start_time(pid: int) -> str:
    """The start time of ``pid`` (clock ticks since boot, ``/proc/PID/stat``); "" if it is gone.

    Recorded with every pid so that a later ``stop`` never signals a process that merely
    reuses the number.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    # The command name (field 2) may hold spaces and parentheses: count from the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    return fields[19] if fields[0] != "Z" else ""


def alive(pid: int, started: str) -> bool:
    """True if the process recorded as ``pid`` started at ``started`` still runs (no zombie)."""
    return bool(started) and start_time(pid) == started


def qemu_child(keeper_pid: int, timeout: float = 10.0) -> int:
    """The pid of the keeper's child (QEMU, or the NixOS run script that ``exec``s it)."""
    deadline = time.monotonic() + timeout
    seen = ""
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            seen = Path(f"/proc/{keeper_pid}/task/{keeper_pid}/children").read_text().strip()
            if seen:
                return int(seen.split()[0])
        time.sleep(0.05)
    raise DriverError(
        f"the keeper (pid {keeper_pid}) has no child after {timeout:.0f}s (children: {seen!r})"
    )


def hand_over(proc: subprocess.Popen[bytes], keep_for: float, state_file: Path) -> None:
    """Tell the keeper ``proc`` to keep its QEMU for ``keep_for`` seconds and let it go: the
    session's cleanup no longer kills it."""
    if proc.stdin is None:
        raise DriverError(f"pid {proc.pid} is not a keeper (no control pipe)")
    try:
        proc.stdin.write(f"{KEEP_LINE} {keep_for:g} {state_file}\n".encode())
        proc.stdin.close()
    except OSError as error:
        raise DriverError(
            f"the keeper (pid {proc.pid}) did not take the keep line: {error}"
        ) from error
    procs.unregister(proc.pid)


def write_state(path: Path, state: KeptState) -> Path:
    """Write ``state`` to ``path`` (JSON), readable by its owner only (it names the ssh key)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(asdict(state), indent=2, sort_keys=True) + "\n")
    temporary.chmod(0o600)
    temporary.replace(path)
    return path


def state_path(given: Path) -> Path:
    """The state file named by ``given``: the file itself or the directory holding it."""
    return given / STATE_FILE if given.is_dir() else given


def read_state(given: Path) -> KeptState:
    """The kept guest described at ``given`` (a state file or its directory)."""
    path = state_path(given)
    try:
        data = json.loads(path.read_text())
        return KeptState(**data)
    except (OSError, ValueError, TypeError) as error:
        raise DriverError(f"{path}: not the state of a kept guest ({error})") from error


def attach_argv(state: KeptState, command: Sequence[str] = ()) -> list[str]:
    """The ssh command line to the kept guest: a login shell, or ``command`` when given.

    One word is a shell command line, as ssh takes it (``'journalctl | tail'``); several are
    one command's argv, quoted, since ssh would join them unquoted (``sh -c 'exit 7'``).
    """
    argv = ["ssh", "-p", str(state.ssh_port), "-o", "ConnectTimeout=10", "-o", "LogLevel=ERROR"]
    if state.known_hosts:
        argv += ["-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={state.known_hosts}"]
    else:
        argv += ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"]
    if state.ssh_key:
        argv += ["-o", "IdentitiesOnly=yes", "-i", state.ssh_key]
    argv += ["-t"] if not command else ["-o", "BatchMode=yes"]
    remote = [command[0] if len(command) == 1 else shlex.join(command)] if command else []
    return [*argv, f"{state.user}@127.0.0.1", *remote]


def _qmp(socket_path: str, command: str) -> str:
    """Send one QMP command to a kept QEMU; "" when it answered, else why not."""
    from qemu.qmp.legacy import QEMUMonitorProtocol  # noqa: PLC0415  (only stop needs QMP)

    qmp = QEMUMonitorProtocol(socket_path)
    try:
        qmp.connect(negotiate=True)
        qmp.settimeout(10.0)
        qmp.cmd(command)
        return ""
    except Exception as error:  # qemu.qmp raises several unrelated types here
        return f"{type(error).__name__}: {error}"
    finally:
        for _ in range(2):  # the second close completes one that QEMU's exit broke
            with contextlib.suppress(Exception):
                qmp.close()


def _ssh_poweroff(state: KeptState) -> str:
    """Ask the guest over ssh to power off; "" when it took the request, else why not."""
    argv = attach_argv(state, ["systemctl --no-block poweroff"])
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=POWEROFF_REQUEST_TIMEOUT, check=False
        )
    except subprocess.TimeoutExpired:
        return f"no answer within {POWEROFF_REQUEST_TIMEOUT:.0f}s"
    return "" if done.returncode == 0 else f"exit {done.returncode}: {done.stderr.strip()[-200:]}"


def _wait_gone(pid: int, started: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while alive(pid, started):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)
    return True


def stop_kept(state: KeptState, *, from_keeper: bool = False) -> list[str]:
    """End a kept guest gracefully and remove what it left; returns what happened, in order.

    ``systemctl poweroff`` over ssh and QMP ``system_powerdown`` (the guest shuts down
    cleanly; a guest without an ACPI power button handler ignores the latter), for
    ``POWERDOWN_GRACE`` seconds, then ``quit``, then SIGKILL of the keeper's process group
    (QEMU is in it). The keeper itself calls this at its time limit (``from_keeper``): it does
    not signal itself.
    """
    said: list[str] = []
    if alive(state.qemu_pid, state.qemu_start):
        why = _ssh_poweroff(state)
        said.append(
            "asked the guest to power off (ssh systemctl poweroff)" + (f": {why}" if why else "")
        )
        why = _qmp(state.qmp_socket, "system_powerdown")
        said.append(
            "asked the guest to power off (QMP system_powerdown)" + (f": {why}" if why else "")
        )
        if not _wait_gone(state.qemu_pid, state.qemu_start, POWERDOWN_GRACE):
            why = _qmp(state.qmp_socket, "quit")
            said.append(
                f"still running after {POWERDOWN_GRACE:.0f}s: QMP quit"
                + (f": {why}" if why else "")
            )
            if not _wait_gone(state.qemu_pid, state.qemu_start, QUIT_GRACE):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(state.qemu_pid, signal.SIGKILL)
                said.append(f"still running {QUIT_GRACE:.0f}s after quit: killed QEMU")
                _wait_gone(state.qemu_pid, state.qemu_start, QUIT_GRACE)
    else:
        said.append("QEMU had already ended")
    if not from_keeper and not _wait_gone(state.keeper_pid, state.keeper_start, QUIT_GRACE):
        procs.kill_group(state.keeper_pid)
        said.append(f"the keeper (pid {state.keeper_pid}) was still there: killed its group")
    for path in state.remove:
        shutil.rmtree(path, ignore_errors=True)
    if state.remove:
        said.append(f"removed {', '.join(state.remove)}")
    return said
