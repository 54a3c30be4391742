"""Graceful SIGTERM with a request in flight, and the start/hang fault knobs."""

from __future__ import annotations

import signal
import threading
from typing import Any

import pytest
import requests
from stub_support import (
    BASELINE_ARGS,
    HTTP_TIMEOUT,
    PRODUCTION_ARGS,
    PRODUCTION_ENV,
    StartServer,
    metric,
    post,
    wait_until,
)

from vmtests.driver.errors import WaitTimeout
from vmtests.guest.local_stub import READY_LINE
from vmtests.stub import knobs


def test_sigterm_drains_a_streaming_request_then_exits_0(start_server: StartServer) -> None:
    server = start_server(PRODUCTION_ARGS, {**PRODUCTION_ENV, knobs.TIME_SCALE: "0.2"})
    result: dict[str, Any] = {}
    first_chunk = threading.Event()

    def stream() -> None:
        """Read the first SSE line, signal it, then read the rest."""
        body = {"prompt": "drain me", "max_tokens": 40, "stream": True}
        response = post(server.url, "/v1/completions", body, stream=True)
        lines = response.iter_lines(decode_unicode=True)
        result["first"] = next(line for line in lines if line)
        first_chunk.set()
        result["rest"] = [line for line in lines if line]

    client = threading.Thread(target=stream)
    client.start()
    assert first_chunk.wait(HTTP_TIMEOUT), "no first SSE chunk"
    rc = server.terminate(timeout=60)
    client.join(timeout=HTTP_TIMEOUT)
    assert rc == 0, server.tail()
    assert result["rest"][-1] == "data: [DONE]"
    assert len(result["rest"]) == 40  # 39 more tokens + [DONE]: nothing was cut off
    output = server.output()
    assert "Received SIGTERM; shutting down gracefully, draining 1 in-flight request(s)" in output
    assert output.rstrip().endswith(f"Finished server process [{server.pid}]")


def test_requests_after_sigterm_are_refused_while_draining(start_server: StartServer) -> None:
    server = start_server(BASELINE_ARGS, {knobs.TIME_SCALE: "0.2"})
    statuses: list[int] = []
    slow = threading.Thread(
        target=lambda: statuses.append(
            post(server.url, "/v1/completions", {"prompt": "x", "max_tokens": 30}).status_code
        )
    )
    slow.start()
    wait_until(lambda: metric(server.url, "vllm:num_requests_running") == 1, 10, "the slow request")
    server.send_signal(signal.SIGTERM)
    server.wait_for_line("Shutting down", timeout=10)
    assert requests.get(server.url + "/health", timeout=HTTP_TIMEOUT).status_code == 503
    assert post(server.url, "/v1/completions", {"prompt": "late"}).status_code == 503
    slow.join(timeout=HTTP_TIMEOUT)
    assert statuses == [200]
    assert server.wait_exit(60) == 0


def test_slow_start_listens_only_after_the_delay(start_server: StartServer) -> None:
    server = start_server(BASELINE_ARGS, {knobs.START_DELAY: "3"}, ready=False)
    server.wait_for_line("Initializing a V1 LLM engine", timeout=30)
    # During the delay nothing accepts connections on the port (a real engine loads first).
    with pytest.raises(requests.ConnectionError):
        requests.get(server.url + "/health", timeout=HTTP_TIMEOUT)
    with pytest.raises(WaitTimeout):
        server.wait_for_line(READY_LINE, timeout=0.5)
    server.wait_ready(timeout=30)
    assert requests.get(server.url + "/health", timeout=HTTP_TIMEOUT).status_code == 200


def test_hang_at_start_never_becomes_ready_but_dies_on_sigterm(start_server: StartServer) -> None:
    server = start_server(BASELINE_ARGS, {knobs.HANG: "start"}, ready=False)
    server.wait_for_line("Initializing a V1 LLM engine", timeout=30)
    with pytest.raises(WaitTimeout):
        server.wait_for_line(READY_LINE, timeout=1.0)
    with pytest.raises(requests.ConnectionError):
        requests.get(server.url + "/health", timeout=HTTP_TIMEOUT)
    assert server.terminate(timeout=30) == -signal.SIGTERM


def test_hang_per_request_keeps_health_up_and_is_aborted_at_shutdown(
    start_server: StartServer,
) -> None:
    env = {knobs.HANG: "request", knobs.DRAIN_TIMEOUT: "1"}
    server = start_server(BASELINE_ARGS, env)
    with pytest.raises(requests.Timeout):
        requests.post(server.url + "/v1/completions", json={"prompt": "x"}, timeout=1.0)
    assert requests.get(server.url + "/health", timeout=HTTP_TIMEOUT).status_code == 200
    assert server.terminate(timeout=30) == 0
    assert "Aborted 1 request(s) still running after 1.0s" in server.output()


def test_crash_after_answers_first_then_dies_like_the_engine(start_server: StartServer) -> None:
    """An engine that dies while serving: the server answers, then logs vLLM's fatal engine
    error and the API server's end, and exits 1 (what the unit's ``Restart=on-failure`` and
    the restart check need)."""
    server = start_server(BASELINE_ARGS, {knobs.CRASH_AFTER: "2"})
    assert requests.get(server.url + "/health", timeout=HTTP_TIMEOUT).status_code == 200
    assert server.wait_exit(30) == 1
    server.wait_for_line("EngineCore encountered a fatal error.", timeout=5)
    server.wait_for_line("AsyncLLMEngine has failed, terminating server process", timeout=5)
