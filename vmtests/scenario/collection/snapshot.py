"""The state snapshot: what the serving unit, its process, the journal and the host look like.

A ``Snapshot`` is plain data (JSON-serialisable with ``to_dict``), taken by
``vmtests.scenario.collection.collect.take_snapshot`` over any ``Machine``. Secrets are already
redacted when a snapshot exists. Accessors here interpret the raw data (which journal lines belong
to the current start of the unit, which hugepage pool is which) so that checks stay short.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any

from vmtests.contracts.serving import HUGEPAGES_UNIT, SERVING_PORT, SERVING_UNIT


@dataclass
class UnitState:
    """``systemctl show`` of a unit plus the text of its unit file and drop-ins."""

    name: str
    properties: dict[str, str] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    environment: dict[str, str] = field(default_factory=dict)
    # Other files the unit reads: EnvironmentFile=, Exec* scripts and the files they source,
    # docker --env-file (path -> text).
    sources: dict[str, str] = field(default_factory=dict)

    def prop(self, key: str) -> str:
        """One property, ``""`` when systemd did not report it."""
        return self.properties.get(key, "")

    @property
    def load_state(self) -> str:
        """``LoadState`` (loaded, not-found, masked, ...)."""
        return self.prop("LoadState")

    @property
    def main_pid(self) -> int:
        """``MainPID``; 0 when the unit has no main process."""
        text = self.prop("MainPID")
        return int(text) if text.isdigit() else 0

    @property
    def active_state(self) -> str:
        """``ActiveState`` (active, inactive, failed, ...)."""
        return self.prop("ActiveState")

    @property
    def drop_in_paths(self) -> list[str]:
        """The drop-in files systemd applied, in order."""
        return self.prop("DropInPaths").split()

    @property
    def invocation_id(self) -> str:
        """``InvocationID`` of the unit's current (or last) start."""
        return self.prop("InvocationID")

    @property
    def need_daemon_reload(self) -> bool:
        """True when a unit file changed on disk after systemd last loaded it."""
        return self.prop("NeedDaemonReload") == "yes"

    @property
    def fragment_path(self) -> str:
        """The unit file systemd loaded."""
        return self.prop("FragmentPath")

    @property
    def unit_file_state(self) -> str:
        """``UnitFileState`` (enabled, disabled, masked, static, ...)."""
        return self.prop("UnitFileState")

    @property
    def n_restarts(self) -> int | None:
        """``NRestarts``: automatic restarts since the unit was last started explicitly (None
        when systemd did not report it)."""
        text = self.prop("NRestarts")
        return int(text) if text.isdigit() else None


@dataclass
class ProcessState:
    """A process on the machine: argv, environment and cgroup.

    ``origin`` says how it was found: ``main-pid`` (the unit's MainPID), ``listener`` (the
    process listening on the serving port) or ``container`` (``docker/podman inspect``).
    """

    origin: str
    pid: int
    argv: list[str] = field(default_factory=list)
    environment: dict[str, str] = field(default_factory=dict)
    cgroup: str = ""


CONTAINER_LOG = "container log"
"""``JournalLine.source`` of a line read from the container's own log (``docker logs``)."""


@dataclass
class ContainerState:
    """``docker/podman inspect`` of the serving container: its name (without Docker's leading
    slash), image, state, stop timeout, how often the engine restarted it (``RestartCount``,
    its ``--restart`` policy's restarts) and the exit code of its last run, and the process it
    runs (``origin`` ``container``: ``[Path, *Args]``, ``Config.Env`` and ``State.Pid``)."""

    name: str
    image: str = ""
    status: str = ""
    running: bool = False
    started_at: str = ""
    stop_timeout: int | None = None
    restart_count: int = 0
    exit_code: int = 0
    process: ProcessState = field(default_factory=lambda: ProcessState("container", 0))


@dataclass
class JournalLine:
    """One journal entry of the serving unit (or, with ``source``, a line of another log)."""

    message: str
    boot_id: str = ""
    invocation_id: str = ""
    timestamp_us: int = 0
    dropped: int = 0
    """journald's ``N_DROPPED``: on its ``Suppressed N messages from <unit>`` line, how many
    lines of the unit it dropped (systemd ``src/journal/journald-manager.c``)."""
    object_invocation_id: str = ""
    """``OBJECT_SYSTEMD_INVOCATION_ID``: the start of the unit a journald line is about."""
    source: str = ""
    """Where the line comes from: ``""`` the unit's journal, ``CONTAINER_LOG`` the container's."""


@dataclass
class Endpoint:
    """An HTTP endpoint fetched on the machine itself (curl), so it works over ssh too."""

    url: str
    status: int | None = None
    body: str = ""
    error: str = ""


@dataclass
class HugepageState:
    """Reserved hugepages per pool (KiB -> nr_hugepages), meminfo lines and boot-time sources."""

    pools: dict[int, int] = field(default_factory=dict)
    meminfo: dict[str, str] = field(default_factory=dict)
    unit: UnitState = field(default_factory=lambda: UnitState(HUGEPAGES_UNIT))
    sysctl_lines: list[str] = field(default_factory=list)

    def count(self, size_kib: int) -> int:
        """``nr_hugepages`` of the pool with pages of ``size_kib`` KiB (0 if no such pool)."""
        return self.pools.get(size_kib, 0)


