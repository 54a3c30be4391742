"""Fault injection for the stub server, switched by the ``VMTESTS_STUB_*`` knobs (``knobs.py``).

The faults imitate what the hardware tier has met (docs/requirements.md): an intermittent request
failure under concurrency, degenerate output (``HT#3333...``), output whose sha changed, and a
server that crashes, starts slowly, hangs, or logs so much at startup that journald drops lines.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass, field

from vmtests.stub import knobs

DEGENERATE_PREFIX = ("HT", "#")
DEGENERATE_TOKEN = "3333"


@dataclass
class Faults:
    """The fault knobs of one server process."""

    fail_rate: float = 0.0
    degenerate: bool = False
    output_salt: str = ""
    crash_at_start: bool = False
    crash_after: float = 0.0
    start_delay: float = 0.0
    hang: str = ""
    log_flood: int = 0
    seed: int | None = None
    _rng: random.Random = field(init=False, repr=False)
    _lock: threading.Lock = field(init=False, repr=False, default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def draw_failure(self) -> bool:
        """Decide, for one request, whether it fails (probability ``fail_rate``)."""
        if self.fail_rate <= 0.0:
            return False
        with self._lock:
            return self._rng.random() < self.fail_rate

    def active(self) -> dict[str, object]:
        """The knobs that are switched on (for the startup log)."""
        values: dict[str, object] = {
            "fail_rate": self.fail_rate,
            "degenerate": self.degenerate,
            "output_salt": self.output_salt,
            "crash_at_start": self.crash_at_start,
            "crash_after": self.crash_after,
            "start_delay": self.start_delay,
            "hang": self.hang,
            "log_flood": self.log_flood,
        }
        return {name: value for name, value in values.items() if value}


def from_environment(env: knobs.Environ) -> Faults:
    """Read every fault knob; raises ``knobs.KnobError`` on a malformed value."""
    fail_rate = knobs.env_float(env, knobs.FAIL_RATE, 0.0)
    if fail_rate > 1.0:
        raise knobs.KnobError(f"{knobs.FAIL_RATE}={fail_rate} must be in [0, 1]")
    hang = env.get(knobs.HANG, "").strip()
    if hang and hang not in knobs.HANG_MODES:
        raise knobs.KnobError(f"{knobs.HANG}={hang!r} must be one of {knobs.HANG_MODES}")
    seed_text = env.get(knobs.FAULT_SEED, "").strip()
    try:
        seed = int(seed_text) if seed_text else None
    except ValueError as error:
        raise knobs.KnobError(f"{knobs.FAULT_SEED}={seed_text!r} is not an integer") from error
    return Faults(
        fail_rate=fail_rate,
        degenerate=knobs.env_flag(env, knobs.DEGENERATE),
        output_salt=env.get(knobs.OUTPUT_SALT, ""),
        crash_at_start=knobs.env_flag(env, knobs.CRASH_AT_START),
        crash_after=knobs.env_float(env, knobs.CRASH_AFTER, 0.0),
        start_delay=knobs.env_float(env, knobs.START_DELAY, 0.0),
        hang=hang,
        log_flood=int(knobs.env_float(env, knobs.LOG_FLOOD, 0.0)),
        seed=seed,
    )
