"""The rich tables of ``tt-smi -ls`` read into one row mapping per board and table, so that the
stub's tables can be held to real tt-smi 6.2.1 output (tenstorrent/tt-smi ``tt_smi/backend.py``
``print_all_available_devices_umd``/``_luwen``). Only the tests read ``-ls``."""

from __future__ import annotations

from dataclasses import dataclass

from vmtests.tt_smi_parse import TtSmiError


@dataclass(frozen=True)
class ListedBoard:
    """One row of a ``tt-smi -ls`` table: its title and column -> cell."""

    table: str
    cells: dict[str, str]


_VERTICAL = "│┃|"


def _split_row(line: str) -> list[str]:
    inner = line.strip()[1:-1]
    for bar in _VERTICAL[1:]:
        inner = inner.replace(bar, _VERTICAL[0])
    return [cell.strip() for cell in inner.split(_VERTICAL[0])]


def parse_list(text: str) -> list[ListedBoard]:
    """Read the tables of ``tt-smi -ls`` (rich boxes); raise ``TtSmiError`` if there are none."""
    rows: list[ListedBoard] = []
    title, header = "", None
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        if stripped[0] not in "┏┡└│┃┗+|-╇":
            title, header = stripped, None
        elif stripped[0] == "┃" or (stripped[0] in "│|" and header is None):
            header = _split_row(stripped)
        elif stripped[0] in "│|" and header is not None:
            cells = _split_row(stripped)
            if len(cells) == len(header):
                rows.append(ListedBoard(title, dict(zip(header, cells, strict=True))))
    if not rows:
        raise TtSmiError(f"no board rows in tt-smi -ls output: {text.strip()[:300]!r}")
    return rows
