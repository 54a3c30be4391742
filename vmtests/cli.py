"""The ``vmtests`` command: ``check``, ``run``, ``selftest``, ``certify``, ``shell``, ``bench``,
``cache-key``, ``attach`` and ``stop``.

``vmtests check --profile P --target T`` checks a live machine against a profile, read-only (one
snapshot; no switch, no reboot, no restart), optionally writing a Prometheus textfile;
``vmtests run --profile P --target T`` runs the persistence scenario on one machine (preflight,
switch, S1, reboot, S2; ``--plan`` prints it and changes nothing) and writes reports, going back
to the generation it found when it fails (``--on-failure``); ``vmtests selftest`` runs it on
fresh reference guests for the shipped production profiles, then the negative controls;
``vmtests certify`` is the hardware certification run (``vmtests.certify.command``);
``vmtests shell --profile P --stage S`` brings a fresh machine to a stage of the scenario and opens
a Python prompt on it, or its login shell (``vmtests.scenario.runner.stage_shell``);
``vmtests bench`` hands over to ``vmtests.bench``; ``vmtests cache-key`` prints the digests and
directories of the image cache (``vmtests.guest.cache_key``) without building, for CI caches.
With ``--keep``, a failed run leaves its QEMU guest running for ``vmtests attach STATE`` and
``vmtests stop STATE`` (``vmtests.driver.keep``); ``--deadline`` bounds the whole run
(``vmtests.contracts.deadline``).

Exit status (``ExitStatus``): 0 when every check passed, 1 when a check failed or a control went
undetected, 2 for bad arguments, a missing profile or a run the preflight refused, 3 when the
run itself broke (a driver error) or its deadline passed, 130 on Ctrl-C. Reports are written
in every case, including failures, refusals and interruptions. Per-host settings (timeouts, ssh
options, the API key file, the container) come from the environment, ``--host-config`` and the
target's query options (``vmtests.guest.host_settings``).
"""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from functools import partial
from pathlib import Path

from vmtests.certify.command import add_parser as add_certify_parser
from vmtests.certify.command import command_certify
from vmtests.contracts import deadline
from vmtests.contracts.serving import SERVING_CONTAINER
from vmtests.contracts.settings import NO_CONTAINER, SettingError, Settings, settings
from vmtests.contracts.status import ExitStatus, RunStatus, UsageError
from vmtests.driver import keep, keep_run
from vmtests.driver.errors import DriverError
from vmtests.driver.lanes import run_in_lanes
from vmtests.driver.log import log
from vmtests.driver.machine import Machine
from vmtests.guest import REFERENCE_TARGET, SSH_TARGET_PREFIX, TARGET_FORMS
from vmtests.guest.cache_key import cached_builds, output_lines
from vmtests.guest.host_settings import machine_options, resolve
from vmtests.guest.image import install_ssh_key, is_reference_guest, write_guest_description
from vmtests.guest.targets import TargetError, machine_from_target
from vmtests.profiles import Profile, ProfileError, available_profiles, load_profile
from vmtests.report import write_controls_report, write_prometheus, write_scenario_report
from vmtests.scenario.collection.redact import redact_text
from vmtests.scenario.controls.run import ControlsRun
from vmtests.scenario.install.reference_switch import ReferenceSwitch
from vmtests.scenario.install.switching import PROFILE_FIELD, CommandSwitch, NoSwitch, Switcher
from vmtests.scenario.prepared import base_deployed, controls_jobs, prepared_reference_guest
from vmtests.scenario.runner import stage_shell
from vmtests.scenario.runner.preflight import PreflightRefused, run_preflight
from vmtests.scenario.runner.recovery import OnFailure
from vmtests.scenario.runner.run_plan import RunPlan, render_run_plan
from vmtests.scenario.runner.scenario import STAGES, Scenario, ScenarioResult

