"""Every environment variable the stub device layer and the stub server read: the one place.

The qwen36 feature switches (``QWEN36_*``) are not here: they are named in ``features.json``,
shared with the Nix core. The variables below belong to the stub alone; README's table of
environment variables lists them too.

Device layer
  ``VMTESTS_STUB_DEVICES``      colon-separated device nodes the server and tt-smi require
                                (default ``/dev/tenstorrent/0``). The serving module hands the
                                card to docker (``--device``), not to vLLM, so the stub cannot learn
                                it from its command line.
  ``VMTESTS_STUB_DRIVER_FILE``  the stub driver's version file, standing in for
                                ``/sys/module/tenstorrent/version`` (default
                                ``/run/tenstorrent-stub/driver-version``, written at every boot
                                by systemd-tmpfiles: like sysfs, it exists only while the
                                "driver" is loaded).

Timing (see ``latency.py`` for the table)
  ``VMTESTS_STUB_TIME_SCALE``   multiplies every modelled duration (default 0.1; tests use less).
  ``VMTESTS_STUB_STEP_FACTORS`` JSON object overriding per-feature decode-step factors, e.g.
                                ``{"deviceResident": 0.9}`` to make an A/B gate see a difference.
  ``VMTESTS_STUB_DRAIN_TIMEOUT`` seconds SIGTERM waits for in-flight requests (default 30).

Model build
  ``VMTESTS_STUB_MODEL_CAPABILITIES`` JSON object overriding qwen36's ``model_capabilities``
                                (``supports_prefix_caching``, default true;
                                ``supports_async_decode``, default: resident decode is on),
                                e.g. ``{"supports_prefix_caching": false}`` for a build whose
                                model does not declare prefix caching: the TT plugin then
                                switches it off although the flag was given.

Faults (see ``faults.py``)
  ``VMTESTS_STUB_FAIL_RATE``    probability in [0, 1] that a request fails with HTTP 500.
  ``VMTESTS_STUB_FAULT_SEED``   seed of the failure draw (default: random per process).
  ``VMTESTS_STUB_DEGENERATE``   ``1``: every completion is the degenerate text ``HT#3333...``.
  ``VMTESTS_STUB_OUTPUT_SALT``  non-empty: mixes into generation, so the output sha changes.
  ``VMTESTS_STUB_CRASH_AT_START`` ``1``: log a fatal engine error during startup and exit 1.
  ``VMTESTS_STUB_CRASH_AFTER``  seconds: start and answer, then after that long log the engine
                                core's fatal error and exit 1 (an engine that dies while
                                serving; the unit's ``Restart=on-failure`` starts it again).
  ``VMTESTS_STUB_START_DELAY``  seconds to stall while "loading the model" before listening.
  ``VMTESTS_STUB_HANG``         ``start``: never finish startup; ``request``: accept requests but
                                never produce a token (``/health`` stays 200).
  ``VMTESTS_STUB_LOG_FLOOD``    a number of lines: a chatty startup, logged at once before the
                                plugin's lines and the feature banners, so that journald's rate
                                limit can swallow them (``Suppressed N messages from <unit>``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

from vmtests.contracts.serving import DEVICE

PREFIX = "VMTESTS_STUB_"
"""Every knob's name starts so (a variable of the serving stack, not of the serving config)."""
DEVICES = "VMTESTS_STUB_DEVICES"
DRIVER_FILE = "VMTESTS_STUB_DRIVER_FILE"
TIME_SCALE = "VMTESTS_STUB_TIME_SCALE"
STEP_FACTORS = "VMTESTS_STUB_STEP_FACTORS"
DRAIN_TIMEOUT = "VMTESTS_STUB_DRAIN_TIMEOUT"
FAIL_RATE = "VMTESTS_STUB_FAIL_RATE"
FAULT_SEED = "VMTESTS_STUB_FAULT_SEED"
DEGENERATE = "VMTESTS_STUB_DEGENERATE"
OUTPUT_SALT = "VMTESTS_STUB_OUTPUT_SALT"
CRASH_AT_START = "VMTESTS_STUB_CRASH_AT_START"
CRASH_AFTER = "VMTESTS_STUB_CRASH_AFTER"
START_DELAY = "VMTESTS_STUB_START_DELAY"
HANG = "VMTESTS_STUB_HANG"
LOG_FLOOD = "VMTESTS_STUB_LOG_FLOOD"
MODEL_CAPABILITIES = "VMTESTS_STUB_MODEL_CAPABILITIES"
CAPABILITY_NAMES = ("supports_prefix_caching", "supports_async_decode")

