"""The persistence run's preflight: everything that would make the first run on a real host fail
for a reason that has nothing to do with the settings under test, asked before anything changes.

Each item is a result keyed by a ``Check`` (``preflight.*``) and, when it does not hold, a
``Reason``; the first that does not hold refuses the run with one line (exit 2): a required tool
is missing (the versions found, ``versions.VERSION_COMMANDS``, are reported either way);
tt-smi is older than the first that prints its snapshot on standard output;
``MemAvailable`` below the owner's floor; the hugepages the target still has to reserve do not
fit above it; too little free disk; the serving unit is not running (failed or inactive: a
switch restarts only running units, so S1 could not show a restart); the target does not
evaluate, or its switch would not restart the serving unit (``Switcher.dry_run``); the API
answers 401 without the key it was given (or without one).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from vmtests.contracts.findings import Check, Reason
from vmtests.contracts.serving import (
    API_KEY_GUARDED_PREFIX,
    GIB_KIB,
    MIN_DISK_GIB,
    MIN_MEM_AVAILABLE_GIB,
    POOL_SIZES,
    SERVING_UNIT,
    parse_pools,
)
from vmtests.contracts.settings import Settings
from vmtests.driver.machine import Machine
from vmtests.profiles import Profile
from vmtests.scenario.collection.collect import (
    API_KEY_READ,
    MARK,
    parse_meminfo,
    split_sections,
)
from vmtests.scenario.install.generations import SWITCH_COMPARED_STATES, simple_commands
from vmtests.scenario.install.switching import CommandSwitch, Switcher
from vmtests.scenario.judgement.checks import unauthorized_message
from vmtests.scenario.judgement.results import CheckResult
from vmtests.scenario.runner.versions import VERSIONS_TIMEOUT, parse_versions, versions_script
from vmtests.tt_smi_parse import SNAPSHOT_ON_STDOUT_SINCE_TT_SMI, dotted, version_tuple

PREFLIGHT = "preflight"
"""The stage label of the preflight's results."""
BASE_TOOLS = ("systemctl", "journalctl", "curl", "tt-smi")
PREFLIGHT_TIMEOUT = VERSIONS_TIMEOUT + 60.0
"""The preflight's one round trip: the version commands (``VERSIONS_TIMEOUT``), then its own
reads (systemctl, df, and the API key's request, which curl bounds at 10 s), given a
minute."""

_SCRIPT = r"""
tools=$1; keyfile=$2; port=$3; unit=$4
export port  # vLLM's /version (versions.VERSION_COMMANDS)
sec() { printf '\n%s%s\n' "$MARK" "$1"; }
@VERSIONS@
sec tools
for tool in $tools; do printf '%s %s\n' "$tool" "$(command -v "$tool" || echo -)"; done
sec meminfo; grep -E '^(MemAvailable|Hugepagesize):' /proc/meminfo
sec pools; @POOL_SIZES@
sec disk; df -Pk / | tail -n1
sec unit; systemctl show -p ActiveState -p SubState "$unit"
sec unit_jobs; systemctl list-jobs --no-legend --no-pager "$unit" 2>/dev/null
sec v1
if [ -n "$keyfile" ]; then
  @API_KEY_READ@
  printf 'header = "Authorization: Bearer %s"\n' "$key" \
    | curl -s -m 10 -K - -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port$GUARDED/models"
else curl -s -m 10 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port$GUARDED/models"; fi
"""


@dataclass
class Preflight:
    """Every item, and the versions of the tools found."""

    items: list[CheckResult] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)

    @property
    def refusal(self) -> CheckResult | None:
        """The first item that does not hold (None: the run may go on)."""
        return next((item for item in self.items if not item.ok), None)

    def versions_line(self) -> str:
        """``tt-smi: 6.2.1; docker: Docker version ...; ...`` for the log and the reports."""
        return "; ".join(f"{tool}: {found}" for tool, found in self.versions.items())


class PreflightRefused(Exception):
    """The preflight refused the run before anything changed (exit status 2)."""

    def __init__(self, item: CheckResult) -> None:
        super().__init__(f"preflight refused ({item.check}, {item.reason}): {item.message}")
        self.item = item


def _item(check: Check, holds: bool, reason: Reason, detail: str) -> CheckResult:
    """One item: its subject is the check's last part (``tools``), its message the detail."""
    subject = check.removeprefix(f"{PREFLIGHT}.")
    return CheckResult(PREFLIGHT, check, subject, holds, detail, reason=None if holds else reason)


