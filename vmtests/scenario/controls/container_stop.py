"""The container is stopped gracefully, never killed: at a start over a leftover, and at a stop.

The advisory's rule is ``docker stop -t 60``, never ``docker rm -f``: a P150 container killed
with SIGKILL leaves the card in an unknown state. oci-containers.nix's own pre-start runs
``docker rm -f <name>``, which kills a container left running by hand or by a crashed unit;
the module's pre-start stops it gracefully first (``vmtests.scenario.install.serving_unit``).

The evidence is Docker's own event log: ``docker events`` records, per container, each
``kill`` with its signal and the ``die`` with the exit code. A graceful stop is SIGTERM
followed by the server's own exit (0); ``rm -f`` is SIGKILL and exit code 137. Without a
``die`` event there is no evidence, and the check fails saying so.
"""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass, replace

from vmtests.contracts.findings import Check, Reason
from vmtests.contracts.serving import DEVICE, SERVING_CONTAINER, SERVING_UNIT
from vmtests.driver.log import log
from vmtests.driver.machine import Machine
from vmtests.scenario.controls.catalogue import RM_F
from vmtests.scenario.controls.control import ControlOutcome, StartingPoint, judge
from vmtests.scenario.controls.reset import reset_to_target
from vmtests.scenario.install.reference_switch import (
    UNIT_RESTART_TIMEOUT,
    ReferenceSwitch,
    install_units,
)
from vmtests.scenario.install.serving_unit import BACKEND
from vmtests.scenario.install.switching import wait_healthy, wait_ready
from vmtests.scenario.judgement.results import CheckResult, failed, passed

SIGTERM, SIGKILL, KILLED_EXIT_CODE = "15", "9", 137
STARTS_FROM: StartingPoint = "clean"
"""What the container path starts from: it installs the units it needs itself."""
EVENT_FORMAT = "{{.Action}} {{.Actor.Attributes.exitCode}} {{.Actor.Attributes.signal}}"


@dataclass(frozen=True)
class ContainerEvents:
    """What Docker recorded about one container: the signals it got and how it exited."""

    container_id: str
    signals: tuple[str, ...]
    exit_codes: tuple[int, ...]
    raw: str


def container_events(machine: Machine, container_id: str) -> ContainerEvents:
    """The ``kill`` and ``die`` events of ``container_id`` (from the last hour up to now)."""
    output = machine.succeed(
        f"{BACKEND} events --since 1h --until 0s --filter container={shlex.quote(container_id)} "
        f"--format {shlex.quote(EVENT_FORMAT)}",
        timeout=60,
    )
    return parse_events(container_id, output)


def parse_events(container_id: str, output: str) -> ContainerEvents:
    """``docker events --format EVENT_FORMAT`` output: ``kill <exit code> <signal>`` (no exit
    code on a kill) and ``die <exit code> <signal>`` lines, oldest first."""
    signals: list[str] = []
    exit_codes: list[int] = []
    for line in output.splitlines():
        action, *rest = line.split()
        if action == "kill" and rest:
            signals.append(rest[-1])
        elif action == "die" and rest and rest[0].isdigit():
            exit_codes.append(int(rest[0]))
    return ContainerEvents(container_id, tuple(signals), tuple(exit_codes), output.strip())


def check_stopped_gracefully(stage: str, what: str, events: ContainerEvents) -> CheckResult:
    """Pass when the container died by its own exit after SIGTERM, never by SIGKILL."""
    short = events.container_id[:12]
    if not events.exit_codes:
        return failed(
            stage,
            Check.GRACEFUL_STOP,
            what,
            Reason.NO_DIE_EVENT,
            f"no `die` event for container {short} ({what}): whether it was stopped gracefully "
            f"cannot be shown; events seen: {events.raw or '(none)'}",
        )
    code = events.exit_codes[-1]
    if code == KILLED_EXIT_CODE or SIGKILL in events.signals:
        return failed(
            stage,
            Check.GRACEFUL_STOP,
            what,
            Reason.KILLED,
            f"container {short} ({what}) was killed: exit code {code}, signals "
            f"{', '.join(events.signals) or 'none'}; it must be stopped with `docker stop -t "
            "<stopTimeout>`, never `docker rm -f` while running",
        )
    return passed(
        stage,
        Check.GRACEFUL_STOP,
        what,
        f"container {short} ({what}) stopped gracefully: signals "
        f"{', '.join(events.signals) or 'none'}, exit code {code}",
    )


