"""What a snapshot shows for each expectation of a profile, and the live state around it, in
words a person can compare with the profile: the report of ``vmtests check`` puts them beside
what was expected, so that a profile can be pinned to what the real stack runs and prints.

Everything here comes from a snapshot, which is redacted when it is taken.
"""

from __future__ import annotations

import re

from vmtests.contracts.features import module_banner_tag
from vmtests.contracts.findings import Check
from vmtests.profiles import Profile
from vmtests.profiles.expectations import parse_module_banner
from vmtests.scenario.collection.snapshot import JournalLine, Snapshot
from vmtests.scenario.judgement.banners import banner_patterns, module_banner_lines
from vmtests.scenario.judgement.checks import Row
from vmtests.scenario.judgement.server_config import describe

MAX_LINE = 200
MAX_STATEMENT = 1000
STATEMENT = re.compile(
    r"vLLM (API )?server version|Automatic prefix caching is|Asynchronous scheduling is|"
    r"Async scheduling was requested|tool choice has been enabled|Initializing a V1 LLM engine|"
    r"Mamba cache mode|\bACTIVE\b|banner",
)
"""Lines worth seeing when pinning banners: the statements vLLM and the TT plugin make about
the configuration (``vmtests/stub/release.py`` names their sources) and anything that calls
itself a banner or says ACTIVE."""


def _flag(argv: list[str], flag: str) -> str:
    """How ``flag`` appears in ``argv``: ``--flag value``, ``--flag=value``, ``--flag``, or
    ``absent``."""
    for index, word in enumerate(argv):
        if word == flag:
            following = argv[index + 1] if index + 1 < len(argv) else ""
            takes_value = following and not following.startswith("--")
            return f"`{flag} {following}`" if takes_value else f"`{flag}`"
        if word.startswith(flag + "="):
            return f"`{word}`"
    return "absent"


def _line(line: JournalLine, limit: int = MAX_LINE) -> str:
    where = f" ({line.source})" if line.source else ""
    return f"`{line.message.strip()[:limit]}`{where}"


def seen(profile: Profile, row: Row, snapshot: Snapshot) -> str:
    """What ``snapshot`` shows for the expectation ``row`` of ``profile``."""
    if row.check == Check.PROFILE_ARGS:
        return _flag(snapshot.argv, row.subject)
    if row.check == Check.PROFILE_ENV:
        value = snapshot.environment.get(row.subject)
        return "unset" if value is None else f"`{row.subject}={value}`"
    if row.check == Check.PROFILE_BANNER:
        banners = {b.name: b for b in (*profile.banners_present, *profile.banners_absent)}
        pattern = banners[row.subject].pattern
        hits = [line for line in snapshot.current_lines() if pattern.search(line.message)]
        return _line(hits[-1]) if hits else "not logged in the current start"
    if row.check == Check.PROFILE_MODULE_BANNER:
        lines = module_banner_lines(snapshot.current_lines())
        if not lines:
            return "no module banner in the current start"
        if row.subject == "present":
            return _line(lines[-1])
        try:
            pairs = parse_module_banner(lines[-1].message)
        except ValueError as error:
            return f"unreadable: {error}"
        return f"`{row.subject}={pairs[row.subject]}`" if row.subject in pairs else "absent"
    if row.check == Check.SERVER_CACHE_CONFIG:
        return f"`{row.subject}={describe(snapshot, [row.subject])[row.subject]}`"
    if row.check == Check.PROFILE_HUGEPAGES and profile.hugepages is not None:
        size = profile.hugepages.size_kib
        return f"{snapshot.hugepages.count(size)} x {profile.hugepages.size}"
    return "-"


def statement_lines(snapshot: Snapshot) -> list[str]:
    """The current start's lines that state the configuration (banners, vLLM's and the
    plugin's statements), each once, in order; a line only the container's log kept says so."""
    patterns = list(banner_patterns().values())
    tag = module_banner_tag()
    found: dict[str, JournalLine] = {}
    for line in snapshot.current_lines():
        text = line.message.strip()
        if STATEMENT.search(text) or tag in text or any(p.search(text) for p in patterns):
            found.setdefault(text, line)
    return [_line(line, MAX_STATEMENT) for line in found.values()]


def live_state(snapshot: Snapshot) -> list[tuple[str, str]]:
    """(what, value) pairs of the live state: the unit and its source, the process, the
    container, the generation and the card."""
    unit = snapshot.unit
    process, container = snapshot.server, snapshot.container
    return [
        ("unit", f"{unit.name}: {unit.active_state or '?'}, {unit.unit_file_state or '?'}, "
                 f"invocation {unit.invocation_id or '?'}"),
        ("unit file", unit.fragment_path or "?"),
        ("drop-ins", ", ".join(unit.drop_in_paths) or "none"),
        ("ExecStart", unit.prop("ExecStart")[:MAX_LINE] or "?"),
        ("start script", ", ".join(snapshot.start_script) or "none"),
        ("serving process", f"{process.origin}, pid {process.pid}" if process else "none"),
        ("argv", " ".join(snapshot.argv) or "none"),
        ("environment", " ".join(f"{k}={v}" for k, v in sorted(snapshot.environment.items()))
                        or "none"),
        ("container", f"{container.name}, image {container.image or '?'}, "
                      f"started {container.started_at or '?'}" if container else "none"),
        ("generation", ", ".join(f"{k} -> {v}" for k, v in snapshot.generations.items())
                       or "not NixOS"),
        ("tt-smi", f"exit {snapshot.tt_smi.status}" if snapshot.tt_smi.status is not None
                   else snapshot.tt_smi.error or "not run"),
    ]  # fmt: skip
