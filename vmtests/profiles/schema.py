"""Expectation profiles: the dataclasses and the one schema that validates a YAML file.

A profile says, for one serving profile (a Nix attrset under ``hosts/profiles/``), which vLLM
arguments must and must not appear, which container environment must be set or absent, which
startup banners must and must not be logged, what the module's own banner must say, which
hugepages must be reserved at boot, and what the running server itself must report about its
cache config (``server_config``: labels of vLLM's ``vllm:cache_config_info``, e.g.
``enable_prefix_caching: "True"``, ``mamba_cache_mode: align``). Profiles are written by hand
from the user's request; they are never generated from the Nix core, so that they can
disagree with it.

Every mistake raises ``ProfileError`` naming the file, the key path and what was expected.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import yaml

from vmtests.contracts.features import ENV_FEATURES, env_name
from vmtests.contracts.serving import Hugepages

TOP_LEVEL_KEYS = frozenset(
    {"name", "description", "serving_profile", "args", "environment", "banners"}
    | {"module_banner", "hugepages", "server_config"}
)
EXPECTATION_KEYS = (
    "args",
    "environment",
    "banners",
    "module_banner",
    "hugepages",
    "server_config",
)


class ProfileError(ValueError):
    """A profile file is invalid; the message names the file, the key path and the expectation."""


@dataclass(frozen=True)
class ArgExpectation:
    """A flag that must appear in the argv; with ``value``, immediately followed by it."""

    flag: str
    value: str | None = None

    def __str__(self) -> str:
        return self.flag if self.value is None else f"{self.flag} {self.value}"


@dataclass(frozen=True)
class BannerExpectation:
    """A named regular expression matched against the serving unit's log lines."""

    name: str
    pattern: re.Pattern[str]


@dataclass(frozen=True)
class Profile:
    """One validated expectation profile (see the module docstring)."""

    name: str
    description: str
    serving_profile: str
    args_present: tuple[ArgExpectation, ...]
    args_absent: tuple[str, ...]
    env_set: Mapping[str, str]
    env_absent: tuple[str, ...]
    banners_present: tuple[BannerExpectation, ...]
    banners_absent: tuple[BannerExpectation, ...]
    module_banner: Mapping[str, str]
    hugepages: Hugepages | None
    """The hugepages that must be reserved at boot."""
    source: Path
    # Labels of vllm:cache_config_info (vLLM config/cache.py field names, values as str()).
    server_config: Mapping[str, str] = field(default_factory=dict)


class UniqueKeyLoader(yaml.SafeLoader):
    """A safe YAML loader that rejects duplicate mapping keys instead of keeping the last one."""


def construct_unique_mapping(loader: UniqueKeyLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    """Build a mapping like SafeLoader does, but fail on a key that appears twice."""
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=True)


UniqueKeyLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    construct_unique_mapping,
)


class SchemaReader:
    """Validates one parsed YAML document; every error carries the file and the key path."""

    def __init__(self, source: Path) -> None:
        self.source = source

    def error(
        self, path: str, expected: str, got: object = None, *, show_got: bool = True
    ) -> NoReturn:
        """Raise ``ProfileError`` for key ``path``."""
        detail = f", got {got!r} ({type(got).__name__})" if show_got else ""
        raise ProfileError(f"{self.source}: {path}: expected {expected}{detail}")

    def mapping(self, value: object, path: str, allowed: frozenset[str]) -> dict[str, Any]:
        """Check ``value`` is a mapping whose keys are all in ``allowed``."""
        if not isinstance(value, dict):
            self.error(path, "a mapping", value)
        for key in value:
            if key not in allowed:
                self.error(
                    f"{path}.{key}" if path else str(key),
                    f"one of the keys {', '.join(sorted(allowed))} (unknown key)",
                    show_got=False,
                )
        return value

    def string(self, value: object, path: str, *, non_empty: bool = True) -> str:
        """Check ``value`` is a (non-empty) string."""
        if not isinstance(value, str) or (non_empty and not value.strip()):
            self.error(path, "a non-empty string" if non_empty else "a string", value)
        return value

    def string_list(self, value: object, path: str) -> list[str]:
        """Check ``value`` is a list of non-empty strings without duplicates."""
        if not isinstance(value, list):
            self.error(path, "a list of strings", value)
        items = [self.string(item, f"{path}[{index}]") for index, item in enumerate(value)]
        self.no_duplicates(items, path)
        return items

    def string_map(self, value: object, path: str) -> dict[str, str]:
        """Check ``value`` is a mapping of strings to strings (quote numbers: "1")."""
        if not isinstance(value, dict):
            self.error(path, "a mapping of strings to strings", value)
        for key, item in value.items():
            self.string(key, f"{path} key")
            self.string(item, f"{path}.{key}", non_empty=False)
        return value

    def no_duplicates(self, items: list[str], path: str) -> None:
        """Reject a list that names the same thing twice."""
        seen: set[str] = set()
        for index, item in enumerate(items):
            if item in seen:
                self.error(
                    f"{path}[{index}]",
                    f"each entry once; {item!r} is a duplicate",
                    None,
                    show_got=False,
                )
            seen.add(item)

    def feature(self, value: str, path: str) -> str:
        """Resolve a feature key (features.json) to its environment variable name."""
        if value not in ENV_FEATURES:
            self.error(
                path, f"a feature of features.json ({', '.join(sorted(ENV_FEATURES))})", value
            )
        return env_name(value)