@dataclass
class Snapshot:
    """Everything one stage (S0, S1, S2) of the scenario records about the machine."""

    label: str
    boot_id: str = ""
    kernel_cmdline: str = ""
    unit: UnitState = field(default_factory=lambda: UnitState(SERVING_UNIT))
    main_process: ProcessState | None = None
    """The unit's MainPID; with a container, the attached ``docker run`` that started it."""
    listener: ProcessState | None = None
    container: ContainerState | None = None
    """The serving container, when one was named and inspected."""
    start_script: dict[str, str] = field(default_factory=dict)
    """The unit's ExecStart program when it is a script (NixOS's ``script``): path -> text."""
    manager_environment: dict[str, str] = field(default_factory=dict)
    env_generators: list[str] = field(default_factory=list)  # system-environment-generators
    journal: list[JournalLine] = field(default_factory=list)
    earlier_journal: list[JournalLine] = field(default_factory=list)
    container_log: list[JournalLine] = field(default_factory=list)
    """The current container's own log (``docker logs``), read when journald dropped lines of
    the unit (or when asked): the fallback source of the banners."""
    health: Endpoint = field(default_factory=lambda: Endpoint("/health"))
    models: Endpoint = field(default_factory=lambda: Endpoint("/v1/models"))
    # The vllm:cache_config_info sample(s) of /metrics: the server's own cache config.
    metrics: Endpoint = field(default_factory=lambda: Endpoint("/metrics"))
    # ``tt-smi -s``: status is its exit status, body its output.
    tt_smi: Endpoint = field(default_factory=lambda: Endpoint("tt-smi -s"))
    hugepages: HugepageState = field(default_factory=HugepageState)
    generations: dict[str, str] = field(default_factory=dict)
    port: int = SERVING_PORT
    api_key_file: str = ""
    """The file on the machine whose API key the ``/v1`` requests sent (``""``: none)."""
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0

    # ---- interpretation ---------------------------------------------------------------------

    @property
    def server(self) -> ProcessState | None:
        """The serving process, whose argv and environment the checks read: the container's
        when the container was inspected, else the unit's main process."""
        return self.container.process if self.container is not None else self.main_process

    @property
    def argv(self) -> list[str]:
        """The live argv of the serving process (empty when none runs)."""
        return list(self.server.argv) if self.server else []

    @property
    def environment(self) -> dict[str, str]:
        """The live environment of the serving process (empty when none runs)."""
        return dict(self.server.environment) if self.server else {}

    def current_lines(self) -> list[JournalLine]:
        """Journal lines of this boot that belong to the unit's current start, then the lines
        of the current container's own log when it was read (``container_log``).

        A line counts when its invocation ID is the unit's ``InvocationID``. If the journal
        carries no invocation IDs at all (old systemd), every line of this boot counts.
        """
        if not any(line.invocation_id for line in self.journal):
            return [*self.journal, *self.container_log]
        current = self.unit.invocation_id
        lines = [line for line in self.journal if line.invocation_id == current]
        return [*lines, *self.container_log]

    def suppressed(self) -> list[JournalLine]:
        """journald's ``Suppressed N messages from <unit>`` lines about the current start (or
        about no known start): lines of the unit were dropped by the rate limit."""
        current = {"", self.unit.invocation_id}
        return [
            line for line in self.journal if line.dropped and line.object_invocation_id in current
        ]

    def older_lines(self) -> list[JournalLine]:
        """Lines of this boot from earlier starts of the unit, then lines of the previous boot."""
        current = {id(line) for line in self.current_lines()}
        this_boot = [line for line in self.journal if id(line) not in current]
        return this_boot + list(self.earlier_journal)

    def to_dict(self) -> dict[str, Any]:
        """The snapshot as JSON-serialisable data (hugepage pool keys become strings)."""
        data = dataclasses.asdict(self)
        data["hugepages"]["pools"] = {str(k): v for k, v in self.hugepages.pools.items()}
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Snapshot:
        """Rebuild a snapshot from ``to_dict`` output (e.g. a report's JSON); ``data`` is
        copied, never shared."""
        data = copy.deepcopy(data)

        def unit(raw: dict[str, Any]) -> UnitState:
            return UnitState(**raw)

        def process(raw: dict[str, Any] | None) -> ProcessState | None:
            return ProcessState(**raw) if raw else None

        def container(raw: dict[str, Any] | None) -> ContainerState | None:
            if not raw:
                return None
            return ContainerState(**{**raw, "process": ProcessState(**raw["process"])})

        hugepages = dict(data.get("hugepages", {}))
        hugepages["pools"] = {int(k): v for k, v in hugepages.get("pools", {}).items()}
        hugepages["unit"] = unit(hugepages.get("unit", {"name": HUGEPAGES_UNIT}))
        fields = dict(data)
        fields.update(
            unit=unit(data["unit"]),
            main_process=process(data.get("main_process")),
            listener=process(data.get("listener")),
            container=container(data.get("container")),
            journal=[JournalLine(**line) for line in data.get("journal", [])],
            earlier_journal=[JournalLine(**line) for line in data.get("earlier_journal", [])],
            container_log=[JournalLine(**line) for line in data.get("container_log", [])],
            health=Endpoint(**data["health"]),
            models=Endpoint(**data["models"]),
            metrics=Endpoint(**data.get("metrics", {"url": "/metrics"})),
            tt_smi=Endpoint(**data.get("tt_smi", {"url": "tt-smi -s"})),
            hugepages=HugepageState(**hugepages),
        )
        return cls(**fields)
