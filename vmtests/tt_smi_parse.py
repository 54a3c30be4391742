"""The one reader of tt-smi output, for the scenario's snapshot and the certification preflight.

It reads what tenstorrent/tt-smi 6.x prints for ``-s`` (``tt_smi/log.py`` ``TTSMILog``),
whether the real tool or the stub (``vmtests/stub/tt_smi.py``) printed it. It is neutral:
standard library only, so every layer that needs it (``scenario``, ``certify``) can import it.

- ``SNAPSHOT_COMMAND``: how every snapshot runs ``tt-smi -s``, saying first which pid tt-smi
  runs as: tt-smi opens the cards to take the snapshot and lists itself among their processes
  (tenstorrent/tt-smi issue 260; ``tt_smi/backend.py`` ``get_device_processes`` lists every pid
  tt-kmd records), so that its own entry can be told from the card's users by pid;
- ``parse_snapshot``: the JSON of ``tt-smi -s`` (indented or not; leading log lines are
  skipped) into boards and processes; a board's type is decoded from its ``board_id`` as
  ``tt_smi/utils.py`` ``get_board_type`` does (UPI = ``(board_id >> 36) & 0xFFFFF``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

# tt_smi/utils.py get_board_type: Unique Part Identifier -> board type.
BOARD_TYPES = {
    0x3: "e150", 0xA: "e300", 0x7: "e75",
    0x8: "nb_cb", 0xB: "wh_4u", 0x14: "n300", 0x18: "n150", 0x35: "tt-galaxy-wh",
    0x36: "bh-scrappy", 0x43: "p100a", 0x40: "p150a", 0x41: "p150b", 0x42: "p150c",
    0x44: "p300b", 0x45: "p300a", 0x46: "p300c", 0x47: "tt-galaxy-bh",
}  # fmt: skip
P150_TYPES = frozenset({"p150a", "p150b", "p150c"})
SNAPSHOT_KEYS = ("time", "host_info", "host_sw_vers", "device_info")
SNAPSHOT_ON_STDOUT_SINCE_TT_SMI = (3, 0, 5)
"""tt-smi 3.0.5 first prints ``-s`` on standard output, where the snapshot reads it, and first
takes ``--snapshot_no_tty``, which it passes (tenstorrent/tt-smi ``CHANGELOG.md`` 3.0.5;
``tt_smi/tt_smi.py`` ``main``: ``backend.print_logs_to_stdout``); 3.0.4 wrote
``~/tt_smi/<timestamp>_snapshot.json`` and printed only its path. The sources tagged v3.0.5
still say 3.0.4 in ``pyproject.toml`` (the next bump went to 3.0.6), so a tt-smi that says
3.0.4 may print either way: it is refused with the older ones."""
PROCESSES_SINCE_TT_SMI = (6, 0, 0)
"""tt-smi 6.0.0 first prints ``processes`` (tt-smi ``debian/changelog``: "Include processes in
snapshot output"); older releases have no such key, and the holders are then not inspectable."""
PIDS_SINCE_TT_KMD = (2, 5, 0)
"""tt-kmd 2.5.0 first has ``/proc/driver/tenstorrent/<N>/pids``, which tt-smi reads
(``tt_smi/backend.py`` ``get_device_processes``); without it tt-smi lists no process at all."""
NAMESPACED_PIDS_SINCE_TT_KMD = (2, 7, 0)
"""tt-kmd 2.7.0 prints those pids in the reader's PID namespace (``enumerate.c``
``pids_proc_show``, ``pid_vnr``); before, a container's holders show the container's own pids."""


OWN_PID_LINE = "vmtests: tt-smi runs as pid "
SNAPSHOT_COMMAND = f'echo "{OWN_PID_LINE}$$"; exec tt-smi -s --snapshot_no_tty'
"""Shell for ``sh -c``: print this shell's pid, then become ``tt-smi -s``, which keeps it (a
pip console script is exec'd by its interpreter line, nixpkgs's wrapper execs
``.tt-smi-wrapped``)."""
_OWN_PID = re.compile(f"^{re.escape(OWN_PID_LINE)}([0-9]+)$", re.MULTILINE)


class TtSmiError(ValueError):
    """tt-smi output that cannot be read; the message quotes what was seen."""


def board_type_of(board_id: str) -> str:
    """``get_board_type``: the board type a 16-hex-digit ``board_id`` encodes ("N/A" if none)."""
    try:
        upi = (int(board_id, 16) >> 36) & 0xFFFFF
    except ValueError:
        return "N/A"
    return BOARD_TYPES.get(upi, "N/A")


@dataclass(frozen=True)
class Board:
    """One ``device_info`` entry."""

    bus_id: str
    board_type: str
    board_id: str
    firmwares: dict[str, Any] = field(default_factory=dict)
    telemetry: dict[str, Any] = field(default_factory=dict)
    limits: dict[str, Any] = field(default_factory=dict)

    @property
    def decoded_type(self) -> str:
        """The board type decoded from ``board_id`` (must agree with ``board_type``)."""
        return board_type_of(self.board_id)

    @property
    def is_p150(self) -> bool:
        """True for a Blackhole P150 (a, b or c), by the decoded id and the reported type."""
        return self.decoded_type in P150_TYPES and self.board_type.startswith(self.decoded_type)


@dataclass(frozen=True)
class Process:
    """One ``processes`` entry: a process holding ``/dev/tenstorrent/<device>``."""

    pid: int
    user: str
    device: int
    cmdline: str


@dataclass(frozen=True)
class TtSmiSnapshot:
    """What ``tt-smi -s`` reported."""

    time: str
    driver: str
    tt_smi_version: str
    boards: list[Board]
    processes: list[Process] | None
    """None when tt-smi printed no ``processes`` key (older than ``PROCESSES_SINCE_TT_SMI``)."""
    own_pid: int | None = None
    """The pid tt-smi ran as (``SNAPSHOT_COMMAND``; None when the output does not say)."""

    @property
    def card_users(self) -> list[Process]:
        """The processes holding a card, without tt-smi's own entry (it held the cards only to
        take this snapshot)."""
        return [process for process in self.processes or [] if process.pid != self.own_pid]

    def holders(self, device: int = 0) -> list[int]:
        """PIDs of the processes holding ``device`` (none known without ``processes``), tt-smi
        itself left out."""
        return [process.pid for process in self.card_users if process.device == device]

    @property
    def driver_version(self) -> tuple[int, ...] | None:
        """tt-kmd's version from ``host_info.Driver`` (``TT-KMD 2.10.0``), None if unreadable."""
        return version_tuple(self.driver)

    def holders_unknown(self) -> str:
        """Why the holders cannot be read from this snapshot (``""``: they can)."""
        return holders_unknown(self.tt_smi_version, self.driver, self.processes)


def holders_unknown(
    tt_smi_version: str, driver: str, processes: Sequence[object] | None, *, host_pids: bool = False
) -> str:
    """Why tt-smi's ``processes`` cannot say who holds the card (``""``: they can): tt-smi
    before ``PROCESSES_SINCE_TT_SMI`` prints none (``processes`` None), tt-kmd before
    ``PIDS_SINCE_TT_KMD`` lists none. ``host_pids``: the holders are looked up among the host's
    processes, which tt-kmd before ``NAMESPACED_PIDS_SINCE_TT_KMD`` (or of no readable version)
    does not give for a container's holders."""
    versions = f"tt-smi {tt_smi_version or '?'}, driver {driver or '?'}"
    if processes is None:
        since = dotted(PROCESSES_SINCE_TT_SMI)
        return f"tt-smi prints no processes before {since} ({versions})"
    kmd = version_tuple(driver)
    if host_pids and (kmd is None or kmd < NAMESPACED_PIDS_SINCE_TT_KMD):
        since = dotted(NAMESPACED_PIDS_SINCE_TT_KMD)
        return f"tt-kmd gives a container's holders as host pids only since {since} ({versions})"
    if not processes and kmd is not None and kmd < PIDS_SINCE_TT_KMD:
        since = dotted(PIDS_SINCE_TT_KMD)
        return f"tt-kmd lists the processes that hold a card only since {since} ({versions})"
    return ""


def dotted(version: tuple[int, ...]) -> str:
    """``version`` as it is written: ``(3, 0, 5)`` -> ``3.0.5``."""
    return ".".join(map(str, version))


def version_tuple(text: str) -> tuple[int, ...] | None:
    """The first dotted version in ``text`` as integers (``TT-KMD 2.10.0-rc1`` -> (2, 10, 0),
    ``6.2.1+vmtests.stub`` -> (6, 2, 1))."""
    for word in text.replace("v", " ").split():
        parts = re.split(r"[-+]", word, maxsplit=1)[0].split(".")
        if len(parts) >= 2 and all(part.isdigit() for part in parts):
            return tuple(int(part) for part in parts)
    return None


def split_own_pid(text: str) -> tuple[int | None, str]:
    """(the pid ``SNAPSHOT_COMMAND`` said tt-smi runs as, or None; ``text`` without that
    line)."""
    match = _OWN_PID.search(text)
    if match is None:
        return None, text
    return int(match[1]), text[: match.start()] + text[match.end() :].removeprefix("\n")


def _json_start(text: str) -> int:
    for index, line in enumerate(text.splitlines(keepends=True)):
        if line.lstrip().startswith("{"):
            return sum(len(earlier) for earlier in text.splitlines(keepends=True)[:index])
    raise TtSmiError(f"no JSON object in tt-smi output: {text.strip()[:300]!r}")


def _mapping(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TtSmiError(f"tt-smi snapshot: {where} is not an object: {value!r}"[:300])
    return value


def parse_snapshot(text: str) -> TtSmiSnapshot:
    """Read ``tt-smi -s`` output; raise ``TtSmiError`` saying what is wrong."""
    own_pid, text = split_own_pid(text)
    start = _json_start(text)
    try:
        data, _ = json.JSONDecoder().raw_decode(text[start:].lstrip())
    except json.JSONDecodeError as error:
        raise TtSmiError(f"tt-smi snapshot is not JSON ({error}): {text[start:][:300]!r}") from None
    top = _mapping(data, "the snapshot")
    missing = [key for key in SNAPSHOT_KEYS if key not in top]
    if missing:
        raise TtSmiError(f"tt-smi snapshot lacks {', '.join(missing)}; keys: {list(top)}")
    boards = []
    for index, raw in enumerate(top["device_info"]):
        entry = _mapping(raw, f"device_info[{index}]")
        info = _mapping(entry.get("board_info"), f"device_info[{index}].board_info")
        boards.append(
            Board(
                bus_id=str(info.get("bus_id", "N/A")),
                board_type=str(info.get("board_type", "N/A")),
                board_id=str(info.get("board_id", "N/A")),
                firmwares=dict(entry.get("firmwares") or {}),
                telemetry=dict(entry.get("telemetry") or {}),
                limits=dict(entry.get("limits") or {}),
            )
        )
    processes: list[Process] = []
    for index, raw in enumerate(top.get("processes") or []):
        entry = _mapping(raw, f"processes[{index}]")
        if not isinstance(entry.get("pid"), int) or not isinstance(entry.get("device"), int):
            raise TtSmiError(f"processes[{index}] needs integer pid and device: {entry}")
        processes.append(
            Process(
                entry["pid"], str(entry.get("user", "?")), entry["device"],
                str(entry.get("cmdline", "")),
            )
        )  # fmt: skip
    host = _mapping(top["host_info"], "host_info")
    versions = _mapping(top["host_sw_vers"], "host_sw_vers")
    return TtSmiSnapshot(
        time=str(top["time"]),
        driver=str(host.get("Driver", "")),
        tt_smi_version=str(versions.get("tt_smi", "")),
        boards=boards,
        processes=processes if "processes" in top else None,
        own_pid=own_pid,
    )
