"""Take a ``Snapshot`` over any ``Machine`` with one shell script and one round trip.

The script only needs POSIX sh, coreutils, systemd, curl and (optionally) iproute2's ``ss``,
all present on the reference guest, NixOS and the P150 hosts. Each part of the output starts
with a section marker; binary or multi-line data (``/proc/<pid>/cmdline``, unit files) travels
base64-encoded so that nothing in it can be mistaken for a marker.
"""

from __future__ import annotations

import base64
import json
import shlex
import time
from collections.abc import Iterator
from typing import Any

from vmtests.contracts.serving import (
    API_KEY_VARIABLE,
    HUGEPAGES_UNIT,
    POOL_SIZES,
    SERVING_PORT,
    SERVING_UNIT,
    parse_pools,
)
from vmtests.driver.errors import DriverError
from vmtests.driver.machine import Machine
from vmtests.scenario.collection.redact import redact_argv, redact_environment, redact_text
from vmtests.scenario.collection.snapshot import (
    CONTAINER_LOG,
    ContainerState,
    Endpoint,
    HugepageState,
    JournalLine,
    ProcessState,
    Snapshot,
    UnitState,
)
from vmtests.tt_smi_parse import SNAPSHOT_COMMAND

MARK = "@@vmtests-section "
FILE_MARK = "@@vmtests-file "
SNAPSHOT_TIMEOUT = 120.0
JOURNAL_MAX_LINES = 20000
UNIT_PROPERTIES = (
    "ActiveState,SubState,Result,MainPID,InvocationID,FragmentPath,DropInPaths,ExecStart,"
    "ExecStartPre,EnvironmentFiles,"
    "NeedDaemonReload,UnitFileState,LoadState,ControlGroup,TimeoutStopUSec,KillSignal,WantedBy,"
    "NRestarts,ExecMainCode,ExecMainStatus"
)
"""``NRestarts`` counts the unit's automatic (``Restart=``) restarts since it was last started
explicitly: systemd flushes it at the first start after the unit ended without an automatic
restart to follow (a stop, a ``systemctl restart``, a switch's restart; systemd
``src/core/service.c``, ``flush_n_restarts``), and a boot starts at 0."""
HUGEPAGE_UNIT_PROPERTIES = (
    "LoadState,UnitFileState,ActiveState,Result,FragmentPath,DropInPaths,WantedBy,NeedDaemonReload"
)
JOURNAL_FIELDS = (
    "MESSAGE,_BOOT_ID,_SYSTEMD_INVOCATION_ID,INVOCATION_ID,N_DROPPED,OBJECT_SYSTEMD_INVOCATION_ID"
)
CONTAINER_LOG_LINES = 20000
CONTAINER_LOG_COMMAND = (
    "if command -v docker >/dev/null; then docker logs --tail %s %s 2>&1; "
    "else podman logs --tail %s %s 2>&1; fi"
)
"""The container's own log: with Docker's journald log driver (NixOS's default,
``virtualisation.docker.logDriver``) it is read back from the journal, where dockerd's lines
count against ``docker.service``'s rate limit, not the serving unit's."""
CARD_NOT_ASKED = "tt-smi: not run (this snapshot was taken without the card)"
API_KEY_READ = (
    f'key=$(sed -n "s/^{API_KEY_VARIABLE}=//p" "$keyfile" | head -n1); '
    '[ -n "$key" ] || key=$(head -n1 "$keyfile")'
)
"""Shell that sets ``$key`` from the file ``$keyfile``: the value of its ``VLLM_API_KEY=`` line
(an environment file, as the container gets the key), else its first line (the key alone)."""

