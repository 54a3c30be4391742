"""Fixtures of the stub tests: real stub server processes on 127.0.0.1, always killed."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import pytest
from stub_support import StartServer, base_env

from vmtests.guest.local_stub import LocalStubServer


@pytest.fixture
def start_server() -> Iterator[StartServer]:
    """Start stub servers and wait until ready; every one is killed when the test ends."""
    started: list[LocalStubServer] = []

    def start(
        args: Sequence[str],
        env: Mapping[str, str] | None = None,
        ready: bool = True,
        timeout: float = 30.0,
    ) -> LocalStubServer:
        """Start one server (waiting for its ready line unless ``ready`` is False)."""
        server = LocalStubServer(args, base_env(**dict(env or {})))
        started.append(server)
        server.start()
        if ready:
            server.wait_ready(timeout)
        return server

    yield start
    for server in started:
        server.kill()
