"""Shared helpers of the stub tests: profile command lines, environments and HTTP/SSE parsing."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import requests

from vmtests.contracts import features
from vmtests.guest.local_stub import PACKAGE_PARENT, LocalStubServer
from vmtests.stub import knobs

# The production command line (cfx-llm2) as modules/serving/core.nix renders it; host and port
# are replaced per test. The nix-marked banner test checks the core's real output as well.
PRODUCTION_ARGS = [
    "--model", "/models/qwen36", "--served-model-name", "qwen36", "--block-size", "64",
    "--enable-prefix-caching", "--mamba-cache-mode", "align", "--no-async-scheduling",
    "--enable-auto-tool-choice", "--tool-call-parser", "qwen3_coder",
]  # fmt: skip
BASELINE_ARGS = [
    "--model", "/models/qwen36", "--served-model-name", "qwen36", "--block-size", "64",
    "--no-enable-prefix-caching",
]  # fmt: skip
MODEL = "qwen36"
HTTP_TIMEOUT = 30.0
# The type of the `start_server` fixture (tests/stub/conftest.py).
StartServer = Callable[..., LocalStubServer]
# Every stub knob, so that the runner's own environment cannot leak into a test.
STUB_KNOBS = (
    knobs.DEVICES, knobs.DRIVER_FILE, knobs.TIME_SCALE, knobs.STEP_FACTORS, knobs.DRAIN_TIMEOUT,
    knobs.FAIL_RATE, knobs.FAULT_SEED, knobs.DEGENERATE, knobs.OUTPUT_SALT, knobs.CRASH_AT_START,
    knobs.CRASH_AFTER, knobs.START_DELAY, knobs.HANG, knobs.MODEL_CAPABILITIES, knobs.LOG_FLOOD,
)  # fmt: skip


def feature_env(*names: str) -> dict[str, str]:
    """The environment that switches on the named features (names from features.json)."""
    return {features.env_name(name): features.env_value(name) for name in names}


def base_env(**extra: str) -> dict[str, str]:
    """A clean stub environment: /dev/null stands in for the card (a real char device)."""
    env = {name: "" for name in STUB_KNOBS}
    env.update({features.env_name(name): "" for name in features.ENV_FEATURES})
    env[knobs.DEVICES] = "/dev/null"
    env[knobs.TIME_SCALE] = "0.002"
    env.update(extra)
    return env


PRODUCTION_ENV = feature_env("sdpaStreaming", "mergeBatchGuard")
RESIDENT_ENV = feature_env("sdpaStreaming", "mergeBatchGuard", "deviceResident", "deviceArgmax")


def post(url: str, path: str, body: dict[str, Any], **kwargs: Any) -> requests.Response:
    """POST JSON to the server."""
    return requests.post(url + path, json=body, timeout=HTTP_TIMEOUT, **kwargs)


def sse_events(response: requests.Response) -> list[Any]:
    """Parse an SSE body into decoded ``data:`` payloads; ``[DONE]`` stays a string."""
    events: list[Any] = []
    for line in response.iter_lines(decode_unicode=True):
        if not line:
            continue
        assert line.startswith("data: "), f"not an SSE data line: {line!r}"
        payload = line[len("data: ") :]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


_SAMPLE = re.compile(
    r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)"
    r"(?:\{(?P<labels>[^}]*)\})? (?P<value>[-+]?(?:[0-9.eE+-]+|Inf|NaN))$"
)
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
_SUFFIXES = ("_bucket", "_count", "_sum")


def parse_prometheus(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """A strict parser of the Prometheus text format (0.0.4) as the stub must emit it.

    Every sample must belong to a family declared by ``# TYPE`` (histogram samples via their
    ``_bucket``/``_count``/``_sum`` suffixes), label sets must parse completely, values must be
    numbers. Returns samples by name.
    """
    types: dict[str, str] = {}
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("# HELP "):
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            assert kind in {"counter", "gauge", "histogram", "summary", "untyped"}, line
            assert name not in types, f"line {number}: family {name} declared twice"
            types[name] = kind
            continue
        assert line, f"line {number}: empty line"
        assert not line.startswith("#"), f"line {number}: unexpected comment {line!r}"
        match = _SAMPLE.match(line)
        assert match, f"line {number}: not a sample: {line!r}"
        name = match["name"]
        family = name
        for suffix in _SUFFIXES:
            if name.endswith(suffix) and name[: -len(suffix)] in types:
                family = name[: -len(suffix)]
        assert family in types, f"line {number}: {name} has no # TYPE"
        raw_labels = match["labels"] or ""
        labels = dict(_LABEL.findall(raw_labels))
        rebuilt = ",".join(f'{key}="{value}"' for key, value in _LABEL.findall(raw_labels))
        assert rebuilt == raw_labels, f"line {number}: malformed labels {raw_labels!r}"
        samples.setdefault(name, []).append((labels, float(match["value"])))
    return samples


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``predicate`` until true; fail saying what was awaited and for how long."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.1f}s waiting for {what}")
        time.sleep(0.02)


def metric(url: str, name: str) -> float:
    """The summed value of one metric's samples, read from ``/metrics``."""
    response = requests.get(url + "/metrics", timeout=HTTP_TIMEOUT)
    response.raise_for_status()
    return sum(value for _, value in parse_prometheus(response.text).get(name, []))


def tt_smi(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run the stub tt-smi with exactly ``env`` (plus a PATH) to its exit."""
    return subprocess.run(
        [sys.executable, "-m", "vmtests.stub.tt_smi", *argv],
        cwd=PACKAGE_PARENT,
        env={"PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def run_to_exit(
    args: Sequence[str], env: Mapping[str, str] | None = None, timeout: float = 30.0
) -> tuple[int, str]:
    """Run a server that is expected to exit by itself (a refusal); return (status, output)."""
    server = LocalStubServer(args, env).start()
    try:
        return server.wait_exit(timeout), server.output()
    finally:
        server.kill()
