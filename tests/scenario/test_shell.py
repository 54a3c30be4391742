"""``vmtests shell`` without a guest: its arguments and refusals, the scenario's ``until`` on a
fake machine (which steps run for each stage), the prompt's names, banner and exit, the login
shell's ssh command line, and the deadline lifted before the prompt."""

from __future__ import annotations

import copy
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from scenario_support import CommandsOnly, good_snapshot

from vmtests import cli
from vmtests.contracts import deadline
from vmtests.contracts.findings import Check, Reason
from vmtests.contracts.status import ExitStatus, RunStatus
from vmtests.driver.errors import DriverError
from vmtests.driver.machine import CommandResult, Machine
from vmtests.driver.ssh import SshMachine
from vmtests.profiles import Profile, load_profile
from vmtests.scenario.collection.snapshot import Snapshot
from vmtests.scenario.install.generations import DryRun, Generation
from vmtests.scenario.install.switching import NoSwitch
from vmtests.scenario.judgement.checks import evaluate_stage
from vmtests.scenario.judgement.results import CheckResult
from vmtests.scenario.runner import scenario as scenario_module
from vmtests.scenario.runner import stage_shell
from vmtests.scenario.runner.preflight import PREFLIGHT, Preflight, PreflightRefused
from vmtests.scenario.runner.recovery import Action, OnFailure, Recovery
from vmtests.scenario.runner.scenario import ROLLBACK_STAGE, STAGES, Scenario

CFX = load_profile("cfx-llm2")


class FakeMachine(CommandsOnly):
    """A machine whose commands all succeed with no output but the boot ID, and whose reboot
    begins a new boot; it counts starts and reboots."""

    name = "fake"

    def __init__(self) -> None:
        self.boot = 1
        self.starts = 0

    def _run(self, command: str, timeout: float) -> CommandResult:
        out = f"boot-{self.boot}\n" if "boot_id" in command else ""
        return CommandResult(command, 0, out.encode(), b"")

    def _start(self) -> None:
        self.starts += 1

    def _issue_reboot(self) -> None:
        self.boot += 1


class FakeSwitch:
    """A switch that records what it was asked."""

    description = "fake switch"
    restarts = True
    expected_system: str | None = None

    def __init__(self) -> None:
        self.calls: list[str] = []

    def prepare_base(self, machine: Machine) -> None:
        self.calls.append("prepare base")

    def switch(self, machine: Machine, profile: Profile) -> None:
        self.calls.append(f"switch {profile.name}")

    def dry_run(self, machine: Machine, profile: Profile) -> DryRun:
        return DryRun(True, True, "fake")

    def record_generation(self, machine: Machine) -> Generation:
        return Generation("/gen", "generation 1", "go-back", "readlink")


def _snapshot(machine: Machine, label: str, **_: object) -> Snapshot:
    """A correct cfx-llm2 snapshot at ``label``; the base's unit started earlier (another
    InvocationID), as a switch leaves it."""
    snap = good_snapshot(label=label)
    if label == "S0":
        snap = copy.deepcopy(snap)
        snap.unit.properties["InvocationID"] = "0" * 32
    return snap


@pytest.fixture
def fake_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """The scenario's host-side and guest-side steps that need more than the fake machine."""
    monkeypatch.setattr(scenario_module, "take_snapshot", _snapshot)
    monkeypatch.setattr(scenario_module, "wait_ready", lambda *args: None)
    monkeypatch.setattr(scenario_module, "read_versions", lambda *args: {})
    monkeypatch.setattr(scenario_module, "stands_in_for", lambda *args: None)


