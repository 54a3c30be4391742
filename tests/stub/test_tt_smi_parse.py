"""vmtests/tt_smi_parse.py (and tests/stub/tt_smi_list.py for ``-ls``) on real tt-smi 6.2.1 output
(checked-in samples) and on the stub's."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from stub_support import BASELINE_ARGS, StartServer, base_env, tt_smi
from tt_smi_list import parse_list

from vmtests.stub import knobs
from vmtests.tt_smi_parse import TtSmiError, board_type_of, parse_snapshot, version_tuple

DATA = Path(__file__).parent / "data"
COLUMNS = ["UMD Chip ID", "PCI BDF", "PCI Dev ID", "Board Type", "Device Series", "Board Number"]


def stub_tt_smi(*argv: str, env: dict[str, str]) -> str:
    """The stub tt-smi's stdout (exit status 0 required)."""
    result = tt_smi(*argv, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.fixture
def stub_env(tmp_path: Path) -> dict[str, str]:
    """A driver version file and /dev/null as the card."""
    driver = tmp_path / "driver-version"
    driver.write_text("2.10.0\n")
    return base_env(**{knobs.DRIVER_FILE: str(driver)})


def test_versions_are_read_past_a_pre_release_or_a_local_label() -> None:
    assert version_tuple("TT-KMD 2.10.0-rc1") == (2, 10, 0)
    assert version_tuple("6.2.1+vmtests.stub") == (6, 2, 1)  # the stub's tt-smi --version
    assert version_tuple("no version") is None


def test_board_ids_decode_as_get_board_type_does() -> None:
    assert board_type_of("0000040000000001") == "p150a"
    assert board_type_of("000004110233c21a") == "p150b"
    assert board_type_of("0000014000000000") == "n300"
    assert board_type_of("N/A") == "N/A"


def test_the_real_snapshot_sample() -> None:
    snapshot = parse_snapshot((DATA / "tt-smi-6.2.1-snapshot.json").read_text())
    assert snapshot.driver == "TT-KMD 2.10.0"
    assert snapshot.tt_smi_version == "6.2.1"
    (board,) = snapshot.boards
    assert board.board_type == "p150b"
    assert board.decoded_type == "p150b"
    assert board.is_p150
    assert board.firmwares["fw_bundle_version"] == "18.7.0.0"
    assert board.limits["board_power_limit"] == "300"
    assert board.telemetry["board_power"] == " 58.0"
    assert snapshot.holders(0) == [48213]
    assert snapshot.processes is not None
    assert snapshot.processes[0].cmdline.startswith("python3 -m vllm.entrypoints")


def test_the_real_list_sample() -> None:
    rows = parse_list((DATA / "tt-smi-6.2.1-list.txt").read_text())
    assert [row.table for row in rows] == [
        "All available boards on host (UMD):",
        "Boards that can be reset (UMD):",
    ]
    assert list(rows[0].cells) == COLUMNS
    assert rows[0].cells["Device Series"] == "p150b"
    assert rows[0].cells["PCI Dev ID"] == "/dev/tenstorrent/0"


def test_the_stub_snapshot_reads_the_same_way(
    stub_env: dict[str, str], start_server: StartServer
) -> None:
    server = start_server(BASELINE_ARGS)
    text = stub_tt_smi("-s", env=stub_env)
    assert text.startswith('{\n    "time": ')  # json.dumps(indent=4), not a TTY
    snapshot = parse_snapshot(text)
    (board,) = snapshot.boards
    assert board.is_p150
    assert len(board.board_id) == 16
    assert snapshot.tt_smi_version == "6.2.1+vmtests.stub"
    assert server.pid in snapshot.holders(0)
    raw = json.loads(text)
    (process,) = [p for p in raw["processes"] if p["pid"] == server.pid]
    assert list(process) == ["pid", "user", "device", "cmdline"]
    assert process["device"] == 0
    assert "vmtests.stub.server" in process["cmdline"]
    sample = json.loads((DATA / "tt-smi-6.2.1-snapshot.json").read_text())
    for section in ("board_info", "telemetry", "firmwares", "limits"):
        assert list(raw["device_info"][0][section]) == list(sample["device_info"][0][section])
    assert list(raw["host_info"]) == list(sample["host_info"])
    assert list(raw["host_sw_vers"]) == list(sample["host_sw_vers"])


def test_the_stub_version_label_is_one(stub_env: dict[str, str]) -> None:
    assert stub_tt_smi("-v", env=stub_env).strip() == "6.2.1+vmtests.stub"
    assert json.loads(stub_tt_smi("-s", env=stub_env))["host_sw_vers"]["tt_smi"] == (
        "6.2.1+vmtests.stub"
    )


def test_the_stub_list_reads_the_same_way_and_is_drawn_as_rich_draws_it(
    stub_env: dict[str, str],
) -> None:
    text = stub_tt_smi("-ls", env=stub_env)
    rows = parse_list(text)
    assert len(rows) == 2
    assert list(rows[0].cells) == COLUMNS
    assert rows[0].cells["Board Type"] == "Blackhole"
    assert board_type_of(rows[0].cells["Board Number"]) == "p150a"
    rich = pytest.importorskip("rich", reason="rich is a dev extra (tt-smi draws with it)")
    from rich.console import Console  # noqa: PLC0415
    from rich.table import Table  # noqa: PLC0415

    assert rich
    buffer = io.StringIO()
    console = Console(file=buffer, width=200, force_terminal=False)
    for title in ("All available boards on host (UMD):", "Boards that can be reset (UMD):"):
        table = Table(title=title)
        for column in COLUMNS:
            table.add_column(column)
        table.add_row(*rows[0].cells.values())
        console.print(table)
    assert text == buffer.getvalue()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("\x1b[31m No Tenstorrent driver detected! \x1b[0m\n", "no JSON object"),
        ('{"time": "x"}', "lacks host_info"),
        ('{"time": ', "is not JSON"),
    ],
)
def test_unreadable_snapshots_say_why(text: str, message: str) -> None:
    with pytest.raises(TtSmiError, match=message):
        parse_snapshot(text)


def test_a_list_without_boards_is_an_error() -> None:
    with pytest.raises(TtSmiError, match="no board rows"):
        parse_list("No Tenstorrent devices detected!\n")
