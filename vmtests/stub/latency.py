"""The stub's latency model: how long prefill and each decode step take.

Base figures are hardware-like milliseconds (B=1 decode control 48.6 ms: docs/requirements.md);
``VMTESTS_STUB_TIME_SCALE`` (default 0.1) multiplies all of them so VM runs and tests stay fast.

==========================  =========  ==============================================
quantity                    base (ms)  why
==========================  =========  ==============================================
prefill, fixed per request     20.0    scheduling + first sampling step
prefill, per uncached token     4.0    TTFT grows with the tokens the cache misses
prefill, per cached token       0.05   a prefix-cache hit is nearly free (block copy)
decode step (B=1)              48.6    the valid B=1 control (no resident decode)
batch growth per extra seq      3 %    step time grows with the running batch
==========================  =========  ==============================================

Feature factors multiply the decode step (``prefill`` column: the prefill time):

==================================  ======  =======  ======================================
feature                             decode  prefill  why
==================================  ======  =======  ======================================
deviceResident, async scheduling     0.80    1.00    the async decode chain overlaps host work
deviceResident, sync scheduling      1.00    1.00    mechanism off under prefix caching (#52)
deviceArgmax                         0.98    1.00    no logits copied back to the host
sdpaStreaming                        1.00    0.90    streamed attention shortens prefill
mergeBatchGuard                      1.00    1.00    "proven free" (#45)
prefixCaching, toolCalling           1.00    1.00    caching acts through cached tokens
==================================  ======  =======  ======================================

``VMTESTS_STUB_STEP_FACTORS`` (JSON, e.g. ``{"deviceResident": 0.9}``) replaces a feature's
decode factor, so the hardware tier's A/B gate can be shown a real difference or none.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vmtests.stub import knobs
from vmtests.stub.features import ActiveFeatures

PREFILL_FIXED_MS = 20.0
PREFILL_UNCACHED_MS_PER_TOKEN = 4.0
PREFILL_CACHED_MS_PER_TOKEN = 0.05
DECODE_STEP_MS = 48.6
BATCH_GROWTH_PER_SEQ = 0.03

RESIDENT_ASYNC_DECODE_FACTOR = 0.80
RESIDENT_SYNC_DECODE_FACTOR = 1.00
DECODE_FACTORS = {"deviceArgmax": 0.98, "sdpaStreaming": 1.00, "mergeBatchGuard": 1.00}
PREFILL_FACTORS = {"sdpaStreaming": 0.90}


@dataclass(frozen=True)
class LatencyModel:
    """Durations in seconds for one server configuration."""

    scale: float
    decode_factor: float
    prefill_factor: float
    factors: dict[str, float] = field(default_factory=dict)

    def prefill_seconds(self, uncached_tokens: int, cached_tokens: int) -> float:
        """Time to first token for a prompt with this many missed and hit tokens."""
        millis = (
            PREFILL_FIXED_MS
            + uncached_tokens * PREFILL_UNCACHED_MS_PER_TOKEN
            + cached_tokens * PREFILL_CACHED_MS_PER_TOKEN
        )
        return millis * self.prefill_factor * self.scale / 1000.0

    def step_seconds(self, running: int) -> float:
        """One decode step (one token per running sequence) with ``running`` sequences."""
        growth = 1.0 + BATCH_GROWTH_PER_SEQ * max(0, running - 1)
        return DECODE_STEP_MS * self.decode_factor * growth * self.scale / 1000.0


def build(active: ActiveFeatures, async_scheduling: bool, env: knobs.Environ) -> LatencyModel:
    """The latency model for ``active`` features, with the environment's scale and overrides."""
    scale = knobs.env_float(env, knobs.TIME_SCALE, knobs.DEFAULT_TIME_SCALE)
    overrides = knobs.env_step_factors(env)
    factors: dict[str, float] = {}
    for name in active.enabled():
        if name == "deviceResident":
            default = (
                RESIDENT_ASYNC_DECODE_FACTOR if async_scheduling else RESIDENT_SYNC_DECODE_FACTOR
            )
        else:
            default = DECODE_FACTORS.get(name, 1.0)
        factors[name] = overrides.get(name, default)
    decode = 1.0
    for factor in factors.values():
        decode *= factor
    prefill = 1.0
    for name in active.enabled():
        prefill *= PREFILL_FACTORS.get(name, 1.0)
    return LatencyModel(scale=scale, decode_factor=decode, prefill_factor=prefill, factors=factors)
