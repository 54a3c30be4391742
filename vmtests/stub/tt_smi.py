"""``python3 -m vmtests.stub.tt_smi`` (installed as ``tt-smi``): the stub P150's tt-smi 6.2.1.

Follows tenstorrent/tt-smi 6.2.1 (``tt_smi/tt_smi.py``, ``tt_smi/backend.py``,
``tt_smi/log.py``, ``tt_smi/utils.py``, ``tt_smi/constants.py``):

- ``-s``/``--snapshot``: ``TTSMILog.get_clean_json_string``, always ``json.dumps(...,
  indent=4)``; top-level keys ``time, host_info, host_sw_vers, device_info, processes``. Each
  device's ``smbus_telem`` holds the ARC telemetry as ``hex()`` strings, and ``board_info``,
  ``telemetry``, ``firmwares`` and ``limits`` are derived from it with the backend's formulas
  (``get_bh_chip_telemetry``, ``get_bh_chip_limits``, ``get_firmware_versions``); the
  ``board_id`` is 16 hex digits whose UPI (``(id >> 36) & 0xFFFFF``) is 0x40, a ``p150a``
  (``get_board_type``). ``processes`` are ``DeviceProcess`` entries ``{pid, user, device,
  cmdline}`` with an integer device, read like ``get_device_processes`` from tt-kmd's
  ``/proc/driver/tenstorrent/<N>/pids``; the stub node has no driver, so the stub server is
  also recognised by its command line. On a terminal the real tool colours the JSON with rich;
  the stub prints the same text uncoloured.
- ``-ls``/``--list``: ``print_all_available_devices_umd``: two rich tables ("All available
  boards on host (UMD):", "Boards that can be reset (UMD):") with the columns UMD Chip ID, PCI
  BDF, PCI Dev ID, Board Type, Device Series, Board Number, drawn as rich's default
  ``box.HEAVY_HEAD`` at their natural width.
- No driver version file: "No Tenstorrent driver detected! ..." and exit 1; no usable device
  node: "No Tenstorrent devices detected! ..." and exit 1, printed as ``print(RED, msg, ENDC)``.

Standard library only.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import pwd
import socket
import sys
from collections.abc import Sequence
from typing import Any

from vmtests.stub import device, knobs

TT_SMI_RELEASE = "6.2.1"
TT_SMI_VERSION = f"{TT_SMI_RELEASE}+vmtests.stub"  # the one label: -v and host_sw_vers
HOST_SW_VERSIONS = {"tt_smi": TT_SMI_VERSION, "pyluwen": "0.9.0", "tt_umd": "0.9.8"}
NO_DRIVER = (
    "No Tenstorrent driver detected! Please install driver using tt-kmd: "
    "https://github.com/tenstorrent/tt-kmd "
)
NO_DEVICES = "No Tenstorrent devices detected! Please check your hardware and try again. Exiting..."
RED, END = "\033[31m", "\033[0m"
P150A_UPI = 0x40  # tt_smi/utils.py get_board_type
PROCFS_BASE = "/proc/driver/tenstorrent"  # tt-kmd: /proc/driver/tenstorrent/<N>/pids
# The stub node cannot be opened (no driver backs it), so the stub server stands for "holds
# the card" by its command line.
CARD_USER_MARKERS = ("vmtests.stub.server",)
LIST_COLUMNS = ("UMD Chip ID", "PCI BDF", "PCI Dev ID", "Board Type", "Device Series",
                "Board Number")  # fmt: skip


def board_id(index: int) -> int:
    """A p150a board id: UPI 0x40 at bits 36..55, a per-card serial below."""
    return (P150A_UPI << 36) | (0x1 << 32) | (0x00C0FFEE + index)


def smbus_telemetry(index: int) -> dict[str, str]:
    """An idle P150's ARC telemetry, as the UMD path reads it (``hex()`` of each tag)."""
    identifier = board_id(index)
    values = {
        "BOARD_ID_HIGH": identifier >> 32,
        "BOARD_ID_LOW": identifier & 0xFFFFFFFF,
        "ASIC_ID": 0x0,
        "VCORE": 800,  # mV
        "TDP": 19,  # W
        "TDC": 24,  # A
        "VDD_LIMITS": (900 << 16) | 700,
        "THM_LIMIT_SHUTDOWN": 105,
        "ASIC_TEMPERATURE": int(41.5 * 65536),  # signed 16.16
        "AICLK": 1000,
        "AICLK_LIMIT_MAX": 1350,
        "TDP_LIMIT_MAX": 300,
        "TDC_LIMIT_MAX": 350,
        "THM_LIMIT_THROTTLE": 90,
        "FW_BUNDLE_VERSION": 0x12030000,  # 18.3.0.0
        "TT_FLASH_VERSION": 0x03030000,
        "CM_FW_VERSION": 0x00130000,
        "DM_APP_FW_VERSION": 0x00130300,
        "DM_BL_FW_VERSION": 0x00010000,
        "ETH_FW_VERSION": 0x010700,
        "GDDR_FW_VERSION": 0x2000F,
        "DDR_SPEED": 16000,
        "TIMER_HEARTBEAT": 252,
        "FAN_RPM": 1800,
        "INPUT_POWER": 45,
        "BOARD_POWER_LIMIT": 300,
    }
    return {key: hex(value) for key, value in values.items()}


