"""The qwen36 feature switches as the stub sees them, read only through ``features.json``.

``features.json`` (a symlink to ``modules/serving/features.json``) names the environment
variables, their "on" values and the banner texts; the Nix core reads the same file, so the
module and the stub cannot drift apart.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FEATURES_FILE = Path(__file__).with_name("features.json")


def load_features(path: Path = FEATURES_FILE) -> dict[str, Any]:
    """Parse ``features.json``."""
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


_FEATURES = load_features()

# Features switched by environment variables (the rest come from the command line).
ENV_FEATURES: tuple[str, ...] = tuple(_FEATURES["environment"])
# Every feature with a banner, in the order the banners are printed.
BANNER_ORDER: tuple[str, ...] = tuple(_FEATURES["banners"])


def env_name(feature: str) -> str:
    """The environment variable that switches ``feature`` (e.g. ``QWEN36_DEVICE_RESIDENT``)."""
    if feature not in ENV_FEATURES:
        known = ", ".join(ENV_FEATURES)
        raise KeyError(f"unknown feature {feature!r} in {FEATURES_FILE}; known: {known}")
    return str(_FEATURES["environment"][feature]["name"])


def module_banner_tag() -> str:
    """The tag that starts the module's one-line banner (``tenstorrent-serving-config:``)."""
    return str(_FEATURES["moduleBanner"]["tag"])


def env_value(feature: str) -> str:
    """The value of ``env_name(feature)`` that turns the feature on."""
    return str(_FEATURES["environment"][feature]["value"])


def banner_text(feature: str, **fields: str) -> str:
    """The self-identifying banner of ``feature`` with ``{mode}``/``{parser}`` filled in."""
    return str(_FEATURES["banners"][feature]).format(**fields)


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
