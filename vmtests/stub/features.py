"""The qwen36 features as one stub server process runs them.

The table itself (variable names, "on" values, banner texts) is ``vmtests.contracts.features``;
this module only combines it with the server's environment and command line.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from vmtests.contracts.features import BANNER_ORDER, banner_text, env_name, env_value


@dataclass(frozen=True)
class ActiveFeatures:
    """Which qwen36 features this server process runs with."""

    device_resident: bool
    device_argmax: bool
    sdpa_streaming: bool
    merge_batch_guard: bool
    prefix_caching: bool
    mamba_cache_mode: str
    tool_calling: bool
    tool_call_parser: str | None

    def enabled(self) -> list[str]:
        """The names (``features.json`` keys) of the enabled features, in banner order."""
        flags = {
            "deviceResident": self.device_resident,
            "deviceArgmax": self.device_argmax,
            "sdpaStreaming": self.sdpa_streaming,
            "mergeBatchGuard": self.merge_batch_guard,
            "prefixCaching": self.prefix_caching,
            "toolCalling": self.tool_calling,
        }
        return [name for name in BANNER_ORDER if flags[name]]

    def banners(self) -> list[str]:
        """One banner line per enabled feature, texts from ``features.json``."""
        fields = {"mode": self.mamba_cache_mode, "parser": self.tool_call_parser or ""}
        return [banner_text(name, **fields) for name in self.enabled()]


def env_switch(env: Mapping[str, str], feature: str) -> bool:
    """True when the environment turns ``feature`` on with exactly its documented value."""
    return env.get(env_name(feature)) == env_value(feature)


def resolve(
    env: Mapping[str, str],
    prefix_caching: bool,
    mamba_cache_mode: str,
    tool_call_parser: str | None,
    auto_tool_choice: bool,
) -> ActiveFeatures:
    """Combine the environment switches with the command-line features."""
    return ActiveFeatures(
        device_resident=env_switch(env, "deviceResident"),
        device_argmax=env_switch(env, "deviceArgmax"),
        sdpa_streaming=env_switch(env, "sdpaStreaming"),
        merge_batch_guard=env_switch(env, "mergeBatchGuard"),
        prefix_caching=prefix_caching,
        mamba_cache_mode=mamba_cache_mode,
        tool_calling=auto_tool_choice,
        tool_call_parser=tool_call_parser,
    )
