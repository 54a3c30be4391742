"""Where the live configuration comes from, and whether that source survives a reboot.

A setting can be live now and still be lost at the next boot: a drop-in or unit under
``/run``, the manager environment (``systemctl set-environment``), a unit file changed on disk
without a restart, a process started by hand, a unit that is not enabled, hugepages written at
runtime or a masked hugepage unit. Each gets its own check and message here.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable

from vmtests.contracts.features import ENV_FEATURES, env_name
from vmtests.contracts.findings import Check, Reason
from vmtests.scenario.collection.redact import REDACTED
from vmtests.scenario.collection.snapshot import ProcessState, Snapshot, UnitState
from vmtests.scenario.judgement.container_run import BACKENDS, ContainerRun, parse_container_run
from vmtests.scenario.judgement.results import CheckResult, failed, passed
from vmtests.stub import knobs

# Manager variables every systemd sets or distributions preset; not a sign of a manual change.
STANDARD_MANAGER_VARIABLES = frozenset({"PATH", "LANG", "LANGUAGE", "LOCALE_ARCHIVE", "TZDIR"})
DURABLE_UNIT_FILE_STATES = frozenset({"enabled", "static", "generated", "alias", "indirect"})
_GENERATOR_DIRS = ("/run/systemd/generator", "/run/systemd/generator.early")
# Variables that configure the serving stack (vLLM, the TT stack, qwen36, Hugging Face, the
# stub's device layer); the feature table and the profile name the rest.
SERVING_PREFIXES = ("VLLM_", "QWEN36_", "TT_", "HF_", knobs.PREFIX)
# Unit settings that change what runs or with which environment/devices (systemd.exec(5),
# systemd.service(5)); any other drop-in setting is unrelated to serving.
SERVING_SETTINGS = frozenset(
    {"Environment", "EnvironmentFile", "PassEnvironment", "UnsetEnvironment", "WorkingDirectory"}
    | {"User", "Group", "DeviceAllow", "BindPaths", "BindReadOnlyPaths", "RootDirectory"}
    | {"RootImage", "TimeoutStopSec", "KillSignal", "KillMode", "Type"}
)
_EXEC_ARGV = re.compile(r"argv\[\]=(?P<argv>.*?) ; ")
_EXEC_PATH = re.compile(r"path=(?P<path>\S+) ; ")


SECRET_DIRS = (
    "/run/secrets/",
    "/run/secrets.d/",
    "/run/secrets-for-users/",
    "/run/agenix/",
    "/run/agenix.d/",
)
"""Where NixOS secret managers decrypt secrets, from the configuration, at every activation (the
boot's included): sops-nix (Mic92/sops-nix ``modules/sops/default.nix``: ``/run/secrets``,
``/run/secrets.d``, ``system.activationScripts.setup-secrets``) and agenix (ryantm/agenix
``modules/age.nix``: ``age.secretsDir`` ``/run/agenix``, ``secretsMountPoint``
``/run/agenix.d``). A server's API key lives there on a real host: durable, though under /run."""


def is_runtime_path(path: str) -> bool:
    """True for files under ``/run`` that vanish at reboot (generator output and the secret
    managers' files are re-made)."""
    return path.startswith("/run/") and not path.startswith((*_GENERATOR_DIRS, *SECRET_DIRS))


def serving_relevant(name: str, extra: Iterable[str] = ()) -> bool:
    """True for a variable that configures serving (feature table, profile, known prefixes)."""
    names = {env_name(feature) for feature in ENV_FEATURES} | set(extra)
    return name in names or name.startswith(SERVING_PREFIXES)


def setting_key(line: str) -> str:
    """The key of a unit-file line (``ExecStart=...`` -> ``ExecStart``); "" for others."""
    text = line.strip()
    if not text or text.startswith(("#", ";", "[")) or "=" not in text:
        return ""
    return text.split("=", 1)[0].strip()


def is_serving_setting(key: str) -> bool:
    """True for a unit setting that changes what runs or with which environment."""
    return key.startswith("Exec") or key in SERVING_SETTINGS


def origin_of(snapshot: Snapshot, subject: str) -> str:
    """Where ``subject`` (a flag or variable name) is set, as a phrase; "" if not found."""
    origins: list[str] = []
    for path, text in snapshot.unit.files.items():
        if subject in text:
            kind = "unit file" if path == snapshot.unit.fragment_path else "drop-in"
            runtime = " (runtime-only, under /run)" if is_runtime_path(path) else ""
            origins.append(f"{kind} {path}{runtime}")
    if subject in snapshot.manager_environment:
        origins.append("the service manager's environment (systemctl set-environment)")
    return "it came from " + " and ".join(origins) if origins else ""