KNOBS_FILE = "/etc/vmtests-stub/knobs.env"
"""Where the stub device layer keeps these knobs for the serving container: the container gets
it as ``docker run --env-file`` (``environmentFiles`` in oci-containers), so that a test can
turn a fault on in the server inside the container without changing the serving config."""

DEFAULT_DEVICES = DEVICE
DEFAULT_DRIVER_FILE = "/run/tenstorrent-stub/driver-version"
DEFAULT_TIME_SCALE = 0.1
DEFAULT_DRAIN_TIMEOUT = 30.0
HANG_MODES = ("start", "request")

Environ = Mapping[str, str]


class KnobError(ValueError):
    """An environment knob holds a value the stub cannot use."""


def device_paths(env: Environ) -> list[str]:
    """The device nodes the stub requires, from ``VMTESTS_STUB_DEVICES``."""
    return [path for path in env.get(DEVICES, DEFAULT_DEVICES).split(":") if path]


def driver_file(env: Environ) -> str:
    """The path of the stub driver's version file."""
    return env.get(DRIVER_FILE, DEFAULT_DRIVER_FILE)


def env_float(env: Environ, name: str, default: float, low: float = 0.0) -> float:
    """A float knob; raises ``KnobError`` naming the variable when it is malformed."""
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError as error:
        raise KnobError(f"{name}={raw!r} is not a number") from error
    if value < low:
        raise KnobError(f"{name}={raw!r} must be >= {low}")
    return value


def env_flag(env: Environ, name: str) -> bool:
    """A boolean knob: ``1``, ``true`` or ``yes`` turn it on."""
    return env.get(name, "").strip().lower() in {"1", "true", "yes"}


def _json_object(env: Environ, name: str) -> dict[str, object]:
    """A knob holding a JSON object ({} when unset); ``KnobError`` when it is not one."""
    raw = env.get(name, "").strip()
    if not raw:
        return {}
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as error:
        raise KnobError(f"{name} is not JSON: {error}") from error
    if not isinstance(parsed, dict):
        raise KnobError(f"{name} must be a JSON object")
    return {str(key): value for key, value in parsed.items()}


def env_step_factors(env: Environ) -> dict[str, float]:
    """The ``VMTESTS_STUB_STEP_FACTORS`` overrides as a feature -> factor mapping."""
    parsed = _json_object(env, STEP_FACTORS)
    if not all(isinstance(value, int | float) and value > 0 for value in parsed.values()):
        raise KnobError(f"{STEP_FACTORS} must map feature names to positive numbers")
    return {key: float(value) for key, value in parsed.items()}  # type: ignore[arg-type]


def model_capabilities(env: Environ) -> dict[str, bool]:
    """The ``VMTESTS_STUB_MODEL_CAPABILITIES`` overrides (capability name -> bool)."""
    parsed = _json_object(env, MODEL_CAPABILITIES)
    if not all(key in CAPABILITY_NAMES and isinstance(v, bool) for key, v in parsed.items()):
        raise KnobError(f"{MODEL_CAPABILITIES} must map {CAPABILITY_NAMES} to true/false")
    return {key: bool(value) for key, value in parsed.items()}


def current_environment() -> dict[str, str]:
    """A snapshot of the process environment (callers pass it on, so tests can inject one)."""
    return dict(os.environ)
