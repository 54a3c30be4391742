"""The snapshot script itself, run by the host's ``sh`` against a fake ``systemctl``.

The fake answers ``show -p`` and ``show-environment`` from a table, the way systemd prints
them (one ``NAME=value`` line per value), and logs every call, so these tests see what the
script asks systemd and what it makes of the answers without a guest. The guest tests run the
same script against real systemd.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vmtests.contracts.findings import Check, Reason
from vmtests.contracts.serving import API_KEY_VARIABLE
from vmtests.guest.local_stub import LocalStubServer
from vmtests.scenario.collection.collect import parse_snapshot, snapshot_command
from vmtests.scenario.collection.snapshot import Snapshot
from vmtests.scenario.judgement.checks import check_service
from vmtests.stub import knobs
from vmtests.tt_smi_parse import parse_snapshot as parse_tt_smi

UNIT = "tenstorrent-serving.service"
HUGEPAGES = "tenstorrent-hugepages.service"
SECRET = "hf_not_in_the_clear"

FAKE_SYSTEMCTL = """#!{python}
import json, sys
table = json.load(open({table!r}))
with open({calls!r}, "a") as log:
    log.write(" ".join(sys.argv[1:]) + "\\n")
args = sys.argv[1:]
if args == ["show-environment"]:
    print("LANG=C.UTF-8")
    sys.exit(0)
assert args[0] == "show" and args[1] == "-p" and "--value" not in args, args
names, unit = args[2].split(","), args[3]
for name in names:
    values = table.get(unit, {{}}).get(name, [""])
    for value in values if isinstance(values, list) else [values]:
        print(f"{{name}}={{value}}")
"""


def _machine(tmp_path: Path) -> tuple[dict[str, dict[str, object]], Path]:
    """Unit files, scripts and the fake systemctl's table under ``tmp_path``."""
    fragment = tmp_path / "tenstorrent-serving.service"
    fragment.write_text("[Service]\nExecStart=/bin/true\n")
    drop_in = tmp_path / "50-extra.conf"
    drop_in.write_text("[Service]\nCPUWeight=50\n")
    flags = tmp_path / "flags.env"
    flags.write_text("SERVE_FLAGS=--max-model-len 8192\n")
    env_file = tmp_path / "serving.env"
    env_file.write_text("TT_MODE=p150\n")
    container_env = tmp_path / "container.env"
    container_env.write_text("QWEN36_SDPA_STREAMING=1\n")
    pre_start = tmp_path / "pre-start"
    pre_start.write_text(f"#!/bin/sh\n. {flags}\nexit 0\n")
    start = tmp_path / "start"
    start.write_text("#!/bin/sh\nexec docker run --rm tenstorrent-serving\n")
    hugepage_fragment = tmp_path / "tenstorrent-hugepages.service"
    hugepage_fragment.write_text("[Service]\nType=oneshot\n")
    table: dict[str, dict[str, object]] = {
        UNIT: {
            "ActiveState": "active",
            "MainPID": str(os.getpid()),
            "FragmentPath": str(fragment),
            "DropInPaths": f"{drop_in} {tmp_path}/missing.conf",
            "Environment": f'PYTHONPATH=/opt/vmtests "HF_TOKEN={SECRET}"',
            "EnvironmentFiles": [f"{env_file} (ignore_errors=no)"],
            "ExecStartPre": [f"{{ path={pre_start} ; argv[]={pre_start} ; ignore_errors=no }}"],
            "ExecStart": [
                f"{{ path={start} ; argv[]={start} --env-file={container_env} ; ignore_errors=no }}"
            ],
        },
        HUGEPAGES: {
            "LoadState": "loaded",
            "UnitFileState": "enabled",
            "FragmentPath": str(hugepage_fragment),
            "DropInPaths": "",
        },
    }
    return table, fragment


