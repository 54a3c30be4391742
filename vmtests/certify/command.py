"""``vmtests certify``: the command line of the certification run (hooked into ``vmtests.cli``).

    vmtests certify --target qemu:reference --profile cfx-llm2 --ab resident --report-dir DIR
    vmtests certify --target ssh://root@cfx-llm2 --hw-opt-in --profile cfx-llm2 --ab resident \\
        --switch-command 'nixos-rebuild switch --flake /etc/nixos#{profile}' --report-dir DIR

Exit status: 0 certified, 1 a gate failed, 2 usage, 3 the run could not complete (preflight
refused, host unreachable, no golden values, interrupted); the certificate says which.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from vmtests.certify.arms import reference_switch
from vmtests.certify.context import MIN_REQUESTS, Options
from vmtests.certify.model import CERTIFY, PROBE, RECORD, CertificationResult
from vmtests.certify.plan import ALL_GATES, build_plan, render_plan
from vmtests.certify.run import certify
from vmtests.contracts.instrumentation import GUEST_MEMORY_MB
from vmtests.contracts.serving import MIN_MEM_AVAILABLE_GIB, SERVING_CONTAINER, SERVING_PORT
from vmtests.contracts.settings import NO_CONTAINER, SettingError, Settings
from vmtests.contracts.status import ExitStatus, UsageError
from vmtests.driver import keep_run
from vmtests.driver.errors import DriverError
from vmtests.guest import REFERENCE_TARGET, SSH_TARGET_PREFIX, TARGET_FORMS
from vmtests.guest.host_settings import machine_options, resolve
from vmtests.guest.targets import machine_from_target
from vmtests.profiles import Profile, ProfileError, load_profile
from vmtests.scenario.collection.redact import redact_text
from vmtests.scenario.install.switching import CommandSwitch, NoSwitch, Switcher

REFERENCE_RESTART_SECONDS = 15.0


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``certify`` on the ``vmtests`` sub-command parser."""
    parser = commands.add_parser("certify", help="the hardware certification run (owner's gates)")
    parser.add_argument("--target", default=REFERENCE_TARGET, help=TARGET_FORMS)
    parser.add_argument("--profile", required=True, help="the configuration to certify (A)")
    parser.add_argument(
        "--ab", metavar="PROFILE", help="A/B against this profile (B), e.g. resident"
    )
    parser.add_argument("--requests", type=int, default=MIN_REQUESTS, help="concurrency gate n")
    parser.add_argument("--ab-blocks", type=int, default=3, help="ABBA blocks of the A/B")
    parser.add_argument(
        "--min-mem-gib", type=float, default=MIN_MEM_AVAILABLE_GIB, help="never below 4"
    )
    modes = parser.add_mutually_exclusive_group()
    modes.add_argument(
        "--record-golden",
        action="store_true",
        help="record golden shas per condition (batch size, cache state) by replaying the gates",
    )
    modes.add_argument(
        "--probe-determinism",
        action="store_true",
        help="report only, first on a new host: the same prompts across batch sizes, cache "
        "state and repeats; which outputs differ and how",
    )
    parser.add_argument("--plan", action="store_true", help="print the steps; change nothing")
    parser.add_argument("--only", help=f"comma-separated gates ({', '.join(ALL_GATES[1:])})")
    parser.add_argument("--report-dir", type=Path, default=Path("vmtests-certificate"))
    parser.add_argument("--switch-command", help="switch template for ssh targets ({profile})")
    parser.add_argument(
        "--container",
        help=f"the serving container, read with docker inspect (default: {SERVING_CONTAINER}, "
        "as the NixOS module names it); '' for a unit whose MainPID is the server itself",
    )
    parser.add_argument(
        "--port", type=int, help=f"serving port on the host (default: {SERVING_PORT})"
    )
    parser.add_argument(
        "--host-config",
        type=Path,
        metavar="FILE",
        help="YAML file of the host's settings (vmtests.guest.host_settings); the target's "
        "query options win over it, these flags over both",
    )
    parser.add_argument("--hw-opt-in", action="store_true", help="required for ssh:// targets")
    parser.add_argument(
        "--identity-file", type=Path, help="ssh targets: the private key to log in with"
    )
    parser.add_argument(
        "--known-hosts",
        type=Path,
        help="ssh targets: the known_hosts file that pins the host's key (checked strictly)",
    )
    keep_run.add_arguments(parser)


def _profile(name: str) -> Profile:
    try:
        return load_profile(name)
    except ProfileError as error:
        raise UsageError(str(error)) from error


def _options(args: argparse.Namespace) -> Options:
    only = tuple(name.strip() for name in (args.only or "").split(",") if name.strip())
    unknown = sorted(set(only) - set(ALL_GATES))
    if unknown:
        raise UsageError(f"--only: unknown gate(s) {unknown}; gates: {ALL_GATES[1:]}")
    if args.requests < 1 or args.ab_blocks < 1:
        raise UsageError("--requests and --ab-blocks must be positive")
    return Options(
        requests=args.requests, ab_blocks=args.ab_blocks, min_mem_gib=args.min_mem_gib, only=only
    )


