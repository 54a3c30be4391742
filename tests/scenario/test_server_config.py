"""The server's own cache config (cache_config_info, engine config line) against the profile."""

from __future__ import annotations

import dataclasses

import pytest
import requests
from scenario_support import CACHE_CONFIG_INFO, ENGINE_LINE, good_snapshot

from vmtests.contracts.findings import Check
from vmtests.guest.local_stub import LocalStubServer
from vmtests.profiles.loader import load_profile
from vmtests.scenario.collection.collect import MARK, parse_snapshot
from vmtests.scenario.collection.snapshot import Endpoint, JournalLine
from vmtests.scenario.judgement.checks import check_consistency, evaluate_stage
from vmtests.scenario.judgement.results import failures
from vmtests.scenario.judgement.server_config import (
    check_server_config,
    describe,
    parse_cache_config_info,
    parse_engine_line,
)

CFX = load_profile("cfx-llm2")


def _with_journal(snapshot, old: str, new: str):  # type: ignore[no-untyped-def]
    journal = [dataclasses.replace(line, message=line.message.replace(old, new))
               for line in snapshot.journal]  # fmt: skip
    return dataclasses.replace(snapshot, journal=journal)


def test_the_correct_server_reports_what_the_profile_expects() -> None:
    results = check_server_config(CFX, good_snapshot())
    assert [r.subject for r in results] == ["enable_prefix_caching", "mamba_cache_mode"]
    assert all(r.ok for r in results), results
    assert "per vllm:cache_config_info and the engine config line" in results[0].message


def test_argv_and_banners_claim_prefix_caching_but_the_engine_has_it_off() -> None:
    snapshot = good_snapshot()
    off = CACHE_CONFIG_INFO.replace('enable_prefix_caching="True"', 'enable_prefix_caching="False"')
    off = off.replace('mamba_cache_mode="align"', 'mamba_cache_mode="none"')
    snapshot.metrics = Endpoint(snapshot.metrics.url, 200, off)
    snapshot = _with_journal(snapshot, "enable_prefix_caching=True", "enable_prefix_caching=False")
    results = evaluate_stage(CFX, snapshot)
    bad = failures(results)
    assert {r.check for r in bad} == {Check.SERVER_CACHE_CONFIG}, bad
    assert [r.subject for r in bad] == ["enable_prefix_caching", "mamba_cache_mode"]
    assert bad[0].message.endswith(
        "profile cfx-llm2: the running server's own cache config says enable_prefix_caching="
        "False (vllm:cache_config_info), not True: whatever argv and banners claim, the engine "
        "does not run it"
    )
    # argv and banners alone agree with each other: only the server's evidence catches it.
    assert all(r.ok for r in check_consistency(snapshot))


def test_the_engine_line_alone_contradicting_the_metric_is_caught() -> None:
    snapshot = _with_journal(
        good_snapshot(), "enable_prefix_caching=True", "enable_prefix_caching=False"
    )
    (bad,) = failures(check_server_config(CFX, snapshot))
    assert "enable_prefix_caching=False (the engine config line), not True" in bad.message


def test_no_metrics_and_no_engine_line_is_a_failure_saying_so() -> None:
    snapshot = _with_journal(good_snapshot(), "Initializing a V1 LLM engine", "Engine")
    snapshot.metrics = Endpoint(snapshot.metrics.url, None, "", "no answer")
    bad = failures(check_server_config(CFX, snapshot))
    assert len(bad) == 2
    assert "gave no answer" in bad[0].message
    assert "no engine config line in this boot's log of the current start" in bad[0].message


def test_an_engine_line_of_an_earlier_start_does_not_count() -> None:
    snapshot = good_snapshot()
    snapshot.journal = [
        dataclasses.replace(line, invocation_id="earlier") if "engine" in line.message else line
        for line in snapshot.journal
    ]
    snapshot.metrics = Endpoint(snapshot.metrics.url, 200, "")
    bad = failures(check_server_config(CFX, snapshot))
    assert bad
    assert "no engine config line" in bad[0].message


def test_parsers_read_labels_and_engine_fields() -> None:
    labels = parse_cache_config_info("# HELP x\n" + CACHE_CONFIG_INFO + "\n")
    assert labels["enable_prefix_caching"] == "True"
    assert labels["engine"] == "0"
    fields = parse_engine_line(ENGINE_LINE)
    assert fields["enable_prefix_caching"] == "True"
    assert fields["served_model_name"] == "qwen36"
    assert parse_engine_line("Asynchronous scheduling is disabled.") == {}


def test_the_snapshot_script_output_carries_the_metric() -> None:
    output = f"{MARK}metrics\n" + CACHE_CONFIG_INFO + f"\n200\n{MARK}end\n"
    snapshot = parse_snapshot(output, "S1")
    assert snapshot.metrics.status == 200
    assert parse_cache_config_info(snapshot.metrics.body)["mamba_cache_mode"] == "align"


def test_describe_gives_the_values_the_report_shows() -> None:
    assert describe(good_snapshot(), ["enable_prefix_caching", "mamba_cache_mode", "x"]) == {
        "enable_prefix_caching": "True",
        "mamba_cache_mode": "align",
        "x": "?",
    }


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--enable-prefix-caching", "--mamba-cache-mode", "none", "--no-async-scheduling"],
         {"enable_prefix_caching": "True", "mamba_cache_mode": "align"}),
        (["--no-enable-prefix-caching"],
         {"enable_prefix_caching": "False", "mamba_cache_mode": "none"}),
    ],
    ids=["mode-none-becomes-align", "prefix-off"],
)  # fmt: skip
def test_the_stub_server_reports_its_real_cache_config(
    args: list[str], expected: dict[str, str]
) -> None:
    """The checks read the stub's own metric and engine line (both are the engine's state)."""
    env = {"VMTESTS_STUB_DEVICES": "/dev/null", "VMTESTS_STUB_TIME_SCALE": "0.002"}
    with LocalStubServer(["--served-model-name", "qwen36", *args], env) as server:
        server.wait_ready(30)
        text = requests.get(server.url + "/metrics", timeout=30).text
        labels = parse_cache_config_info(text)
        lines = [line for line in server.output().splitlines() if "V1 LLM engine (" in line]
        assert len(lines) == 1, server.output()
        line = lines[0]
    assert {key: labels[key] for key in expected} == expected
    assert parse_engine_line(line)["enable_prefix_caching"] == expected["enable_prefix_caching"]
    snapshot = good_snapshot()
    snapshot.metrics = Endpoint(snapshot.metrics.url, 200, text)
    snapshot.journal = [JournalLine(line, snapshot.boot_id, snapshot.unit.invocation_id)]
    results = check_server_config(load_profile("baseline"), snapshot)
    assert all(r.ok for r in results) == (expected["enable_prefix_caching"] == "False")