SELFTEST_PROFILES = ("cfx-llm2", "resident")
SELFTEST_LANES = 2
"""Guests the selftest runs at once at most: each guest uses about one core under TCG, and two
side by side do more in the same time than one (docs/ci-time.md)."""
BASE_PROFILE = "baseline"


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``vmtests``."""
    parser = argparse.ArgumentParser(
        prog="vmtests", description="Prove that Tenstorrent serving settings survive a reboot."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    check = commands.add_parser(
        "check", help="check a live target against a profile, read-only (no switch, no reboot)"
    )
    _target_arguments(check, "vmtests-check")
    check.add_argument(
        "--deploy",
        metavar="PROFILE",
        help=f"{REFERENCE_TARGET} only: deploy this profile first (default: {BASE_PROFILE})",
    )
    keep_run.add_arguments(check)
    check.add_argument(
        "--prometheus",
        type=Path,
        metavar="FILE",
        help="also write the result as a node_exporter textfile-collector file",
    )
    run = commands.add_parser("run", help="run the persistence scenario on one target")
    _target_arguments(run, "vmtests-report")
    _switch_arguments(run)
    _going_back_arguments(run, "after a failure, an error or Ctrl-C")
    run.add_argument(
        "--plan", action="store_true", help="print every step and command; change nothing"
    )
    run.add_argument(
        "--hw-opt-in", action="store_true", help="required for ssh:// targets (reboots the host)"
    )
    keep_run.add_arguments(run)
    selftest = commands.add_parser(
        "selftest", help="scenario + negative controls on fresh reference guests"
    )
    selftest.add_argument("--report-dir", type=Path, default=Path("vmtests-selftest"))
    selftest.add_argument(
        "--profiles",
        default=",".join(SELFTEST_PROFILES),
        help="comma-separated profiles to run the scenario for",
    )
    selftest.add_argument("--skip-controls", action="store_true", help="scenario only")
    keep_run.add_arguments(selftest)
    selftest.add_argument(
        "--lanes",
        type=int,
        default=min(SELFTEST_LANES, os.cpu_count() or 1),
        help="guests run at once (default: %(default)s, one per core up to two)",
    )
    _shell_parser(commands)
    commands.add_parser("bench", help="driver benchmarks (vmtests.bench)", add_help=False)
    add_certify_parser(commands)
    cache_key = commands.add_parser(
        "cache-key",
        help="print the digests and directories of the image cache (CI cache keys); builds nothing",
    )
    attach = commands.add_parser(
        "attach", help="a root shell on a guest kept by --keep, or one command: -- CMD"
    )
    attach.add_argument("state", type=Path, metavar="STATE", help="the state the run printed")
    attach.add_argument(
        "remote", nargs=argparse.REMAINDER, metavar="-- CMD", help="run CMD; its exit status"
    )
    stop = commands.add_parser("stop", help="power off a guest kept by --keep; remove its files")
    stop.add_argument("state", type=Path, metavar="STATE", help="the state the run printed")
    cache_key.add_argument(
        "--ssh-key-stdin",
        action="store_true",
        help="first make the private key on standard input the suite's ssh key (its public key "
        "is an input of the guest image); empty input keeps the key there is",
    )
    return parser


def _shell_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``vmtests shell`` (``vmtests.scenario.runner.stage_shell``)."""
    # No abbreviations: `nix run .#shell` refuses the options that are the app's own by name.
    shell = commands.add_parser(
        "shell",
        allow_abbrev=False,
        help="bring a fresh machine to a stage of the scenario (S0 base, S1 switched, S2 "
        "rebooted) and open a Python prompt on it, or its login shell (--sh)",
    )
    _target_arguments(shell, None)
    shell.add_argument(
        "--stage", required=True, choices=STAGES, help="the stage to bring the machine to"
    )
    shell.add_argument(
        "--sh", action="store_true", help="the guest's login shell over ssh instead of Python"
    )
    _switch_arguments(shell)
    _going_back_arguments(
        shell, "after a failed stage, an error or Ctrl-C, and when the session ends"
    )
    shell.add_argument(
        "--hw-opt-in",
        action="store_true",
        help="required for ssh:// targets at S1 and S2 (the switch, and the reboot at S2)",
    )
    keep_run.add_deadline_argument(
        shell, "stop bringing the machine to its stage after this long (the prompt that follows "
        "has no deadline): the machine closed"
    )  # fmt: skip


def _going_back_arguments(parser: argparse.ArgumentParser, when: str) -> None:
    """``--on-failure`` and ``--rollback-command`` (``_on_failure``)."""
    parser.add_argument(
        "--on-failure",
        choices=tuple(OnFailure),
        help=f"{when}: go back to the generation recorded before the switch (default for "
        "ssh://) or leave the machine as it is (default for VMs)",
    )
    parser.add_argument(
        "--rollback-command",
        help="how to go back instead of the recorded generation's own command; {generation} "
        "is replaced by it (the toplevel store path on NixOS)",
    )


