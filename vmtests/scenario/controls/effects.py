"""What each negative control's mechanism does to the evidence, applied to a recorded snapshot.

A control's mechanism (``vmtests.scenario.controls.catalogue``) changes a guest; its effect here
changes a snapshot of the correct target the same way, as the snapshot script would record it
(unit properties, unit files and drop-ins, the files the unit reads, the manager environment,
the journal, the processes). ``tests/scenario/test_control_effects.py`` applies every effect to a
snapshot recorded on the reference guest and proves that the checks raise exactly the control's
declared findings and nothing else, without a VM; the VM tests prove the mechanisms on a guest.

Each effect models the essence of its mechanism, nothing more: the guest's mechanism may break
more at once (a unit without the features also misses their flags), which the guest's run shows.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace

from vmtests.contracts.features import banner_text
from vmtests.contracts.serving import SERVING_UNIT
from vmtests.scenario.collection.snapshot import CONTAINER_LOG, JournalLine, ProcessState, Snapshot
from vmtests.scenario.controls import places
from vmtests.scenario.judgement.sources import script_command
from vmtests.stub import release

Effect = Callable[[Snapshot], None]
"""Changes a snapshot (a copy of the recorded one) as the control's mechanism would."""

TRANSIENT_UNIT_FILE = f"{places.TRANSIENT_DIR}/{SERVING_UNIT}"
HAND_STARTED_PID = 4242
SESSION_SCOPE = "0::/user.slice/user-0.slice/session-1.scope"
ASYNC_DISABLED = "Asynchronous scheduling is disabled."
FLOOD_LINE = "vmtests stub log flood"
"""How the stub's startup flood begins (``vmtests/stub/server.py``)."""


def start_script(snapshot: Snapshot) -> tuple[str, str]:
    """The unit's start script (NixOS ``script``): its path and text."""
    ((path, text),) = snapshot.start_script.items()
    return path, text


def _started_with(snapshot: Snapshot, text: str) -> None:
    """The unit's start script is now ``text``, and the unit was started with it: its main
    process (the attached ``docker run``) runs the command the script execs."""
    path, _ = start_script(snapshot)
    snapshot.start_script[path] = snapshot.unit.sources[path] = text
    if snapshot.main_process is not None:
        snapshot.main_process.argv = script_command(text).split(" ")


def _without_variable(snapshot: Snapshot, name: str) -> str:
    """Take the container variable ``name`` out of the start script (started with it) and of
    the container; its value."""
    _, text = start_script(snapshot)
    assignment = re.search(rf"  -e {name}=(\S+) \\\n", text)
    assert assignment, f"the recorded start script sets no {name}"
    _started_with(snapshot, text.replace(assignment[0], ""))
    assert snapshot.container is not None
    del snapshot.container.process.environment[name]
    return assignment[1]


def _exec_lines(snapshot: Snapshot) -> list[str]:
    text = snapshot.unit.files[snapshot.unit.fragment_path]
    return [line for line in text.splitlines() if line.startswith(("ExecStart", "Environment="))]


def _add_drop_in(snapshot: Snapshot, path: str, text: str) -> None:
    unit = snapshot.unit
    unit.properties["DropInPaths"] = " ".join([*unit.drop_in_paths, path])
    unit.files[path] = text


def no_change(snapshot: Snapshot) -> None:
    """The correct configuration: nothing changes."""


def runtime_drop_in(snapshot: Snapshot) -> None:
    """The unit's ExecStart, ExecStartPre and Environment come from a drop-in under /run."""
    lines = ["[Service]", "ExecStartPre=", "ExecStart=", *_exec_lines(snapshot), ""]
    _add_drop_in(snapshot, places.RUNTIME_DROP_IN, "\n".join(lines))


def stale_banner(snapshot: Snapshot) -> None:
    """After the reboot a banner of the configuration is only in the previous boot's journal."""
    current = snapshot.current_lines()
    (line,) = [line for line in current if ASYNC_DISABLED in line.message]
    snapshot.journal.remove(line)
    previous = snapshot.earlier_journal[-1]
    snapshot.earlier_journal.append(
        JournalLine(line.message, previous.boot_id, previous.invocation_id, line.timestamp_us)
    )


def manager_environment(snapshot: Snapshot) -> None:
    """The feature variables are set in the service manager's environment."""
    for name in places.FEATURE_VARIABLES:
        if name in snapshot.environment:
            snapshot.manager_environment[name] = snapshot.environment[name]


