"""One unit of a configuration as the full NixOS evaluation renders it, read for the eval tier's
assertions (``vmtests.nixos_eval`` gives the text; this reads it).

``rendered_unit(configuration, key)`` (``key``: ``serving``, ``backdoor`` or ``hugepages``) is a
``RenderedUnit``: ``settings`` (every ``[Section] Key=`` value, in order), ``environment``
(``Environment=`` as a dict, PATH included), ``path`` (PATH entries), ``exec_start_pre`` /
``exec_start`` / ``exec_stop`` / ``exec_stop_post`` (``Exec`` objects: the command line and, for
job scripts, ``script`` = the script's body as written in the NixOS options;
``Exec.file_text(shell)`` is the file nixpkgs writes for it), ``restart``, ``timeout_stop_sec``
and ``docker_run_argv`` (the container's ``docker run ...`` argv from the ExecStart script,
without the leading ``exec``).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from vmtests.nixos_eval import describe, job_script_file


@dataclass(frozen=True)
class Exec:
    """One ``Exec*=`` command of a unit; ``script`` is a job script's body, when it is one."""

    command: str
    script: str | None = None

    @property
    def program(self) -> str:
        """The executable (the first word, systemd prefixes such as ``-`` or ``+`` removed)."""
        return shlex.split(self.command)[0].lstrip("-+!@:")

    def file_text(self, shell: str = "/bin/sh") -> str:
        """The script file as nixpkgs writes it (``job_script_file``)."""
        if self.script is None:
            raise ValueError(f"{self.command} is not a job script of the unit")
        return job_script_file(self.script, shell)


@dataclass(frozen=True)
class RenderedUnit:
    """A systemd service as the NixOS configuration renders it."""

    name: str
    text: str
    settings: dict[str, list[str]] = field(default_factory=dict)
    scripts: dict[str, str] = field(default_factory=dict)

    def values(self, key: str) -> list[str]:
        """Every value of ``key`` (e.g. ``ExecStartPre``), in the unit's order."""
        return list(self.settings.get(key, []))

    def value(self, key: str) -> str | None:
        """The last value of ``key`` (systemd's rule for single-valued settings), or None."""
        found = self.settings.get(key)
        return found[-1] if found else None

    def execs(self, key: str) -> list[Exec]:
        """The ``Exec*`` commands of ``key``, each with its job script's body when known."""
        return [
            Exec(command, self.scripts.get(shlex.split(command)[0].lstrip("-+!@:")))
            for command in self.values(key)
        ]

    @property
    def environment(self) -> dict[str, str]:
        """``Environment=`` assignments (systemd quoting undone)."""
        result: dict[str, str] = {}
        for line in self.values("Environment"):
            for assignment in shlex.split(line):
                name, _, value = assignment.partition("=")
                result[name] = value
        return result

    @property
    def path(self) -> list[str]:
        """The unit's PATH entries, in order."""
        return [entry for entry in self.environment.get("PATH", "").split(":") if entry]

    @property
    def exec_start_pre(self) -> list[Exec]:
        """``ExecStartPre=`` commands."""
        return self.execs("ExecStartPre")

    @property
    def exec_start(self) -> Exec | None:
        """``ExecStart=`` (the last one)."""
        found = self.execs("ExecStart")
        return found[-1] if found else None

    @property
    def exec_stop(self) -> list[Exec]:
        """``ExecStop=`` commands."""
        return self.execs("ExecStop")

    @property
    def exec_stop_post(self) -> list[Exec]:
        """``ExecStopPost=`` commands."""
        return self.execs("ExecStopPost")

    @property
    def restart(self) -> str | None:
        """``Restart=``."""
        return self.value("Restart")

    @property
    def timeout_stop_sec(self) -> str | None:
        """``TimeoutStopSec=`` as written in the unit."""
        return self.value("TimeoutStopSec")

    @property
    def docker_run_argv(self) -> list[str]:
        """The container's ``docker run`` argv (from the ExecStart script, ``exec`` dropped)."""
        start = self.exec_start
        if start is None or start.script is None:
            raise ValueError(f"{self.name} has no ExecStart job script: {start}")
        argv = shlex.split(start.script.replace("\\\n", " "))
        return argv[1:] if argv and argv[0] == "exec" else argv


def parse_unit(text: str) -> dict[str, list[str]]:
    """``Key=value`` settings of a unit file (all sections; repeated keys keep their order)."""
    settings: dict[str, list[str]] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";", "[")) or "=" not in line:
            continue
        key, _, value = line.partition("=")
        settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def rendered_unit(configuration: str, key: str = "serving") -> RenderedUnit:
    """Unit ``key`` (``serving``, ``backdoor``, ``hugepages``) of one nixosConfiguration."""
    unit = describe(configuration)["units"][key]
    if unit is None:
        raise KeyError(f"{configuration} renders no {key} unit")
    name = {
        "serving": "tenstorrent-serving",
        "backdoor": "vmtests-backdoor",
        "hugepages": "tenstorrent-hugepages",
    }[key]
    return RenderedUnit(
        name=f"{name}.service",
        text=unit["text"],
        settings=parse_unit(unit["text"]),
        scripts=dict(unit["scripts"]),
    )


def serving_unit(configuration: str) -> RenderedUnit:
    """``tenstorrent-serving.service`` as ``configuration`` (e.g. ``vm-test-cfx-llm2``) renders
    it; see ``RenderedUnit`` for what it gives."""
    return rendered_unit(configuration, "serving")
