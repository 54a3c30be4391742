"""The qwen36 feature table, read only through ``features.json``.

``features.json`` (a link to ``modules/serving/features.json``) names the environment variables,
their "on" values and the banner texts; the Nix core reads the same file, so the module, the
stub and the expectations cannot drift apart.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FEATURES_FILE = Path(__file__).with_name("features.json")


def load_features(path: Path = FEATURES_FILE) -> dict[str, Any]:
    """Parse ``features.json``."""
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


_FEATURES = load_features()

ENV_FEATURES: tuple[str, ...] = tuple(_FEATURES["environment"])
"""Features switched by environment variables (the rest come from the command line)."""

BANNER_ORDER: tuple[str, ...] = tuple(_FEATURES["banners"])
"""Every feature with a banner, in the order the banners are printed."""


def env_name(feature: str) -> str:
    """The environment variable that switches ``feature`` (e.g. ``QWEN36_DEVICE_RESIDENT``)."""
    if feature not in ENV_FEATURES:
        known = ", ".join(ENV_FEATURES)
        raise KeyError(f"unknown feature {feature!r} in {FEATURES_FILE}; known: {known}")
    return str(_FEATURES["environment"][feature]["name"])


def env_value(feature: str) -> str:
    """The value of ``env_name(feature)`` that turns the feature on."""
    return str(_FEATURES["environment"][feature]["value"])


def module_banner_tag() -> str:
    """The tag that starts the module's one-line banner (``tenstorrent-serving-config:``)."""
    return str(_FEATURES["moduleBanner"]["tag"])


def banner_text(feature: str, **fields: str) -> str:
    """The self-identifying banner of ``feature`` with ``{mode}``/``{parser}`` filled in."""
    return str(_FEATURES["banners"][feature]).format(**fields)


def env_assignment(feature: str) -> str:
    """``NAME=VALUE`` that turns ``feature`` on, as a user would write it."""
    return f"{env_name(feature)}={env_value(feature)}"
