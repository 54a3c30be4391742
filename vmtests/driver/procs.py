"""Child processes (QEMU, ssh) that can never outlive the test session.

Three layers, because each covers a case the others miss:

- ``PR_SET_PDEATHSIG``: the kernel SIGKILLs the child when the thread that spawned it ends,
  even by SIGKILL where no Python code runs. (It fires when the spawning *thread* exits, so
  spawn from a thread that lives as long as the child: the main thread, or the QEMU
  backend's restart follower, which waits on the QEMU it started.)
- a registry killed from ``atexit`` and from a SIGTERM/SIGHUP handler: covers interpreter exit
  and polite termination, including Ctrl-C that skips fixture teardown;
- callers kill their children in ``finally`` blocks (``reap``), the normal path.

Every child gets its own session, so killing its process group also kills what it forked.
``stop_children`` kills them all and refuses new ones until ``allow_children``: threads that
drive guests side by side (``vmtests selftest``'s lanes) then fail at once instead of starting
another guest while the run is being stopped.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import threading
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

from vmtests.driver.errors import MachineGone

_PR_SET_PDEATHSIG = 1
_registry: dict[int, str] = {}
_registry_lock = threading.Lock()
_handlers_installed = False
_refusing = False


class ChildrenRefused(MachineGone):
    """``spawn`` was called between ``stop_children`` and ``allow_children``: the machine it
    would start is gone before it began."""


def child_setup() -> None:
    """``preexec_fn`` for children: die with the parent (PR_SET_PDEATHSIG=SIGKILL)."""
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    # The parent may have died between fork and prctl: then nobody would ever signal us.
    if os.getppid() != parent:
        os._exit(1)


def register(pid: int, what: str) -> None:
    """Track ``pid`` (a session leader) so it is killed at exit if nobody reaped it."""
    _install_handlers()
    with _registry_lock:
        _registry[pid] = what


def unregister(pid: int) -> None:
    """Stop tracking ``pid`` (it has been reaped)."""
    with _registry_lock:
        _registry.pop(pid, None)


def registered(pid: int) -> bool:
    """True if ``pid`` is tracked (killed at exit unless reaped first)."""
    with _registry_lock:
        return pid in _registry


def spawn(
    argv: Sequence[str], what: str, *, die_with_parent: bool = True, **popen_kwargs: Any
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in its own session with PR_SET_PDEATHSIG, registered for cleanup.

    ``die_with_parent=False`` leaves out PR_SET_PDEATHSIG, for a child that ends by other
    means when the session dies (``vmtests.driver.keep``'s keeper: its control pipe closes).
    Raises ``ChildrenRefused`` after ``stop_children``. The child is started and registered
    under the registry's lock, so ``stop_children`` either kills it or refuses it.
    """
    _install_handlers()
    with _registry_lock:
        if _refusing:
            raise ChildrenRefused(f"not starting {what}: the run is being stopped")
        proc = subprocess.Popen(
            list(argv),
            # Only async-signal-safe work happens in child_setup.
            preexec_fn=child_setup if die_with_parent else None,  # noqa: PLW1509
            start_new_session=True,
            **popen_kwargs,
        )
        _registry[proc.pid] = what
    return proc


def kill_group(pid: int, sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to the process group led by ``pid``; ignore groups that are gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def reap(proc: subprocess.Popen[bytes], grace: float = 5.0) -> int | None:
    """Terminate ``proc`` and its group: SIGTERM, then SIGKILL after ``grace`` seconds."""
    try:
        if proc.poll() is None:
            kill_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                kill_group(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
        # Grandchildren may linger in the group after the leader exited.
        kill_group(proc.pid, signal.SIGKILL)
        return proc.returncode
    finally:
        unregister(proc.pid)


def kill_all() -> None:
    """Kill every registered child's process group (the exit-time safety net)."""
    with _registry_lock:
        pids = list(_registry)
        _registry.clear()
    for pid in pids:
        kill_group(pid)


def stop_children() -> None:
    """Kill every registered child's process group and refuse new children (``spawn``) until
    ``allow_children``."""
    global _refusing  # noqa: PLW0603  (process-wide, like the registry)
    with _registry_lock:
        _refusing = True
    kill_all()


def allow_children() -> None:
    """Let ``spawn`` start children again after ``stop_children``."""
    global _refusing  # noqa: PLW0603
    with _registry_lock:
        _refusing = False


def _install_handlers() -> None:
    """Install the atexit hook and chain SIGTERM/SIGHUP handlers, once per process."""
    global _handlers_installed  # noqa: PLW0603  (one-time process-wide installation)
    if _handlers_installed:
        return
    _handlers_installed = True
    atexit.register(kill_all)
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in (signal.SIGTERM, signal.SIGHUP):
        previous = signal.getsignal(signum)
        signal.signal(signum, _make_handler(signum, previous))


def _make_handler(
    signum: int, previous: Callable[[int, FrameType | None], Any] | int | None
) -> Callable[[int, FrameType | None], None]:
    """A handler that kills the children, then behaves like ``previous`` did."""

    def handler(received: int, frame: FrameType | None) -> None:
        kill_all()
        if callable(previous):
            previous(received, frame)
            return
        if previous == signal.SIG_IGN:
            return
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    return handler


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now (the caller binds it moments later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port