def _on_failure(args: argparse.Namespace, target: str) -> OnFailure:
    """``--on-failure``, by default ``ROLLBACK`` on an ``ssh://`` target, else ``LEAVE``."""
    return OnFailure(
        args.on_failure
        or (OnFailure.ROLLBACK if target.startswith(SSH_TARGET_PREFIX) else OnFailure.LEAVE)
    )


def _switch_arguments(parser: argparse.ArgumentParser) -> None:
    """``--switch-command``, ``--expected-system`` and ``--reference-switch`` (``_switcher``)."""
    parser.add_argument(
        "--switch-command",
        help="command run on the machine to switch (required unless the target is "
        f"{REFERENCE_TARGET}), e.g. 'nixos-rebuild switch --flake /etc/nixos#{PROFILE_FIELD}' "
        f"({PROFILE_FIELD} becomes the profile's name)",
    )
    parser.add_argument(
        "--expected-system",
        metavar="STORE_PATH",
        help="the NixOS system (toplevel) the switch must activate, e.g. the target pre-built "
        "into the VM's image: the report says which system runs after the switch and whether "
        "it is this one",
    )
    parser.add_argument(
        "--reference-switch",
        action="store_true",
        help=f"switch with the reference guest's install step (the default on {REFERENCE_TARGET}); "
        "for a reference guest reached over ssh, refused on any other machine",
    )


def _target_arguments(parser: argparse.ArgumentParser, report_dir: str | None) -> None:
    """``--profile``, ``--target``, ``--host-config``, ``--container`` and, unless
    ``report_dir`` is None, ``--report-dir`` (defaulting to it)."""
    parser.add_argument("--profile", required=True, help="profile name or YAML path")
    parser.add_argument(
        "--target",
        default=REFERENCE_TARGET,
        help=f"{TARGET_FORMS}, with a host's settings as query options: "
        "ssh://root@host?ready_timeout=3600&identity_file=/k",
    )
    parser.add_argument(
        "--host-config",
        type=Path,
        metavar="FILE",
        help=f"YAML file of the host's settings ({', '.join(Settings.per_host())})",
    )
    parser.add_argument(
        "--container",
        help=f"docker/podman container of the serving unit (default: {SERVING_CONTAINER}, as "
        "the NixOS module names it); '' for a unit whose MainPID is the server itself",
    )
    if report_dir is not None:
        parser.add_argument("--report-dir", type=Path, default=Path(report_dir))


def _settings(args: argparse.Namespace) -> tuple[str, Settings]:
    """The target without its options, and the host's settings (``--container`` wins)."""
    try:
        target, found = resolve(args.target, args.host_config)
        if args.container is not None:
            found = found.overridden({"container": args.container or NO_CONTAINER}, "--container")
    except SettingError as error:
        raise UsageError(str(error)) from error
    return target, found


def _load(name: str) -> Profile:
    try:
        return load_profile(name)
    except ProfileError as error:
        raise UsageError(
            f"{error}\navailable profiles: {', '.join(available_profiles())}"
        ) from error


def _switcher(args: argparse.Namespace, profile: Profile, target: str, found: Settings) -> Switcher:
    if args.switch_command and args.reference_switch:
        raise UsageError("--switch-command and --reference-switch exclude each other")
    if args.switch_command:
        return CommandSwitch(
            args.switch_command, timeout=found.switch_timeout, expected_system=args.expected_system
        )
    if args.expected_system:
        raise UsageError("--expected-system needs --switch-command (a NixOS switch)")
    if target != REFERENCE_TARGET and not args.reference_switch:
        raise UsageError(f"--target {target} needs --switch-command (how to switch it)")
    return ReferenceSwitch(profile)


@contextmanager
def _machine(target: str, state_dir: Path, found: Settings) -> Iterator[Machine]:
    """The machine for ``target`` (an ssh target with the settings' ssh options), closed (never
    powered off for ssh) at the end."""
    options = machine_options(target, found)
    machine = machine_from_target(target, state_dir, **options)
    try:
        yield machine
    finally:
        close: Callable[[], None] | None = getattr(machine, "close", None)
        if close is not None:
            close()