def _settings(args: argparse.Namespace) -> tuple[str, Settings]:
    """The target without its options and the host's settings: the environment's,
    ``--host-config``, the target's options, then this command's flags."""
    flags = {
        "identity_file": args.identity_file,
        "known_hosts": args.known_hosts,
        "container": None if args.container is None else args.container or NO_CONTAINER,
        "serving_port": args.port,
    }
    given = {name: str(value) for name, value in flags.items() if value is not None}
    try:
        target, found = resolve(args.target, args.host_config)
        found = found.overridden(given, "command line")
    except SettingError as error:
        raise UsageError(str(error)) from error
    ssh = [name for name in ("identity_file", "known_hosts") if name in given]
    if ssh and not target.startswith(SSH_TARGET_PREFIX):
        flags_given = ", ".join("--" + name.replace("_", "-") for name in ssh)
        raise UsageError(f"{flags_given} apply to ssh:// targets only, not {target}")
    return target, found


def _machine_options(target: str, found: Settings) -> dict[str, object]:
    """Options of the machine the target names: the contract's memory for the reference guest,
    the ssh settings for an ssh target."""
    if target == REFERENCE_TARGET:
        return {"memory_mb": GUEST_MEMORY_MB}
    return machine_options(target, found)


def _switcher(args: argparse.Namespace, profile: Profile, target: str, found: Settings) -> Switcher:
    """The reference guest's install step (the profile is its base: a host deployed with it),
    restarts left to the run; else the switch command; else no switch at all."""
    if target.startswith(SSH_TARGET_PREFIX) and not args.hw_opt_in:
        raise UsageError(
            f"--target {target} is a real host: certification restarts its serving "
            "unit and switches its configuration; pass --hw-opt-in to allow that"
        )
    if target == REFERENCE_TARGET:
        return reference_switch(profile)
    if args.switch_command:
        return CommandSwitch(args.switch_command, timeout=found.switch_timeout)
    if args.ab:
        raise UsageError(f"--ab on {target} needs --switch-command (with {{profile}})")
    return NoSwitch()


def _mode(args: argparse.Namespace) -> str:
    if args.record_golden:
        return RECORD
    return PROBE if args.probe_determinism else CERTIFY


def command_certify(args: argparse.Namespace) -> int:
    """``vmtests certify``; returns the exit status (bad arguments raise ``UsageError``, and an
    unknown target ``TargetError``: ``vmtests.cli`` reports both, exit status 2)."""
    profile, ab_profile = _profile(args.profile), _profile(args.ab) if args.ab else None
    options = _options(args)
    target, found = _settings(args)
    switcher = _switcher(args, profile, target, found)
    machine_options = _machine_options(target, found)
    restart = REFERENCE_RESTART_SECONDS if target == REFERENCE_TARGET else found.ready_timeout
    switch = switcher.description
    if args.plan:
        steps = build_plan(
            options, profile=profile.name, ab_profile=args.ab, switch=switch,
            mode=_mode(args), restart_seconds=restart,
        )  # fmt: skip
        print(f"vmtests certify --plan: {args.target}, nothing will be changed\n")
        print(render_plan(steps))
        return ExitStatus.OK
    return _run(
        args, profile, ab_profile, options, switcher,
        target=target, found=found, machine_options=machine_options,
    )  # fmt: skip


def _run(
    args: argparse.Namespace,
    profile: Profile,
    ab_profile: Profile | None,
    options: Options,
    switcher: Switcher,
    *,
    target: str,
    found: Settings,
    machine_options: dict[str, object],
) -> int:
    result: CertificationResult | None = None
    with keep_run.run_state("vmtests-certify-") as state:
        machine = machine_from_target(target, state.path, **machine_options)
        try:
            machine.start()
            switcher.prepare_base(machine)
            result = certify(
                machine, profile, target=args.target,
                switcher=switcher, report_dir=args.report_dir,
                options=options, ab_profile=ab_profile, mode=_mode(args), settings=found,
            )  # fmt: skip
        except DriverError as error:
            print(f"vmtests certify: the run could not start: {redact_text(str(error))}")
            return ExitStatus.INCOMPLETE
        finally:
            failed = result is None or result.exit_status != ExitStatus.OK
            if keep_run.should_keep(args.keep, failed):
                for line in keep_run.keep_machine(
                    machine, state, keep_for=args.keep_for, target=args.target
                ):
                    print(line)
            machine.close()
    print(f"\n{result.verdict}")
    for gate in result.gates:
        print(f"  {gate.name}: {gate.status}: {redact_text(gate.summary)}")
    print(f"left on: {result.left_on}; certificate in {args.report_dir}")
    return result.exit_status