def _settings(text: str) -> list[str]:
    return [
        line.strip()
        for line in text.splitlines()
        if line.strip() and not line.lstrip().startswith(("#", ";", "["))
    ]


def check_runtime_unit_files(snapshot: Snapshot) -> list[CheckResult]:
    """The unit file and every drop-in must live outside ``/run``."""
    stage, unit = snapshot.label, snapshot.unit
    results: list[CheckResult] = []
    if is_runtime_path(unit.fragment_path):
        results.append(
            failed(
                stage,
                Check.RUNTIME_UNIT_FILE,
                unit.fragment_path,
                Reason.RUNTIME_UNIT_FILE,
                f"{unit.name} is loaded from {unit.fragment_path}, a runtime-only unit file "
                "under /run that vanishes at reboot",
            )
        )
    for path in unit.drop_in_paths:
        keys = [setting_key(line) for line in unit.files.get(path, "").splitlines()]
        unrelated = bool([k for k in keys if k]) and not any(
            is_serving_setting(k) for k in keys if k
        )
        if is_runtime_path(path) and not unrelated:  # unrelated ones: provenance.py informs
            settings = "; ".join(_settings(unit.files.get(path, ""))) or "(unreadable)"
            results.append(
                failed(
                    stage,
                    Check.RUNTIME_DROP_IN,
                    path,
                    Reason.RUNTIME_DROP_IN,
                    f"drop-in {path} of {unit.name} is runtime-only (under /run) and vanishes "
                    f"at reboot; it sets: {settings}",
                )
            )
    if not results:
        files = ", ".join([unit.fragment_path, *unit.drop_in_paths]) or "(none)"
        results.append(
            passed(stage, Check.RUNTIME_UNIT_FILE, unit.name, f"unit files durable: {files}")
        )
    return results


def check_manager_environment(
    snapshot: Snapshot, relevant_names: Iterable[str] = ()
) -> list[CheckResult]:
    """No serving variable may reach the service from ``systemctl set-environment``."""
    stage = snapshot.label
    live = snapshot.environment
    # Unrelated variables are information only (provenance.unrelated_state reports them).
    suspicious = sorted(
        name
        for name in snapshot.manager_environment
        if name not in STANDARD_MANAGER_VARIABLES
        and not name.startswith("LC_")
        and serving_relevant(name, relevant_names)
    )
    if not suspicious:
        return [passed(stage, Check.MANAGER_ENVIRONMENT, "manager", "no serving variable set")]
    return [
        failed(
            stage,
            Check.MANAGER_ENVIRONMENT,
            name,
            Reason.MANAGER_VARIABLE,
            f"{name}={snapshot.manager_environment[name]} is set in the service manager's "
            "environment (systemctl set-environment); it reaches the service only until the "
            f"next reboot{'' if name in live else ' (not in the live process yet)'}",
        )
        for name in suspicious
    ]


def exec_start_argv(unit: UnitState) -> str:
    """The ``argv[]`` of the first ``ExecStart`` as systemd prints it (space-joined)."""
    match = _EXEC_ARGV.search(unit.prop("ExecStart"))
    return match["argv"] if match else ""


def script_command(text: str) -> str:
    """The command a start script ``exec``s (NixOS ``script``: ``exec docker run ...``)."""
    joined = text.replace("\\\n", " ")
    for line in joined.splitlines():
        words = line.strip().split(maxsplit=1)
        if len(words) == 2 and words[0] == "exec":
            try:
                return " ".join(shlex.split(words[1]))
            except ValueError:
                return words[1]
    return ""


def declared_command(snapshot: Snapshot) -> str:
    """What the unit starts now: its start script's ``exec`` line, else ExecStart's argv."""
    for text in snapshot.start_script.values():
        command = script_command(text)
        if command:
            return command
    return exec_start_argv(snapshot.unit)


