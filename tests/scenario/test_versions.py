"""The version table every report carries: the run's versions next to NixOS's, in report.json,
summary.md (the run's and the check's) and the certificate (JSON and Markdown); the NixOS column
says why wherever it was not evaluated. The column read from a real evaluation is tested in the
eval tier (tests/eval/test_eval_versions.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import cast

import pytest
from scenario_support import LocalShell

from vmtests import nixos_eval
from vmtests.certify.model import CertificationResult
from vmtests.certify.report import certificate_data, markdown, write_certificate
from vmtests.contracts.status import RunStatus
from vmtests.driver.machine import Machine
from vmtests.profiles import load_profile
from vmtests.report import markdown_summary, write_scenario_report
from vmtests.scenario.runner.scenario import Kind, Scenario, ScenarioResult
from vmtests.scenario.runner.versions import (
    COMPONENTS,
    NixosColumn,
    VersionTable,
    markdown_lines,
    nixos_column,
    parse_versions,
    read_versions,
    same_upstream,
    stands_in_for,
    upstream_version,
)

CFX = load_profile("cfx-llm2")
RUN = {
    "systemd": "257.9-1~deb13u1",
    "docker": "26.1.5+dfsg1",
    "containerd": "1.7.24~ds1",
    "kernel": "6.12.57+deb13-amd64",
    "vllm": "0.16.0+vmtests.stub",
    "tt-smi": "3.0.5",
    "nixos-rebuild": "-",
}
NIXOS = NixosColumn(
    "vm-test-cfx-llm2",
    {
        "systemd": "260.2",
        "docker": "29.6.0",
        "containerd": "2.3.1 (built from v2.2.4 source)",
        "kernel": "6.18.37",
        "vllm": "not evaluated: the image x:1 carries its own vLLM",
        "tt-smi": "not evaluated: hardware.tenstorrent is off",
    },
    "evaluated with nixpkgs: somewhere",
    True,
)


def table_rows(markdown_text: str) -> dict[str, tuple[str, str]]:
    """The version table's rows in a Markdown report: component -> (run, NixOS)."""
    return {name: (run, nixos) for name, (run, nixos, _) in marked_rows(markdown_text).items()}


def marked_rows(markdown_text: str) -> dict[str, tuple[str, str, str]]:
    """The version table's rows: component -> (run, NixOS, same upstream version?)."""
    lines = markdown_text.splitlines()
    start = lines.index("## Versions: this run and NixOS")
    rows: dict[str, tuple[str, str, str]] = {}
    for line in lines[start + 6 : start + 6 + len(COMPONENTS)]:
        component, run, nixos, same = (cell.strip() for cell in line.strip("|").split(" | "))
        rows[component] = (run, nixos, same)
    return rows


def _result(kind: Kind = Kind.RUN) -> ScenarioResult:
    result = ScenarioResult(CFX, "qemu:reference", "reference install step", kind=kind)
    result.versions, result.nixos_versions = dict(RUN), NIXOS
    result.status = RunStatus.FINISHED
    return result


@pytest.mark.parametrize("kind", [Kind.RUN, Kind.CHECK])
def test_the_scenario_reports_carry_the_table(tmp_path: Path, kind: Kind) -> None:
    paths = write_scenario_report(_result(kind), tmp_path)
    expected = {c.label: (RUN[c.key], NIXOS.cells[c.key]) for c in COMPONENTS}
    assert table_rows(paths["markdown"].read_text()) == expected
    assert "NixOS `vm-test-cfx-llm2`" in paths["markdown"].read_text()
    table = json.loads(paths["json"].read_text())["version_table"]
    assert table["nixos_configuration"] == "vm-test-cfx-llm2"
    assert table["nixos_evaluated"] is True
    assert {row["component"]: (row["run"], row["nixos"]) for row in table["rows"]} == expected


