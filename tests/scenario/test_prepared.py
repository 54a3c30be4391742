"""How a restored guest is compared with the guest that was saved, without a guest: what the
witness leaves out (only what is stamped on each answer) and how differences are reported."""

from __future__ import annotations

import json

from vmtests.scenario.prepared import differences, models_without_stamps, tt_smi_without_stamps
from vmtests.tt_smi_parse import OWN_PID_LINE

MODELS = {
    "object": "list",
    "data": [
        {
            "id": "qwen36",
            "created": 1796194829,
            "max_model_len": 32768,
            "permission": [{"id": "modelperm-f11a", "created": 1796194829, "allow_view": True}],
        }
    ],
}


def test_models_lose_only_what_each_answer_stamps() -> None:
    assert models_without_stamps(json.dumps(MODELS)) == {
        "object": "list",
        "data": [{"id": "qwen36", "max_model_len": 32768, "permission": [{"allow_view": True}]}],
    }


def test_tt_smi_loses_only_its_time_and_pid() -> None:
    body = json.dumps({"time": "2026-12-02T07:00:34", "device_info": [{"board": "p150"}]})
    assert tt_smi_without_stamps(body) == {"device_info": [{"board": "p150"}]}
    # The pid the snapshot's tt-smi ran as differs at every snapshot.
    assert tt_smi_without_stamps(f"{OWN_PID_LINE}4242\n{body}") == {
        "device_info": [{"board": "p150"}]
    }


def test_a_body_that_is_not_json_stays_as_it_is() -> None:
    assert models_without_stamps("curl: (7) Failed to connect") == "curl: (7) Failed to connect"
    assert tt_smi_without_stamps("") == ""


def test_differences_name_the_path_and_both_values() -> None:
    fresh = {"boot_id": "a", "unit": {"properties": {"MainPID": "10"}}, "journal": [1, 2]}
    restored = {"boot_id": "a", "unit": {"properties": {"MainPID": "11"}}, "journal": [1, 3]}
    assert differences(fresh, restored) == [
        ".journal[1]: 2 != 3",
        ".unit.properties.MainPID: '10' != '11'",
    ]
    assert differences(fresh, fresh) == []
    assert differences({"a": [1]}, {"a": [1, 2]}) == [".a: [1] != [1, 2]"]
    assert differences({"a": 1}, {}) == [".a: 1 != None"]
