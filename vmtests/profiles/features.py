"""Read ``modules/serving/features.json``: the one place naming feature env vars and banners.

The Nix core reads the same file with ``builtins.fromJSON``; Python reads it here so that no
environment name or banner tag is spelled twice.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
# In a checkout the file is read where the Nix core reads it; an installed package (e.g. the
# flake's vmtests app) only has the stub's copy, vmtests/stub/features.json (a symlink in git).
_CHECKOUT_FILE = REPO_ROOT / "modules" / "serving" / "features.json"
_PACKAGE_FILE = Path(__file__).resolve().parents[1] / "stub" / "features.json"
FEATURES_FILE = _CHECKOUT_FILE if _CHECKOUT_FILE.is_file() else _PACKAGE_FILE


def in_checkout() -> bool:
    """True when running from a repository checkout (hosts/ and modules/ are present)."""
    return _CHECKOUT_FILE.is_file()


@cache
def load_features() -> dict[str, Any]:
    """Return the parsed features.json (cached; the file does not change during a run)."""
    with FEATURES_FILE.open(encoding="utf-8") as handle:
        data: dict[str, Any] = json.load(handle)
    return data


def feature_env_name(feature: str) -> str:
    """The default environment variable name of ``feature`` (e.g. ``mergeBatchGuard``)."""
    environment: dict[str, dict[str, str]] = load_features()["environment"]
    if feature not in environment:
        known = ", ".join(sorted(environment))
        raise KeyError(f"unknown feature {feature!r} in {FEATURES_FILE}; known: {known}")
    return environment[feature]["name"]


def feature_names() -> list[str]:
    """The feature keys that map to environment variables, sorted."""
    return sorted(load_features()["environment"])


def module_banner_tag() -> str:
    """The tag that starts the module's one-line banner (``tenstorrent-serving-config:``)."""
    tag: str = load_features()["moduleBanner"]["tag"]
    return tag
