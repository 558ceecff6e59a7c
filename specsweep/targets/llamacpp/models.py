"""Write tiny llama-architecture GGUF models: a target and a draft that agrees with it.

No weights can be downloaded here, so the models are random, built so that speculation
behaves realistically:
- each block adds only a small, scaled-down amount to the residual stream, so the token
  embedding dominates the logits and a model's greedy pick depends mostly on the current
  token, with the blocks (attention over the context) nudging it;
- the draft is the first block(s) of the target's own weights, so its greedy pick agrees
  with the target's most of the time (tuned to roughly 80-90 %), not always;
- one embedding dimension is a constant "bias" that the output projection turns into a
  large negative logit for control and byte tokens, so streams never end early and the
  text stays valid UTF-8;
- the vocabulary is learned from English text (``vocab``), so that prompts cost about as many tokens
  as on a real model.
Deterministic for a seed; a 28M-parameter target writes in about a second.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from specsweep.targets.llamacpp.vocab import SPECIAL, build_vocab
from specsweep.vocabulary import CHAT_TEMPLATE

#: How the models are generated (vocabulary, weights, GGUF fields): raise it with any change to that code or to
#: ``pieces.txt``, so that models kept in the cache by an earlier version are written again.
GENERATION = 2


@dataclass(frozen=True)
class ModelSpec:
    """Shape of a generated model."""

    n_embd: int = 512
    n_layer: int = 8
    n_head: int = 8
    n_ff: int = 1408
    n_ctx: int = 4096
    draft_layers: int = 1
    #: Tokens in the vocabulary (specials, bytes, learned pieces): an MT-Bench question is about 106 of them.
    vocab_size: int = 4096
    block_scale: float = 0.002
    seed: int = 1234

    def digest(self) -> str:
        """A short name for this shape as ``make_models`` writes it (GENERATION included)."""
        text = json.dumps({"generation": GENERATION, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class ModelFiles:
    target: Path
    draft: Path
    target_params: int
    draft_params: int
    vocab_size: int
    spec: ModelSpec

    def as_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["target"], d["draft"] = str(self.target), str(self.draft)
        return d


def _weights(spec: ModelSpec, n_vocab: int, n_special: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(spec.seed)
    d, f = spec.n_embd, spec.n_ff

    def mat(rows: int, cols: int, scale: float) -> np.ndarray:
        return (rng.standard_normal((rows, cols), dtype=np.float32) * scale).astype(np.float16)

    emb = rng.standard_normal((n_vocab, d), dtype=np.float32)
    emb[:, 0] = 4.0  # the constant "bias" dimension
    out = rng.standard_normal((n_vocab, d), dtype=np.float32) / np.sqrt(d)
    out[:, 0] = 0.0
    out[:n_special, :] = 0.0
    out[:n_special, 0] = -2.0  # control and byte tokens: always unlikely
    w: dict[str, np.ndarray] = {
        "token_embd.weight": emb.astype(np.float16),
        "output_norm.weight": np.ones(d, dtype=np.float32),
        "output.weight": out.astype(np.float16),
    }
    s = spec.block_scale
    for i in range(spec.n_layer):
        w[f"blk.{i}.attn_norm.weight"] = np.ones(d, dtype=np.float32)
        w[f"blk.{i}.attn_q.weight"] = mat(d, d, 1 / np.sqrt(d))
        w[f"blk.{i}.attn_k.weight"] = mat(d, d, 1 / np.sqrt(d))
        w[f"blk.{i}.attn_v.weight"] = mat(d, d, 1 / np.sqrt(d))
        w[f"blk.{i}.attn_output.weight"] = mat(d, d, s * 10 / np.sqrt(d))
        w[f"blk.{i}.ffn_norm.weight"] = np.ones(d, dtype=np.float32)
        w[f"blk.{i}.ffn_gate.weight"] = mat(f, d, 1 / np.sqrt(d))
        w[f"blk.{i}.ffn_up.weight"] = mat(f, d, 1 / np.sqrt(d))
        w[f"blk.{i}.ffn_down.weight"] = mat(d, f, s * 10 / np.sqrt(f))
    return w


def _write(path: Path, name: str, spec: ModelSpec, n_layer: int, vocab: tuple[list[str], list[float], list[int]],
           weights: dict[str, np.ndarray]) -> int:
    import gguf

    tokens, scores, types = vocab
    tmp = path.with_suffix(".tmp")
    writer = gguf.GGUFWriter(str(tmp), "llama")
    writer.add_name(name)
    writer.add_context_length(spec.n_ctx)
    writer.add_embedding_length(spec.n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(spec.n_ff)
    writer.add_head_count(spec.n_head)
    writer.add_head_count_kv(spec.n_head)
    writer.add_rope_dimension_count(spec.n_embd // spec.n_head)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(len(tokens))
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)
    params = 0
    for key, arr in weights.items():
        if key.startswith("blk.") and int(key.split(".")[1]) >= n_layer:
            continue
        writer.add_tensor(key, arr)
        params += arr.size
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(path)
    return params


def make_models(out_dir: Path, spec: ModelSpec = ModelSpec(), *, force: bool = False) -> ModelFiles:
    """Write target.gguf and draft.gguf (and spec.json) under ``out_dir``; reuse them if the spec (and GENERATION)
    match. One writer at a time (a lock in the folder): a second process waits, then reuses what the first wrote."""
    out_dir = Path(out_dir)
    if not force and (kept := _kept(out_dir, spec)) is not None:
        return kept  # no lock needed to read (a read-only folder of models works too)
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _make_models(out_dir, spec, force=force)


def _kept(out_dir: Path, spec: ModelSpec) -> ModelFiles | None:
    """The models already written under ``out_dir`` for ``spec`` by this GENERATION, or None (a spec.json that
    cannot be read counts as none: the models are written again)."""
    target, draft, meta = out_dir / "target.gguf", out_dir / "draft.gguf", out_dir / "spec.json"
    if not (target.exists() and draft.exists() and meta.exists()):
        return None
    try:
        saved = json.loads(meta.read_text())
        if saved.get("spec") == asdict(spec) and saved.get("generation") == GENERATION:
            return ModelFiles(target, draft, saved["target_params"], saved["draft_params"], saved["vocab_size"], spec)
    except (OSError, ValueError, KeyError, AttributeError):
        pass
    return None


def _make_models(out_dir: Path, spec: ModelSpec, *, force: bool) -> ModelFiles:
    target, draft, meta = out_dir / "target.gguf", out_dir / "draft.gguf", out_dir / "spec.json"
    if not force and (kept := _kept(out_dir, spec)) is not None:
        return kept  # another process wrote them while this one waited for the lock
    vocab = build_vocab(spec.vocab_size)
    weights = _weights(spec, len(vocab[0]), len(SPECIAL))
    tp = _write(target, "specsweep-tiny-target", spec, spec.n_layer, vocab, weights)
    dp = _write(draft, "specsweep-tiny-draft", spec, spec.draft_layers, vocab, weights)
    files = ModelFiles(target, draft, tp, dp, len(vocab[0]), spec)
    tmp = meta.with_suffix(".json.tmp")  # written whole, then in place: spec.json is what says the models are done
    tmp.write_text(json.dumps({"spec": asdict(spec), "generation": GENERATION, "target_params": tp,
                               "draft_params": dp, "vocab_size": len(vocab[0])}, indent=2))
    tmp.replace(meta)
    return files
