"""``vmtests shell``: a machine brought to a stage of the persistence scenario, and a way in.

The scenario itself (``Scenario`` with ``until``) takes a fresh machine to S0 (the base
deployed, its snapshot taken and checked), S1 (switched, checked) or S2 (rebooted, checked).
Then, whatever the checks said (a failed stage is what one wants to look at; the failed checks
are printed first), the person gets an interactive Python prompt with the machine, the profile,
the scenario and its snapshot and check functions bound, as the nixpkgs interactive driver gives
one with its machines bound (NixOS/nixpkgs nixos/lib/test-driver/src/test_driver/__init__.py,
``--interactive``; there ptpython, here the standard library's ``code.interact``); or, with
``--sh``, the guest's login shell over ssh with a terminal (``login_argv``), whose exit status
becomes the command's.

Only Ctrl-C, the deadline, SIGTERM and a hangup (the last two as Ctrl-C) stop before the
prompt. The run's deadline (``vmtests.contracts.deadline``) bounds bringing the machine to the
stage; it is lifted before the prompt opens, so no deadline ends an interactive session. When
the prompt or the shell ends, a host the stage switched goes back to the generation it was found
on (``leave``, unless ``--on-failure leave``), and the caller closes the machine as after any
run: a QEMU guest is powered off.
"""

from __future__ import annotations

import code
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vmtests.contracts import deadline
from vmtests.contracts.instrumentation import SSH_PORT
from vmtests.contracts.status import ExitStatus, RunStatus
from vmtests.driver.machine import Machine
from vmtests.driver.qemu import QemuMachine
from vmtests.driver.ssh import SshMachine
from vmtests.guest.access import ssh_to_guest
from vmtests.scenario.collection.redact import redact_text
from vmtests.scenario.judgement.checks import check_profile, check_service, evaluate_stage
from vmtests.scenario.judgement.compare import (
    check_durable,
    check_rebooted,
    check_restarted,
    diff_snapshots,
)
from vmtests.scenario.runner.recovery import Action
from vmtests.scenario.runner.scenario import Scenario

SESSION_KEY = "shell-key"
"""The ssh key made for ``--sh`` on a QEMU guest that has none of the suite's (a NixOS VM)."""
GUEST_USER = "root"
"""Who ``--sh`` logs in as on a QEMU guest: the instrumentation contract's ssh user."""


def enter(
    scenario: Scenario, state_dir: Path, *, sh: bool = False, go_back: bool = False
) -> int | None:
    """Bring ``scenario``'s machine to its stage (``bring_to_stage``), lift the deadline, then
    open the prompt (``interact``) or, with ``sh``, the guest's login shell (``login_shell``,
    files in ``state_dir``). With ``go_back``, the machine goes back to the generation it was
    found on when the session ends, however it ends (``leave``; ``signals_end_the_session``).
    Returns the shell's exit status, the prompt's ``exit(n)``, 3 when going back failed, or
    None when the person left the prompt with Ctrl-D (the stage's outcome is then the status).
    A run the preflight refused, or whose deadline passed, opens no prompt."""
    with signals_end_the_session() as session:
        try:
            bring_to_stage(scenario)
            if scenario.result.status == RunStatus.REFUSED or deadline.passed() is not None:
                return None
            deadline.lift()
            session.at_prompt = True
            status = login_shell(scenario.machine, state_dir) if sh else interact(scenario, go_back)
        finally:
            session.at_prompt = session.ending = True
            if go_back:
                leave(scenario)
    recovery = scenario.result.recovery
    return ExitStatus.INCOMPLETE if recovery and recovery.action == Action.FAILED else status


def bring_to_stage(scenario: Scenario) -> None:
    """Run ``scenario`` until its stage and print the outcome, also when Ctrl-C or the
    deadline (``KeyboardInterrupt``, raised) ends it first. A failed check, a broken run or a
    refusing preflight is printed, not raised: the prompt follows all the same."""
    try:
        # The result holds the error (and the evidence); printed below.
        with contextlib.suppress(Exception):
            scenario.run()
    finally:
        print(outcome_lines(scenario))


def leave(scenario: Scenario) -> None:
    """Put the machine back on the generation it was found on (``Scenario.go_back``), if the
    scenario switched it and nothing went back yet, and say what became of it."""
    had_recovery = scenario.result.recovery is not None
    scenario.go_back()
    recovery = scenario.result.recovery
    if recovery is not None and not had_recovery:
        with contextlib.suppress(OSError):  # the terminal may be gone (a hangup)
            print(f"vmtests shell: {recovery.action}: {redact_text(recovery.message)}")