def check_restarted_after_change(snapshot: Snapshot) -> list[CheckResult]:
    """The running process must be what the unit, as systemd has it now, would start.

    With a container the unit's main process is the attached ``docker run``: its argv must be
    the command the unit's start script runs now; and the container that ``docker inspect``
    shows must run the script's arguments and environment.
    """
    stage, unit = snapshot.label, snapshot.unit
    results: list[CheckResult] = []
    if unit.need_daemon_reload:
        results.append(
            failed(
                stage,
                Check.NOT_RELOADED,
                unit.name,
                Reason.NEED_DAEMON_RELOAD,
                f"{unit.name} changed on disk but systemd has not reloaded it "
                "(NeedDaemonReload=yes): the running service and `systemctl show` describe the "
                "old unit, and the next boot will run the new file",
            )
        )
    if snapshot.main_process is None and snapshot.container is None:
        results.append(
            failed(
                stage,
                Check.NOT_RESTARTED,
                unit.name,
                Reason.NO_LIVE_PROCESS,
                f"no live process of {unit.name} was found (MainPID "
                f"{unit.prop('MainPID') or 'unknown'}): nothing to compare with the unit",
            )
        )
    if snapshot.main_process is not None:
        results += _main_process_not_restarted(snapshot, snapshot.main_process)
    if snapshot.container is not None:
        results += _container_not_restarted(snapshot, snapshot.container.process)
    if not results:
        results.append(
            passed(stage, Check.NOT_RESTARTED, unit.name, "live process matches the unit")
        )
    return results


def _main_process_not_restarted(snapshot: Snapshot, process: ProcessState) -> list[CheckResult]:
    """The unit's main process runs the command and environment the unit declares now."""
    unit = snapshot.unit
    results: list[CheckResult] = []
    declared = declared_command(snapshot)
    live = " ".join(process.argv)
    # A wrapper script (a file the unit reads) execs the server with other words, or with
    # words it fills in when it runs ("$@").
    wrapped = declared.split(" ", 1)[0] in unit.sources or _filled_at_run_time(declared.split())
    if declared and declared != live and REDACTED not in live and not wrapped:
        results.append(
            _stale(
                snapshot,
                unit.name,
                Reason.ARGV_DIFFERS,
                f"the live process (pid {process.pid}) runs `{live}` but the unit's "
                f"ExecStart is now `{declared}`",
            )
        )
    stale = sorted(
        name for name, value in unit.environment.items() if process.environment.get(name) != value
    )
    if stale:
        results.append(
            _stale(
                snapshot,
                ",".join(stale),
                Reason.ENVIRONMENT_DIFFERS,
                f"the unit now sets {', '.join(stale)} but the live process (pid "
                f"{process.pid}) has different values",
            )
        )
    return results


def _stale(snapshot: Snapshot, subject: str, reason: Reason, what: str) -> CheckResult:
    """A ``source.not-restarted`` failure: ``what`` differs because the unit changed."""
    message = f"{what}: the unit changed but the service was not restarted"
    return failed(snapshot.label, Check.NOT_RESTARTED, subject, reason, message)


def _filled_at_run_time(words: list[str]) -> bool:
    """True when a command's words include shell parameters (``"$@"``, ``$1``, ``${FLAGS}``): a
    wrapper fills them in when it runs, so they cannot be compared with the live argv."""
    return any("$" in word for word in words)


def _same(declared: str, live: str | None) -> bool:
    """Equal, or not comparable because the snapshot redacted either side."""
    return live is not None and (declared == live or REDACTED in declared or REDACTED in live)


def _declared_run(snapshot: Snapshot, pid: int) -> tuple[ContainerRun, str] | CheckResult:
    """The ``docker run`` the unit starts now and where it is written (the ExecStart line
    when that is a ``docker run`` itself, else its start script), or the failure that says
    why the running container cannot be compared with it."""
    stage, unit = snapshot.label, snapshot.unit
    declared = exec_start_argv(unit)
    found = _EXEC_PATH.search(unit.prop("ExecStart"))
    path = found["path"] if found else ""
    if declared.split(" ", 1)[0].rsplit("/", 1)[-1] in BACKENDS:
        script, source = declared, "ExecStart"
    elif path in (scripts := {**unit.sources, **snapshot.start_script}):
        script, source = scripts[path], f"start script {path}"
    else:
        missing = f"the ExecStart script {path}" if path else "the ExecStart line"
        return failed(
            stage,
            Check.NOT_RESTARTED,
            path or unit.name,
            Reason.START_SCRIPT_MISSING,
            f"{missing} of {unit.name} is not in the snapshot (the unit's sources hold "
            f"{', '.join(sorted(unit.sources)) or 'no file'}): the running container "
            f"(pid {pid}) cannot be compared with what the unit would start",
        )
    try:
        run = parse_container_run(script)
    except ValueError as error:
        run, why = None, f"cannot be split into shell words ({error})"
    else:
        why = "runs no `docker run` or `podman run`"
    if run is None:
        return failed(
            stage,
            Check.NOT_RESTARTED,
            path or unit.name,
            Reason.START_SCRIPT_UNREADABLE,
            f"the {source} of {unit.name} {why}: the running container (pid {pid}) "
            "cannot be compared with what the unit would start",
        )
    return run, source