def not_restarted(snapshot: Snapshot) -> None:
    """The start script changed on disk (and was reloaded) after the container started."""
    path, text = start_script(snapshot)
    changed = re.sub(r"(--block-size \\\n\s*)64\b", r"\g<1>128", text)
    assert changed != text, "the recorded start script passes no --block-size 64"
    snapshot.start_script[path] = snapshot.unit.sources[path] = changed


def not_reloaded(snapshot: Snapshot) -> None:
    """The unit file changed on disk and systemd was not told (``NeedDaemonReload=yes``)."""
    snapshot.unit.properties["NeedDaemonReload"] = "yes"


def lying_banner(snapshot: Snapshot) -> None:
    """The unit runs without SDPA streaming's switch; a durable drop-in echoes its banner."""
    _without_variable(snapshot, "QWEN36_SDPA_STREAMING")
    echo = f"[Service]\nExecStartPre=/bin/echo {banner_text('sdpaStreaming')!r}\n"
    _add_drop_in(snapshot, places.BANNER_DROP_IN, echo)


def journal_flooded(snapshot: Snapshot) -> None:
    """The server logged a flood of lines at startup, right after its argument dump, past the
    unit's journald rate limit: the journal kept the first of them and dropped the rest (the
    banners among them), then said so (``Suppressed N messages``); the snapshot read the
    container's own log, which has every line the server printed."""
    unit, current = snapshot.unit, snapshot.current_lines()
    started = next(i for i, line in enumerate(current) if line.message.startswith("Started "))
    dump = next(i for i, line in enumerate(current) if "non-default args" in line.message)
    first = current[dump + 1]
    flood = [
        JournalLine(f"{FLOOD_LINE} {n}/{places.LOG_FLOOD_LINES}", first.boot_id,
                    first.invocation_id, first.timestamp_us)
        for n in range(1, places.LOG_FLOOD_LINES + 1)
    ]  # fmt: skip
    printed = [*current[started + 1 : dump + 1], *flood, *current[dump + 1 :]]
    for line in current[dump + 1 :]:
        snapshot.journal.remove(line)
    kept = places.LOG_RATE_LIMIT_BURST - (dump - started)
    suppressed = JournalLine(
        f"Suppressed {len(printed) - kept} messages from {SERVING_UNIT}",
        first.boot_id,
        invocation_id="journald",
        timestamp_us=first.timestamp_us,
        dropped=len(printed) - kept,
        object_invocation_id=unit.invocation_id,
    )
    snapshot.journal += [*flood[:kept], suppressed]
    snapshot.container_log = [replace(line, source=CONTAINER_LOG) for line in printed]


CRASHED_INVOCATION = "c7a5bed0c7a5bed0c7a5bed0c7a5bed0"
"""The invocation of the unit's start whose engine died (its lines stay in this boot)."""


def restarted_on_its_own(snapshot: Snapshot) -> None:
    """The unit's first start served, then its engine died (exit 1); systemd restarted it
    (``Restart=on-failure``), and the current start serves: the same lines, one start earlier,
    then the engine's fatal error and systemd's lines about the ended run; ``NRestarts=1``."""
    current = snapshot.current_lines()
    last = current[-1]
    earlier = [replace(line, invocation_id=CRASHED_INVOCATION) for line in current]
    ended = [
        f"(EngineCore_DP0 pid=1) ERROR {release.ENGINE_FATAL}",
        f"(APIServer pid=1) ERROR {release.SERVER_TERMINATING}",
        f"{SERVING_UNIT}: Main process exited, code=exited, status=1/FAILURE",
        f"{SERVING_UNIT}: Failed with result 'exit-code'.",
        f"{SERVING_UNIT}: Scheduled restart job, restart counter is at 1.",
    ]
    earlier += [
        JournalLine(text, last.boot_id, CRASHED_INVOCATION, last.timestamp_us) for text in ended
    ]
    first = snapshot.journal.index(current[0])
    snapshot.journal[first:first] = earlier
    snapshot.unit.properties["NRestarts"] = "1"


