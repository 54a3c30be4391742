"""Startup lines and one self-identifying banner per active feature, for every profile."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from stub_support import (
    BASELINE_ARGS,
    PRODUCTION_ARGS,
    PRODUCTION_ENV,
    RESIDENT_ENV,
    StartServer,
    feature_env,
)

from vmtests.guest.local_stub import LocalStubServer

PREFIX = re.compile(
    r"^\((APIServer|EngineCore_DP0) pid=(\d+)\) (INFO|WARNING) "
    r"\d\d-\d\d \d\d:\d\d:\d\d \[\w+\.py:\d+\] "
)
PRODUCTION = ["sdpaStreaming", "mergeBatchGuard", "prefixCaching", "toolCalling"]
RESIDENT_PAIR = ["deviceResident", "deviceArgmax"]


def banner_lines(server: LocalStubServer) -> list[str]:
    """The banner texts the server printed (any line carrying a features.json banner prefix)."""
    lines = server.output().splitlines()
    return [line.split("] ", 1)[1] for line in lines if "] qwen36: " in line]


# Written out literally (not built with the stub's own functions), as the YAML profiles are.
BANNERS = {
    "deviceResident": "qwen36: Phase 2a device-resident decode chain ACTIVE",
    "deviceArgmax": "qwen36: on-device argmax sampling ACTIVE",
    "sdpaStreaming": "qwen36: SDPA streaming ACTIVE",
    "mergeBatchGuard": "qwen36: merge batch guard ACTIVE",
    "prefixCaching": (
        "qwen36: prefix caching ACTIVE (mamba cache mode align, prefix sidecars synchronous)"
    ),
    "toolCalling": "qwen36: tool calling ACTIVE (parser qwen3_coder)",
}


def expected_banners(names: list[str]) -> list[str]:
    """The banner texts of ``names`` for the production parameters, in the order given."""
    return [BANNERS[name] for name in names]


def test_production_profile_startup_lines_in_order(start_server: StartServer) -> None:
    server = start_server(PRODUCTION_ARGS, PRODUCTION_ENV)
    lines = server.output().splitlines()
    wanted = [
        "vLLM API server version ",
        "non-default args: {",
        "Asynchronous scheduling is disabled.",
        "Automatic prefix caching is enabled",
        *expected_banners(PRODUCTION),
        '"auto" tool choice has been enabled.',
        f"Starting vLLM API server 0 on http://127.0.0.1:{server.port}",
        "Application startup complete.",
    ]
    positions = []
    for text in wanted:
        found = [index for index, line in enumerate(lines) if text in line]
        assert found, f"missing startup line {text!r} in:\n{server.output()}"
        positions.append(found[0])
    assert positions == sorted(positions), f"startup lines out of order:\n{server.output()}"
    for line in lines:
        if "INFO:     " not in line:
            assert PREFIX.match(line), f"line without vLLM's prefix: {line!r}"
    assert all(f"pid={server.pid})" in line for line in lines)


@pytest.mark.parametrize(
    ("args", "env", "names", "async_state"),
    [
        (PRODUCTION_ARGS, PRODUCTION_ENV, PRODUCTION, "disabled"),
        (PRODUCTION_ARGS, RESIDENT_ENV, RESIDENT_PAIR + PRODUCTION, "disabled"),
        (BASELINE_ARGS, {}, [], "disabled"),
        (BASELINE_ARGS, feature_env(*RESIDENT_PAIR), RESIDENT_PAIR, "enabled"),
    ],
    ids=["production", "resident", "baseline", "resident-without-prefix-caching"],
)
def test_one_banner_per_active_feature(
    start_server: StartServer,
    args: list[str],
    env: dict[str, str],
    names: list[str],
    async_state: str,
) -> None:
    server = start_server(args, env)
    assert banner_lines(server) == expected_banners(names)
    assert f"Asynchronous scheduling is {async_state}." in server.output()
    prefix_state = "enabled" if "prefixCaching" in names else "disabled"
    assert f"Automatic prefix caching is {prefix_state}" in server.output()


def test_tt_plugin_disables_async_scheduling_without_resident_decode(
    start_server: StartServer,
) -> None:
    server = start_server([*BASELINE_ARGS, "--async-scheduling"])
    output = server.output()
    assert "does not declare support for async decode. Disabling async scheduling." in output
    assert "Asynchronous scheduling is disabled." in output


def test_prefix_caching_without_mamba_alignment_is_switched_off(start_server: StartServer) -> None:
    args = [*BASELINE_ARGS, "--enable-prefix-caching", "--no-async-scheduling"]
    server = start_server(args)
    assert "needs --mamba-cache-mode align or all; disabling prefix caching" in server.output()
    assert "Automatic prefix caching is disabled" in server.output()
    assert banner_lines(server) == []


@pytest.mark.nix
@pytest.mark.parametrize("profile_name", ["baseline", "cfx-llm2", "resident"])
def test_stub_satisfies_the_yaml_profile_with_the_cores_real_output(
    start_server: StartServer, profile_name: str
) -> None:
    """The module's args and environment, run by the stub, print what the YAML profile expects."""
    from vmtests.nixcore import evaluate_core  # noqa: PLC0415  (nix tier only)
    from vmtests.profiles.loader import load_profile  # noqa: PLC0415

    profile = load_profile(profile_name)
    core = evaluate_core(profile_file=Path(profile.serving_profile))
    assert core.failed_assertions == []
    server = start_server(core.args, core.environment)
    output = server.output()
    for banner in profile.banners_present:
        assert banner.pattern.search(output), f"{banner.name} missing:\n{output}"
    for banner in profile.banners_absent:
        assert not banner.pattern.search(output), f"{banner.name} must be absent:\n{output}"
