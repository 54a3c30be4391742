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
# 'name': 'value' / "name": ["a", "b"] inside a Python dict repr or JSON: vLLM logs its
# ``non-default args`` as a dict, ``'api_key': ['...']`` included (vLLM
# ``entrypoints/utils.py``, ``log_non_default_args``). Only string values: never a figure.
_STRING = r"(?:'[^']*'|\"[^\"]*\")"
_ITEM = re.compile(
    r"(?P<q>['\"])(?P<name>[A-Za-z_][A-Za-z0-9_-]*)(?P=q)(?P<sep>\s*:\s*)"
    rf"(?P<value>{_STRING}|\[\s*{_STRING}(?:\s*,\s*{_STRING})*\s*\])"
)
# An HTTP bearer credential (``Authorization: Bearer <key>``), whatever carries it.
_BEARER = re.compile(r"(?P<scheme>\bBearer\s+)(?P<value>[^\s\"',;]+)", re.IGNORECASE)


def is_secret_name(name: str) -> bool:
    """True when ``name`` (an environment variable or a flag) names a secret."""
    return any(word.lower() in SECRET_WORDS for word in _WORD.findall(name))


def redact_environment(environment: Mapping[str, str]) -> dict[str, str]:
    """A copy of ``environment`` with the values of secret-named variables replaced."""
    return {
        name: REDACTED if is_secret_name(name) else value for name, value in environment.items()
    }


def redact_argv(argv: Sequence[str]) -> list[str]:
    """A copy of ``argv`` where the value of every secret-named flag is replaced.

    A secret flag's values are every word up to the next flag: ``--api-key`` takes one or more
    keys (vLLM ``entrypoints/openai/cli_args.py``), as argparse reads it.
    """
    result: list[str] = []
    hiding = False
    for token in argv:
        if hiding and not token.startswith("-"):
            result.append(REDACTED)
            continue
        hiding = False
        flag, equals, _ = token.partition("=")
        if token.startswith("--") and is_secret_name(flag):
            if equals:
                result.append(f"{flag}={REDACTED}")
            else:
                result.append(token)
                hiding = True
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

    def item(match: re.Match[str]) -> str:
        if not is_secret_name(match["name"]):
            return match[0]
        quote = match["q"]
        return f"{quote}{match['name']}{quote}{match['sep']}{quote}{REDACTED}{quote}"

    text = _BEARER.sub(lambda match: f"{match['scheme']}{REDACTED}", text)
    text = _ITEM.sub(item, text)
    return _FLAG.sub(flag, _ASSIGNMENT.sub(assignment, text))
