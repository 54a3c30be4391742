"""Helpers of the driver tests (importable by name: pytest puts this directory on sys.path)."""

from __future__ import annotations

from pathlib import Path


def processes_matching(needle: str) -> list[tuple[int, str]]:
    """Live (non-zombie) processes whose command line contains ``needle``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in cmdline and state != "Z":
            found.append((int(entry.name), cmdline))
    return found
