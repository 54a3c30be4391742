"""Shared helpers of the certification's tests without a VM: a real local stub server."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from vmtests.guest.local_stub import LocalStubServer
from vmtests.stub import knobs


@contextmanager
def running_stub(args: Sequence[str], time_scale: str, **env: str) -> Iterator[LocalStubServer]:
    """A stub server (``/dev/null`` stands in for the card), ready; killed when the block ends."""
    server = LocalStubServer(
        args, {knobs.DEVICES: "/dev/null", knobs.TIME_SCALE: time_scale, **env}
    )
    try:
        yield server.start().wait_ready(30.0)
    finally:
        server.kill()