@dataclass
class Session:
    """Where ``enter`` is, for the signal handler: at the prompt, or ending it (``leave``)."""

    at_prompt: bool = False
    ending: bool = False


HANGUP_LOG_PREFIX = "vmtests-shell-hangup-"
"""The file (in the system's temporary directory) that takes the output after a hangup."""


@contextlib.contextmanager
def signals_end_the_session() -> Iterator[Session]:
    """A closed terminal (SIGHUP) or a SIGTERM ends the session the way Ctrl-C or ``exit``
    would, so that the way back still runs: while the stage is being reached, as Ctrl-C (the
    scenario goes back, ``on_failure``); at the prompt, as ``exit``; while going back, not at
    all (it finishes). After a hangup the output goes to a file, as the terminal is gone and a
    write to it would break the way back."""
    session = Session()

    def end(signum: int, _frame: object) -> None:
        if signum == signal.SIGHUP:
            detach_output()
        if session.ending:
            return
        if session.at_prompt:
            raise SystemExit(128 + signum)
        raise KeyboardInterrupt(f"signal {signum}")

    previous = {number: signal.signal(number, end) for number in (signal.SIGHUP, signal.SIGTERM)}
    try:
        yield session
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def detach_output() -> None:
    """Point standard output and error at a file of their own (``HANGUP_LOG_PREFIX``), kept."""
    descriptor, _path = tempfile.mkstemp(prefix=HANGUP_LOG_PREFIX, suffix=".log")
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os.dup2(descriptor, 1)
    os.dup2(descriptor, 2)
    os.close(descriptor)


def outcome_lines(scenario: Scenario) -> str:
    """What became of bringing the machine to the stage: the verdict, each failed check, the
    run's error, where the evidence and the way back are."""
    result, stage = scenario.result, scenario.until
    verdict = "reached" if result.ok else "FAILED"
    lines = [
        f"\n{stage} {verdict}: profile {result.profile.name} on {result.target}: "
        f"{len(result.checks)} checks, {len(result.failures)} failed, {result.wall_seconds:.1f}s"
    ]
    lines += [f"  {redact_text(str(failure))}" for failure in result.failures]
    if result.error:
        lines.append(f"  run error: {redact_text(result.error)}")
    if result.stopped_at and result.stopped_at != stage:
        lines.append(f"  stopped after {result.stopped_at}: it failed, so it was not rebooted")
    lines += [f"  evidence of {name}: result.evidence[{name!r}]" for name in result.evidence]
    if result.recovery is not None:
        lines.append(f"  {result.recovery.action}: {redact_text(result.recovery.message)}")
    elif result.generation is not None and scenario.switched:
        lines.append(
            f"  found on {result.generation.description}; the way back, as root on the "
            f"machine: {result.generation.rollback_command}"
        )
    return "\n".join(lines)


def namespace(scenario: Scenario) -> dict[str, Any]:
    """The names the prompt binds (``BOUND`` describes each)."""
    return {
        "machine": scenario.machine,
        "profile": scenario.profile,
        "scenario": scenario,
        "result": scenario.result,
        "settings": scenario.settings,
        "snapshot": scenario.snapshot,
        "evaluate_stage": evaluate_stage,
        "check_profile": check_profile,
        "check_service": check_service,
        "check_restarted": check_restarted,
        "check_rebooted": check_rebooted,
        "check_durable": check_durable,
        "diff_snapshots": diff_snapshots,
    }


BOUND = {
    "machine": "the machine (succeed, execute, wait_for_unit, journal, reboot, ...)",
    "profile": "the expectation profile",
    "scenario": "the scenario that brought the machine here",
    "result": "its result: checks, failures, snapshots['S0'...], evidence, error",
    "settings": "the host's settings (timeouts, container, port)",
    "snapshot": "snapshot(label): take and keep a snapshot (result.snapshots[label])",
    "evaluate_stage": "evaluate_stage(profile, snap[, previous]): every single-snapshot check",
    "check_profile": "check_profile(profile, snap): the profile's expectations",
    "check_service": "check_service(snap): active, not restarting, /health, /v1/models",
    "check_restarted": "check_restarted(before, after): the switch restarted the unit",
    "check_rebooted": "check_rebooted(before, after): a new boot",
    "check_durable": "check_durable(before, after, profile): the durable fields are equal",
    "diff_snapshots": "diff_snapshots(before, after, profile): the fields that differ",
}


