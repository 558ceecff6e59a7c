"""Regular expressions a user gives that run on the worker (``cleanup_patterns``), bounded so that none can
hold it: ``re`` has no timeout and keeps the GIL while it matches, so one slow pattern would freeze the
worker's event loop, its heartbeats and the kill's own timeout.

Every accepted pattern matches in at most quadratic time in the text, and the text is cut to its first
``MATCH_CHARS`` characters: a repeat that can take more than one character applies to one character,
class or '.' only (no repeated group or alternation: those are exponential), and a pattern has at most
one such repeat (two are cubic)."""

from __future__ import annotations

import re
from re import _constants as _sre  # type: ignore[attr-defined]  # stdlib, Python >= 3.11
from re import _parser as _sre_parse  # type: ignore[attr-defined]
from typing import Any

MAX_PATTERNS, MAX_LENGTH, MATCH_CHARS = 16, 200, 4096
_REPEATS = (_sre.MAX_REPEAT, _sre.MIN_REPEAT, _sre.POSSESSIVE_REPEAT)
_ONE_CHAR = (_sre.LITERAL, _sre.NOT_LITERAL, _sre.IN, _sre.ANY)


def why_slow(pattern: str) -> str | None:
    """Why a valid pattern could take long on a long text, or None."""
    wide = 0

    def walk(items: Any) -> str | None:
        nonlocal wide
        for op, av in items:
            if op in _REPEATS:
                if av[1] > 1:
                    if len(av[2]) != 1 or av[2][0][0] not in _ONE_CHAR:
                        return "it repeats a group (only one character, class or '.' may take *, + or {m,n})"
                    wide += 1
                continue
            if op is _sre.SUBPATTERN:
                inner = [av[-1]]
            elif op is _sre.ATOMIC_GROUP:
                inner = [av]
            elif op in (_sre.ASSERT, _sre.ASSERT_NOT):
                inner = [av[1]]
            elif op is _sre.BRANCH:
                inner = list(av[1])
            elif op is _sre.GROUPREF_EXISTS:
                inner = [b for b in av[1:] if b is not None]
            else:
                continue
            for sub in inner:
                if (why := walk(sub)) is not None:
                    return why
        return None

    why = walk(_sre_parse.parse(pattern))
    return why or ("it has more than one repeat (*, +, {m,n}): give several patterns instead" if wide > 1 else None)


def check(patterns: list[str], what: str = "pattern") -> None:
    """ValueError naming the pattern (``what`` says whose) and what to change, for one that is invalid, long or
    could be slow."""
    if len(patterns) > MAX_PATTERNS:
        raise ValueError(f"{len(patterns)} {what}s given: at most {MAX_PATTERNS}")
    for n, p in enumerate(patterns, 1):
        if len(p) > MAX_LENGTH:
            raise ValueError(f"{what} {n} is {len(p)} characters long: at most {MAX_LENGTH}")
        try:
            re.compile(p)
        except re.error as exc:
            raise ValueError(f"{what} {p!r} is not a valid regular expression: {exc}") from None
        if (why := why_slow(p)) is not None:
            raise ValueError(f"{what} {p!r} could take too long to match a long command line: {why}")


def search(rx: re.Pattern[str], text: str) -> bool:
    """``rx`` found in the first ``MATCH_CHARS`` characters of ``text``."""
    return rx.search(text[:MATCH_CHARS]) is not None