def _semver_m3(value: str) -> str:
    number = int(value, 16)
    return f"{number >> 24 & 0xFF}.{number >> 16 & 0xFF}.{number >> 8 & 0xFF}.{number & 0xFF}"


def _semver_eth(value: str) -> str:
    number = int(value, 16)
    return f"{number >> 16 & 0xFF}.{number >> 8 & 0xFF}.{number & 0xFF}"


def _signed_16_16(value: int) -> float:
    if value & (1 << 31):
        value -= 1 << 32
    return value / 65536.0


def telemetry(smbus: dict[str, str]) -> dict[str, str]:
    """``get_bh_chip_telemetry``: the formatted telemetry (widths as upstream)."""
    voltage = int(smbus["VCORE"], 16) / 1000
    current = int(smbus["TDC"], 16) & 0xFFFF
    power = int(smbus["TDP"], 16) & 0xFFFF
    board_power = f"{int(smbus['INPUT_POWER'], 16):5.1f}"
    temperature = _signed_16_16(int(smbus["ASIC_TEMPERATURE"], 16))
    aiclk = int(smbus["AICLK"], 16) & 0xFFFF
    return {
        "voltage": f"{voltage:4.2f}",
        "current": f"{current:5.1f}",
        "power": f"{power:5.1f}",
        "board_power": board_power,
        "aiclk": f"{aiclk:4.0f}",
        "asic_temperature": f"{temperature:4.1f}",
        "fan_speed": f"{int(smbus['FAN_RPM'], 16) & 0xFFFF}",
        "heartbeat": f"{int(smbus['TIMER_HEARTBEAT'], 16) // 6}",
    }


def limits(smbus: dict[str, str]) -> dict[str, Any]:
    """``get_bh_chip_limits`` over ``constants.LIMITS`` (unknown limits are the integer 0)."""
    vdd = int(smbus["VDD_LIMITS"], 16)
    return {
        "vdd_min": f"{(vdd & 0xFFFF) / 1000:4.2f}",
        "vdd_max": f"{(vdd >> 16) / 1000:4.2f}",
        "tdp_limit": f"{int(smbus['TDP_LIMIT_MAX'], 16):3.0f}",
        "tdc_limit": f"{int(smbus['TDC_LIMIT_MAX'], 16):3.0f}",
        "asic_fmax": f"{int(smbus['AICLK_LIMIT_MAX'], 16):4.0f}",
        "therm_trip_l1_limit": f"{int(smbus['THM_LIMIT_THROTTLE'], 16):2.0f}",
        "thm_limit": f"{int(smbus['THM_LIMIT_SHUTDOWN'], 16):2.0f}",
        "bus_peak_limit": 0,
        "fan_rpm_limit": 0,
        "board_power_limit": f"{int(smbus['BOARD_POWER_LIMIT'], 16):3.0f}",
    }


