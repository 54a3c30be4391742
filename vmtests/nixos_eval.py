"""The full NixOS evaluation of this repository's flake, as data (no store, nothing built).

``tests/eval/nixos-eval.nix`` evaluates the flake's ``nixosConfigurations`` (and optionally its
checks, apps, packages, devShells and formatter) to derivations and describes each
configuration: toplevel and VM drvPaths, kernel parameters, console level, VM resources, boot
loader, the serving options and container, and the rendered units of the backdoor, the serving
container and the hugepage reservation (unit file text plus the text of every job script).

Where it runs (``find_environment``):

- a nixpkgs tree: ``$VMTESTS_NIXPKGS``, else ``<cache>/nixpkgs`` (default
  ``~/.cache/vmtests/nixpkgs``, made by ``scripts/setup-nixos-eval`` from a snapshot). A trimmed
  tree (its module list lacks ``hardware/tenstorrent.nix``) gets the test-only shim
  ``tests/eval/nixos-shim.nix``; a full tree does not;
- without a tree, on a Nix host with flakes (``nix`` >= 2.18): the flake's own locked nixpkgs
  input (``builtins.getFlake``), no shim;
- Nix: the host's ``nix-instantiate`` when it is >= 2.18 (nixpkgs ``lib/minver.nix``), else
  the Debian trixie chroot ``<cache>/nix-chroot`` (root only), entered with
  ``unshare --mount`` + ``chroot`` with the tree on ``/nixpkgs`` and the checkout on ``/src``.

API for other parts of the suite (the reference guest installs what NixOS renders):

- ``evaluate(configurations=None, outputs=True) -> dict``: the raw JSON document, cached per
  process and arguments, and on disk by its inputs (``disk_cache_key``: the checkout's files,
  the tree's stamp, the expression), so parallel workers evaluate once; raises
  ``NixosEvalUnavailable`` (its message names the set-up step) or ``NixError``;
  ``describe(configuration)``: one configuration's part of it (reusing any evaluation already
  made);
- ``serving_unit(configuration) -> RenderedUnit`` and ``rendered_unit(configuration, key)``:
  one unit as NixOS renders it (``key``: ``serving``, ``backdoor`` or ``hugepages``);
- ``RenderedUnit``: ``settings`` (every ``[Section] Key=`` value, in order),
  ``environment`` (``Environment=`` as a dict, PATH included), ``path`` (PATH entries),
  ``exec_start_pre`` / ``exec_start`` / ``exec_stop`` / ``exec_stop_post`` (``Exec`` objects:
  the command line and, for job scripts, ``script`` = the script's body as written in the
  NixOS options; ``Exec.file_text(shell)`` is the file nixpkgs writes for it), ``restart``,
  ``timeout_stop_sec`` and ``docker_run_argv`` (the container's ``docker run ...`` argv from the
  ExecStart script, without the leading ``exec``).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vmtests.contracts.paths import cache_dir, nixpkgs_tree

REPO_ROOT = Path(__file__).resolve().parents[1]
EVAL_FILE = REPO_ROOT / "tests" / "eval" / "nixos-eval.nix"
SETUP_SCRIPT = "scripts/setup-nixos-eval"
EVAL_TIMEOUT = 900.0
MIN_NIX = (2, 18)
CHROOT_TREE, CHROOT_REPO = "/nixpkgs", "/src"
KEEP_CACHED = 12
"""Evaluations kept in the on-disk cache (each checkout change adds some)."""


class NixosEvalUnavailable(RuntimeError):
    """No nixpkgs tree or no Nix able to evaluate it; the message says how to set one up."""


class NixError(RuntimeError):
    """An evaluation failed; the message carries nix-instantiate's stderr."""


@dataclass(frozen=True)
class Environment:
    """Where and how the evaluation runs.

    ``tree`` is the nixpkgs tree (None: the flake's own input), ``shim`` whether the trimmed
    tree's shim is loaded, ``chroot`` the trixie chroot to run Nix in (None: the host's Nix).
    """

    tree: Path | None
    shim: bool
    chroot: Path | None

    def describe(self) -> str:
        """One line for reports and skip reasons."""
        tree = str(self.tree) if self.tree else "the flake's locked nixpkgs input"
        nix = f"chroot {self.chroot}" if self.chroot else "the host's Nix"
        return f"nixpkgs: {tree}{' (trimmed, shim loaded)' if self.shim else ''}; Nix: {nix}"


def nix_version(command: list[str]) -> tuple[int, int] | None:
    """(major, minor) of ``command --version``, None when it cannot run."""
    try:
        result = subprocess.run(
            [*command, "--version"], capture_output=True, text=True, timeout=30, check=False
        )
    except OSError:
        return None
    found = re.search(r"(\d+)\.(\d+)", result.stdout)
    return (int(found.group(1)), int(found.group(2))) if found and result.returncode == 0 else None


