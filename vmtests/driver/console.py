"""Serial console capture, split per boot.

The host reads the guest's ``ttyS0`` from a socket, appends it to ``console.log`` and to one
``boot-<n>.log`` per boot. A boot begins at the kernel's first line (``contract.BOOT_MARKER_RE``,
the ``Linux version`` line at timestamp 0). Waits name the boot they accept text from, so text
printed by an earlier boot can never satisfy a later wait.
"""

from __future__ import annotations

import re
import socket
import threading
import time
from pathlib import Path

from vmtests.contracts.instrumentation import BOOT_MARKER_RE
from vmtests.driver.errors import WaitTimeout

TAIL_LINES = 40


class SerialConsole:
    """Captures one machine's serial console across QEMU restarts and guest reboots."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._data = bytearray()
        self._starts = [0]  # offset in _data where each boot begins
        self._scan_from = 0
        self._seen_marker = False
        self._cond = threading.Condition()
        self._threads: list[threading.Thread] = []

    # ---- capture -----------------------------------------------------------------------------

    def attach(self, connection: socket.socket) -> None:
        """Read ``connection`` in a background thread until it closes."""
        thread = threading.Thread(
            target=self._read, args=(connection,), name="serial-console", daemon=True
        )
        thread.start()
        self._threads.append(thread)

    def wait_detached(self, timeout: float) -> bool:
        """Wait until every attached connection has closed and been read to its end."""
        deadline = time.monotonic() + timeout
        for thread in list(self._threads):
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in self._threads)

    def _read(self, connection: socket.socket) -> None:
        with connection:
            while True:
                try:
                    chunk = connection.recv(65536)
                except OSError:
                    chunk = b""
                if not chunk:
                    with self._cond:
                        self._cond.notify_all()
                    return
                self.feed(chunk)

    def feed(self, chunk: bytes) -> None:
        """Append console bytes; start a new boot at every boot marker."""
        with self._cond:
            old_len = len(self._data)
            self._data += chunk
            for match in BOOT_MARKER_RE.finditer(self._data, self._scan_from):
                if self._seen_marker:
                    self._starts.append(match.start())
                # Bytes before the very first kernel line (firmware) belong to boot 0.
                self._seen_marker = True
                self._scan_from = match.end()
            # A marker may be split across chunks: rescan the tail next time.
            self._scan_from = max(self._scan_from, len(self._data) - 64)
            self._write_files(old_len)
            self._cond.notify_all()

    def _write_files(self, old_len: int) -> None:
        """Append the new bytes to console.log and to the per-boot logs."""
        new = self._data[old_len:]
        with (self.directory / "console.log").open("ab") as handle:
            handle.write(new)
        bounds = [*self._starts, len(self._data)]
        for index in range(len(self._starts)):
            lo, hi = max(bounds[index], old_len), bounds[index + 1]
            if lo < hi:
                with self.log_path(index).open("ab") as handle:
                    handle.write(self._data[lo:hi])

    # ---- reading -----------------------------------------------------------------------------

    @property
    def boot_count(self) -> int:
        """Number of boots seen so far (0 before the first kernel line)."""
        with self._cond:
            return len(self._starts) if self._seen_marker else 0

    def log_path(self, boot_index: int) -> Path:
        """The file holding the console output of boot ``boot_index`` (0-based)."""
        return self.directory / f"boot-{boot_index}.log"

    def text(self, boot_index: int | None = None) -> str:
        """Console text of one boot (default: the latest), decoded, carriage returns removed."""
        with self._cond:
            raw = self.raw(len(self._starts) - 1 if boot_index is None else boot_index)
        return raw.decode("utf-8", errors="replace").replace("\r", "")

    def raw(self, boot_index: int) -> bytes:
        """The bytes of boot ``boot_index`` as they arrived (a saved guest keeps its console)."""
        with self._cond:
            if boot_index >= len(self._starts):
                return b""
            end = self._starts[boot_index + 1] if boot_index + 1 < len(self._starts) else None
            return bytes(self._data[self._starts[boot_index] : end])

    def wait_quiet(self, quiet: float, timeout: float) -> bool:
        """Wait until no byte has arrived for ``quiet`` seconds; False after ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                seen = len(self._data)
                self._cond.wait(quiet)
                if len(self._data) == seen:
                    return True
                if time.monotonic() >= deadline:
                    return False

    def tail(self, lines: int = TAIL_LINES, boot_index: int | None = None) -> str:
        """The last ``lines`` lines of a boot's console, for error messages."""
        text = self.text(boot_index)
        return "\n".join(text.splitlines()[-lines:]) or "(no console output)"

    def wait_for_boot(self, count: int, deadline: float) -> bool:
        """Wait until at least ``count`` boots were seen; return False at ``deadline``."""
        with self._cond:
            while self.boot_count < count:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(min(remaining, 1.0))
            return True

    def wait_for_text(self, pattern: str, boot_index: int, timeout: float) -> re.Match[str]:
        """Wait until ``pattern`` (a regex) matches console text of boot ``boot_index`` or later.

        Raises ``WaitTimeout`` with the console tail.
        """
        regex = re.compile(pattern, re.MULTILINE)
        start = time.monotonic()
        deadline = start + timeout
        with self._cond:
            while True:
                offset = self._starts[boot_index] if boot_index < len(self._starts) else None
                if offset is not None:
                    text = bytes(self._data[offset:]).decode("utf-8", errors="replace")
                    match = regex.search(text.replace("\r", ""))
                    if match is not None:
                        return match
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(min(remaining, 1.0))
        raise WaitTimeout(
            f"console text /{pattern}/ in boot {boot_index}",
            time.monotonic() - start,
            self.tail(),
        )