@pytest.mark.usefixtures("fake_steps")
@pytest.mark.parametrize(
    ("until", "snapshots", "calls", "reboots"),
    [
        ("S0", ["S0"], ["prepare base"], 0),
        ("S1", ["S0", "S1"], ["prepare base", "switch cfx-llm2"], 0),
        ("S2", ["S0", "S1", "S2"], ["prepare base", "switch cfx-llm2"], 1),
    ],
)
def test_the_scenario_stops_after_the_stage_it_is_asked_to_reach(
    until: str, snapshots: list[str], calls: list[str], reboots: int
) -> None:
    machine, switch = FakeMachine(), FakeSwitch()
    scenario = Scenario(machine, CFX, switch, until=until)
    result = scenario.run()
    assert list(result.snapshots) == snapshots
    assert switch.calls == calls
    assert machine.boot - 1 == reboots
    assert result.status == RunStatus.FINISHED
    assert {check.stage for check in result.checks} == set(snapshots)
    if until == "S1":  # S1 of a correct switch: passed, not stopped early by a failure
        assert (result.ok, result.stopped_at) == (True, ""), result.failures
    assert "reboot" in result.steps if reboots else "reboot" not in result.steps


def test_the_scenario_refuses_an_unknown_stage() -> None:
    with pytest.raises(ValueError, match="until must be one of S0, S1, S2, not 'S3'"):
        Scenario(FakeMachine(), CFX, FakeSwitch(), until="S3")
    assert Scenario(FakeMachine(), CFX, FakeSwitch()).until == STAGES[-1]  # the whole run


