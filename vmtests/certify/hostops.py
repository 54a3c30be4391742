"""What the certification run does to and reads from the host, over any ``Machine``.

Every restart goes through the serving unit: ``systemctl stop`` (the NixOS module's ``preStop``
is ``docker stop -t 60``; nothing here ever runs ``docker rm -f``), then the exit status the
unit recorded is checked, then ``systemctl start``. ``docker run`` exits with its container's
status, so the unit's ``ExecMainStatus`` is the container's exit code on a NixOS host and the
stub server's on the reference guest: 137 (``docker stop`` gave up and killed it) or a main
process killed by SIGKILL fails the run. Also here: free memory, disk, the tt-smi snapshot,
the module banner's config digest and the host identity.
"""

from __future__ import annotations

import json
import re
import shlex
import time
from dataclasses import dataclass
from typing import Any

from vmtests.contracts.serving import SERVING_UNIT
from vmtests.contracts.settings import Settings
from vmtests.driver.machine import Machine
from vmtests.profiles.expectations import parse_module_banner
from vmtests.scenario.collection.snapshot import Snapshot
from vmtests.scenario.install.switching import wait_ready
from vmtests.scenario.judgement.banners import module_banner_lines
from vmtests.tt_smi_parse import SNAPSHOT_COMMAND, holders_unknown, split_own_pid

CLD_EXITED, CLD_KILLED, CLD_DUMPED = 1, 2, 3
SIGKILL = 9
DOCKER_KILLED = 137


@dataclass(frozen=True)
class StopOutcome:
    """How the serving process ended when the unit was stopped."""

    code: int
    status: int
    result: str
    ok: bool
    message: str

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "exec_main_code": self.code,
            "exec_main_status": self.status,
            "result": self.result,
            "ok": self.ok,
            "message": self.message,
        }


def judge_exit(code: int, status: int, result: str) -> StopOutcome:
    """Judge ``ExecMainCode``/``ExecMainStatus``/``Result`` after a stop (0 = graceful)."""
    killed = (code == CLD_KILLED and status == SIGKILL) or (
        code == CLD_EXITED and status == DOCKER_KILLED
    )
    if killed:
        return StopOutcome(
            code, status, result, False,
            f"the server was KILLED (ExecMainCode={code}, status {status}, Result={result}), "
            "not stopped gracefully: a graceful stop (docker stop -t 60) did not finish in time",
        )  # fmt: skip
    if code == CLD_EXITED and status == 0:
        return StopOutcome(code, status, result, True, "stopped gracefully (exit status 0)")
    kind = "exited with status" if code == CLD_EXITED else "ended by signal"
    return StopOutcome(
        code, status, result, False,
        f"the server {kind} {status} when stopped (Result={result}); expected exit status 0",
    )  # fmt: skip


def _properties(machine: Machine, unit: str, names: str) -> dict[str, str]:
    text = machine.succeed(f"systemctl show -p {names} {shlex.quote(unit)}")
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def stop_checked(machine: Machine, settings: Settings, unit: str = SERVING_UNIT) -> StopOutcome:
    """``systemctl stop`` the unit (at most ``stop_timeout``), then judge how its main process
    ended."""
    machine.succeed(f"systemctl stop {shlex.quote(unit)}", timeout=settings.stop_timeout)
    props = _properties(machine, unit, "ExecMainCode,ExecMainStatus,Result")
    return judge_exit(
        int(props.get("ExecMainCode") or 0),
        int(props.get("ExecMainStatus") or 0),
        props.get("Result", ""),
    )


def start(machine: Machine, settings: Settings, unit: str = SERVING_UNIT) -> None:
    """``systemctl start`` the unit and wait until it is active and ``/health`` answers, all
    within one ``ready_timeout``."""
    deadline = time.monotonic() + settings.ready_timeout
    machine.succeed(f"systemctl start {shlex.quote(unit)}", timeout=settings.ready_timeout)
    wait_ready(machine, settings.serving_port, max(1.0, deadline - time.monotonic()))


def restart_checked(machine: Machine, settings: Settings, unit: str = SERVING_UNIT) -> StopOutcome:
    """Stop (checked) and start the unit: a fresh server with an empty prefix cache."""
    outcome = stop_checked(machine, settings, unit)
    start(machine, settings, unit)
    return outcome


def machine_time(machine: Machine) -> str:
    """The machine's clock as ``@<epoch seconds>`` (a ``journalctl --since`` value)."""
    return "@" + machine.succeed("date +%s").strip()


_EXIT_LINE = re.compile(r"Main process exited, code=(\w+), status=(\d+)")


def kills_since(machine: Machine, since: str, unit: str = SERVING_UNIT) -> list[str]:
    """Journal lines since ``since`` in which the unit's main process was killed or failed.

    systemd logs ``Main process exited, code=killed, status=9/KILL`` (or ``code=exited,
    status=137``) when a stop had to kill; a switch that restarts the unit itself is judged so.
    """
    text = machine.succeed(
        f"journalctl --no-pager -o cat -u {shlex.quote(unit)} --since {shlex.quote(since)}"
    )
    bad = []
    for line in text.splitlines():
        match = _EXIT_LINE.search(line)
        if match and not (match[1] == "exited" and match[2] == "0"):
            bad.append(line.strip())
    return bad


