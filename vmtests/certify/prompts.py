"""The frozen prompt sets of the certification run (nothing is downloaded).

- ``SMOKE`` (5) and ``EXTENDED`` (11): short, realistic tasks for the correctness stages;
- ``concurrency_prompts()``: 32 distinct realistic requests (a shared operator preamble plus a
  task), one per slot of a 32-wide wave;
- ``ab_prompts()``: the A/B set (16 requests at concurrency 8), the same in both arms;
- ``DECODE``: one realistic prompt of several hundred tokens for the B=1 decode step (the
  advisory rejected a 26-token prompt);
- ``long_prompt(tokens, variant)``: 8k/16k/32k-token documents built deterministically from the
  checked-in ``corpus.txt``; each size starts with its own header, so one size never shares a
  prefix-cache block with another and the cold phase of each size is really cold.

Token counts here are estimates (words and punctuation marks); the server's own count comes
back in ``usage.prompt_tokens`` and is what the report shows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from vmtests.stub.textgen import tokenize

CORPUS_FILE = Path(__file__).with_name("corpus.txt")
LONG_SIZES = {"8k": 8000, "16k": 16000, "32k": 31000}  # 32k leaves room for the answer


@dataclass(frozen=True)
class Prompt:
    """A named prompt text."""

    id: str
    text: str


def estimate_tokens(text: str) -> int:
    """A rough token count: words and punctuation marks (the stub's ``tokenize``)."""
    return len(tokenize(text))


SMOKE = (
    Prompt("smoke-1", "Explain in three sentences what a prefix cache does in an LLM server."),
    Prompt("smoke-2", "Write a short Python function that returns the median of a list."),
    Prompt("smoke-3", "List four checks an operator should run after rebooting a GPU server."),
    Prompt("smoke-4", "Translate to French: The configuration survived the reboot unchanged."),
    Prompt("smoke-5", "What is 17 multiplied by 23? Answer with the number and one sentence."),
)

EXTENDED = (
    Prompt("ext-01", "Summarize the trade-offs of synchronous versus asynchronous scheduling."),
    Prompt("ext-02", "Write a systemd unit that runs a container and stops it gracefully."),
    Prompt("ext-03", "Explain what a Clopper-Pearson upper bound tells you about zero failures."),
    Prompt("ext-04", "Give a JSON object describing a server with host, port and model fields."),
    Prompt("ext-05", "Describe how hugepages are reserved at boot on Linux, step by step."),
    Prompt("ext-06", "Write a haiku about a cache that forgets nothing until it is restarted."),
    Prompt("ext-07", "Compare median and 95th percentile latency and when each one matters."),
    Prompt("ext-08", "Rewrite this sentence in plain English: latency regressed under load."),
    Prompt("ext-09", "Outline a checklist for rolling out a new inference server version."),
    Prompt("ext-10", "Explain why interleaving A and B runs removes the effect of drift."),
    Prompt("ext-11", "Write a bash loop that retries a health check for at most sixty seconds."),
)

_PREAMBLE = (
    "You are the assistant of the operations team of an inference cluster. Answer precisely, "
    "in plain English, with short paragraphs and no speculation. "
)
_TASKS = (
    "Explain how to read a latency histogram.", "Draft a post-incident summary for a restart.",
    "Describe the risks of changing two settings at once.", "Explain a graceful shutdown.",
    "Summarize why warm caches flatter benchmarks.", "Explain what a config digest proves.",
    "List the signs of degenerate model output.", "Explain the rule of three in testing.",
    "Write a short note announcing a maintenance window.", "Explain TTFT to a new colleague.",
    "Describe how to verify a reboot kept the settings.", "Explain paired comparisons.",
    "Give three reasons a request might time out.", "Explain decode step time.",
    "Describe what a prefix cache hit ratio measures.", "Explain what MemAvailable means.",
    "Write a runbook step for checking device holders.", "Explain a bootstrap interval.",
    "Explain why fixed seeds matter for replays.", "Describe how to roll back a configuration.",
    "Explain concurrency versus batch size.", "Summarize the purpose of a golden output hash.",
    "Explain why a container should not be force-removed.", "Describe a canary deployment.",
    "Explain how hugepages help accelerator drivers.", "Write a two-line status update.",
    "Explain what makespan measures in a load test.", "Explain the noise band of a benchmark.",
    "Describe how to spot a memory leak in a server.", "Explain why logs need redaction.",
    "Explain what an interleaved ABBA design is.", "Summarize a safe restart procedure.",
)  # fmt: skip


def concurrency_prompts() -> list[Prompt]:
    """32 distinct realistic requests sharing the operator preamble (one per wave slot)."""
    return [Prompt(f"conc-{i + 1:02d}", _PREAMBLE + task) for i, task in enumerate(_TASKS)]


def ab_prompts() -> list[Prompt]:
    """The A/B set: 16 realistic requests (each arm sends exactly these)."""
    return [
        Prompt(f"ab-{i + 1:02d}", _PREAMBLE + "Context: " + _paragraph(i) + " Task: " + task)
        for i, task in enumerate(_TASKS[:16])
    ]


def corpus_paragraphs() -> list[str]:
    """The checked-in corpus as paragraphs of one line each (blank-line free source)."""
    text = CORPUS_FILE.read_text(encoding="utf-8")
    sentences = re.split(r"(?<=\.)\s+", " ".join(text.split()))
    return [" ".join(sentences[i : i + 4]) for i in range(0, len(sentences), 4)]


def _paragraph(index: int) -> str:
    paragraphs = corpus_paragraphs()
    return paragraphs[index % len(paragraphs)]


DECODE = Prompt(
    "decode-b1",
    _PREAMBLE
    + "Read the following notes and then write a detailed, well-structured explanation of "
    "how to certify a serving configuration.\n\n" + "\n\n".join(corpus_paragraphs()),
)


def long_prompt(size: str, variant: int = 0) -> Prompt:
    """A document of about ``LONG_SIZES[size]`` tokens, then a question (``variant`` picks it).

    The document repeats the corpus with numbered sections; its header names the size, so the
    documents of different sizes share no prefix.
    """
    target = LONG_SIZES[size]
    header = f"Operations handbook, edition {size}. Read all sections before answering.\n"
    questions = (
        "Question: which three promises does the handbook make, and where are they stated?",
        "Question: summarize the handbook's advice on performance claims in five sentences.",
    )
    question = questions[variant % len(questions)]
    parts = [header]
    count = estimate_tokens(header) + estimate_tokens(question)
    paragraphs = corpus_paragraphs()
    section = 0
    while count < target:
        paragraph = f"Section {section + 1}. {paragraphs[section % len(paragraphs)]}\n"
        parts.append(paragraph)
        count += estimate_tokens(paragraph)
        section += 1
    parts.append(question)
    return Prompt(f"long-{size}-{variant}", "".join(parts))


def long_prompts(variants: int = 2) -> dict[str, list[Prompt]]:
    """The cold/warm sets: ``variants`` prompts per size, sharing that size's document."""
    return {size: [long_prompt(size, v) for v in range(variants)] for size in LONG_SIZES}
