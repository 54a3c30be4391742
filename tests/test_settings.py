"""README's table of environment variables against the code: every variable the code reads is in
the table with its default and meaning, the table lists nothing the code does not read, and only
the two registries (the suite's settings, the stub's knobs) name a variable as a key."""

from __future__ import annotations

import ast
import dataclasses
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from vmtests.contracts.settings import SHOWN_DEFAULT, VARIABLE, SettingError, Settings, settings

ROOT = Path(__file__).resolve().parents[1]
VARIABLE_NAME = re.compile(r"\b(?:VMTESTS_[A-Z0-9_]*[A-Z0-9]|NIXPKGS_LIB)\b")
"""A variable of the suite (``VMTESTS_STUB_``, a prefix, ends with ``_`` and is none)."""
REGISTRIES = ("vmtests/contracts/settings.py", "vmtests/stub/knobs.py")
TABLE_ROW = re.compile(
    r"^\| `(?P<variable>[A-Z0-9_]+)` \| (?P<reader>[^|]+) \| (?P<default>[^|]+) \|"
)


def code_files() -> list[Path]:
    """Everything that runs: the package, the scripts, CI, the flake and the Nix it imports
    (a ``builtins.getEnv`` there is a read too)."""
    return [
        *sorted((ROOT / "vmtests").rglob("*.py")),
        *sorted(path for path in (ROOT / "scripts").iterdir() if path.is_file()),
        ROOT / ".ci" / "run",
        ROOT / "flake.nix",
        *sorted(path for part in ("modules", "hosts") for path in (ROOT / part).rglob("*.nix")),
    ]


def variables_read(paths: Iterable[Path], root: Path = ROOT) -> dict[str, list[str]]:
    """Each variable named in ``paths``, with the files (relative to ``root``) that name it."""
    found: dict[str, list[str]] = {}
    for path in paths:
        for name in set(VARIABLE_NAME.findall(path.read_text(encoding="utf-8"))):
            found.setdefault(name, []).append(str(path.relative_to(root)))
    return found


def readme_table(text: str) -> dict[str, str]:
    """The README's rows of environment variables: variable -> its default cell."""
    section = text.split("## Environment variables", 1)[1].split("\n## ", 1)[0]
    return {
        match["variable"]: match["default"].strip()
        for match in map(TABLE_ROW.match, section.splitlines())
        if match is not None
    }


def undocumented(read: dict[str, list[str]], table: dict[str, str]) -> list[str]:
    """``variable (files)`` for every variable read that the table lacks."""
    return [
        f"{name} ({', '.join(files)})" for name, files in sorted(read.items()) if name not in table
    ]


README = readme_table((ROOT / "README.md").read_text(encoding="utf-8"))


def test_every_variable_the_code_reads_is_in_the_readme_table() -> None:
    assert undocumented(variables_read(code_files()), README) == []


def test_the_table_lists_only_variables_the_code_reads() -> None:
    assert sorted(set(README) - set(variables_read(code_files()))) == []


@pytest.mark.parametrize("declared", Settings.fields(), ids=lambda f: f.name)
def test_each_setting_is_in_the_table_with_its_declared_default(
    declared: dataclasses.Field[Any],
) -> None:
    assert README.get(declared.metadata[VARIABLE]) == declared.metadata[SHOWN_DEFAULT]


def _keys(path: Path) -> list[str]:
    """String constants that are exactly a variable's name (a key, not prose) in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
    }
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
        and VARIABLE_NAME.fullmatch(node.value)
    ]


def test_only_the_registries_name_a_variable_as_a_key() -> None:
    """A module that reads ``os.environ["VMTESTS_..."]`` itself bypasses the settings."""
    strays = {
        str(path.relative_to(ROOT)): keys
        for path in sorted((ROOT / "vmtests").rglob("*.py"))
        if str(path.relative_to(ROOT)) not in REGISTRIES and (keys := _keys(path))
    }
    assert strays == {}


def test_the_checks_catch_a_variable_read_behind_the_table_s_back(tmp_path: Path) -> None:
    module = tmp_path / "new.py"
    module.write_text('import os\nTIMEOUT = float(os.environ.get("VMTESTS_NEW_TIMEOUT", "5"))\n')
    read = variables_read([module], root=tmp_path)
    assert undocumented(read, README) == ["VMTESTS_NEW_TIMEOUT (new.py)"]
    assert _keys(module) == ["VMTESTS_NEW_TIMEOUT"]


def test_settings_come_from_the_environment_checked() -> None:
    assert settings({}) == Settings()
    chosen = settings(
        {"VMTESTS_ACCEL": " TCG ", "VMTESTS_CACHE_DIR": "~/cache", "VMTESTS_UNITS": ""}
    )
    assert chosen.accel == "tcg"
    assert chosen.cache_dir == Path.home() / "cache"
    assert chosen.units == "auto"  # empty: the default
    with pytest.raises(SettingError, match=r"the environment: accel \(\$VMTESTS_ACCEL\) is 'kv'"):
        settings({"VMTESTS_ACCEL": "kv"})


def test_values_from_elsewhere_are_layered_the_same_way() -> None:
    host = Settings().overridden({"reboot_mode": "reset"}, "hosts/example.yaml")
    assert host.reboot_mode == "reset"
    with pytest.raises(
        SettingError, match=r"hosts/example.yaml: unknown settings \['rebot_mode'\]"
    ):
        Settings().overridden({"rebot_mode": "reset"}, "hosts/example.yaml")
    with pytest.raises(SettingError, match=r"target query: units \(\$VMTESTS_UNITS\) is 'nix'"):
        Settings().overridden({"units": "nix"}, "target query")
