"""Find secrets in launch commands and environments, and keep them out of every output.

A secret is the value of a flag such as ``--api-key`` or ``--hf-token`` (as the next
argument or after ``=``), the value of an environment variable named like ``*_TOKEN`` or
``*API_KEY*``, or any value registered explicitly (an SSH key, a Secret block's value).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

MASK = "***"

# "token" but not "tokens": --hf-token and HF_TOKEN hide their value, --speculative-num-draft-tokens (a count) not.
_SECRET_WORDS = r"(api[-_]?key|token(?!s)|secret|password|passwd|passphrase|credential|auth)"
_SECRET_FLAG = re.compile(rf"^--?[A-Za-z0-9-_]*{_SECRET_WORDS}[A-Za-z0-9-_]*$", re.IGNORECASE)
_SECRET_ENV = re.compile(rf"^[A-Za-z0-9_]*{_SECRET_WORDS}[A-Za-z0-9_]*$|^[A-Za-z0-9_]*_KEY$", re.IGNORECASE)
# Values this short would turn ordinary words into "***"; no real secret is this short.
_MIN_SECRET_LEN = 4


def is_secret_flag(arg: str) -> bool:
    return bool(_SECRET_FLAG.match(arg.split("=", 1)[0]))


def is_secret_env(name: str) -> bool:
    return bool(_SECRET_ENV.match(name))


def secrets_in_argv(argv: Sequence[str]) -> list[str]:
    """The values that follow a secret flag in ``argv``."""
    found: list[str] = []
    for i, arg in enumerate(argv):
        flag, eq, value = arg.partition("=")
        if not arg.startswith("-") or not is_secret_flag(flag):
            continue
        if eq:
            found.append(value)
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            found.append(argv[i + 1])
    return [s for s in found if len(s) >= _MIN_SECRET_LEN]


def secrets_in_env(env: Mapping[str, str]) -> list[str]:
    return [v for k, v in env.items() if is_secret_env(k) and len(v) >= _MIN_SECRET_LEN]


def mask_argv(argv: Sequence[str]) -> list[str]:
    """A copy of ``argv`` with secret values replaced by ``***``."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next and not arg.startswith("--"):
            out.append(MASK)
            hide_next = False
            continue
        hide_next = False
        flag, eq, _ = arg.partition("=")
        if arg.startswith("-") and is_secret_flag(flag):
            if eq:
                out.append(f"{flag}={MASK}")
            else:
                out.append(arg)
                hide_next = True
            continue
        out.append(arg)
    return out


def mask_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: (MASK if is_secret_env(k) else v) for k, v in env.items()}


class Redactor:
    """Replaces every registered secret value in a text with ``***``."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._secrets: set[str] = set()
        self.add(*secrets)

    def add(self, *secrets: str | None) -> None:
        for s in secrets:
            if s and len(s) >= _MIN_SECRET_LEN:
                self._secrets.add(s)
                # Keys spread over lines (PEM) leak line by line, so register each line too.
                for line in s.splitlines():
                    line = line.strip()
                    if len(line) >= 16 and not line.startswith("-----"):
                        self._secrets.add(line)

    def __call__(self, text: str) -> str:
        # Longest first, so a secret that contains another is masked whole.
        for s in sorted(self._secrets, key=len, reverse=True):
            if s in text:
                text = text.replace(s, MASK)
        return text

    def __bool__(self) -> bool:
        return bool(self._secrets)


class RedactingLogger(logging.LoggerAdapter[Any]):
    """Wraps any logger (a Prefect run logger included) and masks secrets in every line."""

    def __init__(self, logger: logging.Logger | logging.LoggerAdapter[Any], redactor: Redactor) -> None:
        super().__init__(logger, {})
        self.redactor = redactor

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        return msg, kwargs

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        if self.isEnabledFor(level):
            text = str(msg) % args if args else str(msg)
            self.logger.log(level, self.redactor(text), **kwargs)


def refuse_key_parameter(data: Any, where: str) -> Any:
    """For the ``mode="before"`` validator of a model that flows take as a parameter: an
    ``api_key`` in it would show in the Prefect UI, so it is refused (an empty one, as a
    model written out without its key has, is dropped)."""
    if not isinstance(data, dict) or "api_key" not in data:
        return data
    if not data["api_key"]:
        return {k: v for k, v in data.items() if k != "api_key"}
    raise ValueError(
        f"api_key is not accepted in {where}: a flow parameter shows in the Prefect UI. Store the key in a "
        "Secret block (in the UI, or Secret(value=...).save(name)) and give its name in api_key_secret"
    )


def public_url(url: str) -> str:
    """``url`` as it may be shown: without ``user:password@`` (pyarrow and fsspec take them as credentials), its
    query and its fragment (where options such as keys ride). A path (no '://') comes back as it is."""
    if "://" not in url:
        return url
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", ""))
