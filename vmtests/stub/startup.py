"""The startup decisions of vLLM 0.16 + the Tenstorrent plugin + qwen36, in their order.

In the API server process, while ``VllmConfig`` is built:

1. vLLM's hybrid-model config (``model_executor/models/config.py``,
   ``HybridAttentionMambaModelConfig.verify_and_update_config``): with prefix caching on and
   ``--mamba-cache-mode none``, vLLM keeps prefix caching and switches the mode (``all`` when
   the model supports mamba prefix caching, else ``align``: ``align`` for qwen36) with a
   WARNING; with prefix caching on it then logs that mamba prefix caching is experimental; with
   prefix caching off any other mode is forced back to ``none`` with a WARNING.
2. vLLM (``config/vllm.py``): async scheduling is on unless ``--no-async-scheduling``; it logs
   ``Asynchronous scheduling is enabled.`` / ``disabled.``.
3. The TT plugin (``vllm_tt_plugin/platform.py``, ``check_and_update_config``): a model that
   does not declare ``model_capabilities['supports_async_decode']`` gets async scheduling
   switched off with a WARNING. qwen36 declares it only with resident decode
   (``supports_async_decode: _RESIDENT``). A model that does not declare
   ``supports_prefix_caching`` gets prefix caching switched off with a WARNING (and the mamba
   mode renormalised to ``none``); qwen36 declares it, a build can be imitated that does not
   (``VMTESTS_STUB_MODEL_CAPABILITIES``). The plugin then logs ``Automatic prefix caching is
   enabled/disabled``.

In the engine core, when the model loads: the device must exist; the qwen36 model code refuses
prefix caching while async scheduling is *still* on ("prefix sidecars require synchronous local
execution") and resident decode without on-device argmax; it prints one banner per feature.
So prefix caching refuses async only with resident decode, unless the module's automatic
``--no-async-scheduling`` is on the command line.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from vmtests.contracts import features as feature_table
from vmtests.stub import features, knobs, release
from vmtests.stub.args import ServeArgs
from vmtests.stub.device import device_problem
from vmtests.stub.features import ActiveFeatures
from vmtests.stub.vllm_log import ENGINE_CORE, VllmLog

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
    """What the server runs with after the startup decisions (the engine's real config)."""

    active: ActiveFeatures
    async_scheduling: bool

    @property
    def prefix_caching(self) -> bool:
        """``cache_config.enable_prefix_caching`` after every decision."""
        return self.active.prefix_caching

    @property
    def mamba_cache_mode(self) -> str:
        """``cache_config.mamba_cache_mode`` after every decision."""
        return self.active.mamba_cache_mode


def check_devices(env: knobs.Environ) -> None:
    """Refuse unless every required device node exists and is a character device."""
    for path in knobs.device_paths(env):
        problem = device_problem(path)
        if problem is not None:
            raise StartupRefused("device", f"No Tenstorrent device found: {problem}")


def resolve_mamba_mode(prefix: bool, requested: str, printer: VllmLog) -> str:
    """Step 1: vLLM's hybrid-model cache config (see the module docstring)."""
    mode = requested
    if prefix:
        if mode == "none":
            mode = "all" if release.SUPPORTS_MAMBA_PREFIX_CACHING else "align"
            printer.warning("mamba", release.mamba_mode_switched(mode))
        printer.info("mamba_info", release.mamba_experimental(mode))
    elif mode != "none":
        mode = "none"
        printer.warning("mamba", release.MAMBA_MODE_NONE_WITHOUT_PREFIX)
    return mode


def decide(args: ServeArgs, env: knobs.Environ, printer: VllmLog) -> Plan:
    """Steps 1-3 (API server side): resolve cache config and scheduling, log as upstream."""
    prefix = bool(args.enable_prefix_caching)
    mode = resolve_mamba_mode(prefix, args.mamba_cache_mode, printer)
    active = features.resolve(
        env,
        prefix_caching=prefix,
        mamba_cache_mode=mode,
        tool_call_parser=args.tool_call_parser,
        auto_tool_choice=args.enable_auto_tool_choice,
    )
    # vLLM 0.16 schedules asynchronously unless told not to.
    async_scheduling = args.async_scheduling is not False
    printer.info("async", release.async_scheduling_line(async_scheduling))
    # qwen36: model_capabilities = {"supports_async_decode": _RESIDENT,
    #                               "supports_prefix_caching": True, ...}
    capabilities = {
        "supports_async_decode": active.device_resident,
        "supports_prefix_caching": True,
        **knobs.model_capabilities(env),
    }
    if async_scheduling and not capabilities["supports_async_decode"]:
        printer.warning("tt_async", release.TT_ASYNC_WARNING)
        async_scheduling = False
    if prefix and not capabilities["supports_prefix_caching"]:
        prefix = False
        printer.warning("prefix", release.TT_PREFIX_UNSUPPORTED)
        active = replace(active, prefix_caching=False, mamba_cache_mode="none")
    printer.info("prefix", release.prefix_caching_line(prefix))
    return Plan(active=active, async_scheduling=async_scheduling)


def load_model(plan: Plan, env: knobs.Environ, printer: VllmLog) -> None:
    """Engine-core startup: open the device, check model switches, print the banners."""
    check_devices(env)
    active = plan.active
    if active.prefix_caching and plan.async_scheduling:
        raise StartupRefused("refusal", PREFIX_ASYNC_REFUSAL)
    if active.device_resident and not active.device_argmax:
        raise StartupRefused(
            "refusal",
            f"{feature_table.env_assignment('deviceResident')} "
            f"requires {feature_table.env_assignment('deviceArgmax')}"
            " (the device-resident decode chain samples on device)",
        )
    for banner in active.banners():
        printer.info("banner", banner, role=ENGINE_CORE)
