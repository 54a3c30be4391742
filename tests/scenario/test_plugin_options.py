"""The pytest plugin's options: hw tests never run without explicit opt-in; nightly tests only
with --nightly; profile fixture; the host's settings as ``vmtests run`` takes them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import vmtests
from vmtests.guest import REFERENCE_TARGET
from vmtests.pytest_plugin import SHARED_GUEST_SECONDS

CHECKOUT = Path(vmtests.__file__).resolve().parents[1]
"""The checkout under test: the pytest runs below load its plugin, not an installed copy."""

HW_TEST = """
import pytest

from vmtests.pytest_plugin import SHARED_GUEST_SECONDS

@pytest.mark.hw
def test_touches_hardware():
    assert False, "reached the hardware test"

def test_profile_fixture(vmtests_profile, vmtests_target):
    assert vmtests_profile.name == "resident"
    assert vmtests_target
"""


def _checkout_first() -> dict[str, str]:
    """The environment, with the checkout under test first on the module path."""
    paths = [str(CHECKOUT), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, paths))}


def _run_pytest(cwd: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *arguments],
        cwd=cwd,
        env=_checkout_first(),
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def _pytest(tmp_path: Path, *options: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_hw.py").write_text(HW_TEST)
    return _run_pytest(
        tmp_path, "-rs", "--profile", "resident", *options, str(tmp_path / "test_hw.py")
    )


def test_hw_is_skipped_without_opt_in(tmp_path: Path) -> None:
    result = _pytest(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed, 1 skipped" in result.stdout
    assert "needs --target ssh://user@host AND --hw-opt-in" in result.stdout


def test_hw_is_skipped_with_opt_in_but_no_ssh_target(tmp_path: Path) -> None:
    result = _pytest(tmp_path, "--hw-opt-in", "--target", REFERENCE_TARGET)
    assert "1 passed, 1 skipped" in result.stdout, result.stdout + result.stderr


def test_hw_runs_only_with_opt_in_and_ssh_target(tmp_path: Path) -> None:
    result = _pytest(tmp_path, "--hw-opt-in", "--target", "ssh://nobody@127.0.0.1:1")
    assert "reached the hardware test" in result.stdout, result.stdout + result.stderr
    assert "1 failed, 1 passed" in result.stdout
    assert "vmtests: kept guests" not in result.stdout  # a failed test keeps only when asked


NIGHTLY_TEST = """
import pytest

@pytest.mark.nightly
def test_long():
    assert False, "reached the nightly test"

def test_short():
    pass
"""


def _nightly(tmp_path: Path, *options: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_tiers.py").write_text(NIGHTLY_TEST)
    return _run_pytest(tmp_path, "-rs", *options, str(tmp_path / "test_tiers.py"))


def test_nightly_tests_are_skipped_by_default_saying_how_to_run_them(tmp_path: Path) -> None:
    result = _nightly(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed, 1 skipped" in result.stdout
    assert "nightly tier" in result.stdout
    assert "--nightly" in result.stdout


def test_nightly_tests_run_with_the_option(tmp_path: Path) -> None:
    result = _nightly(tmp_path, "--nightly")
    assert "reached the nightly test" in result.stdout, result.stdout + result.stderr
    assert "1 failed, 1 passed" in result.stdout


SETTINGS_TEST = """
def test_the_hosts_settings(vmtests_settings, vmtests_machine):
    assert vmtests_settings.ready_timeout == 1234
    assert vmtests_settings.origin("ready_timeout") == "--host-config {config}"
    assert vmtests_settings.reboot_timeout == 777
    assert vmtests_settings.origin("reboot_timeout") == "target option"
    assert vmtests_settings.switch_timeout == 1800  # a real host's default on ssh://
    assert (vmtests_machine.host, vmtests_machine.port) == ("127.0.0.1", 1)
    assert str(vmtests_machine.identity_file) == "/root/.ssh/vmtests"
    assert vmtests_machine.connect_timeout == 7
"""


def test_the_hosts_settings_reach_the_fixtures_as_vmtests_run_takes_them(tmp_path: Path) -> None:
    """A real host's timeouts and ssh options, from --host-config and the target's options:
    without them the hardware tier would wait as long as for the reference guest's stub."""
    config = tmp_path / "host.yaml"
    config.write_text("ready_timeout: 1234\nidentity_file: /root/.ssh/vmtests\n")
    (tmp_path / "test_settings.py").write_text(SETTINGS_TEST.format(config=config))
    target = "ssh://nobody@127.0.0.1:1?reboot_timeout=777&connect_timeout=7"
    result = _run_pytest(
        tmp_path, "--hw-opt-in", "--target", target, "--host-config", str(config),
        str(tmp_path / "test_settings.py"),
    )  # fmt: skip
    assert "1 passed" in result.stdout, result.stdout + result.stderr


@pytest.mark.parametrize("name", ["no-such-profile"])
def test_missing_profile_is_a_usage_error(tmp_path: Path, name: str) -> None:
    (tmp_path / "test_p.py").write_text("def test_p(vmtests_profile):\n    pass\n")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--profile",
            name,
            str(tmp_path / "test_p.py"),
        ],
        cwd=tmp_path,
        env=_checkout_first(),
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert result.returncode != 0
    assert "no such profile file" in result.stdout + result.stderr


