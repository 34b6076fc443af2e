"""Templates for what an agent says and is told: `{name}` placeholders filled from the call's variables.

Values are inserted as text, once: a value that itself looks like `{other}` stays as it is, and there is
no attribute or index access (`{a.b}` and `{a[0]}` are not placeholders). Unknown names become empty.
`{{` and `}}` are literal braces.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

_TOKEN = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]*)\}")

MAX_CONTEXT_KEYS = 32
MAX_VALUE_CHARS = 1024
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


class ContextError(ValueError):
    """Caller-supplied variables that cannot be used (the caller gets a 4xx with this message)."""


def render(template: str, variables: Mapping[str, str]) -> str:
    return render_with(template, lambda name: variables.get(name, ""))


def render_with(template: str, value: Callable[[str], str]) -> str:
    """The template with each placeholder replaced by `value(name)`."""

    def replace(match: re.Match[str]) -> str:
        token = match.group(0)
        if token == "{{":
            return "{"
        if token == "}}":
            return "}"
        return value(match.group(1))

    return _TOKEN.sub(replace, template)


def placeholders(template: str) -> set[str]:
    """The variable names a template uses."""
    return {m.group(1) for m in _TOKEN.finditer(template) if m.group(1)}


def is_plain_name(name: str) -> bool:
    """A variable's name: letters, digits and '_', not starting with a digit."""
    return bool(_KEY.fullmatch(name))


def checked_context(raw: object) -> dict[str, str]:
    """Context from a caller (the offer's JSON, a carrier's parameters): at most 32 string values of at
    most 1 KB each, under plain names."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ContextError('"context" must be an object of strings')
    if len(raw) > MAX_CONTEXT_KEYS:
        raise ContextError(f'"context" has more than {MAX_CONTEXT_KEYS} keys')
    context: dict[str, str] = {}
    for key, value in raw.items():
        if not isinstance(key, str) or not is_plain_name(key):
            raise ContextError(f"context key {str(key)[:40]!r} is not a plain name (letters, digits, _)")
        if not isinstance(value, str):
            raise ContextError(f"context value of {key!r} must be a string")
        if len(value.encode()) > MAX_VALUE_CHARS:
            raise ContextError(f"context value of {key!r} is over {MAX_VALUE_CHARS} bytes")
        context[key] = value
    return context
