"""The stub refuses to start exactly where the real stack refuses, with one clear ERROR line."""

from __future__ import annotations

from pathlib import Path

import pytest
from stub_support import (
    BASELINE_ARGS,
    PRODUCTION_ARGS,
    PRODUCTION_ENV,
    RESIDENT_ENV,
    StartServer,
    base_env,
    feature_env,
    run_to_exit,
)

from vmtests.stub import knobs

PREFIX_WITHOUT_SYNC = [arg for arg in PRODUCTION_ARGS if arg != "--no-async-scheduling"]


def refused(args: list[str], env: dict[str, str]) -> str:
    """Run the server, require exit status 1 and exactly one ERROR line; return that line."""
    rc, output = run_to_exit(args, base_env(**env))
    assert rc == 1, f"expected a refusal (exit 1), got {rc}:\n{output}"
    errors = [line for line in output.splitlines() if " ERROR " in line]
    assert len(errors) == 1, f"expected one ERROR line:\n{output}"
    assert "Starting vLLM API server" not in output
    assert "Application startup complete." not in output
    return errors[0]


@pytest.mark.parametrize(
    "args",
    [[*PREFIX_WITHOUT_SYNC, "--async-scheduling"], PREFIX_WITHOUT_SYNC],
    ids=["explicit-async", "async-by-default"],
)
def test_resident_decode_keeps_async_on_so_prefix_caching_refuses_it(args: list[str]) -> None:
    """qwen36 declares async decode only with resident decode: the plugin leaves async on."""
    line = refused(args, RESIDENT_ENV)
    assert "prefix sidecars require synchronous local execution" in line


@pytest.mark.parametrize(
    "args",
    [[*PREFIX_WITHOUT_SYNC, "--async-scheduling"], PREFIX_WITHOUT_SYNC],
    ids=["explicit-async", "async-by-default"],
)
def test_without_resident_decode_the_plugin_disables_async_and_prefix_caching_starts(
    start_server: StartServer, args: list[str]
) -> None:
    """The TT plugin switches async off first, so the model never sees it still on."""
    output = start_server(args, PRODUCTION_ENV).output()
    assert "Disabling async scheduling." in output
    assert "prefix sidecars require" not in output
    assert "Automatic prefix caching is enabled" in output


def test_missing_device_node_is_refused(tmp_path: Path) -> None:
    missing = tmp_path / "tenstorrent" / "0"
    line = refused(PRODUCTION_ARGS, {**PRODUCTION_ENV, knobs.DEVICES: str(missing)})
    assert f"No Tenstorrent device found: {missing} does not exist" in line


def test_regular_file_instead_of_a_character_device_is_refused(tmp_path: Path) -> None:
    fake = tmp_path / "0"
    fake.write_text("")
    line = refused(PRODUCTION_ARGS, {**PRODUCTION_ENV, knobs.DEVICES: str(fake)})
    assert f"{fake} is not a character device" in line


def test_every_listed_device_must_exist(tmp_path: Path) -> None:
    devices = f"/dev/null:{tmp_path / 'missing'}"
    line = refused(BASELINE_ARGS, {knobs.DEVICES: devices})
    assert "does not exist" in line


def test_resident_decode_without_argmax_is_refused() -> None:
    env = {**PRODUCTION_ENV, **feature_env("deviceResident")}
    line = refused(PRODUCTION_ARGS, env)
    names = feature_env("deviceResident", "deviceArgmax")
    assert all(f"{name}=1" in line for name in names), line


def test_crash_at_start_knob_fails_startup() -> None:
    line = refused(PRODUCTION_ARGS, {**PRODUCTION_ENV, knobs.CRASH_AT_START: "1"})
    assert "Engine core initialization failed" in line


def test_malformed_knob_is_a_usage_error() -> None:
    rc, output = run_to_exit(BASELINE_ARGS, base_env(**{knobs.FAIL_RATE: "often"}))
    assert rc == 2
    assert f"{knobs.FAIL_RATE}='often' is not a number" in output


@pytest.mark.nix
def test_the_modules_automatic_no_async_scheduling_keeps_resident_prefix_from_being_refused(
    start_server: StartServer,
) -> None:
    """resident = prefix caching + resident decode, asyncScheduling left automatic (null).

    Resident decode makes qwen36 declare async decode, so the plugin leaves vLLM's default
    (async on) alone and the model would refuse prefix caching. The only thing in the way is
    the ``--no-async-scheduling`` the core adds by itself.
    """
    from vmtests.nixcore import evaluate_core  # noqa: PLC0415  (nix tier only)

    core = evaluate_core(profile_file=Path("hosts/profiles/resident.nix"))
    assert core.failed_assertions == []
    assert core.args.count("--no-async-scheduling") == 1
    assert "async-scheduling=off" in core.banner
    output = start_server(core.args, core.environment).output()
    assert "Asynchronous scheduling is disabled." in output
    assert "qwen36: prefix caching ACTIVE" in output
    without = [arg for arg in core.args if arg != "--no-async-scheduling"]
    line = refused(without, core.environment)
    assert "prefix sidecars require synchronous local execution" in line
