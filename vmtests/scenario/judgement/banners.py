"""What the live argv/env turn on, and what the self-identifying banners claim is on.

Both directions use ``features.json`` through the stub's feature model
(``vmtests.stub.features``), so the meaning of an environment switch and the default banner
texts are defined once. The consistency check compares the two.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

from vmtests.contracts.features import (
    BANNER_ORDER,
    ENV_FEATURES,
    banner_text,
    env_name,
    env_value,
    module_banner_tag,
)
from vmtests.scenario.collection.snapshot import JournalLine
from vmtests.stub.features import resolve as resolve_features


@dataclass(frozen=True)
class Claim:
    """A feature turned on, with the evidence: the flags/variables or the banner line."""

    feature: str
    evidence: str
    detail: str = ""  # mamba cache mode / tool-call parser, when the feature has one


def _last_flag_value(argv: Sequence[str], flag: str) -> str | None:
    value: str | None = None
    for index, token in enumerate(argv):
        if token == flag and index + 1 < len(argv):
            value = argv[index + 1]
        elif token.startswith(flag + "="):
            value = token[len(flag) + 1 :]
    return value


def _boolean_flag(argv: Sequence[str], flag: str) -> bool:
    """argparse BooleanOptionalAction: the last of ``--flag`` / ``--no-flag`` wins."""
    state = False
    negative = "--no-" + flag.removeprefix("--")
    for token in argv:
        if token == flag:
            state = True
        elif token == negative:
            state = False
    return state


def features_turned_on(argv: Sequence[str], environment: dict[str, str]) -> dict[str, Claim]:
    """The features the live argv and environment turn on, keyed by features.json name."""
    prefix = _boolean_flag(argv, "--enable-prefix-caching")
    mode = _last_flag_value(argv, "--mamba-cache-mode") or "none"
    parser = _last_flag_value(argv, "--tool-call-parser")
    auto_tool_choice = "--enable-auto-tool-choice" in argv
    active = resolve_features(environment, prefix, mode, parser, auto_tool_choice)
    claims: dict[str, Claim] = {}
    for feature in active.enabled():
        if feature in ENV_FEATURES:
            evidence = f"{env_name(feature)}={env_value(feature)} in the environment"
            claims[feature] = Claim(feature, evidence)
        elif feature == "prefixCaching":
            claims[feature] = Claim(
                feature, f"`--enable-prefix-caching --mamba-cache-mode {mode}` in the argv", mode
            )
        else:
            claims[feature] = Claim(
                feature,
                f"`--enable-auto-tool-choice --tool-call-parser {parser}` in the argv",
                parser or "",
            )
    return claims


@cache
def banner_patterns() -> dict[str, re.Pattern[str]]:
    """One regex per feature from its default banner text; ``{mode}``/``{parser}`` captured."""
    patterns: dict[str, re.Pattern[str]] = {}
    for feature in BANNER_ORDER:
        text = re.escape(banner_text(feature, mode="\0MODE\0", parser="\0PARSER\0"))
        text = text.replace(re.escape("\0MODE\0"), r"(?P<detail>[^\s,)]+)")
        text = text.replace(re.escape("\0PARSER\0"), r"(?P<detail>[^\s,)]+)")
        patterns[feature] = re.compile(text)
    return patterns


def features_claimed(lines: Sequence[JournalLine]) -> dict[str, Claim]:
    """The features that banner lines claim are on (the last banner of a feature wins)."""
    claims: dict[str, Claim] = {}
    for line in lines:
        for feature, pattern in banner_patterns().items():
            match = pattern.search(line.message)
            if match:
                detail = match.groupdict().get("detail") or ""
                claims[feature] = Claim(feature, f"banner {line.message.strip()!r}", detail)
    return claims


def module_banner_lines(lines: Sequence[JournalLine]) -> list[JournalLine]:
    """The lines carrying the module's ``tenstorrent-serving-config:`` banner."""
    tag = module_banner_tag()
    return [line for line in lines if tag in line.message]
