"""The launch flags an engine's presets and settings form produce, each with the check of its value: what a
worker's policy lets through without naming it (``specsweep.policy``). A check returns why a value is refused,
or None.

Both engines parse their flags with argparse-like parsers that take more than the exact spelling: vLLM reads
``--trust_remote_code`` as ``--trust-remote-code``, and argparse (SGLang, specsweep's simulator and launcher)
takes an unambiguous prefix (``--trust-remote-cod``). So a flag passes only in its exact spelling (underscores
read as dashes, as vLLM does); a shortened one is not the flag the table names.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

#: Why a value is refused, or None when it is fine.
Check = Callable[[str], str | None]
#: A flag's check, or None for a switch (a flag without a value).
FlagTable = Mapping[str, Check | None]

# A model is a hub id (org/name) or a path on the host: no option-like start, no shell or URL characters.
_MODEL = re.compile(r"[A-Za-z0-9_.~/+:-]{1,300}")
_ADDRESS = re.compile(r"[A-Za-z0-9.:\[\]-]{1,253}")


def canonical(flag: str) -> str:
    """A flag as the engines read its name: underscores after the leading dashes are dashes (vLLM's parser
    turns ``--max_model_len`` into ``--max-model-len``; reading every engine's flags so refuses nothing a
    parser would not also take as the dashed flag)."""
    name = flag.split("=", 1)[0]
    stripped = name.lstrip("-")
    return name[: len(name) - len(stripped)] + stripped.replace("_", "-")


def abbreviates(word: str, flag: str) -> bool:
    """``word`` is ``flag`` or a prefix argparse would expand to it (long flags only, as argparse does)."""
    word, flag = canonical(word), canonical(flag)
    return word == flag or (word.startswith("--") and len(word) > 2 and flag.startswith(word))


def integer(low: int = 0, high: int = 1 << 20) -> Check:
    def check(value: str) -> str | None:
        if not re.fullmatch(r"\d{1,8}", value) or not low <= int(value) <= high:
            return f"must be a whole number from {low} to {high}"
        return None
    return check


def number(low: float = 0.0, high: float = 1e6) -> Check:
    def check(value: str) -> str | None:
        try:
            ok = low <= float(value) <= high and re.fullmatch(r"[0-9.eE+-]{1,20}", value) is not None
        except ValueError:
            ok = False
        return None if ok else f"must be a number from {low:g} to {high:g}"
    return check


def choice(*options: str) -> Check:
    def check(value: str) -> str | None:
        return None if value in options else f"must be one of {', '.join(options)}"
    return check


def model(value: str) -> str | None:
    """A model's hub id or path on the host (read as weights, never as code: code needs --trust-remote-code)."""
    if value.startswith(("-", "@")) or not _MODEL.fullmatch(value):
        return "must be a model's hub id or path (letters, digits, '.', '_', '-', '/', '~', ':', '+')"
    return None


def address(value: str) -> str | None:
    """The address a server binds to: the profile's own ({host}, checked by the policy's ``targets``) or one."""
    return None if value == "{host}" or _ADDRESS.fullmatch(value) and not value.startswith("-") else (
        "must be {host} or an address")


def port(value: str) -> str | None:
    return None if value == "{port}" else integer(1, 65535)(value)


_LOOPBACK_URL = re.compile(r"https?://(127\.\d{1,3}\.\d{1,3}\.\d{1,3}|localhost|\[::1\]):\d{1,5}")


def loopback_url(value: str) -> str | None:
    """A server's base URL on the host's own loopback (``specsweep route`` in front of two servers there)."""
    return None if _LOOPBACK_URL.fullmatch(value) else "must be a server's base URL on the host's loopback, such " \
        "as http://127.0.0.1:8081"


def placeholder(*names: str) -> Check:
    """A value specsweep fills in ({api_key}: the run's key, from a Secret block)."""
    def check(value: str) -> str | None:
        return None if value in names else f"must be {' or '.join(names)} (specsweep fills it in)"
    return check


def json_object(keys: Mapping[str, Callable[[Any], bool]]) -> Check:
    """A JSON object whose keys are among ``keys``, each value passing its test."""
    def check(value: str) -> str | None:
        try:
            data = json.loads(value)
        except json.JSONDecodeError:
            return "must be a JSON object"
        if not isinstance(data, dict):
            return "must be a JSON object"
        for key, item in data.items():
            if key not in keys:
                return f"key {key!r} is not one specsweep's forms set (they set {', '.join(keys)})"
            if not keys[key](item):
                return f"key {key!r} has a value specsweep's forms never set ({item!r})"
        return None
    return check


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 1 << 20


def is_bool(value: Any) -> bool:
    return isinstance(value, bool)


def is_model(value: Any) -> bool:
    return isinstance(value, str) and model(value) is None


def is_word(value: Any) -> bool:
    return isinstance(value, str) and re.fullmatch(r"[A-Za-z0-9_-]{1,40}", value) is not None


def is_ranges(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(r, list) and all(is_int(x) for x in r) for r in value)