_SCRIPT = r"""
unit=$1; port=$2; hpunit=$3; container=$4; nlines=$5; card=$6; keyfile=$7
sec() { printf '\n%s%s\n' "$MARK" "$1"; }
v1() {  # GET a /v1 path; with $keyfile, its API key as a bearer header, never on a command line
  if [ -z "$keyfile" ]; then curl -sS -m 10 -w '\n%{http_code}' "http://127.0.0.1:$port$1" 2>&1
  else
    @API_KEY_READ@
    printf 'header = "Authorization: Bearer %s"\n' "$key" \
      | curl -sS -m 10 -K - -w '\n%{http_code}' "http://127.0.0.1:$port$1" 2>&1
  fi
}
proc() {  # pid: argv, environment and cgroup of one process, base64
  [ -r "/proc/$1/cmdline" ] || return 0
  echo "pid $1"
  echo "cmdline $(base64 -w0 < /proc/$1/cmdline)"
  echo "environ $(base64 -w0 < /proc/$1/environ 2>/dev/null)"
  echo "cgroup $(base64 -w0 < /proc/$1/cgroup)"
}
prop() {  # prop NAME PROPS: each value of NAME in saved `systemctl show` output PROPS
  printf '%s\n' "$2" | while IFS= read -r line; do
    case $line in "$1="*) printf '%s\n' "${line#"$1="}" ;; esac
  done
}
files() {  # files PROPS: FragmentPath and DropInPaths of saved properties, contents base64
  for f in $(prop FragmentPath "$1") $(prop DropInPaths "$1"); do
    [ -f "$f" ] && printf '%s%s %s\n' "$FMARK" "$f" "$(base64 -w0 < "$f")"
  done
}
# One `systemctl show` per unit: each costs guest CPU under TCG (docs/ci-time.md).
uprops=$(systemctl show -p "$UNITPROPS,Environment" "$unit")
hprops=$(systemctl show -p "$HPPROPS" "$hpunit")
sec boot_id; cat /proc/sys/kernel/random/boot_id
sec cmdline; cat /proc/cmdline
sec unit  # without Environment=, which may hold secrets: it travels base64 to be redacted
printf '%s\n' "$uprops" | grep -v '^Environment='
sec unit_env; prop Environment "$uprops" | base64 -w0
sec unit_files; files "$uprops"
sec start_script  # a NixOS `script` unit: ExecStart runs a shell script; show it
sp=$(prop ExecStart "$uprops" | sed -n 's/^{ path=\([^ ;]*\) .*/\1/p' | head -n1)
if [ -f "$sp" ] && [ "$(head -c 2 "$sp")" = '#!' ]; then
  printf '%s%s %s\n' "$FMARK" "$sp" "$(base64 -w0 < "$sp")"
fi
sec manager_env; systemctl show-environment
sec unit_sources  # files the unit reads: EnvironmentFile=, Exec* scripts, what they source
srcfile() {
  [ -f "$1" ] && printf '%s%s %s\n' "$FMARK" "$1" "$(head -c 65536 "$1" | base64 -w0)"
}
for f in $(prop EnvironmentFiles "$uprops" | sed 's/ ([a-z_]*=[a-z]*)//g'); do
  srcfile "$f"
done
for p in $( { prop ExecStartPre "$uprops"; prop ExecStart "$uprops"; } \
    | grep -o 'path=[^ ;]*' | cut -d= -f2 | sort -u); do
  if [ -f "$p" ] && [ "$(head -c 2 "$p")" = '#!' ]; then
    srcfile "$p"
    for r in $(grep -oE '(^|[ ;])(\.|source) +/[^ ;"]+|--env-file[= ]/[^ ;"]+' "$p" \
        | grep -oE '/[^ ;"]+'); do srcfile "$r"; done
  fi
done
for r in $(prop ExecStart "$uprops" | grep -oE -- '--env-file[= ]/[^ ;]+' \
    | grep -oE '/[^ ;]+'); do srcfile "$r"; done
sec env_generators
for d in /run/systemd/system-environment-generators /etc/systemd/system-environment-generators \
    /usr/local/lib/systemd/system-environment-generators \
    /usr/lib/systemd/system-environment-generators /lib/systemd/system-environment-generators; do
  [ -d "$d" ] && for g in "$d"/*; do [ -e "$g" ] && echo "$g"; done
done
pid=$(prop MainPID "$uprops")
sec main_process; [ "${pid:-0}" != 0 ] && proc "$pid"
sec listener
lpid=$(ss -ltnpH "sport = :$port" 2>/dev/null | sed -n 's/.*pid=\([0-9]*\).*/\1/p' | head -n1)
[ -n "$lpid" ] && proc "$lpid"
sec journal
journalctl --no-pager -b 0 -u "$unit" -o json --output-fields="$JFIELDS" 2>/dev/null \
  | tail -n "$nlines"
sec earlier_journal
journalctl --no-pager -b -1 -u "$unit" -o json --output-fields="$JFIELDS" 2>/dev/null \
  | tail -n "$nlines"
sec health
curl -sS -m 10 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health" 2>&1
sec api_key  # whether the API key file could be read (its content never leaves the machine)
if [ -n "$keyfile" ]; then
  if [ -r "$keyfile" ] && [ -s "$keyfile" ]; then echo read; else echo "$keyfile"; fi
fi
sec models
v1 /v1/models
sec metrics  # only the server's own cache config (vLLM v1/metrics/loggers.py), and the status
curl -sS -m 10 -w '\n%{http_code}' "http://127.0.0.1:$port/metrics" 2>&1 \
  | grep -E '^vllm:cache_config_info[{ ]|^[0-9]{3}$|^curl:'
sec tt_smi  # the card as tt-smi sees it (parsed by vmtests.tt_smi_parse)
if [ "$card" != 1 ]; then
  echo "$NOCARD"
elif command -v tt-smi >/dev/null 2>&1; then
  out=$(timeout 60 sh -c "$SMI" 2>&1); rc=$?
  printf '%s\n' "$out" | head -c 262144; printf '\n%s\n' "$rc"
else
  echo "tt-smi: not installed"
fi
sec meminfo; grep -i huge /proc/meminfo
sec hugepage_pools
@POOL_SIZES@
sec hugepage_unit; printf '%s\n' "$hprops"
sec hugepage_unit_files; files "$hprops"
sec sysctl
# -R, not -r: grep -r skips the symlinks it meets in a directory, and NixOS makes every /etc file
# one, into /etc/static (nixpkgs nixos/modules/system/etc/setup-etc.pl), sysctl.d/60-nixos.conf
# (nixos/modules/config/sysctl.nix) among them.
grep -RsH nr_hugepages /etc/sysctl.conf /etc/sysctl.d /run/sysctl.d /usr/lib/sysctl.d \
  /lib/sysctl.d 2>/dev/null
sec generations
for p in /run/current-system /run/booted-system /nix/var/nix/profiles/system; do
  [ -e "$p" ] && echo "$p $(readlink -f "$p")"
done
sec container
if [ -n "$container" ]; then
  if command -v docker >/dev/null; then docker inspect "$container" 2>&1
  elif command -v podman >/dev/null; then podman inspect "$container" 2>&1
  else echo "neither docker nor podman is on the PATH: cannot inspect container $container"
  fi
fi
sec end
"""


