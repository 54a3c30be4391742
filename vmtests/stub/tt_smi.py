"""``python3 -m vmtests.stub.tt_smi`` (installed as ``tt-smi``): the stub P150's tt-smi.

- ``-s``/``--snapshot``: the JSON snapshot with tt-smi's key layout (tenstorrent/tt-smi
  ``tt_smi/tt_smi.py``), plain JSON when stdout is not a TTY (as the real tool), one ``p150a``
  per stub device node.
- ``-ls``/``--list``: the device list.
- No driver version file: "No Tenstorrent driver detected! ..." and exit 1; no usable device
  node: "No Tenstorrent devices detected! ..." and exit 1 (the real messages and order).

Standard library only.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import socket
import sys
from typing import Any

from vmtests.stub import device, knobs

TT_SMI_VERSION = "3.0.30+vmtests.stub"
NO_DRIVER = (
    "No Tenstorrent driver detected! Please install driver using tt-kmd: "
    "https://github.com/tenstorrent/tt-kmd "
)
NO_DEVICES = "No Tenstorrent devices detected! Please check your hardware and try again. Exiting..."
RED, END = "\033[31m", "\033[0m"
# Process names that stand for "holds the card": the stub node cannot be opened (no driver backs
# it), so the stub server is recognised by its command line instead of an open descriptor.
CARD_USER_MARKERS = ("vmtests.stub.server",)


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
    """``host_info`` in tt-smi's key order."""
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


def device_entry(index: int) -> dict[str, Any]:
    """One P150 (``p150a``) in tt-smi's ``device_info`` layout, with idle telemetry."""
    bus_id = f"0000:{index + 1:02x}:00.0"
    board_id = f"0x{0x40000000 + index:016x}"
    return {
        "smbus_telem": {"BOARD_ID": board_id, "SMBUS_TX_AICLK": "0x3e8"},
        "board_info": {
            "bus_id": bus_id,
            "board_type": "p150a",
            "board_id": board_id,
            "coords": "N/A",
            "dram_status": True,
            "dram_speed": "16G",
            "pcie_speed": 5,
            "pcie_width": "16",
        },
        "telemetry": {
            "voltage": "0.80",
            "current": "24.0",
            "power": "19.0",
            "aiclk": "1000",
            "asic_temperature": "41.5",
            "fan_speed": "30",
            "heartbeat": "42",
        },
        "firmwares": {
            "fw_bundle_version": "18.7.0.0",
            "cm_fw": "0.18.0",
            "cm_fw_date": "2025-06-01",
            "eth_fw": "1.5.0",
            "bm_bl_fw": "N/A",
            "bm_app_fw": "N/A",
        },
        "limits": {
            "vdd_min": "0.70",
            "vdd_max": "0.90",
            "tdp_limit": "300",
            "tdc_limit": "350",
            "asic_fmax": "1350",
            "therm_trip_l1_limit": "N/A",
            "thm_limit": "90",
            "bus_peak_limit": "N/A",
        },
    }


def card_processes(nodes: list[str]) -> list[dict[str, Any]]:
    """Processes using the card: open descriptors on a node, or the stub server itself."""
    found: list[dict[str, Any]] = []
    for entry in sorted(os.listdir("/proc"), key=lambda name: (len(name), name)):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                argv = handle.read().split(b"\0")
            fds = [os.readlink(f"/proc/{entry}/fd/{fd}") for fd in os.listdir(f"/proc/{entry}/fd")]
        except OSError:
            continue
        command = " ".join(part.decode(errors="replace") for part in argv if part)
        holds = [node for node in nodes if node in fds]
        if holds or any(marker in command for marker in CARD_USER_MARKERS):
            device_node = holds[0] if holds else nodes[0]
            found.append({"pid": int(entry), "command": command, "device": device_node})
    return found


def snapshot(env: knobs.Environ, driver: str, nodes: list[str]) -> dict[str, Any]:
    """The full ``-s`` snapshot, top-level keys in tt-smi's order."""
    return {
        "time": datetime.datetime.now().isoformat(),
        "host_info": host_info(driver),
        "host_sw_vers": {"tt_smi": TT_SMI_VERSION, "pyluwen": "N/A", "tt_umd": "N/A"},
        "device_info": [device_entry(index) for index, _ in enumerate(nodes)],
        "processes": card_processes(nodes),
    }


def device_list(nodes: list[str]) -> str:
    """The ``-ls`` table."""
    lines = ["All available boards on host:", "PCI Dev ID | Board Type | Device Series | Node"]
    for index, node in enumerate(nodes):
        lines.append(f"{index:<10} | Blackhole  | p150a         | {node}")
    return "\n".join(lines)


def _fail(message: str) -> int:
    text = f"{RED} {message} {END}" if sys.stdout.isatty() else message
    print(text, flush=True)
    return 1


def main(argv: list[str] | None = None, env: knobs.Environ | None = None) -> int:
    """Run the stub tt-smi; returns the exit status."""
    parser = argparse.ArgumentParser(prog="tt-smi", description="Stub Tenstorrent SMI (vmtests).")
    parser.add_argument("-s", "--snapshot", action="store_true", help="print a JSON snapshot")
    parser.add_argument("-ls", "--list", action="store_true", help="list boards and quit")
    parser.add_argument("-v", "--version", action="version", version=TT_SMI_VERSION)
    parser.add_argument("--snapshot_no_tty", action="store_true", help="force plain JSON")
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
        pretty = sys.stdout.isatty() and not args.snapshot_no_tty
        print(json.dumps(snapshot(environment, driver, nodes), indent=4 if pretty else None))
        return 0
    parser.error("the interactive TUI is not stubbed; use -s or -ls")
    return 2


if __name__ == "__main__":
    sys.exit(main())
