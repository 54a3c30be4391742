"""The tool manifest and the guest's resources: what a guest offers is the contract's, exactly.

Host-only tests: the tool directories built from a fake rootfs, the unit PATH rule of nixpkgs'
systemd-lib, the manifest covering every program the suite's own scripts run, the rc 127
message, and the hugepage reservation against the contract's memory.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import cast

import pytest

from vmtests.contracts import instrumentation as contract
from vmtests.contracts.instrumentation import GUEST_MEMORY_MB, GUEST_TOOLS
from vmtests.contracts.serving import POOL_SIZES, Hugepages
from vmtests.driver.errors import CommandFailed
from vmtests.driver.machine import CommandResult, Machine
from vmtests.driver.shell import REBOOT_COMMAND
from vmtests.guest import firewall, toolpath
from vmtests.guest.image import write_guest_description
from vmtests.guest.resources import check_hugepages_fit, required_memory_mb
from vmtests.profiles import available_profiles, load_profile
from vmtests.scenario.collection.collect import _SCRIPT as SNAPSHOT_SCRIPT
from vmtests.scenario.collection.collect import API_KEY_READ
from vmtests.scenario.install.generations import current_generation, record_unit_set
from vmtests.scenario.runner.preflight import _SCRIPT as PREFLIGHT_SCRIPT
from vmtests.scenario.runner.versions import VERSION_COMMANDS, versions_script

# Shell builtins and keywords of bash (and dash): never looked up on PATH.
BUILTINS = frozenset(
    {
        *("[", "cd", "command", "echo", "exec", "exit", "export", "false", "kill", "local"),
        *("printf", "read", "return", "set", "shift", "test", "trap", "true", "wait"),
        *("if", "then", "elif", "else", "fi", "for", "in", "do", "done", "while", "case"),
        *("esac", "break", "continue"),
    }
)


def _fake_rootfs(tmp_path: Path, skip: str = "") -> Path:
    """A rootfs whose dpkg lists and bin directories hold every manifest program."""
    rootfs = tmp_path / "rootfs"
    info = rootfs / "var/lib/dpkg/info"
    info.mkdir(parents=True)
    (rootfs / "usr/bin").mkdir(parents=True)
    (rootfs / "bin").mkdir()
    for debs in toolpath.DEBIAN_PACKAGES.values():
        for debian in debs:
            (info / f"{debian}.list").write_text("/usr\n/usr/bin\n")
    skipped = {*toolpath.NOT_ON_REFERENCE_GUEST, *toolpath.DEVICE_LAYER_PROGRAMS}
    programs = [p for p in GUEST_TOOLS if p not in skipped]
    for program in [*programs, "dpkg-query"]:
        if program != skip:
            (rootfs / "usr/bin" / program).write_text("#!/bin/sh\n")
    (info / "coreutils.list").write_text("/usr\n/usr/bin\n/usr/bin/cat\n/usr/bin/seq\n")
    (rootfs / "bin/bash").write_text("#!/bin/sh\n")
    return rootfs


def test_tools_dir_holds_exactly_the_manifest(tmp_path: Path) -> None:
    rootfs = _fake_rootfs(tmp_path)
    links = toolpath.populate(rootfs)
    tools = rootfs / toolpath.TOOLS_DIR.lstrip("/")
    present = {path.name for path in tools.iterdir()}
    expected = set(GUEST_TOOLS) - set(toolpath.NOT_ON_REFERENCE_GUEST)
    assert present == expected
    assert "dpkg-query" not in present  # in the image, not in the manifest: not on the PATH
    assert links["sh"] == "/bin/bash"  # bash plays sh, as in the NixOS backdoor
    assert links["cat"] == "/usr/bin/cat"
    # The device layer's program is linked where the stub layer installs it (not Debian's).
    assert links["tt-smi"] == "/usr/local/bin/tt-smi"
    # A package directory holds the whole package (like a store path's bin/).
    coreutils = rootfs / toolpath.PACKAGES_DIR.lstrip("/") / "coreutils/bin"
    assert {path.name for path in coreutils.iterdir()} == {"cat", "seq"}


def test_a_manifest_program_missing_from_the_image_fails_the_build(tmp_path: Path) -> None:
    rootfs = _fake_rootfs(tmp_path, skip="setsid")
    with pytest.raises(ValueError, match=r"setsid \(util-linux\)"):
        toolpath.populate(rootfs)


def test_every_manifest_package_has_a_debian_stand_in() -> None:
    for program, attribute in GUEST_TOOLS.items():
        assert (
            attribute in toolpath.DEBIAN_PACKAGES
            or program in toolpath.NOT_ON_REFERENCE_GUEST
            or program in toolpath.DEVICE_LAYER_PROGRAMS
        ), f"{program} ({attribute}) has no Debian package in toolpath.DEBIAN_PACKAGES"


def test_unit_path_is_the_units_path_then_systemd_libs_defaults() -> None:
    path = toolpath.unit_path(("docker",)).split(":")
    names = [entry.removeprefix(toolpath.PACKAGES_DIR + "/") for entry in path]
    packages = ["docker", "coreutils", "findutils", "gnugrep", "gnused", "systemd"]
    assert names == [f"{p}/bin" for p in packages] + [f"{p}/sbin" for p in packages]
    assert toolpath.unit_path().split(":")[0].endswith("/coreutils/bin")
    with pytest.raises(ValueError, match="no-such-package"):
        toolpath.unit_path(("no-such-package",))


def _command_words(script: str) -> set[str]:
    """Words in command position of a shell script (after ; | && || $( { ( and at line starts)."""
    words: set[str] = set()
    text = re.sub(r"'[^']*'", "''", script)  # quoted arguments are never commands
    text = re.sub(r"(^|\s)#.*", "", text)  # nor are comments
    for segment in re.split(r"\n|;|&&|\|\||\||\$\(|\(|\{\s|\bthen\b|\bdo\b|\belse\b", text):
        tokens = [t for t in segment.strip().split() if not re.match(r"^\w+=", t)]
        if tokens and re.fullmatch(r"[a-z][\w.+-]*", tokens[0]):
            words.add(tokens[0])
    return words


def test_the_manifest_covers_what_the_suites_scripts_run() -> None:
    used = _command_words(SNAPSHOT_SCRIPT) | _command_words(REBOOT_COMMAND)
    functions = set(re.findall(r"^(\w+)\(\) \{", SNAPSHOT_SCRIPT, re.MULTILINE))
    assert {"sec", "prop", "files"} <= functions
    used -= BUILTINS | functions  # the snapshot script's own shell functions
    # Run only when `command -v podman` finds it (the podman backend); guests run docker.
    used -= {"podman"}
    missing = sorted(program for program in used if program not in GUEST_TOOLS)
    assert missing == [], f"programs run in guests but missing from the tool manifest: {missing}"
    assert {"setsid", "systemctl", "journalctl", "curl", "ss", "docker"} <= used


class _Recorder:
    """A machine that answers every command with ``stdout`` (enough to record a generation)."""

    name = "guest"

    def __init__(self, stdout: str) -> None:
        self.stdout = stdout

    def execute(self, command: str, *args: object, timeout: float) -> CommandResult:
        return CommandResult(command, 0, self.stdout.encode(), b"")

    def succeed(self, command: str, *args: object, timeout: float) -> str:
        return self.stdout


def test_the_manifest_covers_the_rollbacks_and_the_preflight() -> None:
    """What a rollback (the reference guest's and NixOS's) and the preflight run in a guest."""
    store = "/nix/store/abc-nixos-system-x"
    nixos = current_generation(cast(Machine, _Recorder(f"{store}\nsystem-4-link\n{store}\n")))
    unit_set = record_unit_set(cast(Machine, _Recorder("0123456789abcdef\n")))
    preflight = PREFLIGHT_SCRIPT.replace("@POOL_SIZES@", POOL_SIZES).replace(
        "@VERSIONS@", versions_script()
    )
    used: set[str] = set()
    for script in (
        nixos.rollback_command, nixos.current_command, unit_set.rollback_command,
        unit_set.current_command, preflight, API_KEY_READ, *VERSION_COMMANDS.values(),
    ):  # fmt: skip
        used |= _command_words(script)
    used -= BUILTINS | {"sec", "version"}  # the preflight script's own functions
    # The NixOS system's own, which the preflight's version command looks for in
    # versions.NIXOS_SYSTEM_BIN, off the manifest.
    used -= {"nixos-version"}
    missing = sorted(program for program in used if program not in GUEST_TOOLS)
    assert missing == [], f"programs run in guests but missing from the tool manifest: {missing}"
    assert {"nix-env", "systemd-run", "systemctl", "tar", "sha256sum", "curl"} <= used


def test_rc_127_names_the_program_and_the_manifest() -> None:
    result = CommandResult("mytool --x", 127, b"", b"sh: line 1: mytool: command not found\n")
    error = CommandFailed(result)
    assert error.missing == ["mytool"]
    message = str(error)
    assert message.startswith("`mytool` not found on the machine's PATH")
    assert "tool manifest" in message
    assert "vmtests/contracts/instrumentation.json" in message
    dash = CommandFailed(CommandResult("ss", 127, b"", b"sh: 1: ss: not found\n"))
    assert dash.missing == ["ss"]
    other = CommandFailed(CommandResult("false", 1, b"", b""))
    assert "tool manifest" not in str(other)


def test_hugepages_of_every_profile_fit_in_the_contracts_memory() -> None:
    for name in available_profiles():
        profile = load_profile(name)
        if profile.hugepages is not None:
            check_hugepages_fit(profile.hugepages)


def test_hugepage_fit_fails_below_the_measured_minimum() -> None:
    # 2 x 1 GiB need 8192 MB (the measurements behind the rule: docs/ci-time.md).
    assert required_memory_mb(2, Hugepages(2, "1G").size_kib) == 8192
    with pytest.raises(ValueError, match=r"need 8192 MB .* has 6144 MB: raise resources.memoryMB"):
        check_hugepages_fit(Hugepages(2, "1G"), memory_mb=6144)
    check_hugepages_fit(Hugepages(2, "1G"), memory_mb=GUEST_MEMORY_MB)
    check_hugepages_fit(Hugepages(512, "2M"), memory_mb=4096)  # 2 MiB pages need no aligned GiB


def test_guest_description_names_the_contract_fields_with_their_values(tmp_path: Path) -> None:
    description = write_guest_description(tmp_path / "guest.json")
    written = json.loads((tmp_path / "guest.json").read_text())["contract_fields"]
    assert written == json.loads(json.dumps(description))
    data = json.loads(contract.CONTRACT_FILE.read_text())
    # Every field of the contract's data is named (the comment is not a field).
    assert {key.split(".")[0] for key in description} == set(data) - {"_comment"}
    assert description["kernelParams"] == list(contract.KERNEL_PARAMS)
    assert description["resources.memoryMB"] == data["resources"]["memoryMB"]
    tools = description["tools"]
    assert isinstance(tools, dict)
    assert tools["programs"] == sorted(data["tools"])


def test_the_firewall_rules_admit_exactly_the_configured_ports() -> None:
    rules = firewall.ruleset([8000, 22, 8000])
    assert "policy drop;" in rules
    assert "tcp dport { 22, 8000 } accept" in rules
    assert rules.startswith(f"table {firewall.TABLE} {{}}\ndelete table {firewall.TABLE}\n")
    assert "tcp dport" not in firewall.ruleset([])  # nothing admitted but lo and replies
    assert firewall.ruleset(None) == f"table {firewall.TABLE} {{}}\ndelete table {firewall.TABLE}\n"
    files = firewall.firewall_files([22])
    assert files[firewall.RULES_FILE] == firewall.ruleset([22])
    assert f"ExecStart={firewall.NFT} -f {firewall.RULES_FILE}" in next(
        text for path, text in files.items() if path.endswith(firewall.FIREWALL_UNIT)
    )
