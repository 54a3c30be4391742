"""After a run that failed, broke or was interrupted: go back to the generation recorded before
the switch (``rollback``, the default for ``ssh://`` targets) or leave the machine as it is for
debugging (``leave``), and say in either case the exact command that goes back.

The command is the generation's own (``vmtests.scenario.generations``) unless
``--rollback-command`` gives another, as ``--switch-command`` gives the switch; ``{generation}``
in it is replaced by the recorded generation (the toplevel store path on NixOS). A rollback waits
for a switch still under way to end (an ssh session that dropped is opened again first; after a
reboot a Ctrl-C cut short, to the new boot, as long as a reboot may take), and is verified: the
machine must run the recorded generation again, with the recorded hugepage pools (else
``rollback failed``), and the server must answer (else ``rolled back, not serving``: the host is
back, its server is still starting or broken). Every outcome names the generation the machine
runs, or, after a Ctrl-C during the rollback, how to see whether the rollback still runs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import StrEnum

from vmtests.contracts.settings import Settings
from vmtests.driver.errors import DriverError, MachineGone
from vmtests.driver.log import log
from vmtests.driver.machine import Machine, Reconnecting
from vmtests.scenario.install.generations import Generation, pool_sizes, pools_differ
from vmtests.scenario.install.switching import wait_ready


class OnFailure(StrEnum):
    """What ``--on-failure`` asks for after a failed, broken or interrupted run."""

    ROLLBACK = "rollback"
    LEAVE = "leave"


class Action(StrEnum):
    """What was done."""

    ROLLED_BACK = "rolled back"
    NOT_SERVING = "rolled back, not serving"
    LEFT = "left"
    FAILED = "rollback failed"


SWITCH_PATTERN = "'[n]ixos-rebuild|[s]witch-to-configuration'"
"""The processes of a switch or a rollback on the machine (the brackets keep the pattern from
matching the command line of the shell that looks for them)."""
SWITCH_RUNNING = f"pgrep -f {SWITCH_PATTERN}"
"""Shell that exits 0 while a switch still runs on the machine."""
SWITCH_PROCESSES = f"pgrep -af {SWITCH_PATTERN}"
"""What a person runs on the machine to see a switch or rollback still running (nothing once it
ended)."""


@dataclass(frozen=True)
class Recovery:
    """What was done after the failure, and how to go back."""

    action: Action
    command: str
    """The exact command, run as root on the machine, that goes back to the recorded generation."""
    message: str
    verified: bool | None = None
    """Whether the machine runs the recorded generation again (None: not rolled back)."""

    def to_dict(self) -> dict[str, object]:
        """JSON form."""
        return asdict(self)


def rollback_command(generation: Generation, template: str | None = None) -> str:
    """The command that goes back to ``generation``: ``template`` (``{generation}`` replaced)
    when given, else the generation's own."""
    if template:
        return template.replace("{generation}", generation.id)
    return generation.rollback_command


def _running(machine: Machine, generation: Generation) -> tuple[bool, str]:
    """Whether ``machine`` runs ``generation`` now, and which one it runs in words (never
    raises)."""
    try:
        now = machine.succeed(generation.current_command, timeout=60).strip()
    except KeyboardInterrupt:
        return False, "an unknown generation (a Ctrl-C stopped the question)"
    except DriverError as error:
        return False, f"an unknown generation ({machine.name} did not say: {str(error)[:200]})"
    if now == generation.id:
        return True, f"the recorded generation {generation.id}"
    return False, f"{now}, not the recorded {generation.id}"


def _answering(machine: Machine, settings: Settings) -> None:
    """Make sure ``machine`` runs commands, and that no switch is still under way on it.

    An ssh session that dropped during the switch (the switch restarted the network, or the
    link failed) is opened again; the switch it ran may still be going on the host, and a
    rollback racing it would be undone by it, so the rollback waits for it to end (at most
    ``switch_timeout``).
    """
    reconnecting = machine if isinstance(machine, Reconnecting) else None
    if reconnecting is not None and reconnecting.reboot_pending:
        # A Ctrl-C during the reboot: the old boot may still answer while it goes down (and
        # take a rollback down with it), or the host is in its POST: the new boot, then.
        reconnecting.reconnect(settings.reboot_timeout)
    try:
        # After a Ctrl-C during the switch, the session's shell still runs it: this waits for it.
        machine.succeed("true", timeout=settings.switch_timeout)
    except MachineGone:
        if reconnecting is None:
            raise
        reconnecting.reconnect()
    machine.wait_until_succeeds(f"! {SWITCH_RUNNING}", timeout=settings.switch_timeout)