def snapshot_command(
    unit: str,
    port: int,
    hugepages_unit: str,
    container: str | None,
    *,
    card: bool = True,
    api_key_file: str | None = None,
) -> str:
    """The shell command that prints every section of a snapshot (``tt-smi`` only with
    ``card``; ``/v1`` requests with the API key in ``api_key_file`` on the machine)."""
    variables = (
        f"MARK={shlex.quote(MARK)} FMARK={shlex.quote(FILE_MARK)} "
        f"UNITPROPS={shlex.quote(UNIT_PROPERTIES)} "
        f"HPPROPS={shlex.quote(HUGEPAGE_UNIT_PROPERTIES)} "
        f"JFIELDS={shlex.quote(JOURNAL_FIELDS)} "
        f"NOCARD={shlex.quote(CARD_NOT_ASKED)} SMI={shlex.quote(SNAPSHOT_COMMAND)}"
    )
    values = (
        unit, port, hugepages_unit, container or "", JOURNAL_MAX_LINES, int(card),
        api_key_file or "",
    )  # fmt: skip
    arguments = " ".join(shlex.quote(str(value)) for value in values)
    script = _SCRIPT.replace("@API_KEY_READ@", API_KEY_READ).replace("@POOL_SIZES@", POOL_SIZES)
    return f"{variables} sh -c {shlex.quote(script)} vmtests-snapshot {arguments}"


