"""The running server's own statement of its cache config, and the check against the profile.

argv and banners can lie (a drop-in echoes a banner; a platform plugin switches a feature off
after the flag was read); the engine's config cannot. Two sources, both from the server:

- ``vllm:cache_config_info`` on ``/metrics`` (vLLM ``v1/metrics/loggers.py``,
  ``log_metrics_info``): a gauge set to 1 whose labels are ``CacheConfig.metrics_info()``
  (``config/cache.py``), e.g. ``enable_prefix_caching="True"``, ``mamba_cache_mode="align"``;
- the engine config line of the current start (vLLM ``v1/engine/core.py``: ``Initializing a V1
  LLM engine (v...) with config: ..., enable_prefix_caching=True, ...``).

The profile's hand-written ``server_config`` section says what both must report.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from vmtests.contracts.findings import Check, Reason
from vmtests.profiles import Profile
from vmtests.scenario.collection.snapshot import Snapshot
from vmtests.scenario.judgement.results import CheckResult, failed, passed

INFO_METRIC = "vllm:cache_config_info"
ENGINE_LINE = "Initializing a V1 LLM engine"
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
_ENGINE_FIELD = re.compile(r"(?:config: |, )(?P<key>[a-z_]+)=(?P<value>[^,]*)")


@dataclass
class ServerConfig:
    """What one snapshot's server said about its cache config (empty when it said nothing)."""

    metrics: dict[str, str] = field(default_factory=dict)
    engine_line: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def parse_cache_config_info(text: str) -> dict[str, str]:
    """The labels of the (first) ``vllm:cache_config_info`` sample in Prometheus text."""
    for line in text.splitlines():
        if line.startswith(INFO_METRIC + "{"):
            labels = line[len(INFO_METRIC) + 1 : line.rindex("}")]
            return {key: value.replace('\\"', '"') for key, value in _LABEL.findall(labels)}
    return {}


def parse_engine_line(message: str) -> dict[str, str]:
    """``key=value`` fields of an engine config line (top-level fields only)."""
    if ENGINE_LINE not in message or "with config:" not in message:
        return {}
    body = message[message.index("with config:") :]
    return {match["key"]: match["value"].strip() for match in _ENGINE_FIELD.finditer(body)}


def server_config(snapshot: Snapshot) -> ServerConfig:
    """Read the server's cache config from the snapshot's /metrics sample and journal."""
    result = ServerConfig()
    endpoint = snapshot.metrics
    if endpoint.status == 200:
        result.metrics = parse_cache_config_info(endpoint.body)
        if not result.metrics:
            result.problems.append(f"GET {endpoint.url} has no {INFO_METRIC} sample")
    else:
        result.problems.append(f"GET {endpoint.url} gave {endpoint.status or endpoint.error}")
    lines = [line for line in snapshot.current_lines() if ENGINE_LINE in line.message]
    if lines:
        result.engine_line = parse_engine_line(lines[-1].message)
    else:
        result.problems.append("no engine config line in this boot's log of the current start")
    return result


def _reported(config: ServerConfig, key: str) -> list[tuple[str, str]]:
    """(source, value) pairs the server gave for ``key``."""
    pairs = []
    if key in config.metrics:
        pairs.append((INFO_METRIC, config.metrics[key]))
    if key in config.engine_line:
        pairs.append(("the engine config line", config.engine_line[key]))
    return pairs


def check_server_config(profile: Profile, snapshot: Snapshot) -> list[CheckResult]:
    """Each ``server_config`` expectation against what the running server itself reports."""
    stage = snapshot.label
    if not profile.server_config:
        return []
    config = server_config(snapshot)
    results: list[CheckResult] = []
    for key, expected in profile.server_config.items():
        reported = _reported(config, key)
        if not reported:
            why = "; ".join(config.problems) or f"neither source names {key}"
            results.append(
                failed(
                    stage,
                    Check.SERVER_CACHE_CONFIG,
                    key,
                    Reason.SERVER_SILENT,
                    f"the server reports no {key}: {why}",
                )
            )
            continue
        wrong = [(source, value) for source, value in reported if value != expected]
        if not wrong:
            sources = " and ".join(source for source, _ in reported)
            results.append(
                passed(stage, Check.SERVER_CACHE_CONFIG, key, f"{key}={expected} per {sources}")
            )
            continue
        source, value = wrong[0]
        results.append(
            failed(
                stage,
                Check.SERVER_CACHE_CONFIG,
                key,
                Reason.SERVER_DIFFERS,
                f"profile {profile.name}: the running server's own cache config says "
                f"{key}={value} ({source}), not {expected}: whatever argv and banners claim, "
                "the engine does not run it",
            )
        )
    return results


def describe(snapshot: Snapshot, keys: list[str]) -> dict[str, str]:
    """``key -> value`` as the server reported it at this snapshot (``?`` when it did not)."""
    config = server_config(snapshot)
    values = {}
    for key in keys:
        reported = _reported(config, key)
        values[key] = reported[0][1] if reported else "?"
    return values
