"""LLaDA's own module names and the names of the modules they become here: pure data, so that the
checkpoint conversion (common/models/convert.py) and the LoRA config, which may name LLaDA's own
Linear modules (``learner.lora.module_names: llada``), read one table, and the config loads no model code.
"""
from __future__ import annotations

# a block's module -> its module in the Llama block it becomes
LLADA_BLOCK = {
    "q_proj": "self_attn.q_proj",
    "k_proj": "self_attn.k_proj",
    "v_proj": "self_attn.v_proj",
    "attn_out": "self_attn.o_proj",
    "ff_proj": "mlp.gate_proj",  # silu(ff_proj(x)) * up_proj(x): ff_proj is the gate
    "up_proj": "mlp.up_proj",
    "ff_out": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ff_norm": "post_attention_layernorm",
}
# LLaDA's own Linear module names -> the names of the modules they become here (the last part of
# the name). ``ff_out`` names two modules in LLaDA's code, each block's down projection and the
# output head (``model.transformer.ff_out``), so a PEFT target "ff_out" there adapts both.
LLADA_LINEAR_NAMES: dict[str, tuple[str, ...]] = {
    own: (ours.rsplit(".", 1)[-1],) for own, ours in LLADA_BLOCK.items() if not own.endswith("_norm")
}
LLADA_LINEAR_NAMES["ff_out"] += ("lm_head",)


def llada_linear_targets(own_names: list[str]) -> list[str]:
    """The project's module names for LLaDA's own Linear names (``LLADA_LINEAR_NAMES``); KeyError
    names one that LLaDA does not have."""
    out: list[str] = []
    for name in own_names:
        if name not in LLADA_LINEAR_NAMES:
            raise KeyError(name)
        out += [t for t in LLADA_LINEAR_NAMES[name] if t not in out]
    return out