def mem_available_kib(machine: Machine) -> int:
    """``MemAvailable`` from ``/proc/meminfo``, in KiB."""
    for line in machine.succeed("cat /proc/meminfo").splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1])
    raise ValueError("/proc/meminfo has no MemAvailable line")


def disk_free_kib(machine: Machine, path: str = "/") -> int:
    """Free space of the filesystem holding ``path``, in KiB (``df -Pk``)."""
    lines = machine.succeed(f"df -Pk {shlex.quote(path)}").splitlines()
    return int(lines[-1].split()[3])


def tt_smi_snapshot(machine: Machine) -> dict[str, Any]:
    """``tt-smi -s`` parsed, without tt-smi's own entry in ``processes`` (it held the cards
    only to take the snapshot: ``tt_smi_parse.SNAPSHOT_COMMAND``); raises ``ValueError``."""
    result = machine.execute(f"sh -c {shlex.quote(SNAPSHOT_COMMAND)}", timeout=120)
    own_pid, text = split_own_pid(result.stdout_text)
    if result.rc != 0 or "{" not in text:
        raise ValueError(
            f"tt-smi -s failed (rc={result.rc}): {(text + result.stderr_text).strip()[-300:]}"
        )
    data: dict[str, Any] = json.loads(text[text.index("{") :])
    if isinstance(data.get("processes"), list):
        data["processes"] = [p for p in data["processes"] if p.get("pid") != own_pid]
    return data


def config_digest(snapshot: Snapshot) -> str:
    """The ``digest=`` of the module banner of the unit's current start (``""`` if none)."""
    lines = module_banner_lines(snapshot.current_lines())
    if not lines:
        return ""
    try:
        return parse_module_banner(lines[-1].message).get("digest", "")
    except ValueError:
        return ""


def booted_system(machine: Machine) -> str:
    """``/run/booted-system`` on NixOS; on another system, says so."""
    result = machine.execute(
        "test -e /run/booted-system && readlink -f /run/booted-system", timeout=30
    )
    return result.stdout_text.strip() if result.rc == 0 else "n/a (not NixOS)"


def identity(machine: Machine, snapshot: Snapshot, smi: dict[str, Any]) -> dict[str, Any]:
    """The host's identity: tt-smi's boards, driver and firmware, booted system, digest."""
    devices = smi.get("device_info") or []
    return {
        "hostname": machine.succeed("cat /proc/sys/kernel/hostname").strip(),
        "kernel": machine.succeed("uname -r").strip(),
        "driver": (smi.get("host_info") or {}).get("Driver", ""),
        "tt_smi": (smi.get("host_sw_vers") or {}).get("tt_smi", ""),
        "boards": [
            {
                "board_type": (d.get("board_info") or {}).get("board_type", ""),
                "board_id": (d.get("board_info") or {}).get("board_id", ""),
                "fw_bundle_version": (d.get("firmwares") or {}).get("fw_bundle_version", ""),
            }
            for d in devices
        ],
        "booted_system": booted_system(machine),
        "config_digest": config_digest(snapshot),
        "tt_smi_snapshot": smi,
    }


def holders_not_inspectable(smi: dict[str, Any]) -> str:
    """Why tt-smi's ``processes`` cannot say who holds the card on this host (``""``: they
    can): ``tt_smi_parse.holders_unknown`` for holders looked up among the host's processes."""
    processes = (smi.get("processes") or []) if "processes" in smi else None
    return holders_unknown(
        str((smi.get("host_sw_vers") or {}).get("tt_smi", "")),
        str((smi.get("host_info") or {}).get("Driver", "")),
        processes,
        host_pids=True,
    )


def device_holders(
    machine: Machine, smi: dict[str, Any], container: str | None = None, unit: str = SERVING_UNIT
) -> list[str]:
    """tt-smi's processes that do not belong to the serving unit (or its container).

    A process belongs to the service when its cgroup is the unit's, or the docker scope of the
    serving container (``container``, by default named like the unit, as the module names it).
    """
    allowed = [unit]
    name = shlex.quote(f"^{container or unit.removesuffix('.service')}$")
    container_id = machine.execute(
        f"docker ps -q --no-trunc --filter name={name} 2>/dev/null", timeout=30
    ).stdout_text.strip()
    if container_id:
        allowed.append(container_id)
    others = []
    for process in smi.get("processes") or []:
        pid = int(process.get("pid", 0))
        result = machine.execute(f"cat /proc/{pid}/cgroup", timeout=30)
        if result.rc != 0:
            continue  # the process ended since tt-smi listed it
        cgroup = result.stdout_text
        if not any(marker in cgroup for marker in allowed):
            command = process.get("command") or process.get("cmdline") or "?"
            others.append(f"pid {pid} ({str(command)[:120]}) cgroup {cgroup.strip()[-120:]}")
    return others