def read_api_key(machine: Machine, api_key_file: str) -> str:
    """The API key held in ``api_key_file`` on ``machine`` (see ``API_KEY_READ``), for a client
    on this side; ``DriverError`` when the file cannot be read or holds none."""
    result = machine.execute(
        f'keyfile=%s; [ -r "$keyfile" ] || exit 3; {API_KEY_READ}; printf %%s "$key"',
        api_key_file,
        timeout=30,
    )
    if result.rc != 0 or not result.stdout_text.strip():
        raise DriverError(
            f"the API key file {api_key_file} on {machine.name} is unreadable or empty"
        )
    return result.stdout_text.strip()


def take_snapshot(
    machine: Machine,
    label: str,
    *,
    unit: str = SERVING_UNIT,
    port: int = SERVING_PORT,
    hugepages_unit: str = HUGEPAGES_UNIT,
    container: str | None = None,
    card: bool = True,
    api_key_file: str | None = None,
    container_log: bool = False,
    timeout: float = SNAPSHOT_TIMEOUT,
) -> Snapshot:
    """Record the live state of ``unit`` on ``machine`` as snapshot ``label`` (S0, S1, S2...).

    ``container`` names a docker/podman container whose ``inspect`` gives the serving
    process's argv and environment; without it the unit's MainPID is the serving process.
    ``card=False`` leaves out ``tt-smi`` (the card check then reports the card as not
    inspected): callers that never read the card save the longest part of the script
    (docs/ci-time.md). ``api_key_file`` names the file on the machine holding the server's API
    key (the key alone, or an environment file with ``VLLM_API_KEY=``): ``/v1`` requests send
    it as a bearer token. The container's own log is read (one more command) when journald
    dropped lines of the unit's current start, or with ``container_log``: the banners are then
    looked for there too.
    """
    start = time.monotonic()
    command = snapshot_command(
        unit, port, hugepages_unit, container, card=card, api_key_file=api_key_file
    )
    result = machine.execute(command, timeout=timeout)
    snapshot = parse_snapshot(result.stdout_text, label, port)
    snapshot.unit.name, snapshot.hugepages.unit.name = unit, hugepages_unit
    snapshot.api_key_file = api_key_file or ""
    if container and (container_log or snapshot.suppressed()):
        _read_container_log(machine, snapshot, container)
    if result.rc != 0:
        snapshot.errors.append(f"snapshot script exited {result.rc}: {result.stderr_text[-500:]}")
    if container is not None and snapshot.container is None:
        snapshot.errors.append(
            f"container {container} was not inspected (no usable inspect output): the serving "
            "process seen is its launcher, not the container"
        )
    snapshot.seconds = time.monotonic() - start
    return snapshot


def _read_container_log(machine: Machine, snapshot: Snapshot, container: str) -> None:
    """Add the container's own log to ``snapshot`` (a failure becomes a snapshot error)."""
    lines = CONTAINER_LOG_LINES
    result = machine.execute(CONTAINER_LOG_COMMAND, lines, container, lines, container, timeout=60)
    if result.rc != 0:
        snapshot.errors.append(
            f"the log of container {container} could not be read (rc={result.rc}): "
            + redact_text(result.stdout_text[-300:])
        )
        return
    snapshot.container_log = [
        JournalLine(
            redact_text(text),
            boot_id=snapshot.boot_id,
            invocation_id=snapshot.unit.invocation_id,
            source=CONTAINER_LOG,
        )
        for text in result.stdout_text.splitlines()
    ]


def split_sections(output: str) -> dict[str, str]:
    """Split the script's output into ``{section: text}``."""
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in output.splitlines():
        if line.startswith(MARK):
            current = sections.setdefault(line[len(MARK) :].strip(), [])
        elif current is not None:
            current.append(line)
    return {name: "\n".join(lines).strip("\n") for name, lines in sections.items()}


