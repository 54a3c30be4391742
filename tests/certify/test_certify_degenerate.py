"""The degenerate-output detector: the advisory's case, each rule, and no false alarms."""

from __future__ import annotations

import pytest

from vmtests.certify import degenerate
from vmtests.certify.prompts import EXTENDED, SMOKE
from vmtests.stub import textgen


def rules(text: str, prompt: str = "") -> set[str]:
    return {finding.rule for finding in degenerate.inspect(text, prompt)}


def test_the_advisory_case_is_degenerate() -> None:
    text = "".join(textgen.generate("any prompt", 48, degenerate=True))
    assert text.startswith("HT#3333")
    assert "char-run" in rules(text)


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("", "empty"),
        ("   \n", "empty"),
        ("the the the the the the the the the", "token-run"),
        ("HT # HT HT # HT HT # HT HT # HT HT # HT", "token-share"),
        ("\ufffd\ufffd\x01\x02 ok \x03\x04\ufffd\x05\x06\x07", "abnormal-chars"),
    ],
)
def test_each_rule(text: str, rule: str) -> None:
    assert rule in rules(text)


def test_prompt_echo() -> None:
    prompt = " ".join(f"word{i}" for i in range(60))
    echoed = "Sure. " + " ".join(f"word{i}" for i in range(10, 50))
    assert "prompt-echo" in rules(echoed, prompt)
    assert "prompt-echo" not in rules("A fresh answer " * 3, prompt)


def test_normal_outputs_pass() -> None:
    # The stub's normal greedy outputs for every correctness prompt, and real-looking prose.
    for prompt in (*SMOKE, *EXTENDED):
        text = "".join(textgen.generate(prompt.text, 48, temperature=0.0))
        assert degenerate.inspect(text, prompt.text) == [], (prompt.id, text)
    prose = "A prefix cache keeps computed blocks. Requests that share a prefix skip work; 42!"
    assert degenerate.inspect(prose) == []


def test_describe_names_the_evidence() -> None:
    text = "3" * 40
    assert "'3' repeated 40 times" in degenerate.describe(degenerate.inspect(text))
