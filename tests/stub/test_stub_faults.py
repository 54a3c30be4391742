"""Each fault knob does what it says; the latency table reacts to features and overrides."""

from __future__ import annotations

import hashlib

import pytest
from stub_support import BASELINE_ARGS, StartServer, post

from vmtests.contracts import features as feature_table
from vmtests.stub import faults, features, knobs, latency

BODY = {
    "prompt": "The realistic prompt of the correctness gate.",
    "max_tokens": 12,
    "temperature": 0,
}


def completion(url: str) -> str:
    """The greedy completion of the gate's prompt."""
    response = post(url, "/v1/completions", BODY)
    response.raise_for_status()
    return str(response.json()["choices"][0]["text"])


def test_fail_rate_1_fails_every_request_with_a_500(start_server: StartServer) -> None:
    server = start_server(BASELINE_ARGS, {knobs.FAIL_RATE: "1"})
    for _ in range(5):
        response = post(server.url, "/v1/completions", BODY)
        assert response.status_code == 500
        assert response.json()["error"]["type"] == "InternalServerError"
    assert "vmtests stub fault knobs: {'fail_rate': 1.0}" in server.output()


def test_partial_fail_rate_is_reproducible_with_a_seed(start_server: StartServer) -> None:
    env = {knobs.FAIL_RATE: "0.25", knobs.FAULT_SEED: "7"}
    runs = []
    for _ in range(2):
        server = start_server(BASELINE_ARGS, env)
        runs.append([post(server.url, "/v1/completions", BODY).status_code for _ in range(40)])
    assert runs[0] == runs[1]
    failures = runs[0].count(500)
    assert 0 < failures < 40
    assert set(runs[0]) == {200, 500}


def test_degenerate_output_repeats_one_token(start_server: StartServer) -> None:
    server = start_server(BASELINE_ARGS, {knobs.DEGENERATE: "1"})
    assert completion(server.url) == "HT#" + "3333" * 10


def test_output_salt_changes_the_output_sha(start_server: StartServer) -> None:
    plain = completion(start_server(BASELINE_ARGS).url)
    salted = completion(start_server(BASELINE_ARGS, {knobs.OUTPUT_SALT: "regression"}).url)
    again = completion(start_server(BASELINE_ARGS).url)
    sha = [hashlib.sha256(text.encode()).hexdigest() for text in (plain, salted, again)]
    assert sha[0] == sha[2]
    assert sha[0] != sha[1]


def test_log_flood_comes_before_the_plugin_lines_and_banners(start_server: StartServer) -> None:
    server = start_server(BASELINE_ARGS, {knobs.LOG_FLOOD: "300"})
    lines = server.output().splitlines()
    flood = [index for index, line in enumerate(lines) if "vmtests stub log flood" in line]
    assert len(flood) == 300
    assert "300/300" in lines[flood[-1]]
    prefix = next(i for i, line in enumerate(lines) if "Automatic prefix caching is" in line)
    args = next(i for i, line in enumerate(lines) if "non-default args" in line)
    assert args < flood[0]
    assert flood[-1] < prefix


def _model(names: list[str], async_scheduling: bool, env: dict[str, str]) -> latency.LatencyModel:
    feature_env = {feature_table.env_name(name): feature_table.env_value(name) for name in names}
    active = features.resolve(
        feature_env, prefix_caching=True, mamba_cache_mode="align", tool_call_parser=None,
        auto_tool_choice=False,
    )  # fmt: skip
    return latency.build(active, async_scheduling, env)


def test_resident_decode_changes_step_time_only_as_the_table_says() -> None:
    control = _model(["deviceArgmax"], async_scheduling=False, env={})
    resident_sync = _model(["deviceResident", "deviceArgmax"], async_scheduling=False, env={})
    resident_async = _model(["deviceResident", "deviceArgmax"], async_scheduling=True, env={})
    assert resident_sync.step_seconds(8) == control.step_seconds(8)  # no difference under sync
    assert resident_async.step_seconds(8) < control.step_seconds(8)
    override = {knobs.STEP_FACTORS: '{"deviceResident": 0.9}'}
    configured = _model(["deviceResident", "deviceArgmax"], async_scheduling=False, env=override)
    assert configured.step_seconds(8) == pytest.approx(0.9 * control.step_seconds(8))


def test_ttft_grows_with_uncached_tokens_only() -> None:
    model = _model([], async_scheduling=False, env={knobs.TIME_SCALE: "1"})
    cold = model.prefill_seconds(uncached_tokens=1000, cached_tokens=0)
    warm = model.prefill_seconds(uncached_tokens=40, cached_tokens=960)
    assert cold > 10 * warm
    assert model.prefill_seconds(2000, 0) > cold


@pytest.mark.parametrize(
    ("name", "value"),
    [(knobs.FAIL_RATE, "1.5"), (knobs.HANG, "sometimes"), (knobs.STEP_FACTORS, "{bad")],
)
def test_malformed_knobs_are_rejected(name: str, value: str) -> None:
    def read_all() -> None:
        """Read every knob the way the server does at startup."""
        faults.from_environment({name: value})
        knobs.env_step_factors({name: value})

    with pytest.raises(knobs.KnobError, match=name):
        read_all()
