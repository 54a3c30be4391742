"""The package's import arrows point down: a neutral contracts layer at the bottom, then the
driver, then guests and stub, then the scenario, with the CLI and the plugin on top.

Every import of a ``vmtests`` module, at any depth of a file (lazy imports included), must go
to a layer the importing layer may use. Inside the scenario the same holds between its groups
(``SCENARIO``): collection, then judgement, beside them the install step, then the controls and
the runner, and on top the prepared states. A new upward or sideways arrow fails here with the
file, the line and the rule it breaks.
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
    # The driver's figures, and the snapshots' against the same steps without them, which
    # need the scenario's deployment and controls.
    "bench": {"contracts", "driver", "guest", "stub", "nixcore", "profiles", "scenario"},
    "cli": {"*"},
    "pytest_plugin": {"*"},
    "__init__": set(),
}


# Which groups of ``vmtests.scenario`` each group may import (besides itself); every other part
# of the package may import any group (by the rules above).
SCENARIO: dict[str, set[str]] = {
    "collection": set(),
    "judgement": {"collection"},
    "install": set(),
    "controls": {"collection", "judgement", "install"},
    "runner": {"collection", "judgement", "install"},
    # The prepared states the scenario, the controls and the certification start from, and
    # the controls' guests restored in the state each one declares.
    "prepared": {"collection", "install", "controls"},
    "__init__": set(),
}


def part_of(path: Path) -> str:
    """The top-level part (``driver``, ``cli``, ...) a file of the package belongs to."""
    relative = path.relative_to(PACKAGE)
    return relative.parts[0] if len(relative.parts) > 1 else relative.stem


def group_of(path: Path) -> str:
    """The group of ``vmtests.scenario`` (``judgement``, ``controls``, ...) a file belongs to."""
    relative = path.relative_to(PACKAGE / "scenario")
    return relative.parts[0] if len(relative.parts) > 1 else relative.stem


def imported_modules(path: Path) -> list[tuple[int, list[str]]]:
    """(line, dotted name split at its dots) of every import in ``path``, lazy ones included.

    ``from a.b import c`` counts as ``a.b.c``: ``c`` may be a module of the package ``a.b``.
    """
    found: list[tuple[int, list[str]]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found.extend((node.lineno, name.split(".")) for name in names)
    return found


def imported_parts(path: Path) -> list[tuple[int, str]]:
    """(line, part) of every ``vmtests`` import in ``path``."""
    return [
        (line, parts[1])
        for line, parts in imported_modules(path)
        if parts[0] == "vmtests" and len(parts) > 1
    ]


def imported_groups(path: Path) -> list[tuple[int, str]]:
    """(line, group) of every ``vmtests.scenario`` import in ``path``."""
    return [
        (line, parts[2])
        for line, parts in imported_modules(path)
        if parts[:2] == ["vmtests", "scenario"] and len(parts) > 2
    ]


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


SCENARIO_SOURCES = sorted((PACKAGE / "scenario").rglob("*.py"))


def test_every_scenario_group_has_a_rule() -> None:
    groups = {group_of(path) for path in SCENARIO_SOURCES}
    assert groups == set(SCENARIO), f"groups without a rule: {sorted(groups - set(SCENARIO))}"


@pytest.mark.parametrize(
    "path", SCENARIO_SOURCES, ids=lambda path: str(path.relative_to(PACKAGE / "scenario"))
)
def test_scenario_groups_import_down(path: Path) -> None:
    group = group_of(path)
    wrong = [
        f"{path.relative_to(PACKAGE)}:{line} imports vmtests.scenario.{target}"
        for line, target in imported_groups(path)
        if target != group and target not in SCENARIO[group]
    ]
    assert not wrong, f"scenario.{group} may import only {sorted(SCENARIO[group])}:\n" + "\n".join(
        wrong
    )


def test_the_rule_catches_an_upward_import(tmp_path: Path) -> None:
    """The checker itself: a driver module importing the scenario is reported."""
    module = tmp_path / "bad.py"
    module.write_text("def f():\n    from vmtests.scenario import checks\n")
    assert imported_parts(module) == [(2, "scenario")]
    assert "scenario" not in ALLOWED["driver"]
    # Inside the scenario: a check that imports the controls is reported.
    module.write_text("from vmtests.scenario.controls.catalogue import CONTROLS\n")
    assert imported_groups(module) == [(1, "controls")]
    assert "controls" not in SCENARIO["judgement"]
