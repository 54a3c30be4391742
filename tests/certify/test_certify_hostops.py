"""Host operations parsed from command outputs (a scripted machine, no VM)."""

from __future__ import annotations

import json
import time

import pytest

from vmtests.certify import hostops
from vmtests.contracts.settings import Settings
from vmtests.driver.machine import CommandResult, Machine
from vmtests.tt_smi_parse import OWN_PID_LINE


class Scripted(Machine):
    """Answers commands from a table: the first key contained in the command wins."""

    name = "scripted"

    def __init__(self, answers: dict[str, tuple[int, str]]) -> None:
        self.answers = answers
        self.commands: list[str] = []

    def _run(self, command: str, timeout: float) -> CommandResult:
        self.commands.append(command)
        for key, (rc, out) in self.answers.items():
            if key in command:
                return CommandResult(command, rc, out.encode(), b"")
        return CommandResult(command, 1, b"", b"unknown")

    def _start(self) -> None: ...
    def _shutdown(self, timeout: float) -> None: ...
    def _crash(self) -> None: ...
    def _close(self) -> None: ...
    def _issue_reboot(self) -> None: ...
    def _wait_until_answering(self, deadline: float) -> None: ...


def test_kills_since_reads_the_units_journal() -> None:
    journal = (
        "Stopping tenstorrent-serving.service...\n"
        "tenstorrent-serving.service: Main process exited, code=killed, status=9/KILL\n"
        "tenstorrent-serving.service: Main process exited, code=exited, status=137/n/a\n"
        "tenstorrent-serving.service: Main process exited, code=exited, status=0/SUCCESS\n"
    )
    machine = Scripted({"journalctl": (0, journal)})
    kills = hostops.kills_since(machine, "@100")
    assert len(kills) == 2
    assert "status=9/KILL" in kills[0]
    assert "--since @100" in machine.commands[0]


def test_stop_checked_reads_exec_main_status() -> None:
    machine = Scripted({
        "systemctl stop": (0, ""),
        "systemctl show": (0, "ExecMainCode=2\nExecMainStatus=9\nResult=signal\n"),
    })  # fmt: skip
    outcome = hostops.stop_checked(machine, Settings())
    assert not outcome.ok
    assert "KILLED" in outcome.message
    assert not any("rm -f" in command for command in machine.commands)


def test_device_holders_outside_the_unit() -> None:
    smi = {"processes": [{"pid": 10, "command": "vllm serve"}, {"pid": 11, "command": "python x"}]}
    machine = Scripted({
        "docker ps": (0, "abc123\n"),
        "/proc/10/cgroup": (0, "0::/system.slice/docker-abc123.scope\n"),
        "/proc/11/cgroup": (0, "0::/user.slice/session-3.scope\n"),
    })  # fmt: skip
    holders = hostops.device_holders(machine, smi)
    assert len(holders) == 1
    assert holders[0].startswith("pid 11")


DF = "Filesystem 1024-blocks Used Available Capacity Mounted\n/dev/vda 9 9 2500000 50% /\n"


def test_memory_disk_and_tt_smi_parsing() -> None:
    machine = Scripted({
        "meminfo": (0, "MemTotal: 8000000 kB\nMemAvailable:    5000000 kB\n"),
        "df -Pk": (0, DF),
        "tt-smi -s": (0, 'log line\n{"host_info": {"Driver": "TT-KMD 2.10.0"}, "device_info": []}'),
    })  # fmt: skip
    assert hostops.mem_available_kib(machine) == 5000000
    assert hostops.disk_free_kib(machine) == 2500000
    assert hostops.tt_smi_snapshot(machine)["host_info"]["Driver"] == "TT-KMD 2.10.0"


def test_tt_smis_own_entry_is_left_out_of_the_processes() -> None:
    """tt-smi holds the card while it takes the snapshot: not a holder of the card."""
    listed = {"processes": [{"pid": 4242, "cmdline": "python3 /usr/bin/tt-smi -s"},
                            {"pid": 48213, "cmdline": "python3 -m vllm"}]}  # fmt: skip
    machine = Scripted({"tt-smi -s": (0, f"{OWN_PID_LINE}4242\n{json.dumps(listed)}")})
    assert hostops.tt_smi_snapshot(machine)["processes"] == [listed["processes"][1]]


def test_a_start_and_its_wait_share_one_ready_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [0.0]
    budgets: list[float] = []

    class SlowStart(Scripted):
        def _run(self, command: str, timeout: float) -> CommandResult:
            clock[0] += 100.0  # systemctl start blocks while the unit activates
            return super()._run(command, timeout)

    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(
        hostops, "wait_ready", lambda machine, port, timeout: budgets.append(timeout)
    )
    hostops.start(SlowStart({"systemctl start": (0, "")}), Settings(ready_timeout=3600.0))
    assert budgets == [3500.0]


def test_holders_are_not_judged_where_tt_smi_or_tt_kmd_cannot_name_them() -> None:
    # tt-kmd 2.5/2.6 record a container's holder by its pid inside the container (often 1):
    # on the host that pid is systemd, which must not refuse the run as "another holder".
    old_kmd = {"host_info": {"Driver": "TT-KMD 2.6.0"}, "host_sw_vers": {"tt_smi": "6.2.1"},
               "processes": [{"pid": 1, "cmdline": "python run_vllm_api_server.py"}]}  # fmt: skip
    assert "since 2.7.0" in hostops.holders_not_inspectable(old_kmd)
    old_smi = {"host_info": {"Driver": "TT-KMD 2.10.0"}, "host_sw_vers": {"tt_smi": "5.3.1"}}
    assert "before 6.0.0" in hostops.holders_not_inspectable(old_smi)
    current = {**old_kmd, "host_info": {"Driver": "TT-KMD 2.10.0"}}
    assert hostops.holders_not_inspectable(current) == ""
