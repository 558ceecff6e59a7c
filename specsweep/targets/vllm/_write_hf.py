"""Write a tiny random llama target and its draft as Hugging Face folders (run by the vLLM
virtualenv's python, which has torch and transformers; specsweep's own has neither).

    python _write_hf.py SPEC_JSON OUT_DIR

The draft is the target's first ``draft_layers`` blocks with the same embeddings, final norm and
head; the target's later blocks add little to the residual stream (``block_scale``), so greedy
drafts are mostly accepted, as with a real draft model of the same family.
"""

import json
import sys
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def main() -> None:
    spec = json.loads(sys.argv[1])
    out = Path(sys.argv[2])
    torch.manual_seed(spec["seed"])
    common = dict(vocab_size=spec["vocab_size"], hidden_size=spec["hidden"], intermediate_size=spec["ffn"],
                  num_attention_heads=spec["heads"], num_key_value_heads=spec["heads"],
                  max_position_embeddings=spec["max_len"], bos_token_id=spec["bos_id"], eos_token_id=spec["eos_id"],
                  tie_word_embeddings=False, torch_dtype="bfloat16")
    target = LlamaForCausalLM(LlamaConfig(num_hidden_layers=spec["layers"], **common))
    with torch.no_grad():
        for layer in target.model.layers[spec["draft_layers"]:]:
            layer.self_attn.o_proj.weight.mul_(spec["block_scale"])
            layer.mlp.down_proj.weight.mul_(spec["block_scale"])
    draft = LlamaForCausalLM(LlamaConfig(num_hidden_layers=spec["draft_layers"], **common))
    state = {k: v for k, v in target.state_dict().items()
             if not k.startswith("model.layers.") or int(k.split(".")[2]) < spec["draft_layers"]}
    draft.load_state_dict(state)
    for name, model in (("target", target), ("draft", draft)):
        model.to(torch.bfloat16).save_pretrained(out / name, safe_serialization=True)
        print(f"{name} {sum(p.numel() for p in model.parameters())}")


if __name__ == "__main__":
    main()