def test_without_an_evaluation_every_nixos_cell_says_why() -> None:
    result = _result()
    result.nixos_versions = NixosColumn.not_evaluated("vm-test-cfx-llm2", "no nixpkgs tree")
    result.versions = {}  # the run ended before its versions were asked
    rows = table_rows(markdown_summary(result))
    assert {nixos for _, nixos in rows.values()} == {"not evaluated: no nixpkgs tree"}
    assert all(run.startswith("not read") for run, _ in rows.values())
    # A result nobody asked NixOS for says so too, never a blank or a guess.
    result.nixos_versions = None
    assert {nixos for _, nixos in table_rows(markdown_summary(result)).values()} == {
        "not evaluated: no NixOS column was asked for"
    }


def test_the_certificate_carries_the_table(tmp_path: Path) -> None:
    result = CertificationResult("cfx-llm2", "ssh://root@host", None)
    result.versions = VersionTable(dict(RUN, docker="-"), NIXOS)
    rows = table_rows(markdown(result))
    assert rows["Docker"] == ("not found", "29.6.0")
    assert rows["systemd"] == (RUN["systemd"], "260.2")
    assert marked_rows(markdown(result))["Docker"][2] == "cannot tell"
    data = certificate_data(result)["version_table"]
    assert data["nixos_source"] == NIXOS.source
    assert [row["component"] for row in data["rows"]] == [c.label for c in COMPONENTS]
    paths = write_certificate(result, tmp_path)
    assert table_rows(paths["markdown"].read_text()) == rows
    if "html" in paths:  # with matplotlib: the page embeds the Markdown
        assert "| Docker | not found | 29.6.0 | cannot tell |" in paths["html"].read_text()
    # A certificate written before the preflight gate ran still shows the table.
    empty = table_rows(markdown(CertificationResult("cfx-llm2", "ssh://root@host", None)))
    assert set(empty) == {c.label for c in COMPONENTS}


def test_the_run_column_is_read_in_one_round_trip(tmp_path: Path) -> None:
    """Fake tools answer the version commands; vLLM's /version JSON gives its version alone."""
    scripts = {
        "systemctl": "echo 'systemd 257 (257.9-1~deb13u1)'; echo '+PAM +AUDIT'",
        "docker": """case "$*" in *Server.Version*) echo 26.1.5+dfsg1;; version*) echo 1.7.24;;
  *) echo "Docker version 26.1.5+dfsg1, build a72d7cd";; esac""",
        "curl": 'case "$*" in *:8123/version*) echo \'{"version": "0.16.0+x"}\';; *) exit 7;; esac',
        "tt-smi": "echo 3.0.5",
    }
    for name, text in scripts.items():
        (tmp_path / name).write_text(f"#!/bin/sh\n{text}\n")
        (tmp_path / name).chmod(0o755)
    machine = cast(Machine, LocalShell(f"{tmp_path}:/usr/bin:/bin"))
    found = read_versions(machine, 8123)
    assert found["vllm"] == "0.16.0+x"  # $port reached the command
    assert (found["systemd"], found["docker"], found["containerd"]) == (
        "257.9-1~deb13u1", "26.1.5+dfsg1", "1.7.24",
    )  # fmt: skip
    assert found["kernel"] == Path("/proc/sys/kernel/osrelease").read_text().strip()
    assert found["tt-smi"] == "3.0.5"
    assert read_versions(machine, 8124)["vllm"] == "-"  # nothing answers there


def test_a_version_answer_that_is_not_json_is_kept_as_said() -> None:
    said = parse_versions({"version vllm": "<html>bad gateway</html>"})
    assert said["vllm"] == "<html>bad gateway</html>"
    assert said["systemd"] == "-"


def test_an_unavailable_evaluation_names_why(monkeypatch: pytest.MonkeyPatch) -> None:
    def unavailable(configuration: str) -> None:
        raise nixos_eval.NixosEvalUnavailable("no nixpkgs tree: run scripts/setup-nixos-eval")

    monkeypatch.setattr(nixos_eval, "describe_with_environment", unavailable)
    column = stands_in_for(CFX.serving_profile)
    assert column.configuration == "vm-test-cfx-llm2"
    assert not column.evaluated
    assert set(column.cells.values()) == {
        "not evaluated: no nixpkgs tree: run scripts/setup-nixos-eval"
    }