def engine_without_prefix_caching(snapshot: Snapshot) -> None:
    """The engine runs without prefix caching: its own cache config says so."""
    metrics = snapshot.metrics
    metrics.body = metrics.body.replace(
        'enable_prefix_caching="True"', 'enable_prefix_caching="False"'
    )
    for line in snapshot.current_lines():
        line.message = line.message.replace(
            "enable_prefix_caching=True", "enable_prefix_caching=False"
        )


def env_file_under_run(snapshot: Snapshot) -> None:
    """The feature variables reach the container from ``docker run --env-file`` under /run."""
    assert snapshot.container is not None
    live = snapshot.container.process.environment
    values = [
        f"{name}={_without_variable(snapshot, name)}"
        for name in places.FEATURE_VARIABLES
        if name in live
    ]
    for value in values:  # the container still gets them, from the file
        name, _, text = value.partition("=")
        live[name] = text
    _, script = start_script(snapshot)
    env_file = f"  --env-file {places.RUN_ENV_FILE} \\\n"
    _started_with(snapshot, script.replace("  --rm \\\n", f"{env_file}  --rm \\\n"))
    snapshot.unit.sources[places.RUN_ENV_FILE] = "\n".join([*values, ""])


def wrapper_sources_run(snapshot: Snapshot) -> None:
    """A durable drop-in makes a wrapper the ExecStart: the start script's ``docker run`` up to
    the image, then ``"$@"``, the arguments it sources from a file under /run."""
    path, text = start_script(snapshot)
    assert snapshot.container is not None
    image = f"  {snapshot.container.image} \\\n"
    command, arguments = text.split("exec ", 1)[1].split(image, 1)
    wrapper = f'#!/bin/sh\n. {places.RUN_FLAGS_FILE}\nexec {command}{image}  "$@"\n'
    del snapshot.start_script[path], snapshot.unit.sources[path]
    snapshot.start_script[places.WRAPPER] = snapshot.unit.sources[places.WRAPPER] = wrapper
    flags = " ".join(arguments.replace("\\\n", " ").split())
    snapshot.unit.sources[places.RUN_FLAGS_FILE] = f"set -- {flags}\n"
    _add_drop_in(
        snapshot, places.WRAPPER_DROP_IN, f"[Service]\nExecStart=\nExecStart={places.WRAPPER}\n"
    )
    unit = snapshot.unit
    unit.properties["ExecStart"] = unit.properties["ExecStart"].replace(path, places.WRAPPER)


def unrelated_manager_variable(snapshot: Snapshot) -> None:
    """``EDITOR=vi`` in the manager environment, so in the unit's processes too."""
    snapshot.manager_environment[places.UNRELATED_VARIABLE] = "vi"
    if snapshot.main_process is not None:
        snapshot.main_process.environment[places.UNRELATED_VARIABLE] = "vi"


def unrelated_runtime_drop_in(snapshot: Snapshot) -> None:
    """A drop-in under /run that only sets ``CPUWeight=50``."""
    _add_drop_in(snapshot, places.UNRELATED_DROP_IN, "[Service]\nCPUWeight=50\n")


def runtime_hugepages(snapshot: Snapshot) -> None:
    """The pages are reserved, but no boot-time unit, sysctl or kernel parameter does it."""
    snapshot.hugepages.unit.properties = {"LoadState": "not-found", "ActiveState": "inactive"}
    snapshot.hugepages.unit.files = {}


def masked_hugepage_unit(snapshot: Snapshot) -> None:
    """The hugepage unit is masked (the pages stay reserved for now)."""
    snapshot.hugepages.unit.properties.update(LoadState="masked", UnitFileState="masked")


def not_enabled(snapshot: Snapshot) -> None:
    """The serving unit runs but is disabled."""
    snapshot.unit.properties["UnitFileState"] = "disabled"


def hand_started(snapshot: Snapshot) -> None:
    """The server answering on the port was started by hand, in a login session."""
    listener = snapshot.listener
    assert listener is not None
    snapshot.listener = ProcessState(
        "listener", HAND_STARTED_PID, list(listener.argv), dict(listener.environment), SESSION_SCOPE
    )


def transient_unit(snapshot: Snapshot) -> None:
    """The unit is a transient ``systemd-run`` unit: its file is under /run, nothing enables
    it (``UnitFileState=transient``)."""
    unit = snapshot.unit
    unit.files = {TRANSIENT_UNIT_FILE: unit.files[unit.fragment_path]}
    unit.properties.update(FragmentPath=TRANSIENT_UNIT_FILE, UnitFileState="transient")