def is_trimmed(tree: Path) -> bool:
    """A trimmed tree's module list omits ``hardware/tenstorrent.nix`` (the shim imports it)."""
    module_list = tree / "nixos" / "modules" / "module-list.nix"
    return "./hardware/tenstorrent.nix" not in module_list.read_text(encoding="utf-8")


def find_tree() -> Path | None:
    """``$VMTESTS_NIXPKGS`` (must be a tree), else the set-up cache, else None."""
    tree = nixpkgs_tree()
    if tree is not None and not (tree / "nixos" / "lib" / "eval-config.nix").is_file():
        raise NixosEvalUnavailable(
            f"{tree} ($VMTESTS_NIXPKGS, else the set-up cache) is not a nixpkgs tree"
        )
    return tree


def find_environment() -> Environment:
    """The evaluation environment; ``NixosEvalUnavailable`` names the missing set-up step."""
    tree = find_tree()
    host_nix = shutil.which("nix-instantiate")
    host_ok = host_nix is not None and (nix_version([host_nix]) or (0, 0)) >= MIN_NIX
    if tree is None:
        if host_ok and shutil.which("nix"):
            return Environment(tree=None, shim=False, chroot=None)
        raise NixosEvalUnavailable(
            f"no nixpkgs tree for the full NixOS evaluation: run {SETUP_SCRIPT} with a nixpkgs "
            "git snapshot (argument or $VMTESTS_NIXPKGS_SNAPSHOT), set $VMTESTS_NIXPKGS to a "
            "nixpkgs tree, or run on a Nix host with flakes (Nix >= 2.18)"
        )
    if host_ok:
        return Environment(tree=tree, shim=is_trimmed(tree), chroot=None)
    chroot = cache_dir() / "nix-chroot"
    if not (chroot / ".vmtests-ready").is_file():
        raise NixosEvalUnavailable(
            f"nixpkgs needs Nix >= {MIN_NIX[0]}.{MIN_NIX[1]} and the host has "
            f"{'none' if host_nix is None else 'an older one'}: run {SETUP_SCRIPT} as root "
            "(builds a Debian trixie chroot with nix-bin into the cache)"
        )
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        raise NixosEvalUnavailable(
            f"the Nix chroot {chroot} is entered with unshare --mount and chroot: run as root"
        )
    return Environment(tree=tree, shim=is_trimmed(tree), chroot=chroot)


# Inside a private mount namespace: the tree, the checkout and /proc into the chroot, then Nix.
_ENTER_CHROOT = (
    'set -e; tree=$1 repo=$2 root=$3; shift 3; mount --bind "$tree" "$root' + CHROOT_TREE + '"; '
    'mount --bind "$repo" "$root' + CHROOT_REPO + '"; mount -t proc proc "$root/proc"; '
    'exec chroot "$root" "$@"'
)


def nix_value(value: object) -> str:
    """A Nix literal for None, bools, strings (as paths when ``Path``) and lists of strings."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, list):
        return "[ " + " ".join(nix_value(item) for item in value) + " ]"
    return json.dumps(str(value)).replace("${", "\\${")


def expression(environment: Environment, configurations: list[str] | None, outputs: bool) -> str:
    """The nix-instantiate expression for ``tests/eval/nixos-eval.nix`` in ``environment``."""
    inside = environment.chroot is not None
    repo = Path(CHROOT_REPO) if inside else REPO_ROOT
    tree = (Path(CHROOT_TREE) if inside else environment.tree) if environment.tree else None
    eval_file = repo / EVAL_FILE.relative_to(REPO_ROOT)
    return (
        f"import {eval_file} {{ nixpkgs = {nix_value(tree)}; shim = {nix_value(environment.shim)};"
        f" repo = {repo}; configurations = {nix_value(configurations)};"
        f" outputs = {nix_value(outputs)}; }}"
    )


def run_nix(environment: Environment, expr: str, timeout: float = EVAL_TIMEOUT) -> Any:
    """Evaluate ``expr`` strictly to JSON in ``environment``; ``NixError`` on failure.

    A JSON object gets the evaluation's warnings (``evaluation warning:`` lines) as
    ``warnings``.
    """
    nix = ["nix-instantiate", "--eval", "--strict", "--json"]
    if environment.tree is None:
        nix += ["--option", "experimental-features", "nix-command flakes"]
    nix += ["-E", expr]
    if environment.chroot is not None:
        assert environment.tree is not None
        command = ["unshare", "--mount", "--propagation", "private", "sh", "-c", _ENTER_CHROOT]
        command += ["sh", str(environment.tree), str(REPO_ROOT), str(environment.chroot), *nix]
    else:
        command = nix
    try:
        result = subprocess.run(
            command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as error:
        raise NixError(f"the NixOS evaluation did not finish within {timeout:.0f}s") from error
    if result.returncode != 0:
        raise NixError(
            f"the NixOS evaluation failed (rc={result.returncode}; {environment.describe()}):\n"
            f"{expr}\n--- stderr ---\n{result.stderr.strip()[-6000:]}"
        )
    data = json.loads(result.stdout)
    if isinstance(data, dict):
        data["warnings"] = [
            line.split("evaluation warning:", 1)[1].strip()
            for line in result.stderr.splitlines()
            if "evaluation warning:" in line
        ]
    return data


_CACHE: dict[tuple[tuple[str, ...] | None, bool], dict[str, Any]] = {}

SOURCE_EXCLUDED = {".git", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache", "result"}
"""What ``tests/eval/nixos-eval.nix`` leaves out of the flake's source (its ``filter``)."""