def test_an_evaluated_column_takes_each_cell_from_the_evaluation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    described = {"versions": {"systemd": {"version": "260.2"}, "vllm": {"why": "the image"}}}
    monkeypatch.setattr(
        nixos_eval, "describe_with_environment", lambda configuration: (described, "env")
    )
    column = nixos_column("vm-test-cfx-llm2")
    assert column.evaluated
    assert column.source == "evaluated with env"
    assert column.cells["systemd"] == "260.2"
    assert column.cells["vllm"] == "not evaluated: the image"
    assert column.cells["docker"] == "not evaluated: the evaluation gives no version"


def test_a_check_reads_both_columns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``vmtests check`` (no preflight) asks the run's versions itself and names its NixOS
    configuration, whose column says why it was not evaluated."""

    def unavailable(configuration: str) -> None:
        raise nixos_eval.NixosEvalUnavailable(f"no tree for {configuration}")

    monkeypatch.setattr(nixos_eval, "describe_with_environment", unavailable)
    (tmp_path / "tt-smi").write_text("#!/bin/sh\necho 3.0.5\n")
    (tmp_path / "tt-smi").chmod(0o755)
    machine = LocalShell(f"{tmp_path}:/usr/bin:/bin")
    result = Scenario(machine, CFX, None, start_machine=False).check()
    assert "versions" in result.steps
    assert "nixos versions" in result.steps
    table = result.version_table.to_dict()
    rows = {row["component"]: row for row in table["rows"]}
    assert rows["tt-smi"]["run"] == "3.0.5"
    assert rows["kernel"]["run"] == Path("/proc/sys/kernel/osrelease").read_text().strip()
    assert table["nixos_configuration"] == "vm-test-cfx-llm2"
    assert rows["systemd"]["nixos"] == "not evaluated: no tree for vm-test-cfx-llm2"


@pytest.mark.parametrize(
    ("text", "upstream"),
    [
        ("257.9-1~deb13u1", "257.9"),
        ("26.1.5+dfsg1", "26.1.5"),
        ("1.7.24~ds1", "1.7.24"),
        ("v2.2.4", "2.2.4"),
        ("6.12.57+deb13-amd64", "6.12.57"),
        ("2.3.1 (built from v2.2.4 source)", "2.3.1"),
        ("0.16.0+vmtests.stub", "0.16.0"),
        ("not found", None),
        ("not evaluated: the image x:1 carries its own vLLM", None),
        ("260", None),  # a bare number names no dotted release
    ],
)
def test_the_normaliser_keeps_the_upstream_version(text: str, upstream: str | None) -> None:
    assert upstream_version(text) == upstream


def test_each_row_says_whether_both_sides_name_the_same_upstream_version() -> None:
    assert same_upstream("1.7.24~ds1", "1.7.24") is True
    assert same_upstream("6.18.37", "6.18.37") is True
    assert same_upstream("257.9-1~deb13u1", "260.2") is False
    assert same_upstream("not found", "29.6.0") is None
    run = dict(RUN, containerd="2.3.1", kernel="6.18.37", systemd="260.2")
    table = VersionTable(run, NIXOS)
    marks = {row["component"]: row["same_upstream"] for row in table.rows()}
    # The containerd cell's first version is what the binary claims, so the two compare.
    assert marks == {
        "systemd": True, "Docker": False, "containerd": True, "kernel": True,
        "vLLM": None, "tt-smi": None,
    }  # fmt: skip
    shown = {c: row[2] for c, row in marked_rows("\n".join(markdown_lines(table))).items()}
    assert shown == {
        "systemd": "yes", "Docker": "no", "containerd": "yes", "kernel": "yes",
        "vLLM": "cannot tell", "tt-smi": "cannot tell",
    }  # fmt: skip


def test_a_real_host_stands_for_the_production_configuration(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An ssh:// target is a real host: its column is the production configuration's, not
    the VM configuration's that a reference guest stands in for."""

    def unavailable(configuration: str) -> None:
        raise nixos_eval.NixosEvalUnavailable(f"no tree for {configuration}")

    monkeypatch.setattr(nixos_eval, "describe_with_environment", unavailable)
    assert stands_in_for(CFX.serving_profile, "ssh://root@cfx-llm2").configuration == "cfx-llm2"
    reference = stands_in_for(CFX.serving_profile, "qemu:reference")
    assert reference.configuration == "vm-test-cfx-llm2"