def _container_not_restarted(snapshot: Snapshot, process: ProcessState) -> list[CheckResult]:
    """The running container must be what the unit's start script (or its ExecStart, when
    that is a ``docker run`` itself) runs now: its args end the container's argv, its ``-e``
    assignments are in the container's environment."""
    stage, unit = snapshot.label, snapshot.unit
    declared = _declared_run(snapshot, process.pid)
    if isinstance(declared, CheckResult):
        return [declared]
    run, source = declared
    results: list[CheckResult] = []
    live = process.argv[len(process.argv) - len(run.args) :] if run.args else []
    comparable = not _filled_at_run_time(run.args)
    if comparable and (len(live) != len(run.args) or not all(map(_same, run.args, live))):
        results.append(
            _stale(
                snapshot,
                unit.name,
                Reason.ARGV_DIFFERS,
                f"the running container (pid {process.pid}) runs `{' '.join(process.argv)}` "
                f"but the unit's {source} now passes `{' '.join(run.args)}` to {run.image}",
            )
        )
    stale = {
        name: value
        for name, value in run.environment.items()
        if not _same(value, process.environment.get(name))
    }
    if stale:
        described = ", ".join(
            f"{name}={value} (running: {process.environment.get(name, 'unset')})"
            for name, value in sorted(stale.items())
        )
        results.append(
            _stale(
                snapshot,
                ",".join(sorted(stale)),
                Reason.ENVIRONMENT_DIFFERS,
                f"the unit's {source} now sets {described} for the container but the running "
                f"container (pid {process.pid}) has different values",
            )
        )
    if not results:
        results.append(
            passed(
                stage,
                Check.NOT_RESTARTED,
                unit.name,
                f"the running container matches the unit's {source}",
            )
        )
    return results


def check_inside_unit(snapshot: Snapshot) -> list[CheckResult]:
    """The server answering on the serving port must be the unit's own process."""
    stage, unit, listener = snapshot.label, snapshot.unit, snapshot.listener
    check = Check.OUTSIDE_UNIT
    if listener is None:
        if snapshot.health.status is None:
            return [passed(stage, check, f"port {snapshot.port}", "nothing listens on the port")]
        # Something answered /health, so a listener exists: not finding it is missing evidence
        # (the snapshot's `ss -ltnp`, from iproute2, is absent or failed), never a pass.
        return [
            failed(
                stage,
                check,
                f"port {snapshot.port}",
                Reason.LISTENER_UNKNOWN,
                f"{snapshot.health.url} answered {snapshot.health.status} but no listening "
                f"process on port {snapshot.port} could be found with `ss -ltnp` (iproute2): is "
                "`ss` in the guest's PATH? Without it the server's origin cannot be checked",
            )
        ]
    group = unit.prop("ControlGroup")
    paths = [line.rpartition(":")[2] for line in listener.cgroup.splitlines()]
    in_unit = listener.pid == unit.main_pid or (
        bool(group) and any(path == group or path.startswith(group + "/") for path in paths)
    )
    if snapshot.container is not None:  # docker-proxy / the container scope answer for it
        in_unit = in_unit or snapshot.container.process.pid == listener.pid
        in_unit = in_unit or any("docker-proxy" in arg for arg in listener.argv[:1])
    if in_unit:
        return [passed(stage, check, f"port {snapshot.port}", f"pid {listener.pid} is the unit's")]
    cgroup = listener.cgroup.splitlines()[-1] if listener.cgroup else "?"
    return [
        failed(
            stage,
            check,
            f"port {snapshot.port}",
            Reason.OUTSIDE_UNIT,
            f"the server answering on port {snapshot.port} is pid {listener.pid} "
            f"(`{' '.join(listener.argv)}`, cgroup {cgroup}), started outside {unit.name} "
            f"(ActiveState={unit.active_state}, MainPID={unit.main_pid}, cgroup "
            f"{group or 'none'}): nothing starts it at boot",
        )
    ]