def _collected(tmp_path: Path, modules: dict[str, str]) -> list[str]:
    """The node IDs ``--collect-only`` lists for ``{file name: source}``, in order."""
    for name, source in modules.items():
        (tmp_path / name).write_text(source)
    result = _run_pytest(tmp_path, "--collect-only", "-n", "0")
    collected = [line for line in result.stdout.splitlines() if "::" in line]
    assert collected, result.stdout + result.stderr
    return collected


def _weighted(seconds: float, body: str, group: str | None = None) -> str:
    """A test module with ``guest_seconds`` (and an xdist group, as a VM module gets one)."""
    marks = [f"pytest.mark.guest_seconds({seconds})"]
    if group:
        marks.append(f"pytest.mark.xdist_group({group!r})")
    return f"import pytest\npytestmark = [{', '.join(marks)}]\n{body}"


ONE_TEST = "def test_one():\n    pass\n"
TWO_TESTS = ONE_TEST + "\ndef test_two():\n    pass\n"


def test_heaviest_guest_groups_are_collected_first(tmp_path: Path) -> None:
    collected = _collected(
        tmp_path,
        {
            "test_a_plain.py": "def test_plain():\n    pass\n",
            "test_b_light.py": _weighted(10, TWO_TESTS, "light"),
            "test_c_heavy.py": _weighted(900, TWO_TESTS, "heavy"),
        },
    )
    assert collected == [
        "test_c_heavy.py::test_one",
        "test_c_heavy.py::test_two",
        "test_b_light.py::test_one",
        "test_b_light.py::test_two",
        "test_a_plain.py::test_plain",
    ]


def test_weighted_single_test_groups_go_before_all_other_groups(tmp_path: Path) -> None:
    collected = _collected(
        tmp_path,
        {
            "test_a_plain.py": "def test_plain():\n    pass\n",
            "test_b_single.py": _weighted(10, ONE_TEST),
            "test_c_heavy.py": _weighted(900, TWO_TESTS, "heavy"),
            "test_d_single.py": _weighted(20, ONE_TEST),
        },
    )
    assert collected == [
        "test_d_single.py::test_one",
        "test_b_single.py::test_one",
        "test_c_heavy.py::test_one",
        "test_c_heavy.py::test_two",
        "test_a_plain.py::test_plain",
    ]


def test_the_shared_guest_group_is_weighted_between_heavy_and_light_groups(tmp_path: Path) -> None:
    shared = "def test_one(shared_reference_guest):\n    pass\n\n"
    collected = _collected(
        tmp_path,
        {
            "test_a_plain.py": "def test_plain():\n    pass\n",
            "test_b_light.py": _weighted(SHARED_GUEST_SECONDS - 1, TWO_TESTS, "light"),
            "test_c_shared.py": shared + "def test_two(shared_reference_guest):\n    pass\n",
            "test_d_heavy.py": _weighted(SHARED_GUEST_SECONDS + 1, TWO_TESTS, "heavy"),
        },
    )
    assert collected == [
        "test_d_heavy.py::test_one",
        "test_d_heavy.py::test_two",
        "test_c_shared.py::test_one",
        "test_c_shared.py::test_two",
        "test_b_light.py::test_one",
        "test_b_light.py::test_two",
        "test_a_plain.py::test_plain",
    ]


KEEP_TEST = """
import pytest

from vmtests.pytest_plugin import used_by_a_failed_test

@pytest.fixture
def verdict(request):
    yield
    path = request.config.rootpath / f"{request.node.name}.verdict"
    path.write_text(str(used_by_a_failed_test(request)))

def test_fails(vmtests_machine, verdict):
    assert False, "fails on purpose"

def test_passes(verdict):
    pass
"""


def test_a_failed_tests_machine_is_kept_and_the_summary_says_how_to_reach_it(
    tmp_path: Path,
) -> None:
    """--vmtests-keep: the fixtures learn which test failed (a session fixture: whether any
    test that used it did) and the keep's lines reach the summary from the xdist worker that
    tore the machine down. A host over ssh is never kept: its line is the ssh command."""
    (tmp_path / "test_keep.py").write_text(KEEP_TEST)
    target = "ssh://nobody@127.0.0.1:1"
    result = _run_pytest(
        tmp_path, "-n", "1", "--vmtests-keep", "--hw-opt-in", "--target", target,
        str(tmp_path / "test_keep.py"),
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert "1 failed, 1 passed" in result.stdout, output
    assert (tmp_path / "test_fails.verdict").read_text() == "True"
    assert (tmp_path / "test_passes.verdict").read_text() == "False"
    (summary,) = [line for line in result.stdout.splitlines() if "vmtests: kept guests" in line]
    after = result.stdout.split(summary, 1)[1].splitlines()
    assert after[1].startswith(f"not kept: {target} is a real host; reach it with: ssh "), output
    assert after[1].endswith(" nobody@127.0.0.1"), output
