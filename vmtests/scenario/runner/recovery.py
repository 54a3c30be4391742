"""After a run that failed, broke or was interrupted: go back to the generation recorded before
the switch (``rollback``, the default for ``ssh://`` targets) or leave the machine as it is for
debugging (``leave``), and say in either case the exact command that goes back.

The command is the generation's own (``vmtests.scenario.generations``) unless
``--rollback-command`` gives another, as ``--switch-command`` gives the switch; ``{generation}``
in it is replaced by the recorded generation (the toplevel store path on NixOS). A rollback is
verified: the machine must run the recorded generation again and the server must answer.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import StrEnum

from vmtests.contracts.settings import Settings
from vmtests.driver.errors import DriverError
from vmtests.driver.log import log
from vmtests.driver.machine import Machine
from vmtests.scenario.install.generations import Generation
from vmtests.scenario.install.switching import wait_ready


class OnFailure(StrEnum):
    """What ``--on-failure`` asks for after a failed, broken or interrupted run."""

    ROLLBACK = "rollback"
    LEAVE = "leave"


class Action(StrEnum):
    """What was done."""

    ROLLED_BACK = "rolled back"
    LEFT = "left"
    FAILED = "rollback failed"


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


def recover(
    machine: Machine,
    generation: Generation,
    *,
    on_failure: OnFailure,
    command: str | None,
    settings: Settings,
) -> Recovery:
    """Roll ``machine`` back to ``generation`` (``ROLLBACK``) or leave it (``LEAVE``)."""
    back = rollback_command(generation, command)
    if on_failure == OnFailure.LEAVE:
        return Recovery(
            Action.LEFT,
            back,
            f"left as it is (--on-failure leave); to go back to {generation.description}, run "
            f"as root on {machine.name}: {back}",
        )
    try:
        with log.nested(f"rolling {machine.name} back to {generation.description}"):
            machine.succeed(back, timeout=settings.switch_timeout)
            now = machine.succeed(generation.current_command, timeout=60).strip()
            wait_ready(machine, settings.serving_port, settings.ready_timeout)
    except (DriverError, KeyboardInterrupt) as error:
        what = "interrupted" if isinstance(error, KeyboardInterrupt) else f"failed: {error}"
        return Recovery(
            Action.FAILED,
            back,
            f"the rollback to {generation.description} {what}; to go back, run as root on "
            f"{machine.name}: {back}",
            verified=False,
        )
    if now != generation.id:
        return Recovery(
            Action.FAILED,
            back,
            f"`{back}` ran, but {machine.name} runs {now}, not the recorded {generation.id}; "
            "go back by hand",
            verified=False,
        )
    return Recovery(
        Action.ROLLED_BACK,
        back,
        f"rolled back to the recorded generation, {generation.description}: {machine.name} "
        f"runs it again and serves (command: {back})",
        verified=True,
    )