def banner(scenario: Scenario, go_back: bool = False) -> str:
    """The prompt's banner: where the machine is, the names bound, how to leave and what
    happens to the machine then."""
    machine = scenario.machine
    width = max(len(name) for name in BOUND)
    names = [f"  {name:<{width}}  {what}" for name, what in BOUND.items()]
    end = f"{machine.name} is left as it is when you leave"
    generation = scenario.result.generation
    if isinstance(machine, QemuMachine):
        end = "the guest is powered off when you leave"
    elif scenario.result.recovery is not None:
        end = (
            f"{machine.name} already went back ({scenario.result.recovery.action}, above) and "
            "is left as it is when you leave"
        )
    elif scenario.switched and generation is not None and scenario.result.recovery is None:
        end = (
            f"leaving puts {machine.name} back on {generation.description} (its serving unit "
            "restarts)"
            if go_back
            else f"{machine.name} stays switched when you leave; the way back: "
            f"{generation.rollback_command}"
        )
    return "\n".join(
        [
            f"vmtests shell: {machine.name} at {scenario.until}, profile {scenario.profile.name}",
            "bound:",
            *names,
            f"Ctrl-D (or exit()) leaves; {end}.",
        ]
    )


def interact(scenario: Scenario, go_back: bool = False) -> int | None:
    """The interactive Python prompt (``code.interact``) with ``namespace`` bound; line editing
    and completion of the bound names when ``readline`` is there. Returns ``exit(n)``'s status,
    or None after Ctrl-D."""
    bound = namespace(scenario)
    with contextlib.suppress(ImportError):
        import readline  # noqa: PLC0415  (line editing for input(), where it exists)
        import rlcompleter  # noqa: PLC0415

        readline.set_completer(rlcompleter.Completer(bound).complete)
        readline.parse_and_bind("tab: complete")
    end = "powering the guest off" if isinstance(scenario.machine, QemuMachine) else "leaving"
    try:
        code.interact(
            banner=banner(scenario, go_back), local=bound, exitmsg=f"vmtests shell: {end}"
        )
    except SystemExit as leaving:  # exit(n) at the prompt
        return exit_code(leaving.code)
    return None


def exit_code(code_: object) -> int:
    """The exit status ``sys.exit(code_)`` gives: None is 0, an int itself, anything else 1."""
    if code_ is None:
        return 0
    return code_ if isinstance(code_, int) else 1


def login_shell(machine: Machine, state_dir: Path) -> int:
    """The machine's login shell over ssh with a terminal; its exit status."""
    argv = login_argv(machine, state_dir)
    print(f"vmtests shell: {' '.join(argv)}")
    return subprocess.run(argv, check=False).returncode


def login_argv(machine: Machine, state_dir: Path) -> list[str]:
    """The ssh command line of an interactive login shell (``-t``, no command) on ``machine``:
    a host's own ssh options, or a QEMU guest's forwarded sshd with its host key pinned
    (``vmtests.guest.access.ssh_to_guest``), the suite's key or else one made for the session
    (``authorize_session_key``)."""
    if isinstance(machine, QemuMachine):
        # sshd may still be starting (S0 right after the boot): its host keys are read next.
        machine.wait_for_open_port(SSH_PORT)
        key = machine.ssh_key or authorize_session_key(machine, state_dir / SESSION_KEY)
        machine = ssh_to_guest(machine, state_dir / "ssh", GUEST_USER, identity_file=key)
    if not isinstance(machine, SshMachine):
        raise TypeError(f"--sh: {machine.name} is neither a QEMU guest nor reached over ssh")
    argv = machine.ssh_argv("")[:-1]
    return ["-t" if word == "-T" else word for word in argv]


def authorize_session_key(guest: QemuMachine, key: Path) -> Path:
    """Make an ssh key pair at ``key`` and authorize it for root on ``guest`` through the
    backdoor: a guest built with another key (the NixOS VM has nixpkgs' test key,
    hosts/vm-test/common.nix) lets the session in all the same."""
    key.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "vmtests-shell", "-f", str(key)],
        check=True,
        capture_output=True,
    )
    public = key.with_name(key.name + ".pub").read_text().strip()
    guest.succeed(
        "umask 077 && mkdir -p /root/.ssh && printf '%%s\\n' %s >> /root/.ssh/authorized_keys",
        public,
    )
    return key
