"""Redaction of secrets (tokens, API keys, passwords) before anything is stored or logged.

A variable or flag whose *name* has a secret's word in it (``HF_TOKEN``, ``--api-key``,
``DB_PASSWORD``, ``clientSecret``) keeps its name and loses its value. The word must stand on
its own: ``prompt_tokens``, ``max_tokens`` or ``tokenizer`` name figures and paths, not
secrets, and keep their values. Snapshots are redacted when they are taken, so reports and logs
built from them can never leak what the machine holds.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

REDACTED = "<redacted>"
SECRET_WORDS = frozenset({"token", "key", "apikey", "secret", "password", "passwd", "credentials"})
"""The words of a name (split at ``_``, ``-``, ``.`` and lower-to-upper case changes) that make
it a secret's."""
_WORD = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")
# NAME=value inside free text (unit files, journal lines, `Environment=` lists).
_ASSIGNMENT = re.compile(
    r"(?P<name>\b[A-Za-z_][A-Za-z0-9_]*)=(?P<value>\"[^\"]*\"|'[^']*'|[^\s\"']+)"
)
# --flag value / --flag=value inside free text; also across a shell line continuation and with
# a quoted value, as nixpkgs oci-containers.nix writes a container's start script.
_FLAG = re.compile(
    r"(?P<flag>--[A-Za-z0-9][A-Za-z0-9_-]*)(?P<sep>=|(?:\s|\\\n)+)"
    r"(?P<value>\"[^\"]*\"|'[^']*'|[^\s\"']+)"
)


def is_secret_name(name: str) -> bool:
    """True when ``name`` (an environment variable or a flag) names a secret."""
    return any(word.lower() in SECRET_WORDS for word in _WORD.findall(name))


def redact_environment(environment: Mapping[str, str]) -> dict[str, str]:
    """A copy of ``environment`` with the values of secret-named variables replaced."""
    return {
        name: REDACTED if is_secret_name(name) else value for name, value in environment.items()
    }


def redact_argv(argv: Sequence[str]) -> list[str]:
    """A copy of ``argv`` where the value of every secret-named flag is replaced."""
    result: list[str] = []
    hide_next = False
    for token in argv:
        if hide_next:
            result.append(REDACTED)
            hide_next = False
            continue
        flag, equals, _ = token.partition("=")
        if token.startswith("--") and is_secret_name(flag):
            if equals:
                result.append(f"{flag}={REDACTED}")
            else:
                result.append(token)
                hide_next = True
            continue
        result.append(token)
    return result


def redact_text(text: str) -> str:
    """Redact ``NAME=value`` and ``--flag value`` pairs with secret names inside free text."""

    def assignment(match: re.Match[str]) -> str:
        if not is_secret_name(match["name"]):
            # `Environment="API_KEY=x"`: the secret hides inside a quoted value.
            value = match["value"]
            if value[:1] in {'"', "'"}:
                return f"{match['name']}={value[0]}{redact_text(value[1:-1])}{value[-1]}"
            return match[0]
        return f"{match['name']}={REDACTED}"

    def flag(match: re.Match[str]) -> str:
        if not is_secret_name(match["flag"]):
            return match[0]
        return f"{match['flag']}{match['sep']}{REDACTED}"

    return _FLAG.sub(flag, _ASSIGNMENT.sub(assignment, text))
