"""The distance between a run and NixOS: the versions the run used next to those of the NixOS
configuration it stands in for, as one table every report carries (``report.json``,
``summary.md``, the certificate).

- ``COMPONENTS``: the table's rows, defined here only (``tests/eval/nixos-eval.nix`` gives each
  configuration's ``versions`` under the same keys);
- the run's column: one shell round trip (``VERSION_COMMANDS``; the preflight folds the same
  commands into its own script). On the reference guest vLLM and tt-smi are what the stub
  claims (its ``/version``, its ``tt-smi --version``); on a real host, the real ones;
- the NixOS column (``nixos_column``): the full NixOS evaluation of the configuration
  (``vmtests.nixos_eval``) when one can run, else every cell says ``not evaluated: <why>``;
  a component the evaluation cannot know (the image's vLLM, a stubbed package) says why too.
- a mark per row (``same_upstream``): whether both cells begin with the same upstream version
  (``upstream_version``), packaging suffixes aside; the cells keep the raw text.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from vmtests import nixos_eval
from vmtests.driver.machine import Machine
from vmtests.guest import SSH_TARGET_PREFIX
from vmtests.nixrun import NixError
from vmtests.scenario.collection.collect import MARK, split_sections
from vmtests.scenario.install.nixos_units import PRODUCTION_CONFIGURATION, configuration_for


@dataclass(frozen=True)
class Component:
    """One row: its key (in ``VERSION_COMMANDS`` and the evaluation's ``versions``) and label."""

    key: str
    label: str


COMPONENTS = (
    Component("systemd", "systemd"),
    Component("docker", "Docker"),
    Component("containerd", "containerd"),
    Component("kernel", "kernel"),
    Component("vllm", "vLLM"),
    Component("tt-smi", "tt-smi"),
)

NIXOS_SYSTEM_BIN = "/run/current-system/sw/bin"
"""The NixOS system's programs: on a NixOS VM's backdoor, whose PATH is the tool manifest only,
nixos-rebuild and nixos-version are found here alone."""
VERSION_COMMANDS = {
    # The parenthesised version of the first line ("systemd 257 (257.9-1~deb13u1)"): the full
    # one, as NixOS's systemd.package.version gives it.
    "systemd": ('v=$(systemctl --version | head -n1); v=${v#*"("}; printf "%s\\n" "${v%%")"*}"'),
    # The daemon's version: moby's VERSION, which nixpkgs' docker.version is.
    "docker": "docker version --format '{{.Server.Version}}'",
    # The containerd the daemon itself reports: Debian runs containerd.service, NixOS's dockerd
    # the containerd its package links into libexec/docker (nixpkgs
    # pkgs/applications/virtualization/docker/default.nix); neither needs it on the PATH.
    "containerd": (
        "docker version --format "
        "'{{range .Server.Components}}{{if eq .Name \"containerd\"}}{{.Version}}{{end}}{{end}}'"
    ),
    "kernel": "cat /proc/sys/kernel/osrelease",  # uname -r, with a program the manifest has
    # vLLM's /version is outside the /v1 paths its API key guards (and the stub's too).
    "vllm": 'curl -sf -m 10 "http://127.0.0.1:$port/version"',
    "tt-smi": "tt-smi --version",  # argparse's version action: the bare version (tt-smi.py)
    "nixos-rebuild": (
        f'PATH="$PATH:{NIXOS_SYSTEM_BIN}"; command -v nixos-rebuild && nixos-version'
    ),
}
"""What each command prints is the run's version of that component (``-`` when it fails);
nixos-rebuild is a preflight item, not a row."""
UPSTREAM_VERSION = re.compile(r"v?(\d+(?:\.\d+)+)")
"""The upstream version a cell begins with; what follows (Debian's ``+dfsg1``, ``~ds1``,
``-1~deb13u1``, ``+deb13-amd64``, a note in parentheses) is packaging."""
SAME_UPSTREAM_MARKS = {True: "yes", False: "no", None: "cannot tell"}
"""The ``same upstream version?`` column: ``cannot tell`` when a side has no version."""
VERSION_COMMAND_TIMEOUT = 30
"""Seconds each version command may take on the machine (``timeout`` in ``versions_script``)."""
VERSIONS_TIMEOUT = float(VERSION_COMMAND_TIMEOUT * len(VERSION_COMMANDS) + 30)
"""One round trip: every version command at its bound, and the shell's own start."""
NOT_FOUND = "not found"

_FUNCTION = rf"""
version() {{  # version TOOL COMMAND: what COMMAND prints (within its bound), "-" when it fails
  sec "version $1"; out=$(timeout {VERSION_COMMAND_TIMEOUT} sh -c "$2" 2>&1) || out=-
  printf '%s\n' "${{out:--}}"
}}
"""


def versions_script() -> str:
    """Shell that prints one ``version <key>`` section per command; it needs the ``sec``
    function of the script it is part of and ``$port`` exported (the serving port)."""
    calls = "\n".join(
        f"version {key} {shlex.quote(command)}" for key, command in VERSION_COMMANDS.items()
    )
    return _FUNCTION + calls + "\n"


def parse_versions(sections: dict[str, str]) -> dict[str, str]:
    """Each command's output on one line (``-`` when absent); vLLM's ``/version`` answer is
    JSON, of which the version alone is kept."""
    found = {
        key: " ".join(sections.get(f"version {key}", "").split()) or "-" for key in VERSION_COMMANDS
    }
    try:
        answer = json.loads(found["vllm"])
    except ValueError:
        answer = None
    if isinstance(answer, dict) and answer.get("version"):
        found["vllm"] = str(answer["version"])
    return found


def upstream_version(text: str) -> str | None:
    """The upstream version ``text`` begins with (``1.7.24~ds1`` -> ``1.7.24``), or None."""
    match = UPSTREAM_VERSION.match(text.strip())
    return match.group(1) if match else None


def same_upstream(run: str, nixos: str) -> bool | None:
    """Whether both cells name the same upstream version; None when either names none."""
    left, right = upstream_version(run), upstream_version(nixos)
    if left is None or right is None:
        return None
    return left == right


def read_versions(machine: Machine, port: int) -> dict[str, str]:
    """The run's versions, asked in one round trip (when no preflight asked them)."""
    script = 'sec() { printf \'\\n%s%s\\n\' "$MARK" "$1"; }\n' + versions_script()
    # An assignment before the command puts $port in the environment of the commands too.
    command = f"MARK={shlex.quote(MARK)} port={int(port)} sh -c {shlex.quote(script)}"
    result = machine.execute(command, timeout=VERSIONS_TIMEOUT)
    return parse_versions(split_sections(result.stdout_text))


@dataclass(frozen=True)
class NixosColumn:
    """The versions of one NixOS configuration, or why they were not evaluated."""

    configuration: str
    cells: dict[str, str]
    source: str
    """Where the evaluation ran (``nixos_eval.Environment.describe``), or why it did not."""
    evaluated: bool

    @classmethod
    def not_evaluated(cls, configuration: str, why: str) -> NixosColumn:
        """A column of which no cell was evaluated, each saying why."""
        text = f"not evaluated: {why}"
        return cls(configuration, {c.key: text for c in COMPONENTS}, text, False)


def nixos_column(configuration: str) -> NixosColumn:
    """The NixOS column from the full evaluation (reusing one already made in this process)."""
    try:
        described, environment = nixos_eval.describe_with_environment(configuration)
    except (nixos_eval.NixosEvalUnavailable, NixError) as error:
        return NixosColumn.not_evaluated(configuration, str(error).strip().splitlines()[0])
    evaluated: dict[str, dict[str, str]] = described.get("versions") or {}
    cells = {}
    for component in COMPONENTS:
        item = evaluated.get(component.key) or {}
        version = item.get("version")
        why = item.get("why") or "the evaluation gives no version"
        cells[component.key] = str(version) if version else f"not evaluated: {why}"
    return NixosColumn(configuration, cells, f"evaluated with {environment}", True)


def stands_in_for(serving_profile: str, target: str = "") -> NixosColumn:
    """The NixOS column of the configuration a run of ``serving_profile`` on ``target`` stands
    in for: on an ``ssh://`` target, a real host, the production configuration itself;
    elsewhere (the reference guest, a NixOS VM) the flake's VM configuration of that profile
    (``nixos_units.configuration_for``), the production host with the VM and the stub device
    layer swapped in."""
    if target.startswith(SSH_TARGET_PREFIX):
        return nixos_column(PRODUCTION_CONFIGURATION)
    try:
        configuration = configuration_for(serving_profile)
    except ValueError as error:
        return NixosColumn.not_evaluated("?", str(error))
    return nixos_column(configuration)


@dataclass
class VersionTable:
    """The run's versions (``VERSION_COMMANDS``' keys) and the NixOS column."""

    run: dict[str, str] = field(default_factory=dict)
    nixos: NixosColumn | None = None

    def run_cell(self, key: str) -> str:
        """What the run used, ``not found`` when the command failed, or why nothing was read."""
        if not self.run:
            return "not read (the run ended before its versions were asked)"
        found = self.run.get(key, "-")
        return NOT_FOUND if found == "-" else found

    def run_line(self) -> str:
        """``systemd: ...; Docker: ...`` for the log."""
        return "; ".join(f"{c.label}: {self.run_cell(c.key)}" for c in COMPONENTS)

    @property
    def column(self) -> NixosColumn:
        """The NixOS column, which says so when it was never asked for."""
        return self.nixos or NixosColumn.not_evaluated("?", "no NixOS column was asked for")

    def rows(self) -> list[dict[str, Any]]:
        """One row per component: label, the run's cell, the NixOS cell, and whether the two
        name the same upstream version (``same_upstream``: true, false or null)."""
        column = self.column
        rows: list[dict[str, Any]] = []
        for c in COMPONENTS:
            run, nixos = self.run_cell(c.key), column.cells[c.key]
            rows.append(
                {
                    "component": c.label,
                    "run": run,
                    "nixos": nixos,
                    "same_upstream": same_upstream(run, nixos),
                }
            )
        return rows

    def to_dict(self) -> dict[str, Any]:
        """JSON form: the NixOS configuration, where its column comes from, the rows."""
        column = self.column
        return {
            "nixos_configuration": column.configuration,
            "nixos_evaluated": column.evaluated,
            "nixos_source": column.source,
            "rows": self.rows(),
        }


def markdown_lines(table: VersionTable) -> list[str]:
    """The table as Markdown, headed by what it compares and where the NixOS column is from."""
    column = table.column
    lines = [
        "## Versions: this run and NixOS",
        "",
        f"The run used the left column; NixOS `{column.configuration}` would run the right one "
        f"({column.source}). Where they differ, the run did not prove the NixOS version; "
        "the last column compares upstream versions, distribution packaging suffixes aside.",
        "",
        f"| component | this run | NixOS `{column.configuration}` | same upstream version? |",
        "| --- | --- | --- | --- |",
    ]
    for row in table.rows():
        mark = SAME_UPSTREAM_MARKS[row["same_upstream"]]
        cells = (row["component"], row["run"], row["nixos"], mark)
        lines.append("| " + " | ".join(_cell(text) for text in cells) + " |")
    return lines


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
