"""``vmtests cache-key``: the digests and directories of the image cache, computed without
building, are the ones the suite builds into; a key given on standard input keeps the guest's
digest from one empty machine to the next."""

from __future__ import annotations

import io
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from vmtests.cli import main
from vmtests.contracts.status import ExitStatus
from vmtests.guest import build_cache, image, stub_image


def cache_key(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    *args: str,
    stdin: str | None = None,
) -> dict[str, str]:
    """Run ``vmtests cache-key`` and return its ``name=value`` lines as a dict."""
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    assert main(["cache-key", *args]) == ExitStatus.OK
    lines = capsys.readouterr().out.splitlines()
    return dict(line.split("=", 1) for line in lines)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cache directory for the suite, as on a fresh CI runner."""
    directory = tmp_path / "cache"
    monkeypatch.setenv("VMTESTS_CACHE_DIR", str(directory))
    return directory


def fake_builds(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Make both images "build" instantly, through the real ``cached_build`` (so the digest and
    directory are the suite's own); return the directories built into, in order."""
    built: list[Path] = []

    def cached_build(
        builds: Path, digest: str, what: str, build: Callable[[Path], dict[str, Any]]
    ) -> tuple[Path, dict[str, Any]]:
        def fake(directory: Path) -> dict[str, Any]:
            for name in ("vmlinuz", "initrd.img", "disk.raw", stub_image.ARCHIVE_NAME):
                (directory / name).write_text("")
            return {"append": "", "image": stub_image.IMAGE, "digest": "", "archive_sha256": ""}

        built.append(builds / digest)
        return build_cache.cached_build(builds, digest, what, fake)

    monkeypatch.setattr(image, "cached_build", cached_build)
    monkeypatch.setattr(stub_image, "cached_build", cached_build)
    return built


def test_cache_key_names_the_directories_the_suite_builds_into(
    cache: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    before = cache_key(capsys, monkeypatch)
    assert before["guest-image-built"] == before["stub-image-built"] == "false"
    built = fake_builds(monkeypatch)
    guest, stub = image.reference_image(), stub_image.stub_image()
    assert built == [guest.directory, stub.archive.parent]
    assert Path(before["guest-image-path"]) == guest.directory
    assert Path(before["stub-image-path"]) == stub.archive.parent
    assert guest.directory.name == before["guest-image"]
    assert stub.archive.parent.name == before["stub-image"]
    assert guest.directory.is_relative_to(cache)
    assert stub.archive.is_relative_to(cache)
    after = cache_key(capsys, monkeypatch)
    assert after == {**before, "guest-image-built": "true", "stub-image-built": "true"}


def test_a_given_ssh_key_keeps_the_guest_digest_from_one_empty_machine_to_the_next(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = tmp_path / "secret"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "ci", "-f", str(secret)], check=True
    )
    digests = []
    for machine in ("first", "second", "without-the-key"):
        monkeypatch.setenv("VMTESTS_CACHE_DIR", str(tmp_path / machine))
        given = "" if machine == "without-the-key" else secret.read_text()
        digests.append(cache_key(capsys, monkeypatch, "--ssh-key-stdin", stdin=given))
    first, second, without = digests
    assert first == {
        **second,
        "guest-image-path": first["guest-image-path"],
        "stub-image-path": first["stub-image-path"],
    }
    assert without["guest-image"] != first["guest-image"]  # a fresh key: a fresh digest
    assert without["stub-image"] == first["stub-image"]  # the stub image has no key in it
    monkeypatch.setenv("VMTESTS_CACHE_DIR", str(tmp_path / "first"))
    installed = image.suite_ssh_key()  # the installed key is used, not replaced
    assert installed.read_text() == secret.read_text()
    assert stat.S_IMODE(installed.stat().st_mode) == 0o600
    public = Path(f"{secret}.pub").read_text().split()[:2]
    assert image.public_key_of(installed).split()[:2] == public


def test_a_key_that_is_no_key_is_refused_and_not_installed(
    cache: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("not a key\n"))
    assert main(["cache-key", "--ssh-key-stdin"]) == ExitStatus.INCOMPLETE
    error = capsys.readouterr().err
    assert "not a private key" in error
    assert "not a key" not in error.replace("not a private key", "")  # the input is not echoed
    assert not image.suite_ssh_key_path().exists()
    assert not list(image.suite_ssh_key_path().parent.glob("tmp-*"))
