"""A real tokenizer.json, made here with the ``tokenizers`` package (nothing downloaded)."""

from __future__ import annotations

from pathlib import Path

from specsweep.bench.workload import _WORDS


def make_tokenizer(folder: Path, *, decoder: bool = True, vocab_size: int = 1000) -> Path:
    """Byte-level BPE trained on the synthetic prompts' vocabulary, with a ``<s>`` added in front of every
    text (as a model's tokenizer adds its BOS); ``decoder``: whether it can turn tokens back into text.
    With the default vocabulary each of the words is one token, as in a model's tokenizer; a small one
    (300) splits them into several."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    if decoder:
        tok.decoder = decoders.ByteLevel()
    corpus = [" ".join(_WORDS[i:] + _WORDS[:i]) for i in range(len(_WORDS))]
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "<s>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tokenizer.json"
    tok.save(str(path))
    return path