@contextmanager
def _checked_machine(
    target: str,
    state_dir: Path,
    found: Settings,
    deploy: ReferenceSwitch | None,
    name: str = "check",
) -> Iterator[tuple[Machine, bool]]:
    """The machine ``vmtests check`` reads (or ``vmtests shell`` brings to a stage: ``name``),
    and whether it is started already: given ``deploy`` (on ``qemu:reference``), a guest with
    its base deployed, restored from the snapshot cache (booted, deployed and saved there when
    the cache lacks it, as the selftest's scenarios start); else ``_machine``."""
    if deploy is None:
        with _machine(target, state_dir, found) as machine:
            yield machine, False
        return
    with prepared_reference_guest(state_dir, base_deployed(deploy), name) as prepared:
        log.info(f"{name}: the guest {prepared.how}")
        yield prepared.machine, True


def _print_outcome(result: ScenarioResult, report_dir: Path) -> None:
    failures = result.failures
    verdict = "PASSED" if result.ok else "FAILED"
    print(f"\n{verdict}: profile {result.profile.name} on {result.target}: ", end="")
    print(f"{len(result.checks)} checks, {len(failures)} failed, {result.wall_seconds:.1f}s")
    for failure in failures:
        print(f"  {redact_text(str(failure))}")
    if result.error:
        print(f"  run error: {redact_text(result.error)}")
    if result.stopped_at:
        print(f"  stopped after {result.stopped_at}: it failed, so the machine was not rebooted")
    for stage in result.evidence:
        print(f"  evidence of {stage}: {report_dir / 'evidence' / stage}/")
    if result.recovery is not None:
        print(f"  {result.recovery.action}: {result.recovery.message}")
    elif result.generation is not None and not result.ok:
        print(
            f"  to go back to {result.generation.description}, run as root on the machine: "
            f"{result.generation.rollback_command}"
        )


def run_scenario_on(
    machine: Machine,
    profile: Profile,
    switcher: Switcher,
    report_dir: Path,
    *,
    target: str,
    found: Settings | None = None,
    preflight: bool = False,
    on_failure: OnFailure = OnFailure.LEAVE,
    rollback_command: str | None = None,
) -> ScenarioResult:
    """Run the scenario and write the reports, whatever happens; a preflight refusal is
    reported in the result (status ``refused``), not raised."""
    base = _load(BASE_PROFILE) if isinstance(switcher, ReferenceSwitch) else None
    scenario = Scenario(
        machine, profile, switcher, target=target, base_profile=base,
        settings=found or settings(), preflight=preflight, on_failure=on_failure,
        rollback_command=rollback_command,
    )  # fmt: skip
    try:
        scenario.run()
    except PreflightRefused as refused:
        print(f"vmtests run: {refused}", file=sys.stderr)
    finally:
        paths = write_scenario_report(scenario.result, report_dir, machine)
        log.info(f"reports: {', '.join(str(path) for path in paths.values())}")
        # Also when the run broke or was interrupted: where the machine was left, and the
        # command that goes back, belong on the screen, not only in the report.
        _print_outcome(scenario.result, report_dir)
    return scenario.result


def exit_status(result: ScenarioResult) -> ExitStatus:
    """The exit status of a run or a check that ended with ``result``."""
    if result.status == RunStatus.REFUSED:
        return ExitStatus.USAGE
    if result.ok:
        return ExitStatus.OK
    return ExitStatus.FAILED if result.status == RunStatus.FINISHED else ExitStatus.INCOMPLETE


def command_run(args: argparse.Namespace) -> int:
    """``vmtests run``."""
    profile = _load(args.profile)
    target, found = _settings(args)
    if target.startswith(SSH_TARGET_PREFIX) and not args.hw_opt_in and not args.plan:
        raise UsageError(
            f"--target {target} is a real host: the scenario reboots it; "
            "pass --hw-opt-in to allow that (--plan needs none: it changes nothing)"
        )
    switcher = _switcher(args, profile, target, found)
    on_failure = _on_failure(args, target)
    if args.plan:
        return command_plan(
            args, profile, target=target, found=found, switcher=switcher, on_failure=on_failure
        )
    result: ScenarioResult | None = None
    with (
        keep_run.run_state("vmtests-run-") as state,
        _machine(target, state.path, found) as machine,
    ):
        try:
            if args.reference_switch:
                _require_reference_guest(machine)
            result = run_scenario_on(
                machine, profile, switcher, args.report_dir, target=args.target, found=found,
                preflight=True, on_failure=on_failure, rollback_command=args.rollback_command,
            )  # fmt: skip
        finally:
            _keep_if_failed(args, machine, state, result)
    assert result is not None  # run_scenario_on returned (it raises otherwise)
    return exit_status(result)