def firmwares(smbus: dict[str, str]) -> dict[str, str]:
    """``get_firmware_versions`` over ``constants.FW_LIST_SNAPSHOT``."""
    gddr = int(smbus["GDDR_FW_VERSION"], 16)
    return {
        "fw_bundle_version": _semver_m3(smbus["FW_BUNDLE_VERSION"]),
        "tt_flash_version": _semver_m3(smbus["TT_FLASH_VERSION"]),
        "cm_fw": _semver_m3(smbus["CM_FW_VERSION"]),
        "cm_fw_date": "N/A",
        "eth_fw": _semver_eth(smbus["ETH_FW_VERSION"]),
        "dm_bl_fw": _semver_m3(smbus["DM_BL_FW_VERSION"]),
        "dm_app_fw": _semver_m3(smbus["DM_APP_FW_VERSION"]),
        "gddr_fw": f"{gddr >> 16}.{gddr & 0xFFFF}",
    }


def bus_id(index: int) -> str:
    """The card's PCI BDF."""
    return f"0000:{index + 1:02x}:00.0"


def device_entry(index: int) -> dict[str, Any]:
    """One P150 (``p150a``) in tt-smi's ``device_info`` layout, with idle telemetry."""
    smbus = smbus_telemetry(index)
    speed = int(smbus["DDR_SPEED"], 16)
    return {
        "smbus_telem": smbus,
        "board_info": {
            "bus_id": bus_id(index),
            "board_type": "p150a",
            # get_board_id without BOARD_ID: f"{BOARD_ID_HIGH:08x}{BOARD_ID_LOW:08x}"
            "board_id": f"{int(smbus['BOARD_ID_HIGH'], 16):08x}"
            f"{int(smbus['BOARD_ID_LOW'], 16):08x}",
            "coords": "N/A",
            "dram_status": True,
            "dram_speed": f"{speed // 1000}G" if speed % 1000 == 0 else f"{speed}",
            "pcie_speed": 5,
            "pcie_width": "16",
        },
        "telemetry": telemetry(smbus),
        "firmwares": firmwares(smbus),
        "limits": limits(smbus),
    }


def _memory() -> str:
    try:
        with open("/proc/meminfo", encoding="utf-8") as handle:
            kib = int(handle.readline().split()[1])
    except (OSError, IndexError, ValueError):
        return "N/A"
    return f"{kib / 1024 / 1024:.2f} GB"


def _distro() -> str:
    try:
        release = platform.freedesktop_os_release()
    except OSError:
        return "N/A"
    return release.get("PRETTY_NAME", release.get("NAME", "N/A"))


def host_info(driver: str) -> dict[str, str]:
    """``host_info`` in ``HostInfo``'s field order."""
    return {
        "OS": platform.system(),
        "Distro": _distro(),
        "Kernel": platform.release(),
        "Hostname": socket.gethostname(),
        "Platform": platform.machine(),
        "Python": platform.python_version(),
        "Memory": _memory(),
        "Driver": f"TT-KMD {driver}",
    }


def _user(pid: int) -> str:
    try:
        return pwd.getpwuid(os.stat(f"/proc/{pid}").st_uid).pw_name
    except (OSError, KeyError):
        return "?"


def _cmdline(pid: int) -> str | None:
    """``_sanitize_proc_bytes`` of ``/proc/<pid>/cmdline``; None when unreadable or empty."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            raw = handle.read()
    except OSError:
        return None
    out = []
    for byte in raw:
        if byte in {0x00, 0x0A}:
            out.append(" ")
        elif 0x20 <= byte <= 0x7E:
            out.append(chr(byte))
        else:
            out.append(f"\\x{byte:02x}")
    return "".join(out).strip() or None


def _holders(nodes: list[str]) -> set[tuple[int, int]]:
    """(pid, device) pairs from tt-kmd's procfs, else the stub server by its command line."""
    found: set[tuple[int, int]] = set()
    for index, _ in enumerate(nodes):
        try:
            with open(f"{PROCFS_BASE}/{index}/pids", encoding="utf-8") as handle:
                found |= {(int(line.split()[0]), index) for line in handle if line.split()}
        except (OSError, ValueError):
            continue
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            command = _cmdline(int(entry)) or ""
            if any(marker in command for marker in CARD_USER_MARKERS):
                found.add((int(entry), 0))
    return found


