"""Compare what a machine (or the Nix core) produced against an expectation ``Profile``.

Pure functions shared by the eval tier (core output) and the scenario checks (the live unit):
each returns a list of ``Mismatch``; an empty list means the expectation holds. Messages name
the profile and the flag, variable or key, so a failing test says exactly what broke.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from vmtests.contracts.features import module_banner_tag
from vmtests.contracts.findings import Reason
from vmtests.contracts.serving import HUGEPAGE_SIZES_KIB
from vmtests.profiles.schema import Profile


@dataclass(frozen=True)
class Mismatch:
    """One expectation that does not hold.

    ``kind`` says which (``Reason.ARG_MISSING``, ``ENV_VALUE``, ``MODULE_BANNER_VALUE``,
    ``HUGEPAGES_COUNT``, ...); ``subject`` is the flag, variable or banner key.
    """

    kind: Reason
    subject: str
    message: str


def _flag_values(argv: Sequence[str], flag: str) -> list[str | None]:
    """Every occurrence of ``flag`` in ``argv`` with the value that follows it.

    ``--flag value`` and ``--flag=value`` both count; the value is None when nothing follows.
    """
    values: list[str | None] = []
    for index, token in enumerate(argv):
        if token == flag:
            values.append(argv[index + 1] if index + 1 < len(argv) else None)
        elif token.startswith(flag + "="):
            values.append(token[len(flag) + 1 :])
    return values


def match_args(profile: Profile, argv: Sequence[str]) -> list[Mismatch]:
    """Check required flags (and the value right after them) and forbidden flags in ``argv``."""
    mismatches: list[Mismatch] = []
    shown = " ".join(argv)
    for expected in profile.args_present:
        values = _flag_values(argv, expected.flag)
        if not values:
            mismatches.append(
                Mismatch(
                    Reason.ARG_MISSING,
                    expected.flag,
                    f"profile {profile.name}: `{expected.flag}` is missing from the argv: {shown}",
                )
            )
        # argparse keeps the last occurrence, so that is the one the server uses.
        elif expected.value is not None and values[-1] != expected.value:
            mismatches.append(
                Mismatch(
                    Reason.ARG_VALUE,
                    expected.flag,
                    f"profile {profile.name}: `{expected.flag}` must be immediately followed by "
                    f"`{expected.value}`, found `{values[-1]}` in the argv: {shown}",
                )
            )
    for flag in profile.args_absent:
        if _flag_values(argv, flag):
            mismatches.append(
                Mismatch(
                    Reason.ARG_FORBIDDEN,
                    flag,
                    f"profile {profile.name}: `{flag}` must not appear, but the argv has it: "
                    f"{shown}",
                )
            )
    return mismatches


def match_environment(profile: Profile, env: Mapping[str, str]) -> list[Mismatch]:
    """Check variables that must be set to a value and variables that must be absent."""
    mismatches: list[Mismatch] = []
    for name, value in profile.env_set.items():
        if name not in env:
            mismatches.append(
                Mismatch(
                    Reason.ENV_MISSING,
                    name,
                    f"profile {profile.name}: environment variable `{name}` must be set to "
                    f"`{value}`, but it is not set",
                )
            )
        elif env[name] != value:
            mismatches.append(
                Mismatch(
                    Reason.ENV_VALUE,
                    name,
                    f"profile {profile.name}: environment variable `{name}` must be `{value}`, "
                    f"found `{env[name]}`",
                )
            )
    for name in profile.env_absent:
        if name in env:
            mismatches.append(
                Mismatch(
                    Reason.ENV_FORBIDDEN,
                    name,
                    f"profile {profile.name}: environment variable `{name}` must be absent, "
                    f"found `{name}={env[name]}`",
                )
            )
    return mismatches


def parse_module_banner(line: str) -> dict[str, str]:
    """Parse the module banner's ``key=value`` pairs from a line (journal prefixes allowed).

    Raises ``ValueError`` when the tag is missing, a field is not ``key=value``, a key repeats,
    or the ``digest`` field is missing.
    """
    tag = module_banner_tag()
    _, found, rest = line.partition(tag)
    if not found:
        raise ValueError(f"not a module banner (no {tag!r}): {line!r}")
    pairs: dict[str, str] = {}
    for field in rest.split():
        key, equals, value = field.partition("=")
        if not equals or not key or not value:
            raise ValueError(f"malformed field {field!r} (expected key=value) in {line!r}")
        if key in pairs:
            raise ValueError(f"field {key!r} appears twice in {line!r}")
        pairs[key] = value
    if "digest" not in pairs:
        raise ValueError(f"module banner without digest=sha256:<hex>: {line!r}")
    return pairs


def match_module_banner(profile: Profile, pairs: Mapping[str, str]) -> list[Mismatch]:
    """Check the expected ``key=value`` pairs of the module banner."""
    mismatches: list[Mismatch] = []
    for key, value in profile.module_banner.items():
        found = pairs.get(key)
        if found != value:
            seen = "it is missing" if found is None else f"found `{key}={found}`"
            mismatches.append(
                Mismatch(
                    Reason.MODULE_BANNER_VALUE,
                    key,
                    f"profile {profile.name}: module banner must say `{key}={value}`, {seen}",
                )
            )
    return mismatches


def match_hugepages(profile: Profile, count: int, size_kib: int) -> list[Mismatch]:
    """Check the reserved hugepages: exactly the expected count of the expected page size.

    ``count`` is ``nr_hugepages`` of the pool with pages of ``size_kib`` KiB. A profile without
    a hugepages expectation accepts anything.
    """
    expected = profile.hugepages
    if expected is None:
        return []
    if size_kib != expected.size_kib:
        sizes = {kib: name for name, kib in HUGEPAGE_SIZES_KIB.items()}
        found = sizes.get(size_kib, f"{size_kib} KiB")
        return [
            Mismatch(
                Reason.HUGEPAGES_SIZE,
                "size",
                f"profile {profile.name}: hugepages must be {expected.size} pages "
                f"({expected.size_kib} KiB), checked the {found} pool",
            )
        ]
    if count != expected.count:
        return [
            Mismatch(
                Reason.HUGEPAGES_COUNT,
                "count",
                f"profile {profile.name}: {expected.count} x {expected.size} hugepages must be "
                f"reserved at boot, found {count}",
            )
        ]
    return []
