"""How the host running ``vmtests certify`` reaches the serving port of the machine.

- a QEMU guest: the port QEMU forwards to the guest's serving port (``forwarded_port``);
- an ssh host: ``http://<host>:<port>`` when ``/health`` answers from here, otherwise an ssh
  tunnel (``ssh -N -L``) with the machine's own ssh options, killed when the run ends.

Requests go to the endpoint directly; everything else goes through the ``Machine``.
"""

from __future__ import annotations

import http.client
import time
from collections.abc import Iterator
from contextlib import contextmanager

from vmtests.driver import procs
from vmtests.driver.errors import WaitTimeout
from vmtests.driver.machine import Machine
from vmtests.stub.local import free_port

PROBE_TIMEOUT = 5.0
TUNNEL_TIMEOUT = 30.0


def health_ok(host: str, port: int, timeout: float = PROBE_TIMEOUT) -> bool:
    """True when ``GET /health`` on ``host:port`` answers 200."""
    connection = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        connection.request("GET", "/health")
        return connection.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        connection.close()


@contextmanager
def serving_endpoint(machine: Machine, port: int) -> Iterator[str]:
    """The base URL of the machine's serving port, valid inside the ``with`` block."""
    forwarded = getattr(machine, "forwarded_port", None)
    if callable(forwarded):
        yield f"http://127.0.0.1:{forwarded(port)}"
        return
    host = getattr(machine, "host", None)
    ssh_argv = getattr(machine, "ssh_argv", None)
    if isinstance(host, str) and health_ok(host, port):
        yield f"http://{host}:{port}"
        return
    if not callable(ssh_argv):
        raise TypeError(f"{machine.name}: no way to reach serving port {port} from here")
    local = free_port()
    argv = list(ssh_argv(""))
    destination = argv[-2]
    command = [
        *argv[:-2],
        "-N",
        "-o",
        "ExitOnForwardFailure=yes",
        "-L",
        f"127.0.0.1:{local}:127.0.0.1:{port}",
        destination,
    ]
    tunnel = procs.spawn(command, "ssh tunnel to the serving port")
    try:
        deadline = time.monotonic() + TUNNEL_TIMEOUT
        while not health_ok("127.0.0.1", local):
            if tunnel.poll() is not None or time.monotonic() > deadline:
                raise WaitTimeout(
                    f"the ssh tunnel to {machine.name}:{port} to answer /health",
                    TUNNEL_TIMEOUT,
                    f"ssh exit status {tunnel.poll()}",
                )
            time.sleep(0.5)
        yield f"http://127.0.0.1:{local}"
    finally:
        procs.reap(tunnel, grace=2.0)