def card_processes(nodes: list[str]) -> list[dict[str, Any]]:
    """``DeviceProcess`` entries (field order pid, user, device, cmdline), by device and pid."""
    processes = []
    for pid, index in sorted(_holders(nodes), key=lambda pair: (pair[1], pair[0])):
        command = _cmdline(pid)
        if command is None:
            continue  # exited meanwhile
        processes.append({"pid": pid, "user": _user(pid), "device": index, "cmdline": command})
    return processes


def snapshot(driver: str, nodes: list[str]) -> dict[str, Any]:
    """The full ``-s`` snapshot, top-level keys in ``TTSMILog``'s order."""
    return {
        "time": datetime.datetime.now().isoformat(),
        "host_info": host_info(driver),
        "host_sw_vers": dict(HOST_SW_VERSIONS),
        "device_info": [device_entry(index) for index, _ in enumerate(nodes)],
        "processes": card_processes(nodes),
    }


def _rich_table(title: str, rows: Sequence[tuple[str, ...]]) -> list[str]:
    """A rich ``Table`` (``box.HEAVY_HEAD``, one space of padding) at its natural width."""
    widths = [max(len(cell) for cell in column) for column in zip(LIST_COLUMNS, *rows, strict=True)]

    def line(left: str, fill: str, middle: str, right: str) -> str:
        return left + middle.join(fill * (width + 2) for width in widths) + right

    def cells(values: tuple[str, ...], edge: str, sep: str) -> str:
        padded = [f" {value.ljust(width)} " for value, width in zip(values, widths, strict=True)]
        return edge + sep.join(padded) + edge

    total = sum(widths) + 3 * len(widths) + 1
    out = [title.center(total), line("┏", "━", "┳", "┓"), cells(LIST_COLUMNS, "┃", "┃")]
    out.append(line("┡", "━", "╇", "┩"))
    out += [cells(row, "│", "│") for row in rows]
    out.append(line("└", "─", "┴", "┘"))
    return out


def device_list(nodes: list[str]) -> str:
    """The ``-ls`` output: every board, then the boards that can be reset (all, for P150s)."""
    rows = [
        (
            str(index),
            bus_id(index),
            f"/dev/tenstorrent/{index}",
            "Blackhole",
            "p150a",
            f"{board_id(index):016x}",
        )
        for index, _ in enumerate(nodes)
    ]
    tables = _rich_table("All available boards on host (UMD):", rows)
    tables += _rich_table("Boards that can be reset (UMD):", rows)
    return "\n".join(tables)


def _fail(message: str) -> int:
    print(RED, message, END, flush=True)
    return 1


def main(argv: list[str] | None = None, env: knobs.Environ | None = None) -> int:
    """Run the stub tt-smi; returns the exit status."""
    parser = argparse.ArgumentParser(prog="tt-smi", description="Stub Tenstorrent SMI (vmtests).")
    parser.add_argument("-s", "--snapshot", action="store_true", help="print a JSON snapshot")
    parser.add_argument("-ls", "--list", action="store_true", help="list boards and quit")
    parser.add_argument("-v", "--version", action="version", version=TT_SMI_VERSION)
    parser.add_argument("--snapshot_no_tty", action="store_true", help="force no-tty output")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    environment = knobs.current_environment() if env is None else env
    driver = device.driver_version(environment)
    if driver is None:
        return _fail(NO_DRIVER)
    nodes = device.usable_devices(environment)
    if not nodes:
        return _fail(NO_DEVICES)
    if args.list:
        print(device_list(nodes), flush=True)
        return 0
    if args.snapshot:
        print(json.dumps(snapshot(driver, nodes), indent=4), flush=True)
        return 0
    if not sys.stdin.isatty():
        print(f"{RED}No TTY detected! Interactive shell required.\nUse tt-smi -s for snapshot "
              f"output.{END}")  # fmt: skip
        return 1
    parser.error("the interactive TUI is not stubbed; use -s or -ls")
    return 2


if __name__ == "__main__":
    sys.exit(main())