def source_digest(root: Path = REPO_ROOT) -> str:
    """sha256 over every file of the flake's source as the evaluation copies it."""
    digest = hashlib.sha256()
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if d not in SOURCE_EXCLUDED)
        for name in sorted(files):
            path = Path(directory, name)
            if name in SOURCE_EXCLUDED or not path.is_file():
                continue
            digest.update(str(path.relative_to(root)).encode() + b"\0")
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def disk_cache_key(environment: Environment, expr: str) -> str | None:
    """The evaluation's key in the on-disk cache, or None when its inputs cannot be named.

    Inputs: the expression, the environment, this checkout's files and the tree's identity
    (the ``.vmtests-ready`` stamp ``scripts/setup-nixos-eval`` writes: the snapshot's commit).
    A tree without a stamp ($VMTESTS_NIXPKGS) may change under us: never cached on disk.
    """
    stamp = b""
    if environment.tree is not None:
        ready = environment.tree / ".vmtests-ready"
        if not ready.is_file():
            return None
        stamp = ready.read_bytes()
    parts = [expr.encode(), environment.describe().encode(), stamp, source_digest().encode()]
    return hashlib.sha256(b"\0".join(parts)).hexdigest()


def cached_run_nix(environment: Environment, expr: str) -> Any:
    """``run_nix``, through the on-disk cache (``<cache>/nixos-eval``): parallel test workers
    and later runs of the same checkout evaluate once (about a minute each under load)."""
    key = disk_cache_key(environment, expr)
    if key is None:
        return run_nix(environment, expr)
    directory = cache_dir() / "nixos-eval"
    directory.mkdir(parents=True, exist_ok=True)
    stored = directory / f"{key}.json"
    with (directory / f".lock-{key}").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stored.is_file():
            return json.loads(stored.read_text())
        data = run_nix(environment, expr)
        partial = stored.with_suffix(".tmp")
        partial.write_text(json.dumps(data))
        partial.replace(stored)
    for stale in sorted(directory.glob("*.json"), key=lambda p: p.stat().st_mtime)[:-KEEP_CACHED]:
        stale.unlink(missing_ok=True)
        stale.with_name(f".lock-{stale.stem}").unlink(missing_ok=True)
    return data


def evaluate(configurations: list[str] | None = None, *, outputs: bool = True) -> dict[str, Any]:
    """The evaluation document of ``tests/eval/nixos-eval.nix`` (cached per arguments).

    ``configurations`` restricts the described nixosConfigurations; ``outputs = False`` skips
    the flake's checks, apps, packages, devShells and formatter (faster).
    """
    key = (None if configurations is None else tuple(configurations), outputs)
    if key not in _CACHE:
        environment = find_environment()
        data: dict[str, Any] = cached_run_nix(
            environment, expression(environment, configurations, outputs)
        )
        data["environment"] = environment.describe()
        _CACHE[key] = data
    return _CACHE[key]


def describe(configuration: str) -> dict[str, Any]:
    """One configuration's description, from any evaluation already made in this process."""
    for data in _CACHE.values():
        if configuration in data["configurations"]:
            found: dict[str, Any] = data["configurations"][configuration]
            return found
    described: dict[str, Any] = evaluate([configuration], outputs=False)["configurations"][
        configuration
    ]
    return described


def job_script_file(text: str, shell: str = "/bin/sh") -> str:
    """The file a job script is (nixos/lib/systemd-lib.nix ``makeJobScript`` without strict
    shell checks): ``writeShellScriptBin`` (pkgs/build-support/trivial-builders) writes
    ``#!<shell>\\n<text>\\n`` of the text ``set -e\\n\\n<body>\\n``."""
    return f"#!{shell}\nset -e\n\n{text}\n\n"


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


def main() -> None:
    """Benchmark: ``python3 -m vmtests.nixos_eval`` prints the environment and the time to
    evaluate each configuration alone (a fresh nix-instantiate each) and everything at once."""
    environment = find_environment()
    print(f"environment: {environment.describe()}")
    started = time.monotonic()
    names = sorted(run_nix(environment, expression(environment, None, False))["configurations"])
    print(f"all configurations, no other outputs: {time.monotonic() - started:.1f} s")
    for name in names:
        started = time.monotonic()
        run_nix(environment, expression(environment, [name], False))
        print(f"{name}: {time.monotonic() - started:.1f} s")
    started = time.monotonic()
    run_nix(environment, expression(environment, None, True))
    print(
        f"everything (configurations, checks, apps, packages): {time.monotonic() - started:.1f} s"
    )


if __name__ == "__main__":
    main()