def _run(
    tmp_path: Path,
    table: dict[str, dict[str, object]],
    port: int = 8000,
    api_key_file: str | None = None,
    sysctl_dir: Path | None = None,
    *,
    card: bool = False,
) -> tuple[Snapshot, str, list[str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (tmp_path / "table.json").write_text(json.dumps(table))
    calls = tmp_path / "calls.log"
    fake = bin_dir / "systemctl"
    fake.write_text(
        FAKE_SYSTEMCTL.format(
            python=sys.executable, table=str(tmp_path / "table.json"), calls=str(calls)
        )
    )
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}
    script = snapshot_command(UNIT, port, HUGEPAGES, None, card=card, api_key_file=api_key_file)
    if sysctl_dir is not None:
        assert script.count(" /etc/sysctl.d ") == 1, "the script reads /etc/sysctl.d elsewhere"
        script = script.replace(" /etc/sysctl.d ", f" {sysctl_dir} ")
    done = subprocess.run(
        ["sh", "-c", script],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    snapshot = parse_snapshot(done.stdout, "S1", port)
    snapshot.api_key_file = api_key_file or ""
    return snapshot, done.stdout, calls.read_text().splitlines()


@pytest.fixture
def collected(tmp_path: Path) -> tuple[Snapshot, str, list[str], Path]:
    table, fragment = _machine(tmp_path)
    return (*_run(tmp_path, table), fragment)


FAKE_TT_SMI = """#!/bin/sh
# tt-smi lists itself among the card's processes: it opened the card for this snapshot.
printf '{"time": "t", "host_info": {"Driver": "TT-KMD 2.10.0"}, "host_sw_vers": {}, '
printf '"device_info": [], "processes": [{"pid": %s, "device": 0, "cmdline": "tt-smi -s"}, ' $$
printf '{"pid": 48213, "device": 0, "cmdline": "python3 -m vllm"}]}\\n'
"""


def test_the_snapshot_knows_tt_smis_own_pid(tmp_path: Path) -> None:
    """The snapshot's tt-smi says which pid it runs as, through ``timeout``, ``sh -c`` and its
    own ``exec``; only the other processes hold the card."""
    table, _ = _machine(tmp_path)
    (tmp_path / "bin").mkdir()
    fake = tmp_path / "bin" / "tt-smi"
    fake.write_text(FAKE_TT_SMI)
    fake.chmod(0o755)
    snapshot, _, _ = _run(tmp_path, table, card=True)
    assert snapshot.tt_smi.status == 0, snapshot.tt_smi
    card = parse_tt_smi(snapshot.tt_smi.body)
    assert card.own_pid is not None
    assert [p.pid for p in card.processes or []] == [card.own_pid, 48213]
    assert card.holders(0) == [48213]


def test_systemd_is_asked_once_per_unit(collected: tuple[Snapshot, str, list[str], Path]) -> None:
    _, _, calls, _ = collected
    shows = [call for call in calls if call.startswith("show -p")]
    assert [call.split()[-1] for call in shows] == [UNIT, HUGEPAGES]
    assert calls.count("show-environment") == 1
    assert len(calls) == 3


def test_unit_properties_files_and_environment(
    collected: tuple[Snapshot, str, list[str], Path],
) -> None:
    snapshot, output, _, fragment = collected
    unit = snapshot.unit
    assert unit.active_state == "active"
    assert unit.main_pid == os.getpid()
    assert "Environment" not in unit.properties  # only base64, then redacted
    assert SECRET not in output
    assert unit.environment["PYTHONPATH"] == "/opt/vmtests"
    assert unit.environment["HF_TOKEN"] != SECRET
    assert unit.files[str(fragment)] == "[Service]\nExecStart=/bin/true\n"
    assert len(unit.files) == 2  # the fragment and the drop-in that exists
    assert snapshot.server is not None
    assert snapshot.server.pid == os.getpid()
    assert snapshot.tt_smi.status is None
    assert "without the card" in snapshot.tt_smi.error


def test_every_file_the_unit_reads_is_collected(
    collected: tuple[Snapshot, str, list[str], Path], tmp_path: Path
) -> None:
    snapshot, _, _, _ = collected
    sources = snapshot.unit.sources
    assert sources[str(tmp_path / "serving.env")] == "TT_MODE=p150\n"  # EnvironmentFile=
    assert str(tmp_path / "pre-start") in sources  # an ExecStartPre script
    assert sources[str(tmp_path / "flags.env")].startswith("SERVE_FLAGS=")  # what it sources
    assert sources[str(tmp_path / "container.env")] == "QWEN36_SDPA_STREAMING=1\n"  # --env-file
    start = snapshot.start_script
    assert list(start) == [str(tmp_path / "start")]


def test_the_hugepage_unit_comes_from_its_own_show(
    collected: tuple[Snapshot, str, list[str], Path], tmp_path: Path
) -> None:
    snapshot, _, _, _ = collected
    hugepage_unit = snapshot.hugepages.unit
    assert hugepage_unit.prop("UnitFileState") == "enabled"
    assert list(hugepage_unit.files) == [str(tmp_path / "tenstorrent-hugepages.service")]


def test_a_sysctl_file_that_is_a_symlink_is_read(tmp_path: Path) -> None:
    """On NixOS /etc/sysctl.d/60-nixos.conf is a symlink into /etc/static (nixpkgs
    nixos/modules/system/etc/setup-etc.pl): its nr_hugepages counts as reserved at boot."""
    static = tmp_path / "static" / "sysctl.d"
    static.mkdir(parents=True)
    (static / "60-nixos.conf").write_text("kernel.poweroff_delay=1\nvm.nr_hugepages=2\n")
    sysctl_dir = tmp_path / "etc" / "sysctl.d"
    sysctl_dir.mkdir(parents=True)
    (sysctl_dir / "60-nixos.conf").symlink_to(static / "60-nixos.conf")
    table, _ = _machine(tmp_path)
    snapshot, _, _ = _run(tmp_path, table, sysctl_dir=sysctl_dir)
    assert snapshot.hugepages.sysctl_lines == [f"{sysctl_dir}/60-nixos.conf:vm.nr_hugepages=2"]


def test_v1_requests_carry_the_api_key_from_its_file(tmp_path: Path) -> None:
    """Against a stub that wants a key: without the file, /v1/models gives 401 and the check
    says what to do; with an environment file or a bare key file it passes; the key never
    appears in what the script prints."""
    key = "sk-test-0123456789"
    table, _ = _machine(tmp_path)
    env_file = tmp_path / "vllm.env"
    env_file.write_text(f"OTHER=1\n{API_KEY_VARIABLE}={key}\n")
    bare = tmp_path / "api-key"
    bare.write_text(key + "\n")
    args = ["--model", "/models/qwen36", "--served-model-name", "qwen36"]
    env = {API_KEY_VARIABLE: key, knobs.DEVICES: "/dev/null", knobs.TIME_SCALE: "0.002"}
    server = LocalStubServer(args, env)
    with server:
        server.wait_ready(30)
        without, _, _ = _run(tmp_path, table, server.port)
        results = {
            name: _run(tmp_path, table, server.port, str(path))
            for name, path in (("env", env_file), ("bare", bare), ("missing", tmp_path / "nope"))
        }
    assert without.health.status == 200  # /health is open
    models = [r for r in check_service(without) if r.check == Check.SERVICE_MODELS]
    assert models[0].reason == Reason.UNAUTHORIZED
    assert "401 Unauthorized: the server requires an API key" in models[0].message
    assert "the setting api_key_file" in models[0].message
    for name in ("env", "bare"):
        snapshot, output, _ = results[name]
        assert snapshot.models.status == 200, (name, snapshot.models)
        assert snapshot.errors == [], snapshot.errors
        assert key not in output
    missing, _, _ = results["missing"]
    assert missing.models.status == 401
    assert any("API key file" in error for error in missing.errors)
    refused = next(r for r in check_service(missing) if r.check == Check.SERVICE_MODELS)
    assert refused.reason == Reason.UNAUTHORIZED
    assert "with the API key in" in refused.message
