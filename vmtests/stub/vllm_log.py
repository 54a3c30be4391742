"""Log lines in vLLM's format, flushed one by one so journald sees each at once.

vLLM prefixes every line with the process role and pid, the level, ``MM-DD HH:MM:SS`` and the
source location: ``(APIServer pid=7) INFO 09-24 14:55:08 [api_server.py:1880] ...``. Engine-side
lines (the TT platform plugin, the qwen36 model code) come from the engine core process in the
real stack, so they carry ``(EngineCore_DP0 pid=N)``. The stub runs both roles in one process,
so both prefixes show the same pid. uvicorn's own lines use ``INFO:     text`` after the prefix.
Lines logged while the command line is parsed, before vLLM names the process, carry no role
(``WARNING 05-01 18:48:42 [argparse_utils.py:260] ...``). The source locations are in
``release.py``.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import TextIO

from vmtests.stub.release import SOURCES

API_SERVER = "APIServer"
ENGINE_CORE = "EngineCore_DP0"


class VllmLog:
    """Writes vLLM-style lines to one stream; safe to use from many threads."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream
        self._lock = threading.Lock()
        self.pid = os.getpid()

    def _emit(self, line: str) -> None:
        stream = self._stream or sys.stdout
        with self._lock:
            stream.write(line + "\n")
            stream.flush()

    def line(self, level: str, source: str, message: str, role: str | None = API_SERVER) -> None:
        """Write ``message`` with the full vLLM prefix; ``source`` is a ``SOURCES`` key.

        A multi-line message gets the prefix on every line, as vLLM's ``NewLineFormatter``
        does; ``role=None`` leaves out the ``(Role pid=N)`` part.
        """
        stamp = time.strftime("%m-%d %H:%M:%S")
        head = f"({role} pid={self.pid}) " if role else ""
        for text in message.split("\n"):
            self._emit(f"{head}{level} {stamp} [{SOURCES[source]}] {text}".rstrip(" "))

    def info(self, source: str, message: str, role: str = API_SERVER) -> None:
        """An INFO line."""
        self.line("INFO", source, message, role)

    def warning(self, source: str, message: str, role: str | None = API_SERVER) -> None:
        """A WARNING line."""
        self.line("WARNING", source, message, role)

    def error(self, source: str, message: str, role: str = API_SERVER) -> None:
        """An ERROR line."""
        self.line("ERROR", source, message, role)

    def uvicorn(self, message: str) -> None:
        """A uvicorn line as vLLM shows it: ``(APIServer pid=N) INFO:     message``."""
        self._emit(f"({API_SERVER} pid={self.pid}) INFO:     {message}")