@pytest.mark.parametrize("argv", [["--stage", "S3"], ["--stage", "s1"], []])
def test_a_stage_that_is_not_s0_s1_or_s2_is_refused_by_the_parser(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as raised:
        cli.main(["shell", "--profile", "cfx-llm2", *argv])
    assert raised.value.code == ExitStatus.USAGE
    assert "--stage" in capsys.readouterr().err


@pytest.mark.parametrize("option", ["--prof=resident", "--targ=qemu:reference", "--ref"])
def test_an_abbreviated_option_is_refused(option: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``nix run .#shell`` refuses the app's own options by their full names, which an
    abbreviation would slip past."""
    with pytest.raises(SystemExit) as raised:
        cli.main(["shell", "--profile", "cfx-llm2", "--stage", "S0", option])
    assert raised.value.code == ExitStatus.USAGE
    assert "unrecognized arguments" in capsys.readouterr().err


@pytest.mark.parametrize(("stage", "what"), [("S1", "switches it;"), ("S2", "and reboots it;")])
def test_a_host_at_s1_or_s2_needs_the_hardware_opt_in(
    stage: str, what: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["shell", "--profile", "cfx-llm2", "--stage", stage, "--target", "ssh://root@p150"]
    assert cli.main([*argv, "--switch-command", "nixos-rebuild switch"]) == ExitStatus.USAGE
    error = capsys.readouterr().err
    assert "pass --hw-opt-in" in error
    assert what in error


@contextmanager
def _fake_machine(*args: object, **kwargs: object) -> Iterator[tuple[Machine, bool]]:
    yield FakeMachine(), False


@pytest.mark.parametrize(("left", "status"), [(None, ExitStatus.OK), (7, 7)])
def test_s0_of_a_host_needs_neither_opt_in_nor_switch_and_ctrl_d_gives_the_stages_status(
    monkeypatch: pytest.MonkeyPatch, left: int | None, status: int
) -> None:
    """Nothing is switched at S0: no switch command, no preflight; leaving the prompt with
    Ctrl-D exits with the stage's status, ``exit(n)`` with n."""
    seen: list[Scenario] = []
    backs: list[bool] = []

    def enter(
        scenario: Scenario, state_dir: Path, *, sh: bool = False, go_back: bool = False
    ) -> int | None:
        seen.append(scenario)
        backs.append(go_back)
        scenario.result.status = RunStatus.FINISHED
        return left

    monkeypatch.setattr(cli, "_checked_machine", _fake_machine)
    monkeypatch.setattr(stage_shell, "enter", enter)
    argv = ["shell", "--profile", "cfx-llm2", "--stage", "S0", "--target", "ssh://root@p150"]
    assert cli.main(argv) == status
    (scenario,) = seen
    assert isinstance(scenario.switcher, NoSwitch)
    assert (scenario.until, scenario.preflight, scenario.start_machine) == ("S0", False, True)
    # A host goes back to the generation it was found on (here nothing was switched).
    assert (scenario.on_failure, backs) == (OnFailure.ROLLBACK, [True])


def test_a_failed_stage_is_printed_and_the_prompt_follows(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken_switch(self: Scenario) -> None:
        raise RuntimeError("the switch broke")

    monkeypatch.setattr(Scenario, "_run", broken_switch)
    monkeypatch.setattr(scenario_module, "stands_in_for", lambda *args: None)
    monkeypatch.setattr(Scenario, "collect_evidence", lambda self, stage: None)
    prompts: list[Scenario] = []
    monkeypatch.setattr(stage_shell, "interact", lambda scenario, go_back: prompts.append(scenario))
    scenario = Scenario(FakeMachine(), CFX, FakeSwitch(), until="S1")
    assert stage_shell.enter(scenario, Path("/nonexistent")) is None
    assert prompts == [scenario]
    out = capsys.readouterr().out
    assert "S1 FAILED: profile cfx-llm2 on fake" in out
    assert "run error: RuntimeError: the switch broke" in out
    assert cli.exit_status(scenario.result) == ExitStatus.INCOMPLETE


def _feed(monkeypatch: pytest.MonkeyPatch, lines: list[str]) -> None:
    """Type ``lines`` at the prompt, then Ctrl-D (EOF)."""
    fed = iter(lines)

    def raw_input(self: object, prompt: str = "") -> str:
        line = next(fed, None)
        if line is None:
            raise EOFError
        return line

    monkeypatch.setattr("code.InteractiveConsole.raw_input", raw_input)


@pytest.mark.usefixtures("fake_steps")
def test_the_prompt_binds_the_machine_and_the_checks_and_ctrl_d_leaves(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = Scenario(FakeMachine(), CFX, FakeSwitch(), until="S1")
    scenario.run()
    assert set(stage_shell.namespace(scenario)) == set(stage_shell.BOUND)
    _feed(
        monkeypatch,
        [
            "print('boot:', machine.succeed('cat /proc/sys/kernel/random/boot_id').strip())",
            "print('failures:', result.failures)",
            "print('again:', len(evaluate_stage(profile, snapshot('again'))))",
        ],
    )
    assert stage_shell.interact(scenario) is None
    captured = capsys.readouterr()
    assert "boot: boot-1" in captured.out
    assert "failures: []" in captured.out
    assert "again" in scenario.result.snapshots
    banner = captured.err
    assert "vmtests shell: fake at S1, profile cfx-llm2" in banner
    for name in stage_shell.BOUND:
        assert f"  {name} " in banner
    assert "Ctrl-D (or exit()) leaves; fake is left as it is when you leave." in banner


def test_exit_at_the_prompt_gives_its_status(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = Scenario(FakeMachine(), CFX, FakeSwitch(), until="S0")
    _feed(monkeypatch, ["raise SystemExit(4)"])
    assert stage_shell.interact(scenario) == 4
    assert [stage_shell.exit_code(code) for code in (None, 0, 3, "why")] == [0, 0, 3, 1]


def test_the_login_shell_of_a_host_is_its_ssh_with_a_terminal(tmp_path: Path) -> None:
    host = SshMachine(host="p150", port=2222, user="root", identity_file=Path("/k"))
    argv = stage_shell.login_argv(host, tmp_path)
    assert argv[0] == "ssh"
    assert "-t" in argv
    assert "-T" not in argv
    assert argv[argv.index("-p") + 1] == "2222"
    assert argv[-1] == "root@p150"  # no command: the login shell
    assert argv[argv.index("-i") + 1] == "/k"


def test_the_deadline_is_lifted_for_the_prompt() -> None:
    with deadline.run_deadline(0.2):
        deadline.lift()
        time.sleep(0.4)  # the deadline would have passed here
    assert deadline.passed() is None
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_the_outcome_names_each_failed_check_and_where_the_evidence_is() -> None:
    scenario = Scenario(FakeMachine(), CFX, FakeSwitch(), until="S1")
    snap = good_snapshot()
    snap.unit.properties["ActiveState"] = "failed"
    scenario.result.checks = evaluate_stage(CFX, snap)
    scenario.result.evidence["S1"] = {"journal": "..."}
    scenario.result.status = RunStatus.FINISHED
    text = stage_shell.outcome_lines(scenario)
    first, *rest = text.strip().splitlines()
    assert first.startswith("S1 FAILED: profile cfx-llm2 on fake: ")
    assert len([line for line in rest if "FAIL" in line]) == len(scenario.result.failures) > 0
    assert "  evidence of S1: result.evidence['S1']" in rest


# ---- a host the shell switched goes back to the generation it was found on -------------------

ROLLED_BACK = Recovery(Action.ROLLED_BACK, "go-back", "rolled back to generation 1", True)


@pytest.fixture
def on_a_host(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The preflight holds (and records the generation, ``FakeSwitch``); each recovery is
    recorded as its ``on_failure`` and rolls back."""
    monkeypatch.setattr(scenario_module, "run_preflight", lambda *args: Preflight())
    monkeypatch.setattr(Scenario, "collect_evidence", lambda self, stage: None)
    recoveries: list[str] = []

    def recover(machine: Machine, generation: Generation, **options: object) -> Recovery:
        recoveries.append(f"{options['on_failure']} {generation.description}")
        return ROLLED_BACK

    monkeypatch.setattr(scenario_module, "recover", recover)
    return recoveries


def _host_scenario(until: str, switch: FakeSwitch | None = None) -> Scenario:
    return Scenario(
        FakeMachine(), CFX, switch or FakeSwitch(), until=until, preflight=True,
        on_failure=OnFailure.ROLLBACK,
    )  # fmt: skip


@pytest.mark.usefixtures("fake_steps")
@pytest.mark.parametrize("left", [None, 7, "an error at the prompt"])
def test_leaving_the_prompt_puts_a_switched_host_back(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    on_a_host: list[str],
    left: int | str | None,
) -> None:
    """Ctrl-D, exit(n) or an error at the prompt: the recorded generation comes back."""

    def prompt(scenario: Scenario, go_back: bool) -> int | None:
        assert "leaving puts fake back on generation 1" in stage_shell.banner(scenario, go_back)
        if left == "an error at the prompt":
            raise RuntimeError(left)
        assert not isinstance(left, str)
        return left

    monkeypatch.setattr(stage_shell, "interact", prompt)
    scenario = _host_scenario("S1")
    if isinstance(left, str):
        with pytest.raises(RuntimeError):
            stage_shell.enter(scenario, Path("/nonexistent"), go_back=True)
    else:
        assert stage_shell.enter(scenario, Path("/nonexistent"), go_back=True) == left
    assert on_a_host == ["rollback generation 1"]
    out = capsys.readouterr().out
    assert "found on generation 1; the way back, as root on the machine: go-back" in out
    assert "vmtests shell: rolled back: rolled back to generation 1" in out
    assert ROLLBACK_STAGE in scenario.result.snapshots


@pytest.mark.usefixtures("fake_steps")
def test_ctrl_c_while_switching_puts_the_host_back_and_says_so(
    capsys: pytest.CaptureFixture[str], on_a_host: list[str]
) -> None:
    class Interrupted(FakeSwitch):
        def switch(self, machine: Machine, profile: Profile) -> None:
            raise KeyboardInterrupt

    scenario = _host_scenario("S1", Interrupted())
    with pytest.raises(KeyboardInterrupt):
        stage_shell.enter(scenario, Path("/nonexistent"), go_back=True)
    assert on_a_host == ["rollback generation 1"]  # once: by the run, not again on leaving
    out = capsys.readouterr().out
    assert "S1 FAILED" in out
    assert "rolled back: rolled back to generation 1" in out


@pytest.mark.usefixtures("fake_steps")
def test_a_failed_rollback_on_leaving_exits_3(
    monkeypatch: pytest.MonkeyPatch, on_a_host: list[str]
) -> None:
    failed = Recovery(Action.FAILED, "go-back", "the rollback broke")
    monkeypatch.setattr(scenario_module, "recover", lambda *args, **options: failed)
    monkeypatch.setattr(stage_shell, "interact", lambda scenario, go_back: None)
    status = stage_shell.enter(_host_scenario("S1"), Path("/nonexistent"), go_back=True)
    assert status == ExitStatus.INCOMPLETE


@pytest.mark.usefixtures("fake_steps")
def test_a_refused_preflight_opens_no_prompt(monkeypatch: pytest.MonkeyPatch) -> None:
    nothing = "the host already runs cfx-llm2: the switch would restart nothing"
    item = CheckResult(
        PREFLIGHT, Check.PREFLIGHT_RESTARTS, "restarts", False, nothing,
        reason=Reason.SWITCH_CHANGES_NOTHING,
    )  # fmt: skip
    refusal = Preflight(items=[item])
    monkeypatch.setattr(scenario_module, "run_preflight", lambda *args: refusal)
    monkeypatch.setattr(stage_shell, "interact", lambda *args: pytest.fail("a prompt opened"))
    scenario = _host_scenario("S1")
    assert stage_shell.enter(scenario, Path("/nonexistent"), go_back=True) is None
    assert scenario.result.status == RunStatus.REFUSED
    assert cli.exit_status(scenario.result) == ExitStatus.USAGE


@pytest.mark.usefixtures("fake_steps")
def test_sigterm_while_switching_puts_the_host_back_as_ctrl_c_does(
    capsys: pytest.CaptureFixture[str], on_a_host: list[str]
) -> None:
    class Terminated(FakeSwitch):
        def switch(self, machine: Machine, profile: Profile) -> None:
            os.kill(os.getpid(), signal.SIGTERM)

    scenario = _host_scenario("S1", Terminated())
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):
        stage_shell.enter(scenario, Path("/nonexistent"), go_back=True)
    assert scenario.result.status == RunStatus.INTERRUPTED
    assert on_a_host == ["rollback generation 1"]
    assert "rolled back: rolled back to generation 1" in capsys.readouterr().out
    assert signal.getsignal(signal.SIGTERM) == before  # put back as it was


@pytest.mark.usefixtures("fake_steps")
def test_a_hangup_at_the_prompt_detaches_the_output_and_still_goes_back(
    monkeypatch: pytest.MonkeyPatch, on_a_host: list[str]
) -> None:
    detached: list[bool] = []
    monkeypatch.setattr(stage_shell, "detach_output", lambda: detached.append(True))

    def prompt(scenario: Scenario, go_back: bool) -> int | None:
        os.kill(os.getpid(), signal.SIGHUP)
        pytest.fail("the hangup did not end the prompt")

    monkeypatch.setattr(stage_shell, "interact", prompt)
    with pytest.raises(SystemExit) as ended:
        stage_shell.enter(_host_scenario("S1"), Path("/nonexistent"), go_back=True)
    assert ended.value.code == 128 + signal.SIGHUP
    assert detached == [True]
    assert on_a_host == ["rollback generation 1"]


@pytest.mark.usefixtures("fake_steps")
def test_a_host_whose_generation_cannot_be_recorded_is_not_switched_even_with_a_rollback_command(
    on_a_host: list[str],
) -> None:
    class Unrecorded(FakeSwitch):
        def record_generation(self, machine: Machine) -> Generation:
            raise DriverError("readlink /run/current-system: no such file")

    switch = Unrecorded()
    scenario = Scenario(
        FakeMachine(), CFX, switch, until="S1", preflight=True, on_failure=OnFailure.ROLLBACK,
        rollback_command="nixos-rebuild switch --rollback",
    )  # fmt: skip
    with pytest.raises(PreflightRefused):
        scenario.run()
    assert not any(call.startswith("switch") for call in switch.calls)
    (item,) = [r for r in scenario.result.preflight if r.failed]
    assert item.reason == Reason.NO_GENERATION
