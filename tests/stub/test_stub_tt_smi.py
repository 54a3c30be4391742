"""The stub tt-smi: real snapshot keys, device list, and the real no-driver/no-device failures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from stub_support import BASELINE_ARGS, StartServer, base_env, tt_smi

from vmtests.stub import knobs

HOST_INFO_KEYS = ["OS", "Distro", "Kernel", "Hostname", "Platform", "Python", "Memory", "Driver"]
BOARD_INFO_KEYS = {"bus_id", "board_type", "board_id", "coords", "dram_status", "dram_speed",
                   "pcie_speed", "pcie_width"}  # fmt: skip


@pytest.fixture
def driver_file(tmp_path: Path) -> Path:
    """A stub driver version file saying 2.10.0."""
    path = tmp_path / "driver-version"
    path.write_text("2.10.0\n")
    return path


def test_snapshot_has_the_real_key_layout(driver_file: Path, start_server: StartServer) -> None:
    server = start_server(BASELINE_ARGS)
    result = tt_smi("-s", env=base_env(**{knobs.DRIVER_FILE: str(driver_file)}))
    assert result.returncode == 0, result.stdout + result.stderr
    snapshot = json.loads(result.stdout)  # plain JSON: stdout is not a TTY
    assert list(snapshot) == ["time", "host_info", "host_sw_vers", "device_info", "processes"]
    assert list(snapshot["host_info"]) == HOST_INFO_KEYS
    assert snapshot["host_info"]["Driver"] == "TT-KMD 2.10.0"
    (board,) = snapshot["device_info"]
    assert list(board) == ["smbus_telem", "board_info", "telemetry", "firmwares", "limits"]
    assert set(board["board_info"]) == BOARD_INFO_KEYS
    assert board["board_info"]["board_type"] == "p150a"
    assert {"voltage", "current", "power", "aiclk", "asic_temperature", "heartbeat"} <= set(
        board["telemetry"]
    )
    assert "fw_bundle_version" in board["firmwares"]
    assert server.pid in [process["pid"] for process in snapshot["processes"]]


def test_list_shows_one_p150(driver_file: Path) -> None:
    result = tt_smi("-ls", env=base_env(**{knobs.DRIVER_FILE: str(driver_file)}))
    assert result.returncode == 0
    rows = [line for line in result.stdout.splitlines() if "p150a" in line]
    assert len(rows) == 2  # all boards, then the boards that can be reset
    assert "/dev/tenstorrent/0" in rows[0]
    assert "Blackhole" in rows[0]


def test_no_driver_prints_the_real_message(tmp_path: Path) -> None:
    result = tt_smi("-s", env=base_env(**{knobs.DRIVER_FILE: str(tmp_path / "absent")}))
    assert result.returncode == 1
    # tt_smi/tt_smi.py: print(CMD_LINE_COLOR.RED, message, CMD_LINE_COLOR.ENDC), TTY or not
    assert result.stdout.startswith("\x1b[31m No Tenstorrent driver detected! ")


@pytest.mark.parametrize("kind", ["missing", "regular-file"])
def test_no_device_prints_the_real_message(driver_file: Path, tmp_path: Path, kind: str) -> None:
    node = tmp_path / "0"
    if kind == "regular-file":
        node.write_text("")
    env = base_env(**{knobs.DRIVER_FILE: str(driver_file), knobs.DEVICES: str(node)})
    result = tt_smi("-s", env=env)
    assert result.returncode == 1
    assert result.stdout.startswith("\x1b[31m No Tenstorrent devices detected! ")
