"""How the host running ``vmtests certify`` reaches the serving port of the machine.

- an ssh host: ``http://<host>:<port>`` when ``/health`` answers from here, otherwise an ssh
  tunnel (``ssh -N -L``) with the machine's own ssh options;
- a QEMU guest: an ssh tunnel over the guest's forwarded sshd (host key pinned over the
  backdoor, ``vmtests.guest.access``). Not QEMU's forwarded serving port: user-mode networking
  (slirp) reset some of many simultaneous forwarded connections (docs/ci-time.md has what was
  seen), which the concurrency gate would count as server failures. One tunnelled TCP
  connection carries every request as an ssh channel, and sshd connects to the server inside
  the guest.

The tunnel is killed when the ``with`` block ends. Requests go to the endpoint; everything else
goes through the ``Machine``.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from vmtests.driver import procs
from vmtests.driver.errors import WaitTimeout
from vmtests.driver.http_probe import PROBE_TIMEOUT, http_status
from vmtests.driver.machine import Machine
from vmtests.driver.procs import free_port
from vmtests.driver.qemu import QemuMachine
from vmtests.guest.access import ssh_to_guest

TUNNEL_TIMEOUT = 60.0


def health_ok(host: str, port: int, timeout: float = PROBE_TIMEOUT) -> bool:
    """True when ``GET /health`` on ``host:port`` answers 200."""
    return http_status(host, port, "/health", timeout)[0] == 200


@contextmanager
def ssh_tunnel(ssh_argv: Sequence[str], what: str, port: int) -> Iterator[str]:
    """``ssh -N -L`` to ``127.0.0.1:port`` on the far side; yields the local base URL.

    ``ssh_argv`` is a machine's ssh command line ending in ``destination remote-command``.
    """
    local = free_port()
    argv = list(ssh_argv)
    command = [
        *argv[:-2],
        "-N",
        "-o",
        "ExitOnForwardFailure=yes",
        "-L",
        f"127.0.0.1:{local}:127.0.0.1:{port}",
        argv[-2],
    ]
    tunnel = procs.spawn(command, f"ssh tunnel to {what}:{port}")
    try:
        deadline = time.monotonic() + TUNNEL_TIMEOUT
        while not health_ok("127.0.0.1", local):
            if tunnel.poll() is not None or time.monotonic() > deadline:
                raise WaitTimeout(
                    f"the ssh tunnel to {what}:{port} to answer /health",
                    TUNNEL_TIMEOUT,
                    f"ssh exit status {tunnel.poll()}",
                )
            time.sleep(0.5)
        yield f"http://127.0.0.1:{local}"
    finally:
        procs.reap(tunnel, grace=2.0)


@contextmanager
def serving_endpoint(machine: Machine, port: int) -> Iterator[str]:
    """The base URL of the machine's serving port, valid inside the ``with`` block."""
    if isinstance(machine, QemuMachine):
        with tempfile.TemporaryDirectory(prefix="vmtests-tunnel-") as state:
            ssh = ssh_to_guest(machine, Path(state))
            with ssh_tunnel(ssh.ssh_argv(""), machine.name, port) as url:
                yield url
        return
    host = getattr(machine, "host", None)
    ssh_argv = getattr(machine, "ssh_argv", None)
    if isinstance(host, str) and health_ok(host, port):
        yield f"http://{host}:{port}"
        return
    if not callable(ssh_argv):
        raise TypeError(f"{machine.name}: no way to reach serving port {port} from here")
    with ssh_tunnel(ssh_argv(""), machine.name, port) as url:
        yield url
