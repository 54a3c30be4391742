"""The startup sequence: scheduling decisions, refusals and banners, in vLLM's order.

Refusals mirror where the real stack refuses to start (exit status 1, one ERROR line):

- prefix caching while async scheduling is requested, explicitly or by default (the qwen36 model
  code: "prefix sidecars require synchronous local execution"); the module must pass
  ``--no-async-scheduling``;
- a device node (``VMTESTS_STUB_DEVICES``) that is missing or not a character device;
- resident decode (``QWEN36_DEVICE_RESIDENT``) without on-device argmax.
"""

from __future__ import annotations

from dataclasses import dataclass

from vmtests.contracts import features as feature_table
from vmtests.stub import features, knobs
from vmtests.stub.args import ServeArgs
from vmtests.stub.device import device_problem
from vmtests.stub.features import ActiveFeatures
from vmtests.stub.vllm_log import ENGINE_CORE, VllmLog

TT_MODEL_CLASS = "Qwen36ForCausalLM"
PREFIX_ASYNC_REFUSAL = (
    "Prefix caching cannot run with async scheduling: prefix sidecars require synchronous "
    "local execution (pass --no-async-scheduling)"
)


class StartupRefused(Exception):
    """The stack refuses to start; the message is the one ERROR line it prints."""

    def __init__(self, source: str, message: str) -> None:
        super().__init__(message)
        self.source = source
        self.message = message


@dataclass(frozen=True)
class Plan:
    """What the server runs with after startup decisions."""

    active: ActiveFeatures
    async_scheduling: bool


def check_devices(env: knobs.Environ) -> None:
    """Refuse unless every required device node exists and is a character device."""
    for path in knobs.device_paths(env):
        problem = device_problem(path)
        if problem is not None:
            raise StartupRefused("device", f"No Tenstorrent device found: {problem}")


def decide(args: ServeArgs, env: knobs.Environ, printer: VllmLog) -> Plan:
    """Resolve features and scheduling, log the config lines; raise ``StartupRefused``."""
    prefix = bool(args.enable_prefix_caching)
    if prefix and args.mamba_cache_mode == "none":
        # Hybrid (Mamba) models can only cache prefixes with aligned or full mamba state.
        printer.warning(
            "prefix",
            "Prefix caching of hybrid models needs --mamba-cache-mode align or all; "
            "disabling prefix caching",
        )
        prefix = False
    active = features.resolve(
        env,
        prefix_caching=prefix,
        mamba_cache_mode=args.mamba_cache_mode,
        tool_call_parser=args.tool_call_parser,
        auto_tool_choice=args.enable_auto_tool_choice,
    )
    # Unset means requested: the vLLM version we imitate schedules asynchronously by default.
    async_requested = args.async_scheduling is not False
    if prefix and async_requested:
        raise StartupRefused("refusal", PREFIX_ASYNC_REFUSAL)
    async_scheduling = async_requested
    if async_requested and not active.device_resident:
        printer.warning(
            "tt_async",
            f"Async scheduling was requested, but TT model {TT_MODEL_CLASS} does not declare "
            "support for async decode. Disabling async scheduling.",
        )
        async_scheduling = False
    printer.info(
        "async",
        f"Asynchronous scheduling is {'enabled' if async_scheduling else 'disabled'}.",
    )
    printer.info("prefix", f"Automatic prefix caching is {'enabled' if prefix else 'disabled'}")
    return Plan(active=active, async_scheduling=async_scheduling)


def load_model(plan: Plan, env: knobs.Environ, printer: VllmLog) -> None:
    """Engine-core startup: open the device, check model switches, print the banners."""
    check_devices(env)
    active = plan.active
    if active.device_resident and not active.device_argmax:
        raise StartupRefused(
            "refusal",
            f"{feature_table.env_assignment('deviceResident')} "
            f"requires {feature_table.env_assignment('deviceArgmax')}"
            " (the device-resident decode chain samples on device)",
        )
    for banner in active.banners():
        printer.info("banner", banner, role=ENGINE_CORE)
