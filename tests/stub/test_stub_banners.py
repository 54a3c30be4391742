"""Startup lines and one self-identifying banner per active feature, for every profile."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import requests
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
    r"^(\((APIServer|EngineCore_DP0) pid=(\d+)\) )?(INFO|WARNING) "
    r"\d\d-\d\d \d\d:\d\d:\d\d \[\w+\.py:\d+\]( |$)"
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
        "[argparse_utils.py:260] With `vllm serve`, you should provide the model as a "
        "positional argument or in a config file instead of via the `--model` option.",
        "version 0.16.0+vmtests.stub",
        "model   /models/qwen36",
        "non-default args: {",
        "Warning: Prefix caching in Mamba cache 'align' mode is currently enabled. Its support "
        "for Mamba layers is experimental. Please report any issues you may observe.",
        "Asynchronous scheduling is disabled.",
        "Automatic prefix caching is enabled",
        "Initializing a V1 LLM engine (v0.16.0+vmtests.stub) with config: "
        "model='/models/qwen36', speculative_config=None, tokenizer='/models/qwen36'",
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
    # Only the --model warning is logged before vLLM names its process.
    unnamed = [line for line in lines if f"pid={server.pid})" not in line]
    assert len(unnamed) == 1, unnamed
    assert "served_model_name=qwen36, enable_prefix_caching=True," in server.output()
    assert "Disabling async scheduling" not in server.output()


def test_version_line_without_the_logo(start_server: StartServer) -> None:
    """VLLM_DISABLE_LOG_LOGO=1: vLLM's plain version line (entrypoints/utils.py)."""
    server = start_server(BASELINE_ARGS, {"VLLM_DISABLE_LOG_LOGO": "1"})
    assert (
        "[utils.py:299] vLLM server version 0.16.0+vmtests.stub, serving model /models/qwen36"
        in server.output()
    )
    assert "▀▀▀▀▀" not in server.output()


@pytest.mark.parametrize(
    ("args", "env", "names", "async_state"),
    [
        (PRODUCTION_ARGS, PRODUCTION_ENV, PRODUCTION, "disabled"),
        (PRODUCTION_ARGS, RESIDENT_ENV, RESIDENT_PAIR + PRODUCTION, "disabled"),
        (BASELINE_ARGS, {}, [], "enabled"),
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


def message_order(output: str, *texts: str) -> list[int]:
    """The line number of the first line containing each text (fails when one is missing)."""
    lines = output.splitlines()
    found = []
    for text in texts:
        hits = [index for index, line in enumerate(lines) if text in line]
        assert hits, f"missing {text!r} in:\n{output}"
        found.append(hits[0])
    return found


@pytest.mark.parametrize("flag", [[], ["--async-scheduling"]], ids=["default", "explicit"])
def test_tt_plugin_disables_async_scheduling_without_resident_decode(
    start_server: StartServer, flag: list[str]
) -> None:
    """vLLM says enabled (config/vllm.py), then the plugin (platform.py) switches it off."""
    output = start_server([*BASELINE_ARGS, *flag]).output()
    warning = (
        "WARNING", "[platform.py:412] Async scheduling was requested, but TT model "
        "Qwen36ForCausalLM (models.demos.qwen36.tt.qwen36_vllm) does not declare support "
        "(`model_capabilities['supports_async_decode']`). Disabling async scheduling.",
    )  # fmt: skip
    positions = message_order(output, "Asynchronous scheduling is enabled.", warning[1])
    assert positions == sorted(positions)
    assert "Asynchronous scheduling is disabled." not in output
    assert any(warning[0] in line and warning[1] in line for line in output.splitlines())


def test_resident_decode_declares_async_decode_so_the_plugin_keeps_it(
    start_server: StartServer,
) -> None:
    output = start_server(BASELINE_ARGS, feature_env(*RESIDENT_PAIR)).output()
    assert "Asynchronous scheduling is enabled." in output
    assert "Disabling async scheduling" not in output


def test_prefix_caching_with_mamba_mode_none_stays_on_in_align_mode(
    start_server: StartServer,
) -> None:
    """vLLM model_executor/models/config.py: the mode is switched, prefix caching kept."""
    args = [*BASELINE_ARGS, "--enable-prefix-caching", "--no-async-scheduling"]
    server = start_server(args)
    output = server.output()
    warning = (
        "[config.py:367] Mamba cache mode is set to 'align' for "
        "Qwen3_5MoeForConditionalGeneration by default when prefix caching is enabled"
    )
    assert any(" WARNING " in line and warning in line for line in output.splitlines())
    assert "Automatic prefix caching is enabled" in output
    assert banner_lines(server) == [
        "qwen36: prefix caching ACTIVE (mamba cache mode align, prefix sidecars synchronous)"
    ]


def test_a_mamba_mode_without_prefix_caching_is_forced_to_none(start_server: StartServer) -> None:
    output = start_server([*BASELINE_ARGS, "--mamba-cache-mode", "align"]).output()
    assert "Mamba cache mode is set to 'none' when prefix caching is disabled" in output
    assert "Automatic prefix caching is disabled" in output


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


def test_a_model_build_without_prefix_support_gets_prefix_caching_switched_off(
    start_server: StartServer,
) -> None:
    """vllm_tt_plugin/platform.py: the flag is given, the plugin turns it off, the engine too."""
    capabilities = '{"supports_prefix_caching": false}'
    env = {**PRODUCTION_ENV, "VMTESTS_STUB_MODEL_CAPABILITIES": capabilities}
    server = start_server(PRODUCTION_ARGS, env)
    output = server.output()
    assert (
        "Prefix caching is not supported in TT backend for models.demos.qwen36.tt.qwen36_vllm, "
        "disabling it" in output
    )
    assert "Automatic prefix caching is disabled" in output
    assert "enable_prefix_caching=False," in output
    assert "qwen36: prefix caching ACTIVE" not in output
    text = requests.get(server.url + "/metrics", timeout=30).text
    assert 'enable_prefix_caching="False"' in text
    assert 'mamba_cache_mode="none"' in text
