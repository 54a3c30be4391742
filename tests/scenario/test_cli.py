"""The ``vmtests`` CLI's argument handling: clear errors and exit status 2, before any boot."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from vmtests.cli import _switcher, build_parser, main, run_scenario_on
from vmtests.contracts.settings import Settings
from vmtests.contracts.status import ExitStatus
from vmtests.driver.machine import Machine
from vmtests.profiles import load_profile
from vmtests.scenario.install.switching import CommandSwitch
from vmtests.scenario.runner.recovery import Action, Recovery
from vmtests.scenario.runner.scenario import Scenario, ScenarioResult


def test_missing_profile_is_a_clear_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--profile", "no-such-profile"]) == ExitStatus.USAGE
    error = capsys.readouterr().err
    assert "no such profile file" in error
    assert "available profiles:" in error
    assert "cfx-llm2" in error


def test_foreign_target_needs_a_switch_command(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", "--profile", "cfx-llm2", "--target", "qemu-nixos:/nix/store/x/run-vm"])
    assert code == ExitStatus.USAGE
    assert "needs --switch-command" in capsys.readouterr().err


def test_the_expected_system_goes_to_the_command_switch(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["run", "--profile", "cfx-llm2", "--expected-system", "/nix/store/aaaa-nixos-system"]
    assert main(argv) == ExitStatus.USAGE  # the reference guest's switch has no NixOS system
    assert "--expected-system needs --switch-command" in capsys.readouterr().err
    args = build_parser().parse_args([*argv, "--switch-command", "nixos-rebuild switch"])
    switch = _switcher(args, load_profile("cfx-llm2"), args.target, Settings())
    assert isinstance(switch, CommandSwitch)
    assert switch.expected_system == "/nix/store/aaaa-nixos-system"


def test_ssh_target_needs_explicit_hardware_opt_in(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["run", "--profile", "cfx-llm2", "--target", "ssh://root@p150-host"]
    assert main([*argv, "--switch-command", "nixos-rebuild switch"]) == ExitStatus.USAGE
    assert "pass --hw-opt-in" in capsys.readouterr().err


def test_selftest_rejects_an_unknown_profile(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["selftest", "--profiles", "cfx-llm2,nope"]) == ExitStatus.USAGE
    assert "nope.yaml: no such profile file" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [[], ["run"], ["frobnicate"], ["run", "--profile"]])
def test_bad_arguments_exit_2(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        main(argv)
    assert raised.value.code == 2


def test_console_script_is_installed() -> None:
    """The ``vmtests`` entry point of pyproject.toml is installed and runs this CLI."""
    beside_python = Path(sys.executable).parent / "vmtests"
    script = str(beside_python) if beside_python.exists() else shutil.which("vmtests")
    assert script, "no `vmtests` console script: install the package (pip install -e .)"
    result = subprocess.run([script, "run", "--help"], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert "--switch-command" in result.stdout
    assert "--report-dir" in result.stdout


def test_an_interrupted_run_prints_where_the_machine_was_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A Ctrl-C after the switch: the recovery ran; the person at the terminal must see which
    # generation the host runs and the command that goes back, not only the report.
    def interrupted_run(self: Scenario) -> ScenarioResult:
        self.result.recovery = Recovery(
            Action.FAILED, "rollback-41", "the rollback was interrupted; run rollback-41"
        )
        raise KeyboardInterrupt

    monkeypatch.setattr(Scenario, "run", interrupted_run)
    machine = cast(Machine, SimpleNamespace(name="cfx-llm2", observe=lambda record: lambda: None))
    switch = CommandSwitch("nixos-rebuild switch --flake /etc/nixos#{profile}")
    with pytest.raises(KeyboardInterrupt):
        run_scenario_on(machine, load_profile("cfx-llm2"), switch, tmp_path, target="ssh://h")
    assert (
        "rollback failed: the rollback was interrupted; run rollback-41" in capsys.readouterr().out
    )
