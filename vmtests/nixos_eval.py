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
  made), ``describe_with_environment`` with where it was evaluated;
- ``job_script_file(text, shell)``: the file nixpkgs writes for a unit's job script.

The eval tier reads single units of a description with ``tests/eval/rendered_unit.py``.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vmtests.contracts.paths import REPO_ROOT, cache_dir, nixpkgs_tree
from vmtests.nixrun import Nix, nix_value
from vmtests.nixrun import evaluate as evaluate_nix

EVAL_FILE = REPO_ROOT / "tests" / "eval" / "nixos-eval.nix"
SETUP_SCRIPT = "scripts/setup-nixos-eval"
EVAL_TIMEOUT = 900.0
MIN_NIX = (2, 18)
CHROOT_TREE, CHROOT_REPO = "/nixpkgs", "/src"
KEEP_CACHED = 12
"""Evaluations kept in the on-disk cache (each checkout change adds some)."""


class NixosEvalUnavailable(RuntimeError):
    """No nixpkgs tree or no Nix able to evaluate it; the message says how to set one up."""


@dataclass(frozen=True)
class Environment:
    """Where and how the evaluation runs.

    ``tree`` is the nixpkgs tree (None: the flake's own input), ``shim`` whether the trimmed
    tree's shim is loaded, ``chroot`` the trixie chroot to run Nix in (None: the host's Nix).
    """

    tree: Path | None
    shim: bool
    chroot: Path | None

    @property
    def nix(self) -> Nix:
        """How ``vmtests.nixrun`` runs Nix here: inside the chroot the tree is ``/nixpkgs`` and
        the checkout ``/src``; without a tree, flakes give the flake's own nixpkgs input."""
        if self.chroot is None:
            return Nix(flakes=self.tree is None)
        assert self.tree is not None
        return Nix(self.chroot, ((self.tree, CHROOT_TREE), (REPO_ROOT, CHROOT_REPO)))

    def describe(self) -> str:
        """One line for reports and skip reasons."""
        tree = str(self.tree) if self.tree else "the flake's locked nixpkgs input"
        nix = self.nix.describe()
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


def expression(environment: Environment, configurations: list[str] | None, outputs: bool) -> str:
    """The nix-instantiate expression for ``tests/eval/nixos-eval.nix`` in ``environment``."""
    inside = environment.chroot is not None
    repo = Path(CHROOT_REPO) if inside else REPO_ROOT
    tree = (Path(CHROOT_TREE) if inside else environment.tree) if environment.tree else None
    eval_file = repo / EVAL_FILE.relative_to(REPO_ROOT)
    return (
        f"import {nix_value(eval_file)} {{ nixpkgs = {nix_value(tree)};"
        f" shim = {nix_value(environment.shim)}; repo = {nix_value(repo)};"
        f" configurations = {nix_value(configurations)}; outputs = {nix_value(outputs)}; }}"
    )


def run_nix(environment: Environment, expr: str, timeout: float = EVAL_TIMEOUT) -> Any:
    """Evaluate ``expr`` in ``environment`` (``vmtests.nixrun``); ``NixError`` on failure.

    A JSON object gets the evaluation's warnings (``evaluation warning:`` lines) as
    ``warnings``.
    """
    evaluation = evaluate_nix(expr, nix=environment.nix, timeout=timeout)
    data = evaluation.value
    if isinstance(data, dict):
        data["warnings"] = evaluation.warnings
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
    return describe_with_environment(configuration)[0]


def describe_with_environment(configuration: str) -> tuple[dict[str, Any], str]:
    """``describe``, and the environment line of the evaluation it comes from."""
    for data in _CACHE.values():
        if configuration in data["configurations"]:
            found: dict[str, Any] = data["configurations"][configuration]
            return found, str(data["environment"])
    data = evaluate([configuration], outputs=False)
    described: dict[str, Any] = data["configurations"][configuration]
    return described, str(data["environment"])


def job_script_file(text: str, shell: str = "/bin/sh") -> str:
    """The file a job script is (nixos/lib/systemd-lib.nix ``makeJobScript`` without strict
    shell checks): ``writeShellScriptBin`` (pkgs/build-support/trivial-builders) writes
    ``#!<shell>\\n<text>\\n`` of the text ``set -e\\n\\n<body>\\n``."""
    return f"#!{shell}\nset -e\n\n{text}\n\n"


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