def parse_snapshot(output: str, label: str, port: int = SERVING_PORT) -> Snapshot:
    """Build a (redacted) ``Snapshot`` from the snapshot script's output (the units named as
    the serving unit and the hugepage unit; ``take_snapshot`` names the ones it asked for)."""
    sections = split_sections(output)
    snapshot = Snapshot(label=label, port=port)
    if "end" not in sections:
        snapshot.errors.append("snapshot output is truncated (no end marker)")
    snapshot.boot_id = sections.get("boot_id", "").strip()
    snapshot.kernel_cmdline = redact_text(sections.get("cmdline", "").strip())
    snapshot.unit = UnitState(
        name=SERVING_UNIT,
        properties=_properties(sections.get("unit", "")),
        files=_files(sections.get("unit_files", "")),
        environment=redact_environment(
            _environment_words(_b64(sections.get("unit_env", "")).strip())
        ),
    )
    snapshot.unit.sources = _files(sections.get("unit_sources", ""))
    snapshot.env_generators = sections.get("env_generators", "").split()
    snapshot.unit.properties["ExecStart"] = redact_text(snapshot.unit.prop("ExecStart"))
    snapshot.manager_environment = redact_environment(
        _assignments(sections.get("manager_env", "").splitlines())
    )
    snapshot.main_process = _process(sections.get("main_process", ""), "main-pid")
    snapshot.listener = _process(sections.get("listener", ""), "listener")
    snapshot.journal = list(_journal(sections.get("journal", "")))
    snapshot.earlier_journal = list(_journal(sections.get("earlier_journal", "")))
    key_file = sections.get("api_key", "").strip()
    if key_file and key_file != "read":
        snapshot.errors.append(f"the API key file {key_file} is unreadable or empty")
    snapshot.health = _endpoint(f"http://127.0.0.1:{port}/health", sections.get("health", ""))
    snapshot.models = _endpoint(
        f"http://127.0.0.1:{port}/v1/models", sections.get("models", ""), with_body=True
    )
    snapshot.metrics = _endpoint(
        f"http://127.0.0.1:{port}/metrics", sections.get("metrics", ""), with_body=True
    )
    snapshot.tt_smi = _endpoint("tt-smi -s", sections.get("tt_smi", ""), with_body=True)
    snapshot.hugepages = HugepageState(
        pools=parse_pools(sections.get("hugepage_pools", "")),
        meminfo=parse_meminfo(sections.get("meminfo", "")),
        unit=UnitState(
            name=HUGEPAGES_UNIT,
            properties=_properties(sections.get("hugepage_unit", "")),
            files=_files(sections.get("hugepage_unit_files", "")),
        ),
        sysctl_lines=[line for line in sections.get("sysctl", "").splitlines() if line.strip()],
    )
    snapshot.generations = dict(
        line.split(" ", 1) for line in sections.get("generations", "").splitlines() if " " in line
    )
    snapshot.start_script = _files(sections.get("start_script", ""))
    container_text = sections.get("container", "").strip()
    if container_text:
        snapshot.container = _container(container_text, snapshot.errors)
    return snapshot


# ---- section parsers -------------------------------------------------------------------------


def _b64(text: str) -> str:
    try:
        return base64.b64decode(text.strip(), validate=False).decode("utf-8", errors="replace")
    except ValueError:
        return ""


