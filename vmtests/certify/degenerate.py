"""The degenerate-output detector, applied to every response of every stage.

The advisory invalidated a decode-time claim whose text was ``HT#3333...``: the output looked
like a run and had a sha, but it was garbage. A response is degenerate when any of these holds:

- it is empty (no content at all);
- one character repeats in a long run (``3333333333...``), or one token (a whitespace- or
  punctuation-separated word) repeats back to back many times (``the the the ...``);
- one token dominates the text (a loop over a short cycle, such as ``HT#3333`` repeated);
- too small a share of its characters are "normal" (letters, digits, spaces, common
  punctuation), as in a stream of control or replacement characters;
- it echoes the prompt: a long stretch of the prompt comes back verbatim.

Thresholds are module constants; every finding names the rule and the evidence.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

from vmtests.stub.textgen import tokenize

MAX_CHAR_RUN = 12
MAX_TOKEN_RUN = 6
MAX_TOKEN_SHARE = 0.5
MIN_TOKENS_FOR_SHARE = 12
MIN_NORMAL_SHARE = 0.85
ECHO_WORDS = 24
_NORMAL = set(
    string.ascii_letters + string.digits + string.whitespace + ".,;:!?'\"()-[]{}/_*#`<>=+%&@$|"
)


@dataclass(frozen=True)
class Finding:
    """One reason an output is degenerate."""

    rule: str
    evidence: str

    def __str__(self) -> str:
        return f"{self.rule}: {self.evidence}"


def _longest_char_run(text: str) -> tuple[str, int]:
    best, best_len, current, length = "", 0, "", 0
    for char in text:
        length = length + 1 if char == current else 1
        current = char
        if length > best_len:
            best, best_len = char, length
    return best, best_len


def _longest_token_run(tokens: list[str]) -> tuple[str, int]:
    best, best_len, length = "", 0, 0
    for index, token in enumerate(tokens):
        length = length + 1 if index and tokens[index - 1] == token else 1
        if length > best_len:
            best, best_len = token, length
    return best, best_len


def _is_normal(char: str) -> bool:
    return char in _NORMAL or (char.isalpha() and char.isprintable())


def _echo(text: str, prompt: str) -> str:
    """A stretch of at least ``ECHO_WORDS`` prompt words repeated in ``text``, or ``""``."""
    words = text.split()
    if len(words) < ECHO_WORDS or not prompt:
        return ""
    normalized_prompt = " " + " ".join(prompt.split()) + " "
    for start in range(0, len(words) - ECHO_WORDS + 1, max(1, ECHO_WORDS // 2)):
        window = " " + " ".join(words[start : start + ECHO_WORDS]) + " "
        if window in normalized_prompt:
            return window.strip()
    return ""


def inspect(text: str, prompt: str = "") -> list[Finding]:
    """Every degenerate-output rule that ``text`` breaks (empty list: it looks normal)."""
    if not text.strip():
        return [Finding("empty", "the response carries no text")]
    findings: list[Finding] = []
    char, run = _longest_char_run(text)
    if run > MAX_CHAR_RUN and not char.isspace():
        findings.append(Finding("char-run", f"{char!r} repeated {run} times in a row"))
    tokens = tokenize(text)
    token, token_run = _longest_token_run(tokens)
    if token_run > MAX_TOKEN_RUN:
        findings.append(
            Finding("token-run", f"token {token!r} repeated {token_run} times in a row")
        )
    if len(tokens) >= MIN_TOKENS_FOR_SHARE:
        top = max(set(tokens), key=tokens.count)
        share = tokens.count(top) / len(tokens)
        if share > MAX_TOKEN_SHARE:
            findings.append(Finding("token-share", f"token {top!r} is {share:.0%} of the tokens"))
    normal = sum(_is_normal(c) for c in text) / len(text)
    if normal < MIN_NORMAL_SHARE:
        findings.append(
            Finding(
                "abnormal-chars", f"only {normal:.0%} normal characters (< {MIN_NORMAL_SHARE:.0%})"
            )
        )
    echoed = _echo(text, prompt)
    if echoed:
        findings.append(Finding("prompt-echo", f"echoes the prompt: {echoed[:80]!r}..."))
    return findings


def describe(findings: list[Finding]) -> str:
    """One line naming every finding (``""`` when there is none)."""
    return "; ".join(str(finding) for finding in findings)