def required_tools(settings: Settings, switcher: Switcher) -> list[str]:
    """The programs the run needs on the machine."""
    tools = list(BASE_TOOLS)
    if settings.container:
        tools.append("docker")
    if isinstance(switcher, CommandSwitch):
        # Every simple command's program: a compound switch (flake.nix's prebuilt one runs
        # nix-env, then systemd-run) needs them all.
        tools.extend(filter(None, map(_program, simple_commands(switcher.command))))
    return list(dict.fromkeys(tools))


def _program(words: list[str]) -> str | None:
    """The program a simple command runs, past variable assignments and ``sudo``/``env`` with
    their options."""
    wrapped = False
    for word in words:
        if re.match(r"^\w+=", word) or (wrapped and word.startswith("-")):
            continue
        if word in ("sudo", "env"):
            wrapped = True
            continue
        return word
    return None


def _tt_smi_item(found: str) -> CheckResult:
    """Whether tt-smi prints its snapshot where the run reads it: on standard output, which it
    does since ``SNAPSHOT_ON_STDOUT_SINCE_TT_SMI`` (a version it does not say is not compared)."""
    since = dotted(SNAPSHOT_ON_STDOUT_SINCE_TT_SMI)
    version = version_tuple(found)
    recent = version is None or version >= SNAPSHOT_ON_STDOUT_SINCE_TT_SMI
    if version is None:
        detail = f"no tt-smi version in {found!r}: not compared with {since}"
    else:
        detail = f"tt-smi {found}; the snapshot needs at least {since}"
    if not recent:
        detail += (
            f": tt-smi {found} writes `tt-smi -s` to a file, not to standard output, and knows no "
            f"--snapshot_no_tty; upgrade tt-smi on the host to {since} or later"
        )
    return _item(Check.PREFLIGHT_TT_SMI, recent, Reason.TOOL_TOO_OLD, detail)


def _memory_items(sections: dict[str, str], profile: Profile) -> list[CheckResult]:
    meminfo = parse_meminfo(sections.get("meminfo", ""))
    available_kib = int(meminfo.get("MemAvailable", "0 kB").split()[0])
    floor_kib = int(MIN_MEM_AVAILABLE_GIB * GIB_KIB)
    pools = parse_pools(sections.get("pools", ""))
    items = [
        _item(
            Check.PREFLIGHT_MEMORY,
            available_kib >= floor_kib,
            Reason.LOW_MEMORY,
            f"MemAvailable {available_kib / GIB_KIB:.2f} GiB; the floor "
            f"{MIN_MEM_AVAILABLE_GIB:.1f} GiB (docs/requirements.md)",
        )
    ]
    hugepages = profile.hugepages
    if hugepages is not None:
        have = pools.get(hugepages.size_kib, 0)
        missing_kib = max(0, hugepages.count - have) * hugepages.size_kib
        items.append(
            _item(
                Check.PREFLIGHT_HUGEPAGES,
                available_kib - floor_kib >= missing_kib,
                Reason.HUGEPAGES_DO_NOT_FIT,
                f"the target reserves {hugepages}; the pool holds {have}; the hugepages still to "
                f"reserve {missing_kib / GIB_KIB:.2f} GiB, above the floor "
                f"{max(0, available_kib - floor_kib) / GIB_KIB:.2f} GiB are available",
            )
        )
    disk = sections.get("disk", "").split()
    free_gib = int(disk[3]) / GIB_KIB if len(disk) > 3 and disk[3].isdigit() else 0.0
    items.append(
        _item(
            Check.PREFLIGHT_DISK,
            free_gib >= MIN_DISK_GIB,
            Reason.LOW_DISK,
            f"{free_gib:.2f} GiB free on / (at least {MIN_DISK_GIB:.1f} GiB)",
        )
    )
    return items


def _api_item(status: str, settings: Settings) -> CheckResult:
    url = f"{API_KEY_GUARDED_PREFIX}/models"
    key = f" with the key in {settings.api_key_file}" if settings.api_key_file else ""
    return _item(
        Check.PREFLIGHT_API,
        status != "401",
        Reason.UNAUTHORIZED,
        unauthorized_message(url, settings.api_key_file or "")
        if status == "401"
        else f"GET {url}{key} answered {status or 'nothing'}",
    )