def start_leftover_container(machine: Machine, switch: ReferenceSwitch) -> str:
    """Stop the unit and start the serving container by hand under the unit's container name.

    It is what a hand-started or orphaned production container looks like: same name, same
    image, serving on the same port. Returns its container ID once it answers.
    """
    target = switch.target
    machine.succeed(f"systemctl stop {SERVING_UNIT}", timeout=UNIT_RESTART_TIMEOUT)
    if target.image_file:
        machine.succeed(
            f"{BACKEND} load -i {shlex.quote(target.image_file)}", timeout=UNIT_RESTART_TIMEOUT
        )
    environment = " ".join(f"-e {shlex.quote(f'{k}={v}')}" for k, v in target.environment.items())
    container_id = machine.succeed(
        f"{BACKEND} run -d --name={SERVING_CONTAINER} --network=host --ipc=host "
        f"--device={DEVICE} {environment} {shlex.quote(target.image)} "
        + " ".join(map(shlex.quote, target.args)),
        timeout=120,
    ).strip()
    # The unit is stopped on purpose: only the hand-started container answers.
    wait_healthy(machine, target.port, timeout=180)
    return container_id


def _serving_container_id(machine: Machine) -> str:
    return machine.succeed(
        f"{BACKEND} inspect --format '{{{{.Id}}}}' {SERVING_CONTAINER}", timeout=60
    ).strip()


@dataclass(frozen=True)
class ContainerStop:
    """How one container ended: the check's result and Docker's events it judged."""

    result: CheckResult
    events: ContainerEvents


def leftover_then_start(
    machine: Machine, switch: ReferenceSwitch, *, graceful_pre_start: bool = True
) -> list[ContainerStop]:
    """A running leftover container, then a start of the unit; then a stop of the unit.

    Returns two stops: how the unit's pre-start stopped the leftover, and how the unit's own
    stop ended its container. ``graceful_pre_start=False`` installs oci-containers.nix's own
    pre-start (``docker rm -f``), which the first check must catch.
    """
    variant = "module pre-start" if graceful_pre_start else "oci-containers rm -f pre-start"
    with log.nested(f"leftover container before a start ({variant})"):
        config = replace(switch.target, graceful_pre_start=graceful_pre_start)
        install_units(machine, config)
        leftover = start_leftover_container(machine, switch)
        machine.succeed(f"systemctl start {SERVING_UNIT}", timeout=UNIT_RESTART_TIMEOUT)
        wait_ready(machine, config.port)
        events = container_events(machine, leftover)
        stops = [
            ContainerStop(check_stopped_gracefully("start", "leftover container", events), events)
        ]
        serving = _serving_container_id(machine)
        machine.succeed(f"systemctl stop {SERVING_UNIT}", timeout=UNIT_RESTART_TIMEOUT)
        events = container_events(machine, serving)
        stops.append(
            ContainerStop(check_stopped_gracefully("stop", "unit's container", events), events)
        )
        for stop in stops:
            log.info(str(stop.result))
    return stops


@dataclass
class ContainerControls:
    """The container path on one guest: the graceful run and the ``rm -f`` control."""

    graceful: list[ContainerStop]  # the module's pre-start over a leftover, then the unit's stop
    rm_f: ControlOutcome  # oci-containers.nix's own ``docker rm -f`` pre-start

    @property
    def false_alarms(self) -> list[CheckResult]:
        """The graceful run's failures: the correct configuration raised them."""
        return [stop.result for stop in self.graceful if stop.result.failed]


def run_container_controls(
    machine: Machine, switch: ReferenceSwitch, *, reset: bool = True
) -> ContainerControls:
    """The graceful path (its failures are false alarms) and the ``rm -f`` control.

    Expected: both graceful results pass (the leftover stopped by SIGTERM with exit code 0), and
    the control that installs oci-containers.nix's ``docker rm -f`` pre-start is detected (the
    leftover was killed with exit code 137, while the unit's own stop stays graceful).
    ``reset=False``: ``machine`` is fresh in the target state, nothing to undo.
    """
    if reset:  # on a guest that ran other controls: undo theirs (a transient unit, drop-ins)
        reset_to_target(machine, switch, to=STARTS_FROM)
    graceful = leftover_then_start(machine, switch)
    start = time.monotonic()
    killed = leftover_then_start(machine, switch, graceful_pre_start=False)
    outcome = judge(RM_F, [stop.result for stop in killed])
    outcome.seconds = time.monotonic() - start
    return ContainerControls(graceful, outcome)
