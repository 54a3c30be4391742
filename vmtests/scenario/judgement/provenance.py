"""Provenance of every serving-relevant live value: where it comes from, and whether that lasts.

``sources.py`` checks the unit file, its drop-ins and the manager environment. A value can
also reach the server through the other ways systemd and the container runtime deliver
configuration, and each of them can live under ``/run``:

- ``EnvironmentFile=`` (systemd.exec(5)), also feeding ``$VAR``/``${VAR}`` in ``ExecStart=``;
- system environment generators (systemd.environment-generator(7)): their output becomes the
  manager environment; a generator under ``/run`` is itself runtime-only;
- ``ExecStart=`` wrapper scripts and the files they source (``. file``, ``source file``);
- ``docker run --env-file`` (docker run(1); nixpkgs
  ``nixos/modules/virtualisation/oci-containers.nix`` renders ``environmentFiles`` so).

For every serving-relevant live variable and flag this module names every source it found
(an ``ok`` result carries the trace) and fails when one of them is runtime-only and not
already reported by ``sources.py`` (runtime drop-ins and the manager environment are). State
unrelated to serving (another variable in the manager environment, a drop-in setting that
neither runs nor configures the server) is reported as information and never fails a run.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from vmtests.contracts.findings import Check, Reason
from vmtests.scenario.collection.snapshot import Snapshot
from vmtests.scenario.judgement.results import CheckResult, as_informational, failed, passed
from vmtests.scenario.judgement.sources import (
    STANDARD_MANAGER_VARIABLES,
    is_runtime_path,
    is_serving_setting,
    serving_relevant,
    setting_key,
)

_SOURCED = re.compile(r"""(?:^|[\s;])(?:\.|source)\s+(/[^\s;"']+)|--env-file[= ](/[^\s;"']+)""")
_ENV_FILE = re.compile(r"""--env-file[= ](/[^\s;"']+)""")


@dataclass(frozen=True)
class Source:
    """One place a value comes from; ``runtime`` is why it will not survive a reboot ("" if it
    will) and ``reason`` the finding's key then, ``reported_elsewhere`` when a ``sources.py``
    check already fails on it."""

    where: str
    runtime: str = ""
    reason: Reason | None = None
    reported_elsewhere: bool = False


def _runtime_reason(path: str) -> str:
    return f"{path} is under /run (runtime-only)" if is_runtime_path(path) else ""


def _reads(script: str) -> list[tuple[str, Reason]]:
    """Files a script reads, each with how: sourced (``.``, ``source``) or as an environment
    file (``--env-file``)."""
    return [
        (first, Reason.RUNTIME_SOURCED_FILE) if first else (second, Reason.RUNTIME_ENV_FILE)
        for first, second in _SOURCED.findall(script)
    ]


def _assigns(text: str, name: str) -> bool:
    """True when ``text`` assigns ``name`` (``NAME=``, ``export NAME=``, ``-e NAME=``)."""
    return re.search(rf"(?:^|[\s\"'])(?:export\s+)?{re.escape(name)}=", text, re.M) is not None


def sourced_files(script: str) -> list[str]:
    """Files a wrapper script reads: ``. file``, ``source file``, ``--env-file file``."""
    return [path for path, _ in _reads(script)]


def env_sources(snapshot: Snapshot, name: str) -> list[Source]:
    """Every place that sets variable ``name`` for the serving process."""
    unit = snapshot.unit
    found: list[Source] = []
    for path, text in unit.files.items():
        lines = [line for line in text.splitlines() if setting_key(line) == "Environment"]
        if any(_assigns(line.split("=", 1)[1], name) for line in lines):
            kind = "unit file" if path == unit.fragment_path else "drop-in"
            found.append(Source(f"{kind} {path}", _runtime_reason(path), None, True))
    for path, text in unit.sources.items():
        if _assigns(text, name):
            found.append(_file_source(snapshot, path, Reason.RUNTIME_ENV_FILE))
    if name in snapshot.manager_environment and name not in unit.environment:
        generators = [g for g in snapshot.env_generators if is_runtime_path(g)]
        found.append(
            Source(
                "the service manager's environment",
                "set with systemctl set-environment or by a runtime generator "
                + (f"({', '.join(generators)})" if generators else ""),
                Reason.RUNTIME_GENERATOR if generators else Reason.MANAGER_VARIABLE,
                reported_elsewhere=not generators,
            )
        )
    return found


def _file_source(snapshot: Snapshot, path: str, *reads: Reason) -> Source:
    """A file the unit reads (``unit.sources``) as a source: what it is, and whether (and why)
    it is runtime-only: under /run itself, or sourcing a file under /run. ``reads`` are further
    ways a runtime file can reach the value (an environment file, for a variable)."""
    unit = snapshot.unit
    if path in unit.prop("EnvironmentFiles"):
        where, kind = f"EnvironmentFile {path}", Reason.RUNTIME_ENV_FILE
    elif any(
        path in _ENV_FILE.findall(text) for text in [*unit.files.values(), *unit.sources.values()]
    ):
        where, kind = f"docker --env-file {path}", Reason.RUNTIME_ENV_FILE
    elif readers := [p for p, text in unit.sources.items() if path in sourced_files(text)]:
        where = f"{path} (read by the wrapper script {', '.join(readers)})"
        kind = Reason.RUNTIME_SOURCED_FILE
    else:
        where, kind = f"ExecStart script {path}", Reason.RUNTIME_SCRIPT
    if is_runtime_path(path):
        return Source(where, _runtime_reason(path), kind)
    ways = {Reason.RUNTIME_SOURCED_FILE, *reads}
    runtime_reads = [
        (f, how)
        for f, how in _reads(unit.sources.get(path, ""))
        if is_runtime_path(f) and how in ways
    ]
    if runtime_reads:
        files = ", ".join(f for f, _ in runtime_reads)
        why = f"{path} reads {files}, which is under /run (runtime-only)"
        return Source(where, why, runtime_reads[0][1])
    return Source(where)


def flag_sources(snapshot: Snapshot, flag: str) -> list[Source]:
    """Every place that puts ``flag`` on the serving command line."""
    unit = snapshot.unit
    found: list[Source] = []
    for path, text in unit.files.items():
        if any(flag in line for line in text.splitlines() if setting_key(line) == "ExecStart"):
            kind = "unit file" if path == unit.fragment_path else "drop-in"
            found.append(Source(f"{kind} {path}", _runtime_reason(path), None, True))
    for path, text in unit.sources.items():
        if flag in text:
            found.append(_file_source(snapshot, path))
    return found


def _trace(stage: str, subject: str, value: str, sources: list[Source]) -> CheckResult:
    bad = [s for s in sources if s.runtime and not s.reported_elsewhere]
    reasons = [s.reason for s in bad if s.reason is not None]
    if reasons:
        where = "; ".join(f"{s.where} ({s.runtime})" for s in bad)
        return failed(
            stage,
            Check.PROVENANCE,
            subject,
            reasons[0],
            f"{value} reaches the server from {where}: it will be gone after the next reboot",
        )
    trace = ", ".join(s.where for s in sources) or "no file the unit reads (image or default)"
    return passed(stage, Check.PROVENANCE, subject, f"{value} comes from {trace}")


def _flags(argv: list[str]) -> list[str]:
    return list(dict.fromkeys(arg.split("=", 1)[0] for arg in argv if arg.startswith("--")))


def check_provenance(snapshot: Snapshot, relevant_names: Iterable[str] = ()) -> list[CheckResult]:
    """Trace every serving-relevant live variable and flag; flag runtime-only sources."""
    stage = snapshot.label
    extra = list(relevant_names)
    results: list[CheckResult] = []
    for name, value in sorted(snapshot.environment.items()):
        if serving_relevant(name, extra):
            sources = env_sources(snapshot, name)
            results.append(_trace(stage, name, f"{name}={value}", sources))
    for flag in _flags(snapshot.argv):
        results.append(_trace(stage, flag, f"`{flag}`", flag_sources(snapshot, flag)))
    for generator in snapshot.env_generators:
        if is_runtime_path(generator):
            results.append(
                failed(
                    stage,
                    Check.PROVENANCE,
                    generator,
                    Reason.RUNTIME_GENERATOR,
                    f"environment generator {generator} is under /run (runtime-only): the "
                    "manager environment it produces will differ after the next reboot",
                )
            )
    return results + unrelated_state(snapshot, extra)


def unrelated_state(snapshot: Snapshot, relevant_names: Iterable[str] = ()) -> list[CheckResult]:
    """Runtime state that has nothing to do with serving: information, never a failure."""
    stage = snapshot.label
    extra = list(relevant_names)
    notes: list[CheckResult] = []
    for name in sorted(snapshot.manager_environment):
        if (
            name not in STANDARD_MANAGER_VARIABLES
            and not name.startswith("LC_")
            and not serving_relevant(name, extra)
        ):
            notes.append(
                passed(
                    stage,
                    Check.UNRELATED,
                    name,
                    f"{name} is set in the service manager's environment but does not "
                    "configure serving (information only)",
                )
            )
    for path in snapshot.unit.drop_in_paths:
        if not is_runtime_path(path):
            continue
        keys = [setting_key(line) for line in snapshot.unit.files.get(path, "").splitlines()]
        keys = [key for key in keys if key]
        if keys and not any(is_serving_setting(key) for key in keys):
            notes.append(
                passed(
                    stage,
                    Check.UNRELATED,
                    path,
                    f"runtime drop-in {path} sets only {', '.join(keys)}, which does not "
                    "configure serving (information only)",
                )
            )
    return as_informational(notes)