def _properties(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def _assignments(items: list[str]) -> dict[str, str]:
    return dict(item.split("=", 1) for item in items if "=" in item)


def _environment_words(text: str) -> dict[str, str]:
    """systemd prints ``Environment=`` as shell-style words: ``A=1 "B=two words"``."""
    try:
        words = shlex.split(text)
    except ValueError:
        words = text.split()
    return _assignments(words)


def _files(text: str) -> dict[str, str]:
    files: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith(FILE_MARK):
            path, _, encoded = line[len(FILE_MARK) :].partition(" ")
            files[path] = redact_text(_b64(encoded))
    return files


def _process(text: str, origin: str) -> ProcessState | None:
    fields = dict(line.split(" ", 1) for line in text.splitlines() if " " in line)
    if not fields.get("pid", "").isdigit():
        return None
    argv = [part for part in _b64(fields.get("cmdline", "")).split("\0") if part]
    environ = _assignments([part for part in _b64(fields.get("environ", "")).split("\0") if part])
    return ProcessState(
        origin=origin,
        pid=int(fields["pid"]),
        argv=redact_argv(argv),
        environment=redact_environment(environ),
        cgroup=_b64(fields.get("cgroup", "")).strip(),
    )


def _journal(text: str) -> Iterator[JournalLine]:
    for raw in text.splitlines():
        try:
            entry = json.loads(raw)
        except json.JSONDecodeError:
            continue
        message = entry.get("MESSAGE", "")
        if isinstance(message, list):  # journald sends non-UTF-8 messages as byte arrays
            message = bytes(message).decode("utf-8", errors="replace")
        dropped = str(entry.get("N_DROPPED", "0"))
        yield JournalLine(
            message=redact_text(str(message)),
            boot_id=_dashed_uuid(str(entry.get("_BOOT_ID", ""))),
            invocation_id=str(
                entry.get("_SYSTEMD_INVOCATION_ID") or entry.get("INVOCATION_ID") or ""
            ),
            timestamp_us=int(entry.get("__REALTIME_TIMESTAMP", 0) or 0),
            dropped=int(dropped) if dropped.isdigit() else 0,
            object_invocation_id=str(entry.get("OBJECT_SYSTEMD_INVOCATION_ID", "")),
        )


def _dashed_uuid(text: str) -> str:
    """journald prints boot IDs as 32 hex digits; /proc as a dashed UUID. Use the latter."""
    if len(text) != 32:
        return text
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


def _endpoint(url: str, text: str, with_body: bool = False) -> Endpoint:
    body, _, status = text.rpartition("\n") if with_body else ("", "", text.strip())
    status = status.strip()
    if status.isdigit() and status != "000":
        return Endpoint(url, int(status), redact_text(body))
    return Endpoint(url, None, "", redact_text(text.strip()) or "no answer")


def parse_meminfo(text: str) -> dict[str, str]:
    """``/proc/meminfo`` lines as ``{key: value}`` (``MemAvailable: "6512345 kB"``)."""
    return {
        key.strip(): value.strip()
        for key, _, value in (line.partition(":") for line in text.splitlines())
        if value
    }


def _container(text: str, errors: list[str]) -> ContainerState | None:
    """docker/podman inspect: the container's argv, Env, State, StopTimeout and RestartCount.

    ``Path`` is the first word the container runs (the entrypoint's, or the command's without
    one) and ``Args`` the rest (Docker Engine API, ``ContainerInspect``), so the process's argv
    is ``[Path, *Args]``. ``Name`` carries Docker's leading slash.
    """
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError:
        errors.append(f"container inspect failed: {redact_text(text[-500:])}")
        return None
    data: dict[str, Any] = parsed[0] if isinstance(parsed, list) and parsed else {}
    config: dict[str, Any] = data.get("Config") or {}
    state: dict[str, Any] = data.get("State") or {}
    environment = redact_environment(_assignments(list(config.get("Env") or [])))
    words = [data["Path"]] if data.get("Path") else []
    argv = redact_argv([str(arg) for arg in [*words, *(data.get("Args") or [])]])
    stop_timeout = config.get("StopTimeout")
    return ContainerState(
        name=str(data.get("Name", "")).lstrip("/"),
        image=str(config.get("Image", "")),
        status=str(state.get("Status", "")),
        running=bool(state.get("Running")),
        started_at=str(state.get("StartedAt", "")),
        stop_timeout=int(stop_timeout) if stop_timeout is not None else None,
        restart_count=int(data.get("RestartCount") or 0),
        exit_code=int(state.get("ExitCode") or 0),
        process=ProcessState("container", int(state.get("Pid") or 0), argv, environment),
    )