def check_enabled(snapshot: Snapshot) -> list[CheckResult]:
    """The serving unit must be enabled durably, so that it starts at the next boot."""
    stage, unit = snapshot.label, snapshot.unit
    state = unit.unit_file_state
    if state in DURABLE_UNIT_FILE_STATES:
        return [passed(stage, Check.NOT_ENABLED, unit.name, f"UnitFileState={state}")]
    return [
        failed(
            stage,
            Check.NOT_ENABLED,
            unit.name,
            Reason.NOT_ENABLED,
            f"{unit.name} is {unit.active_state or 'not active'} now but its UnitFileState is "
            f"{state or 'unknown'}: it will not start at the next boot",
        )
    ]


def check_hugepage_source(snapshot: Snapshot, size_kib: int | None) -> list[CheckResult]:
    """Reserved hugepages must come from a boot-time source, not a runtime write."""
    stage, pages = snapshot.label, snapshot.hugepages
    check = Check.HUGEPAGE_SOURCE
    sizes = [size_kib] if size_kib else [kib for kib, count in pages.pools.items() if count]
    reserved = {kib: pages.count(kib) for kib in sizes if pages.count(kib) > 0}
    unit = pages.unit
    if unit.load_state == "masked" or unit.unit_file_state.startswith("masked"):
        return [
            failed(
                stage,
                check,
                unit.name,
                Reason.HUGEPAGE_UNIT_MASKED,
                f"the hugepage unit {unit.name} is masked ({unit.unit_file_state}): hugepages "
                f"({_describe(reserved)} now) will not be reserved at the next boot",
            )
        ]
    if not reserved:
        return [passed(stage, check, "hugepages", "no hugepages reserved, none to source")]
    durable: list[str] = []
    if re.search(r"(^|\s)hugepages=\d+", snapshot.kernel_cmdline):
        durable.append("kernel command line")
    durable += [
        line.split(":", 1)[0]
        for line in pages.sysctl_lines
        if not is_runtime_path(line) and "nr_hugepages" in line
    ]
    unit_ok = (
        unit.load_state == "loaded"
        and unit.unit_file_state in DURABLE_UNIT_FILE_STATES
        and not is_runtime_path(unit.fragment_path)
    )
    if unit_ok:
        durable.append(f"{unit.name} (UnitFileState={unit.unit_file_state})")
    if durable:
        return [passed(stage, check, "hugepages", f"reserved at boot by {', '.join(durable)}")]
    why = (
        f"{unit.name} is not installed"
        if unit.load_state in {"", "not-found"}
        else f"{unit.name} is {unit.load_state}/{unit.unit_file_state or 'unknown'} "
        f"from {unit.fragment_path or '?'}"
    )
    return [
        failed(
            stage,
            check,
            "hugepages",
            Reason.HUGEPAGES_RUNTIME_ONLY,
            f"{_describe(reserved)} hugepages are reserved now but nothing reserves them at "
            f"boot ({why}; no nr_hugepages in sysctl.d; no hugepages= on the kernel command "
            "line): they were written at runtime and will be gone after a reboot",
        )
    ]


def _describe(reserved: dict[int, int]) -> str:
    return ", ".join(f"{count} x {kib} KiB" for kib, count in sorted(reserved.items())) or "none"


def check_generation(snapshot: Snapshot) -> list[CheckResult]:
    """On NixOS the system profile (what boots next) must be the running generation."""
    current = snapshot.generations.get("/run/current-system")
    default = snapshot.generations.get("/nix/var/nix/profiles/system")
    if current is None or default is None:
        return []
    if current == default:
        return [passed(snapshot.label, Check.GENERATION, "system", f"boots {current}")]
    why = (
        f"the running generation is {current} but the system profile (what the next boot "
        f"starts) is {default}: the switch did not set the boot default"
    )
    profile = "/nix/var/nix/profiles/system"
    return [failed(snapshot.label, Check.GENERATION, profile, Reason.BOOT_DEFAULT_DIFFERS, why)]


def check_sources(
    snapshot: Snapshot, size_kib: int | None, relevant_names: Iterable[str] = ()
) -> list[CheckResult]:
    """Every runtime-only-source check on one snapshot."""
    return [
        *check_runtime_unit_files(snapshot),
        *check_manager_environment(snapshot, relevant_names),
        *check_restarted_after_change(snapshot),
        *check_inside_unit(snapshot),
        *check_enabled(snapshot),
        *check_hugepage_source(snapshot, size_kib),
        *check_generation(snapshot),
    ]
