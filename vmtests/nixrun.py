"""The one way the suite runs Nix: ``nix-instantiate --eval --strict --json`` of an expression.

Python values reach the expression through ``nix_value`` (one rendering for every caller), and
``evaluate`` runs it where ``Nix`` says: the host's ``nix-instantiate`` (the Nix core, the
module tier), or the Debian trixie chroot that ``scripts/setup-nixos-eval`` builds, entered with
``unshare --mount`` and ``chroot`` with host directories bound into it (the full NixOS
evaluation, whose nixpkgs needs a newer Nix than Debian bookworm's). Every failure is a
``NixError`` carrying the expression and nix-instantiate's stderr.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vmtests.contracts.paths import REPO_ROOT

NIX_TIMEOUT = 120.0
STDERR_TAIL = 6000
"""Characters of nix-instantiate's stderr kept in a ``NixError`` (a trace ends with its cause)."""
WARNING_MARK = "evaluation warning:"


class NixError(RuntimeError):
    """nix-instantiate is missing, or an evaluation failed (the message carries its stderr)."""


def nix_string(text: str) -> str:
    """Quote ``text`` as a Nix string literal (JSON escapes are valid Nix escapes, bar ``${``)."""
    return json.dumps(text).replace("${", "\\${")


def nix_value(value: object) -> str:
    """Render a JSON-like Python value as a Nix expression; a ``Path`` becomes a Nix path
    (absolute, not resolved: it may name a directory inside the chroot)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        # Parenthesised when negative: a leading "-3" is an option to nix-instantiate's -E.
        return json.dumps(value) if value >= 0 else f"({json.dumps(value)})"
    if isinstance(value, str):
        return nix_string(value)
    if isinstance(value, Path):
        return f"(/. + {nix_string(str(value.absolute()))})"
    if isinstance(value, Mapping):
        fields = " ".join(f"{nix_string(str(k))} = {nix_value(v)};" for k, v in value.items())
        return "{ " + fields + " }"
    if isinstance(value, list | tuple):
        return "[ " + " ".join(f"({nix_value(item)})" for item in value) + " ]"
    raise TypeError(f"cannot render {type(value).__name__} {value!r} as a Nix value")


# Inside a private mount namespace: each (host directory, directory inside) pair bound into the
# chroot, then /proc, then Nix.
_ENTER_CHROOT = (
    'set -e; root=$1; shift; while [ "$1" != -- ]; do mount --bind "$1" "$root$2"; shift 2; done; '
    'shift; mount -t proc proc "$root/proc"; exec chroot "$root" "$@"'
)


@dataclass(frozen=True)
class Nix:
    """Where nix-instantiate runs: the host's (``chroot`` None) or the one inside ``chroot``,
    with each ``binds`` pair (host directory, path inside) mounted there first. ``flakes`` turns
    on the experimental features ``builtins.getFlake`` needs."""

    chroot: Path | None = None
    binds: tuple[tuple[Path, str], ...] = ()
    flakes: bool = False

    def describe(self) -> str:
        """Which Nix, for messages and reports."""
        return f"chroot {self.chroot}" if self.chroot else "the host's Nix"

    def command(self, expression: str) -> list[str]:
        """The argv that evaluates ``expression`` strictly to JSON."""
        nix = ["nix-instantiate", "--eval", "--strict", "--json"]
        if self.flakes:
            nix += ["--option", "experimental-features", "nix-command flakes"]
        nix += ["-E", expression]
        if self.chroot is None:
            found = shutil.which("nix-instantiate")
            if found is None:
                raise NixError(
                    "nix-instantiate is not on PATH: install Nix (on Debian: apt-get install "
                    "nix-bin)"
                )
            return [found, *nix[1:]]
        binds = [str(part) for host, inside in self.binds for part in (host, inside)]
        enter = ["unshare", "--mount", "--propagation", "private", "sh", "-c", _ENTER_CHROOT]
        return [*enter, "sh", str(self.chroot), *binds, "--", *nix]


HOST = Nix()


@dataclass(frozen=True)
class Evaluation:
    """What an evaluation gave: the value, and the ``evaluation warning:`` lines Nix printed."""

    value: Any
    warnings: list[str]


def evaluate(expression: str, *, nix: Nix = HOST, timeout: float = NIX_TIMEOUT) -> Evaluation:
    """Evaluate ``expression`` strictly with ``nix`` (from the checkout's root); ``NixError``
    when it cannot run, fails or does not finish within ``timeout`` seconds."""
    try:
        result = subprocess.run(
            nix.command(expression),
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as error:
        raise NixError(
            f"nix-instantiate ({nix.describe()}) did not finish within {timeout:.0f}s "
            f"evaluating:\n{expression}"
        ) from error
    if result.returncode != 0:
        raise NixError(
            f"nix-instantiate failed (rc={result.returncode}; {nix.describe()}) evaluating:\n"
            f"{expression}\n--- stderr ---\n{result.stderr.strip()[-STDERR_TAIL:]}"
        )
    warnings = [
        line.split(WARNING_MARK, 1)[1].strip()
        for line in result.stderr.splitlines()
        if WARNING_MARK in line
    ]
    return Evaluation(json.loads(result.stdout), warnings)


def evaluate_json(expression: str, *, nix: Nix = HOST, timeout: float = NIX_TIMEOUT) -> Any:
    """The value of ``evaluate(expression)``, decoded from JSON."""
    return evaluate(expression, nix=nix, timeout=timeout).value
