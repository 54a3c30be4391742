"""The one Nix runner (vmtests.nixrun): Python values come back from Nix as they went in, every
failure is a ``NixError`` with Nix's own words, and the chroot is entered with its binds."""

from __future__ import annotations

from pathlib import Path

import pytest

from vmtests.contracts.paths import REPO_ROOT
from vmtests.nixrun import Nix, NixError, evaluate, evaluate_json, nix_value

pytestmark = pytest.mark.nix

VALUES: list[object] = [
    None,
    True,
    0,
    -3,
    60,
    1.5,
    "plain",
    'quote " backslash \\ ${not interpolated}',
    ["a", 1, [2, None]],
    {"count": 2, "size": "1G", "nested": {"on": False}},
]


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_a_value_comes_back_from_nix_unchanged(value: object) -> None:
    assert evaluate_json(nix_value(value)) == value


def test_a_tuple_is_a_list_and_a_path_is_a_nix_path() -> None:
    assert evaluate_json(nix_value(("x", 1))) == ["x", 1]
    core = REPO_ROOT / "modules" / "serving" / "core.nix"
    assert evaluate_json(f"builtins.typeOf {nix_value(core)}") == "path"
    assert evaluate_json(f"toString {nix_value(core)}") == str(core)
    # A path inside the chroot is rendered as written, never resolved on the host.
    assert nix_value(Path("/src/tests")) == '(/. + "/src/tests")'


def test_an_unrenderable_value_is_refused() -> None:
    with pytest.raises(TypeError, match="cannot render set"):
        nix_value({1, 2})


def test_a_failed_evaluation_carries_nix_s_message() -> None:
    with pytest.raises(NixError, match=r"(?s)rc=1; the host's Nix.*--- stderr ---.*boom"):
        evaluate_json('throw "boom"')


def test_warnings_are_kept_apart_from_the_value() -> None:
    # What nixpkgs' lib.warn prints (lib/trivial.nix) where Nix has no builtins.warn.
    evaluation = evaluate('builtins.trace "evaluation warning: careful" 1')
    assert evaluation.value == 1
    assert evaluation.warnings == ["careful"]


def test_the_chroot_command_binds_each_directory_then_runs_nix_inside() -> None:
    nix = Nix(
        Path("/cache/nix-chroot"), ((Path("/trees/nixpkgs"), "/nixpkgs"), (REPO_ROOT, "/src"))
    )
    command = nix.command("1")
    assert command[:4] == ["unshare", "--mount", "--propagation", "private"]
    separator = command.index("--")
    assert command[command.index("/cache/nix-chroot") + 1 : separator] == [
        "/trees/nixpkgs",
        "/nixpkgs",
        str(REPO_ROOT),
        "/src",
    ]
    assert command[separator + 1 :] == [
        "nix-instantiate",
        "--eval",
        "--strict",
        "--json",
        "-E",
        "1",
    ]
    assert "experimental-features" in Nix(flakes=True).command("1")
    assert nix.describe() == "chroot /cache/nix-chroot"
