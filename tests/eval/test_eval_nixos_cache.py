"""The on-disk cache of the full NixOS evaluation: keyed by everything the evaluation reads."""

from __future__ import annotations

from pathlib import Path

import pytest

from vmtests import nixos_eval
from vmtests.nixos_eval import Environment, disk_cache_key, source_digest


def _checkout(root: Path) -> Path:
    (root / "modules").mkdir(parents=True)
    (root / "modules" / "a.nix").write_text("{ }\n")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref: main\n")
    return root


def test_the_source_digest_follows_the_flake_source(tmp_path: Path) -> None:
    root = _checkout(tmp_path / "repo")
    before = source_digest(root)
    (root / ".git" / "HEAD").write_text("ref: other\n")  # outside the flake's source
    (root / "__pycache__").mkdir()
    (root / "__pycache__" / "x.pyc").write_bytes(b"\0")
    assert source_digest(root) == before
    (root / "modules" / "a.nix").write_text("{ x = 1; }\n")
    assert source_digest(root) != before
    (root / "modules" / "a.nix").write_text("{ }\n")
    (root / "notes.txt").write_text("an untracked file is in the source too\n")
    assert source_digest(root) != before


def test_the_key_names_the_tree_and_refuses_an_unstamped_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(nixos_eval, "source_digest", lambda root=None: "source")
    tree = tmp_path / "nixpkgs"
    tree.mkdir()
    environment = Environment(tree=tree, shim=True, chroot=None)
    assert disk_cache_key(environment, "expr") is None  # $VMTESTS_NIXPKGS without a stamp
    (tree / ".vmtests-ready").write_text("commit-1\n")
    first = disk_cache_key(environment, "expr")
    assert first is not None
    assert disk_cache_key(environment, "other expr") != first
    (tree / ".vmtests-ready").write_text("commit-2\n")
    assert disk_cache_key(environment, "expr") != first
    flake_input = Environment(tree=None, shim=False, chroot=None)
    assert disk_cache_key(flake_input, "expr") is not None  # flake.lock is in the source


def test_an_evaluation_is_run_once_and_then_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VMTESTS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(nixos_eval, "disk_cache_key", lambda environment, expr: "k")
    calls: list[str] = []

    def fake_run_nix(environment: Environment, expr: str) -> dict[str, object]:
        calls.append(expr)
        return {"configurations": {}, "warnings": []}

    monkeypatch.setattr(nixos_eval, "run_nix", fake_run_nix)
    environment = Environment(tree=None, shim=False, chroot=None)
    assert nixos_eval.cached_run_nix(environment, "e") == {"configurations": {}, "warnings": []}
    assert nixos_eval.cached_run_nix(environment, "e") == {"configurations": {}, "warnings": []}
    assert calls == ["e"]
    assert (tmp_path / "cache" / "nixos-eval" / "k.json").is_file()
