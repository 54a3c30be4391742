"""The ``vmtests`` command: ``run``, ``selftest``, ``certify``, ``bench`` and ``cache-key``.

``vmtests run --profile P --target T`` runs the persistence scenario on one machine and writes
reports; ``vmtests selftest`` runs it on fresh reference guests for the shipped production
profiles, then the negative controls; ``vmtests certify`` is the hardware certification run
(``vmtests.certify.command``, its own exit statuses); ``vmtests bench`` hands over to
``vmtests.bench``; ``vmtests cache-key`` prints the digests and directories of the image cache
(``vmtests.guest.cache_key``) without building, for CI caches.

Exit status: 0 when every check passed, 1 when a check failed or a control went undetected,
2 for bad arguments or a missing profile, 3 when the run itself broke (a driver error), 130 on
Ctrl-C. Reports are written in every case, including failures and interruptions.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from vmtests.certify.command import add_parser as add_certify_parser
from vmtests.certify.command import command_certify
from vmtests.contracts.serving import SERVING_CONTAINER
from vmtests.contracts.status import ExitStatus, UsageError
from vmtests.driver.errors import DriverError
from vmtests.driver.log import log
from vmtests.driver.machine import Machine
from vmtests.guest import REFERENCE_TARGET, SSH_TARGET_PREFIX, TARGET_FORMS
from vmtests.guest.cache_key import cached_builds, output_lines
from vmtests.guest.image import install_ssh_key, write_guest_description
from vmtests.guest.targets import TargetError, machine_from_target
from vmtests.profiles import Profile, ProfileError, available_profiles, load_profile
from vmtests.report import write_controls_report, write_scenario_report
from vmtests.scenario.collection.redact import redact_text
from vmtests.scenario.controls.run import ControlsRun, run_all_controls
from vmtests.scenario.install.reference_switch import ReferenceSwitch
from vmtests.scenario.install.switching import PROFILE_FIELD, CommandSwitch, Switcher
from vmtests.scenario.judgement.results import CheckResult
from vmtests.scenario.runner.scenario import Scenario, ScenarioResult

SELFTEST_PROFILES = ("cfx-llm2", "resident")
BASE_PROFILE = "baseline"


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``vmtests``."""
    parser = argparse.ArgumentParser(
        prog="vmtests", description="Prove that Tenstorrent serving settings survive a reboot."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = commands.add_parser("run", help="run the persistence scenario on one target")
    run.add_argument("--profile", required=True, help="profile name or YAML path")
    run.add_argument(
        "--target",
        default=REFERENCE_TARGET,
        help=TARGET_FORMS,
    )
    run.add_argument(
        "--switch-command",
        help="command run on the machine to switch (required unless the target is "
        f"{REFERENCE_TARGET}), e.g. 'nixos-rebuild switch --flake /etc/nixos#{PROFILE_FIELD}' "
        f"({PROFILE_FIELD} becomes the profile's name)",
    )
    run.add_argument(
        "--expected-system",
        metavar="STORE_PATH",
        help="the NixOS system (toplevel) the switch must activate, e.g. the target pre-built "
        "into the VM's image: the report says which system runs after the switch and whether "
        "it is this one",
    )
    run.add_argument("--report-dir", type=Path, default=Path("vmtests-report"))
    run.add_argument(
        "--container",
        default=SERVING_CONTAINER,
        help="docker/podman container of the serving unit (default: %(default)s, as the NixOS "
        "module names it); '' for a unit whose MainPID is the server itself",
    )
    run.add_argument(
        "--hw-opt-in", action="store_true", help="required for ssh:// targets (reboots the host)"
    )
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
    commands.add_parser("bench", help="driver benchmarks (vmtests.bench)", add_help=False)
    add_certify_parser(commands)
    cache_key = commands.add_parser(
        "cache-key",
        help="print the digests and directories of the image cache (CI cache keys); builds nothing",
    )
    cache_key.add_argument(
        "--ssh-key-stdin",
        action="store_true",
        help="first make the private key on standard input the suite's ssh key (its public key "
        "is an input of the guest image); empty input keeps the key there is",
    )
    return parser


def _load(name: str) -> Profile:
    try:
        return load_profile(name)
    except ProfileError as error:
        raise UsageError(
            f"{error}\navailable profiles: {', '.join(available_profiles())}"
        ) from error


def _switcher(args: argparse.Namespace, profile: Profile) -> Switcher:
    if args.switch_command:
        return CommandSwitch(args.switch_command, expected_system=args.expected_system)
    if args.expected_system:
        raise UsageError("--expected-system needs --switch-command (a NixOS switch)")
    if args.target != REFERENCE_TARGET:
        raise UsageError(f"--target {args.target} needs --switch-command (how to switch it)")
    return ReferenceSwitch(profile)


@contextmanager
def _machine(target: str, state_dir: Path) -> Iterator[Machine]:
    """The machine for ``target``, closed (never powered off for ssh) at the end."""
    machine = machine_from_target(target, state_dir)
    try:
        yield machine
    finally:
        close: Callable[[], None] | None = getattr(machine, "close", None)
        if close is not None:
            close()


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


def run_scenario_on(
    machine: Machine,
    profile: Profile,
    switcher: Switcher,
    report_dir: Path,
    *,
    target: str,
    container: str | None = SERVING_CONTAINER,
) -> ScenarioResult:
    """Run the scenario and write the reports, whatever happens."""
    base = _load(BASE_PROFILE) if isinstance(switcher, ReferenceSwitch) else None
    scenario = Scenario(
        machine, profile, switcher, target=target, base_profile=base, container=container
    )
    try:
        scenario.run()
    finally:
        paths = write_scenario_report(scenario.result, report_dir, machine)
        log.info(f"reports: {', '.join(str(path) for path in paths.values())}")
    _print_outcome(scenario.result, report_dir)
    return scenario.result


def command_run(args: argparse.Namespace) -> int:
    """``vmtests run``."""
    profile = _load(args.profile)
    if args.target.startswith(SSH_TARGET_PREFIX) and not args.hw_opt_in:
        raise UsageError(
            f"--target {args.target} is a real host: the scenario reboots it; "
            "pass --hw-opt-in to allow that"
        )
    switcher = _switcher(args, profile)
    with (
        tempfile.TemporaryDirectory(prefix="vmtests-run-") as state,
        _machine(args.target, Path(state)) as machine,
    ):
        result = run_scenario_on(
            machine,
            profile,
            switcher,
            args.report_dir,
            target=args.target,
            container=args.container or None,
        )
    return ExitStatus.OK if result.ok else ExitStatus.FAILED


def command_selftest(args: argparse.Namespace) -> int:
    """``vmtests selftest``: the scenario per profile, then the negative controls."""
    profiles = [_load(name.strip()) for name in args.profiles.split(",") if name.strip()]
    if not profiles:
        raise UsageError("--profiles names no profile")
    guest = write_guest_description(args.report_dir / "guest.json")
    print("Reference guest built from instrumentation contract fields: " + ", ".join(guest))
    ok = True
    controls = ControlsRun()
    false_alarms: list[CheckResult] = []
    for index, profile in enumerate(profiles):
        switch = ReferenceSwitch(profile)
        print(f"{profile.name}: {switch.description}")
        with (
            tempfile.TemporaryDirectory(prefix="vmtests-selftest-") as state,
            _machine(REFERENCE_TARGET, Path(state)) as machine,
        ):
            result = run_scenario_on(
                machine, profile, switch, args.report_dir / profile.name, target=REFERENCE_TARGET
            )
            ok = ok and result.ok
            # Every profile's scenario runs a correct configuration: its failures are false
            # alarms too.
            false_alarms += result.failures
            print(f"{profile.name}: scenario {'passed' if result.ok else 'FAILED'}")
            # The controls reuse the first guest: each one resets it to the target first.
            if index == 0 and not args.skip_controls:
                try:
                    run_all_controls(machine, switch, controls)
                finally:
                    write_controls_report(
                        controls.report_outcomes,
                        false_alarms + controls.report_false_alarms,
                        args.report_dir / "controls",
                        controls.correct,
                    )
    outcomes = controls.report_outcomes
    false_alarms += controls.report_false_alarms
    if outcomes:
        print("\nNegative controls:")
        for outcome in outcomes:
            print(
                f"  {'detected' if outcome.detected else 'NOT DETECTED'}: {outcome.name}: "
                f"{redact_text(outcome.message)}"
            )
    print(f"False alarms on the correct configurations: {len(false_alarms)}")
    for alarm in false_alarms:
        print(f"  {redact_text(str(alarm))}")
    ok = ok and all(o.detected for o in outcomes) and not false_alarms
    return ExitStatus.OK if ok else ExitStatus.FAILED


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
        if args.command == "run":
            return command_run(args)
        if args.command == "certify":
            return command_certify(args)
        if args.command == "cache-key":
            return command_cache_key(args)
        return command_selftest(args)
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
