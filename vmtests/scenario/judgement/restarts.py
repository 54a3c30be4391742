"""A service that keeps restarting is not healthy, even when it answers at the snapshot.

Every stage shows that the serving unit and its container stayed up since the switch or the
boot started them:

- the unit's ``NRestarts`` (``systemctl show``) counts its automatic restarts (``Restart=``;
  oci-containers sets ``Restart=on-failure``, nixpkgs
  ``nixos/modules/virtualisation/oci-containers.nix``) since it was last started explicitly:
  systemd flushes the counter at the first start after the unit ended with no automatic
  restart to follow (a stop, ``systemctl restart``, the restart of a switch), and a boot begins
  at 0 (systemd ``src/core/service.c``, ``flush_n_restarts``). So any count above 0 is a crash
  since the switch or the boot started the unit;
- the container's ``RestartCount`` (``docker inspect``) counts the restarts of its own
  ``--restart`` policy, which systemd never sees: the unit stays up while Docker restarts the
  server under it. With oci-containers' ``--rm`` there is no such policy (Docker refuses the
  two together), so each of the unit's restarts runs a new container, whose count is 0.

Both fail with the count and the last exit status: systemd's ``Main process exited`` line of
the unit's journal in this boot (the unit's ``ExecMainCode``/``ExecMainStatus`` describe the
current run once it restarted), Docker's ``State.ExitCode`` of the container's last run.
"""

from __future__ import annotations

import re

from vmtests.contracts.findings import Check, Reason
from vmtests.scenario.collection.snapshot import Snapshot
from vmtests.scenario.judgement.results import CheckResult, failed, passed

MAIN_EXITED = re.compile(r"Main process exited, code=(?P<code>[\w-]+), status=(?P<status>\S+)")
"""systemd's line when a service's main process ends (``src/core/service.c``,
``service_sigchld_event``): ``Main process exited, code=exited, status=1/FAILURE``."""


def last_exit(snapshot: Snapshot) -> str:
    """How the unit's last ended run ended, in words: systemd's last ``Main process exited``
    line of this boot's journal of the unit, else its ``ExecMainCode``/``ExecMainStatus`` when
    no run is going on now; ``""`` when neither says."""
    for line in reversed(snapshot.journal):
        match = MAIN_EXITED.search(line.message)
        if match:
            return f"code={match['code']}, status={match['status']} (invocation " + (
                f"{line.invocation_id or 'unknown'})"
            )
    unit = snapshot.unit
    if unit.main_pid == 0 and unit.prop("ExecMainCode") not in {"", "0"}:
        return f"ExecMainCode={unit.prop('ExecMainCode')}, status={unit.prop('ExecMainStatus')}"
    return ""


def check_restarts(snapshot: Snapshot) -> list[CheckResult]:
    """The unit restarted on its own (``NRestarts``), the container engine restarted the
    container (``RestartCount``): each a failure with the count and the last exit status; no
    ``NRestarts`` at all is an incomplete snapshot, never a pass."""
    stage, unit, check = snapshot.label, snapshot.unit, Check.SERVICE_RESTARTS
    count = unit.n_restarts
    results: list[CheckResult] = []
    if count is None:
        results.append(
            failed(
                stage,
                check,
                unit.name,
                Reason.INCOMPLETE_SNAPSHOT,
                f"systemd reported no NRestarts for {unit.name} (systemd 235 or later does): "
                "whether it restarted on its own is unknown",
            )
        )
    elif count:
        ended = last_exit(snapshot) or "not in this boot's journal of the unit"
        results.append(
            failed(
                stage,
                check,
                unit.name,
                Reason.UNIT_RESTARTED,
                f"{unit.name} restarted on its own {count} time(s) since the switch or the boot "
                f"started it (NRestarts={count}; it is {unit.active_state or 'unknown'} now); "
                f"the last run ended with {ended}. A server that crashes is not healthy even "
                f"when it answers: read `journalctl -b -u {unit.name}` before the restart for "
                "the cause (the engine's fatal error) and fix it",
            )
        )
    container = snapshot.container
    if container is not None and container.restart_count:
        results.append(
            failed(
                stage,
                check,
                f"container {container.name}",
                Reason.CONTAINER_RESTARTED,
                f"the container engine restarted container {container.name} "
                f"{container.restart_count} time(s) under the unit (RestartCount="
                f"{container.restart_count}, its restart policy; started last at "
                f"{container.started_at or 'unknown'}; State.ExitCode={container.exit_code}, "
                "the last run's while it is restarting): "
                f"systemd does not see these restarts. Read `docker logs {container.name}` for "
                "the cause, and leave restarting to the unit (no `--restart` policy)",
            )
        )
    if results:
        return results
    since = f", container started at {container.started_at}" if container is not None else ""
    container_part = " and its container 0 times" if container is not None else ""
    return [
        passed(
            stage,
            check,
            unit.name,
            f"no restart on its own: {unit.name} restarted 0 times{container_part}{since}",
        )
    ]