def _keep_if_failed(
    args: argparse.Namespace,
    machine: Machine,
    state: keep_run.RunState,
    result: ScenarioResult | None,
) -> None:
    """``--keep``: keep ``machine`` when the run did not pass (see ``keep_run.should_keep``)."""
    failed = result is None or not result.ok
    if keep_run.should_keep(args.keep, failed):
        target = getattr(args, "target", REFERENCE_TARGET)  # selftest's guests have none
        for line in keep_run.keep_machine(machine, state, keep_for=args.keep_for, target=target):
            print(line)


def _require_reference_guest(machine: Machine) -> None:
    """Refuse ``--reference-switch`` on a machine that is not a reference guest."""
    machine.start()
    if not is_reference_guest(machine):
        raise UsageError(
            f"--reference-switch: {machine.name} is not a reference guest (it would install the "
            "stub device layer): switch it with --switch-command"
        )


def command_plan(
    args: argparse.Namespace,
    profile: Profile,
    *,
    target: str,
    found: Settings,
    switcher: Switcher,
    on_failure: OnFailure,
) -> int:
    """``vmtests run --plan``: the steps; over ssh, the host's answers too (read only)."""
    plan = RunPlan(
        profile, args.target, switcher.description, found, on_failure, args.rollback_command,
        deploys_base=isinstance(switcher, ReferenceSwitch) and not args.reference_switch,
    )  # fmt: skip
    if target.startswith(SSH_TARGET_PREFIX):
        with (
            tempfile.TemporaryDirectory(prefix="vmtests-plan-") as state,
            _machine(target, Path(state), found) as machine,
        ):
            machine.start()
            plan = replace(plan, preflight=run_preflight(machine, profile, switcher, found))
            if isinstance(switcher, CommandSwitch):
                try:
                    plan = replace(plan, generation=switcher.record_generation(machine))
                except DriverError as error:
                    plan = replace(plan, generation_note=str(error))
            else:
                plan = replace(plan, generation_note="the installed unit set, archived then")
    print(f"vmtests run --plan: profile {profile.name} on {args.target}; nothing is changed\n")
    print(render_run_plan(plan))
    refusal = plan.preflight.refusal if plan.preflight else None
    if refusal is not None:
        print(f"\nthe run would be refused ({refusal.check}, {refusal.reason}): {refusal.message}")
        return ExitStatus.USAGE
    return ExitStatus.OK


def command_check(args: argparse.Namespace) -> int:
    """``vmtests check``: one read-only snapshot against the profile; exit 0/1/2/3."""
    profile = _load(args.profile)
    target, found = _settings(args)
    deploy: ReferenceSwitch | None = None
    if target == REFERENCE_TARGET:
        deployed = _load(args.deploy or BASE_PROFILE)
        deploy = ReferenceSwitch(deployed, base_serving_profile=deployed.serving_profile)
    elif args.deploy:
        raise UsageError(f"--deploy applies to {REFERENCE_TARGET} only: a check changes nothing")
    with (
        keep_run.run_state("vmtests-check-") as state,
        _checked_machine(target, state.path, found, deploy) as (machine, started),
    ):
        scenario = Scenario(
            machine, profile, deploy, target=args.target, settings=found, start_machine=not started
        )
        try:
            scenario.check()
        finally:
            result = scenario.result
            paths = write_scenario_report(result, args.report_dir, machine)
            if args.prometheus is not None:
                paths["prometheus"] = write_prometheus(result, args.prometheus)
            log.info(f"reports: {', '.join(str(path) for path in paths.values())}")
            _keep_if_failed(args, machine, state, result)
    verdict = "CONFORMS" if result.ok else "DOES NOT CONFORM"
    print(f"\n{verdict}: {args.target} against profile {profile.name}: {len(result.checks)} "
          f"checks, {len(result.failures)} failed; report in {args.report_dir}")  # fmt: skip
    for failure in result.failures:
        print(f"  {redact_text(str(failure))}")
    return exit_status(result)