def _unit_item(sections: dict[str, str]) -> CheckResult:
    """Whether the serving unit runs: a switch restarts only running units, so from a failed
    or inactive one S1 could show no restart (and dry-activate names it under no action)."""
    state = dict(
        line.split("=", 1) for line in sections.get("unit", "").splitlines() if "=" in line
    )
    active, sub = state.get("ActiveState") or "unknown", state.get("SubState") or "unknown"
    running = active in SWITCH_COMPARED_STATES
    detail = f"{SERVING_UNIT} is {active} ({sub})"
    jobs = [line.split() for line in sections.get("unit_jobs", "").splitlines()]
    queued = [job for job in jobs if job[1:3] == [SERVING_UNIT, "start"]]
    if not running and queued:
        detail += (
            f" with start job {queued[0][0]} queued ({' '.join(queued[0][3:])}): it has not "
            "started yet (the boot, or a unit it is ordered after, has not finished); wait "
            f"until `systemctl is-active {SERVING_UNIT}` says active (`systemctl list-jobs` "
            "shows what it waits for), then run again"
        )
    elif not running:
        detail += (
            f": it is not running, so no switch could show its restart; start it (`systemctl "
            f"start {SERVING_UNIT}`), or read why it stopped (`journalctl -b -u {SERVING_UNIT}`), "
            "before a persistence run"
        )
    return _item(Check.PREFLIGHT_ACTIVE, running, Reason.NOT_ACTIVE, detail)


def _switch_items(
    machine: Machine, profile: Profile, switcher: Switcher, *, unit_runs: bool
) -> list[CheckResult]:
    """Whether the target evaluates and, when the serving unit runs (else the dry run cannot
    tell: ``_unit_item``), whether the switch restarts it."""
    dry = switcher.dry_run(machine, profile)
    items = [
        _item(Check.PREFLIGHT_EVALUATES, dry.evaluates is not False, Reason.DOES_NOT_EVALUATE,
              dry.detail)
    ]  # fmt: skip
    if dry.evaluates is not False and unit_runs:
        detail = dry.detail
        if dry.restarts is False:
            detail += (
                f": the switch would change nothing, so S1 could not show a restart of "
                f"{SERVING_UNIT}; start from the base configuration (switch to it first, or "
                "run on a host that is not on the profile yet)"
            )
        items.append(
            _item(
                Check.PREFLIGHT_RESTARTS,
                dry.restarts is not False,
                Reason.SWITCH_CHANGES_NOTHING,
                detail,
            )
        )
    return items


def run_preflight(
    machine: Machine, profile: Profile, switcher: Switcher, settings: Settings
) -> Preflight:
    """Ask everything, changing nothing; the caller refuses on ``refusal``."""
    tools = required_tools(settings, switcher)
    script = (
        _SCRIPT.replace("@VERSIONS@", versions_script())
        .replace("@API_KEY_READ@", API_KEY_READ)
        .replace("@POOL_SIZES@", POOL_SIZES)
    )
    values = (" ".join(tools), settings.api_key_file or "", settings.serving_port, SERVING_UNIT)
    command = (
        f"MARK={shlex.quote(MARK)} GUARDED={API_KEY_GUARDED_PREFIX} sh -c {shlex.quote(script)} "
        "vmtests-preflight " + " ".join(shlex.quote(str(value)) for value in values)
    )
    sections = split_sections(machine.execute(command, timeout=PREFLIGHT_TIMEOUT).stdout_text)
    preflight = Preflight(versions=parse_versions(sections))
    paths = dict(
        line.split(" ", 1) for line in sections.get("tools", "").splitlines() if " " in line
    )
    missing = [tool for tool in tools if paths.get(tool, "-") == "-"]
    preflight.items.append(
        _item(
            Check.PREFLIGHT_TOOLS,
            not missing,
            Reason.TOOL_MISSING,
            (f"missing on {machine.name}: {', '.join(missing)}; " if missing else "")
            + f"found {preflight.versions_line()}",
        )
    )
    preflight.items.append(_tt_smi_item(preflight.versions["tt-smi"]))
    preflight.items += _memory_items(sections, profile)
    unit = _unit_item(sections)
    preflight.items.append(unit)
    preflight.items += _switch_items(machine, profile, switcher, unit_runs=unit.ok)
    preflight.items.append(_api_item(sections.get("v1", "").strip(), settings))
    return preflight
