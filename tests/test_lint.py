"""Lint and type checks run as part of the test command, so CI and developers run the same."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


# Each test folder is its own import root (pytest's rootdir-relative imports of *_support
# modules, one conftest per folder), so mypy checks each folder with it as MYPYPATH.
TEST_FOLDERS = sorted(path.name for path in (ROOT / "tests").iterdir() if path.is_dir())
TEST_FOLDERS = [name for name in TEST_FOLDERS if not name.startswith((".", "__"))]
CHECKS = {
    "ruff-check": (["ruff", "check", "."], ""),
    "ruff-format": (["ruff", "format", "--check", "."], ""),
    "mypy-strict": ([sys.executable, "-m", "mypy"], ""),
    "mypy-tests": (
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            *sorted(str(path.relative_to(ROOT)) for path in (ROOT / "tests").glob("*.py")),
        ],
        "tests",
    ),
    **{
        f"mypy-tests-{name}": (
            [sys.executable, "-m", "mypy", "--strict", f"tests/{name}"],
            f"tests/{name}",
        )
        for name in TEST_FOLDERS
    },
}


@pytest.mark.parametrize("check", sorted(CHECKS))
def test_static_checks(check: str) -> None:
    command, mypy_path = CHECKS[check]
    if command[0] == "ruff" and shutil.which("ruff") is None:
        pytest.fail("ruff is not installed; install the dev extras: pip install -e '.[dev]'")
    if command[1:3] == ["-m", "mypy"]:
        # One cache per check: xdist runs the checks at once, and mypy processes sharing one
        # cold cache directory crash with an INTERNAL ERROR (seen with mypy 2.4.1).
        command = [*command, "--cache-dir", f".mypy_cache/{check}"]
    env = {**os.environ, "MYPYPATH": mypy_path} if mypy_path else None
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False, env=env)
    assert result.returncode == 0, f"{' '.join(command)} failed:\n{result.stdout}{result.stderr}"
