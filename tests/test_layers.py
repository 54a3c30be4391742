"""The package's import arrows point down: a neutral contracts layer at the bottom, then the
driver, then guests and stub, then the scenario, with the CLI and the plugin on top.

Every import of a ``vmtests`` module, at any depth of a file (lazy imports included), must go
to a layer the importing layer may use. A new upward or sideways arrow fails here with the file,
the line and the rule it breaks.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "vmtests"

# Which top-level parts of ``vmtests`` each part may import (besides itself).
ALLOWED: dict[str, set[str]] = {
    "contracts": set(),
    # The one way to run Nix (host or chroot), and Python values rendered as Nix.
    "nixrun": {"contracts"},
    "nixcore": {"contracts", "nixrun"},
    # The one tt-smi reader (snapshot, certification preflight): neutral, contracts only.
    "tt_smi_parse": {"contracts"},
    # What the full NixOS evaluation renders (the eval tier, the reference guest's units).
    "nixos_eval": {"contracts", "nixrun"},
    "driver": {"contracts"},
    "stub": {"contracts"},
    "profiles": {"contracts"},
    "guest": {"contracts", "driver", "stub", "tt_smi_parse"},
    "scenario": {
        "contracts",
        "nixrun",
        "nixcore",
        "nixos_eval",
        "driver",
        "stub",
        "profiles",
        "guest",
        "tt_smi_parse",
    },
    "certify": {
        "contracts",
        "nixcore",
        "driver",
        "stub",
        "profiles",
        "guest",
        "scenario",
        "tt_smi_parse",
        "report",  # write_atomic: certificates are written like the scenario's reports
    },
    "report": {"contracts", "profiles", "scenario"},
    "bench": {"contracts", "driver", "guest", "stub"},
    "cli": {"*"},
    "pytest_plugin": {"*"},
    "__init__": set(),
}


def part_of(path: Path) -> str:
    """The top-level part (``driver``, ``cli``, ...) a file of the package belongs to."""
    relative = path.relative_to(PACKAGE)
    return relative.parts[0] if len(relative.parts) > 1 else relative.stem


def imported_parts(path: Path) -> list[tuple[int, str]]:
    """(line, part) of every ``vmtests`` import in ``path``, lazy ones included."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
            if node.module == "vmtests":
                names = [f"vmtests.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "vmtests" and len(parts) > 1:
                found.append((node.lineno, parts[1]))
    return found


SOURCES = sorted(PACKAGE.rglob("*.py"))


def test_every_part_has_a_rule() -> None:
    parts = {part_of(path) for path in SOURCES}
    assert parts <= set(ALLOWED), f"parts without a layering rule: {sorted(parts - set(ALLOWED))}"


@pytest.mark.parametrize("path", SOURCES, ids=lambda path: str(path.relative_to(PACKAGE)))
def test_imports_point_down(path: Path) -> None:
    part = part_of(path)
    allowed = ALLOWED[part]
    wrong = [
        f"{path.relative_to(PACKAGE)}:{line} imports vmtests.{target}"
        for line, target in imported_parts(path)
        if target != part and "*" not in allowed and target not in allowed
    ]
    assert not wrong, f"{part} may import only {sorted(allowed)}:\n" + "\n".join(wrong)


def test_the_rule_catches_an_upward_import(tmp_path: Path) -> None:
    """The checker itself: a driver module importing the scenario is reported."""
    module = tmp_path / "bad.py"
    module.write_text("def f():\n    from vmtests.scenario import checks\n")
    assert imported_parts(module) == [(2, "scenario")]
    assert "scenario" not in ALLOWED["driver"]