def _interrupted(machine: Machine, generation: Generation, back: str, *, sent: bool) -> Recovery:
    """A Ctrl-C before the rollback command was ``sent`` (while the machine was awaited), or
    after: then it stopped the wait here, not the command, which may still be running on the
    machine. Its generation is not asked: the session would wait for the rollback first."""
    if not sent:
        what = f"did not begin (a Ctrl-C stopped the wait for {machine.name} to answer); "
    else:
        what = (
            f"was interrupted and may still be running on {machine.name}: "
            f"`{SWITCH_PROCESSES}` lists it until it ends; then, "
        )
    return Recovery(
        Action.FAILED,
        back,
        f"the rollback to {generation.description} {what}if `{generation.current_command}` does "
        f"not print {generation.id}, run as root on {machine.name}: {back}",
        verified=False,
    )


def recover(
    machine: Machine,
    generation: Generation,
    *,
    on_failure: OnFailure,
    command: str | None,
    settings: Settings,
) -> Recovery:
    """Roll ``machine`` back to ``generation`` (``ROLLBACK``) or leave it (``LEAVE``); either
    way the result says which generation the machine runs and the command that goes back."""
    back = rollback_command(generation, command)
    if on_failure == OnFailure.LEAVE:
        return Recovery(
            Action.LEFT,
            back,
            f"left as it is (--on-failure leave): {machine.name} runs "
            f"{_running(machine, generation)[1]}; to go back to {generation.description}, run as "
            f"root on {machine.name}: {back}",
        )
    sent = False
    try:
        with log.nested(f"rolling {machine.name} back to {generation.description}"):
            _answering(machine, settings)
            sent = True
            machine.succeed(back, timeout=settings.switch_timeout)
    except KeyboardInterrupt:
        return _interrupted(machine, generation, back, sent=sent)
    except DriverError as error:
        return Recovery(
            Action.FAILED,
            back,
            f"the rollback to {generation.description} failed: {error}; {machine.name} runs "
            f"{_running(machine, generation)[1]}; to go back, run as root on {machine.name}: "
            f"{back}",
            verified=False,
        )
    back_on_it, now = _running(machine, generation)
    if not back_on_it:
        return Recovery(
            Action.FAILED,
            back,
            f"`{back}` ran, but {machine.name} runs {now}; go back by hand",
            verified=False,
        )
    try:
        pools = pools_differ(generation.pools, pool_sizes(machine)) if generation.pools else []
    except DriverError as error:
        pools = [f"unknown ({machine.name} did not say: {str(error)[:200]})"]
    if pools:
        return Recovery(
            Action.FAILED,
            back,
            f"`{back}` ran and {machine.name} runs {now} again, but its hugepage pools are not "
            f"the recorded ones ({'; '.join(pools)}): set them back by hand",
            verified=False,
        )
    try:
        wait_ready(machine, settings.serving_port, settings.ready_timeout)
    except (DriverError, KeyboardInterrupt) as error:
        what = "a Ctrl-C stopped the wait" if isinstance(error, KeyboardInterrupt) else str(error)
        return Recovery(
            Action.NOT_SERVING,
            back,
            f"rolled back: {machine.name} runs {now} again, but its server was not seen "
            f"answering (ready_timeout {settings.ready_timeout:g} s: {what[:2000]}); the "
            f"command was: {back}",
            verified=True,
        )
    return Recovery(
        Action.ROLLED_BACK,
        back,
        f"rolled back to the recorded generation, {generation.description}: {machine.name} "
        f"runs it again and serves (command: {back})",
        verified=True,
    )
