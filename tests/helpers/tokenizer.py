"""A real tokenizer.json, made with the ``tokenizers`` package (nothing downloaded)."""

from specsweep.targets.vllm.models import make_tokenizer

__all__ = ["make_tokenizer"]