def command_shell(args: argparse.Namespace) -> int:
    """``vmtests shell``: a fresh machine brought to ``--stage`` by the scenario itself, then a
    Python prompt on it, or its login shell (``vmtests.scenario.runner.stage_shell``). On
    ``qemu:reference`` the guest starts from the base deployment (as ``vmtests check``'s);
    ``--stage S0`` of a host needs no switch command: nothing is switched. A host switched at
    S1 or S2 goes back to the generation it was found on when the session ends, and at once
    when its stage fails (``--on-failure rollback``, the default on ``ssh://``: the run then
    refuses to switch a host whose generation it cannot record)."""
    profile = _load(args.profile)
    target, found = _settings(args)
    on_host, changes = target.startswith(SSH_TARGET_PREFIX), args.stage != STAGES[0]
    if on_host and changes and not args.hw_opt_in:
        reboot = " and reboots it" if args.stage == STAGES[-1] else ""
        raise UsageError(
            f"--target {target} is a real host: --stage {args.stage} switches it{reboot}; "
            f"pass --hw-opt-in to allow that (--stage {STAGES[0]} needs none: it changes nothing)"
        )
    foreign = target != REFERENCE_TARGET and not args.reference_switch
    switcher: Switcher = (
        NoSwitch()
        if not changes and foreign and not args.switch_command
        else _switcher(args, profile, target, found)
    )
    reference = switcher if isinstance(switcher, ReferenceSwitch) else None
    deploy = reference if target == REFERENCE_TARGET else None
    with (
        keep_run.run_state("vmtests-shell-") as state,
        _checked_machine(target, state.path, found, deploy, "shell") as (machine, started),
    ):
        if args.reference_switch:
            _require_reference_guest(machine)
        on_failure = _on_failure(args, target)
        scenario = Scenario(
            machine, profile, switcher, target=args.target, settings=found, until=args.stage,
            base_profile=None if reference is None else _load(BASE_PROFILE),
            start_machine=not started, preflight=changes, on_failure=on_failure,
            rollback_command=args.rollback_command,
        )  # fmt: skip
        go_back = on_failure == OnFailure.ROLLBACK
        status = stage_shell.enter(scenario, state.path, sh=args.sh, go_back=go_back)
    return exit_status(scenario.result) if status is None else status


def command_selftest(args: argparse.Namespace) -> int:
    """``vmtests selftest``: the scenario per profile, then the negative controls, each on a
    guest of its own, ``--lanes`` guests at a time."""
    profiles = [_load(name.strip()) for name in args.profiles.split(",") if name.strip()]
    if not profiles:
        raise UsageError("--profiles names no profile")
    guest = write_guest_description(args.report_dir / "guest.json")
    print("Reference guest built from instrumentation contract fields: " + ", ".join(guest))
    switches = [ReferenceSwitch(profile) for profile in profiles]
    controls = ControlsRun()
    with keep_run.run_state("vmtests-selftest-") as top:
        state = top.path
        jobs: list[Callable[[], ScenarioResult | None]] = [
            partial(_selftest_scenario, switch, top, args) for switch in switches
        ]
        # The controls start from the first profile's target.
        more = (
            []
            if args.skip_controls
            else controls_jobs(state, switches[0], controls, lanes=args.lanes)
        )
        results: list[ScenarioResult | None] = []
        try:
            results = run_in_lanes([*jobs, *more], args.lanes)[: len(jobs)]
        finally:
            controls.in_order()
            # Every profile's scenario runs a correct configuration: its failures are false
            # alarms too.
            false_alarms = [
                failure
                for result in results
                if isinstance(result, ScenarioResult)
                for failure in result.failures
            ]
            if more:
                write_controls_report(
                    controls.report_outcomes,
                    false_alarms + controls.report_false_alarms,
                    args.report_dir / "controls",
                    controls.correct,
                )
    ok = all(isinstance(result, ScenarioResult) and result.ok for result in results)
    outcomes = controls.report_outcomes
    false_alarms += controls.report_false_alarms
    if outcomes:
        print("\nNegative controls:")
        for outcome in outcomes:
            print(
                f"  {'detected' if outcome.detected else 'NOT DETECTED'}: {outcome.name}: "
                f"{redact_text(outcome.message)} ({outcome.seconds:.0f} s)"
            )
    print(f"False alarms on the correct configurations: {len(false_alarms)}")
    for alarm in false_alarms:
        print(f"  {redact_text(str(alarm))}")
    ok = ok and all(o.detected for o in outcomes) and not false_alarms
    return ExitStatus.OK if ok else ExitStatus.FAILED


def _selftest_scenario(
    switch: ReferenceSwitch, top: keep_run.RunState, args: argparse.Namespace
) -> ScenarioResult:
    """One profile's scenario, from the base deployment (restored from a snapshot when one was
    saved, ``vmtests.guest.snapshot_cache``; S0, the switch and the reboot are real). With
    ``--keep``, a failed scenario's guest is kept (in its own directory under ``top``, which
    then stays); the controls' guests never are."""
    name = switch.profile.name
    own = keep_run.RunState(top.path / name)
    with prepared_reference_guest(own.path, base_deployed(switch), f"scenario-{name}") as ready:
        print(f"{name}: {switch.description}; guest {ready.how}")
        result: ScenarioResult | None = None
        try:
            result = run_scenario_on(
                ready.machine, switch.profile, switch, args.report_dir / name,
                target=REFERENCE_TARGET,
            )  # fmt: skip
        finally:
            _keep_if_failed(args, ready.machine, own, result)
            top.kept = top.kept or own.kept
    print(f"{name}: scenario {'passed' if result.ok else 'FAILED'}")
    return result


def command_cache_key(args: argparse.Namespace) -> int:
    """``vmtests cache-key``: ``name=value`` lines for every content-addressed build."""
    if args.ssh_key_stdin:
        private_key = sys.stdin.read()
        if private_key.strip():
            install_ssh_key(private_key)
        else:
            print(
                "vmtests cache-key: no ssh key on standard input: the guest image's digest "
                "follows the suite's own key, which a fresh machine generates anew",
                file=sys.stderr,
            )
    for line in output_lines(cached_builds()):
        print(line)
    return ExitStatus.OK


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "check":
        return command_check(args)
    if args.command == "run":
        return command_run(args)
    if args.command == "certify":
        return command_certify(args)
    if args.command == "shell":
        return command_shell(args)
    if args.command == "cache-key":
        return command_cache_key(args)
    if args.command == "attach":
        return command_attach(args)
    if args.command == "stop":
        return command_stop(args)
    return command_selftest(args)


def command_attach(args: argparse.Namespace) -> int:
    """``vmtests attach STATE [-- CMD]``: ssh to a kept guest; CMD's exit status."""
    state = keep.read_state(args.state)
    if not keep.alive(state.qemu_pid, state.qemu_start):
        raise UsageError(f"{state.name} (QEMU pid {state.qemu_pid}) is no longer running")
    remote = args.remote[1:] if args.remote[:1] == ["--"] else args.remote
    return subprocess.run(keep.attach_argv(state, remote), check=False).returncode


def command_stop(args: argparse.Namespace) -> int:
    """``vmtests stop STATE``: power off a kept guest and remove what it left."""
    state = keep.read_state(args.state)
    for line in keep.stop_kept(state):
        print(f"vmtests stop: {state.name}: {line}")
    return ExitStatus.OK


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``vmtests`` console script."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["bench"]:
        # Imported by name: the benchmarks belong to the driver and load only when asked for.
        bench = importlib.import_module("vmtests.bench")
        return int(bench.main(arguments[1:]) or 0)
    parser = build_parser()
    args = parser.parse_args(arguments)
    try:
        with (
            keep.keeping(getattr(args, "keep", False)),
            deadline.run_deadline(getattr(args, "deadline", 0.0)),
        ):
            status = _dispatch(args)
        passed = deadline.passed()
        if passed is not None:  # the command handled it like an interruption, and finished
            raise passed
        return status
    except deadline.DeadlineExceeded as passed:
        print(f"vmtests {args.command}: {passed}; reports written so far are kept",
              file=sys.stderr)  # fmt: skip
        return ExitStatus.INCOMPLETE
    except (UsageError, TargetError) as error:
        print(f"vmtests {args.command}: error: {error}", file=sys.stderr)
        return ExitStatus.USAGE
    except KeyboardInterrupt:
        print("\nvmtests: interrupted; reports written so far are kept", file=sys.stderr)
        return ExitStatus.INTERRUPTED
    except DriverError as error:
        print(f"vmtests {args.command}: driver error: {redact_text(str(error))}", file=sys.stderr)
        return ExitStatus.INCOMPLETE


if __name__ == "__main__":
    sys.exit(main())
