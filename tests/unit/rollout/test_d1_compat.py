"""``sampler.compat: d1`` (rollout/sampling/d1_compat.py) decodes as d1's eval ``generate()`` does.

The expected token ids are figures printed by tests/parity/d1_generate.py, which ran d1's own
``eval/generate.py::generate`` (dllm-reasoning/d1) with LLaDA's released model code on this exact
tiny model and batch (fp32, CPU); no code of d1 or LLaDA is used here."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from stabledrl.common.config.sampler import SamplerConfig
from stabledrl.rollout.sampling import generate

_spec = importlib.util.spec_from_file_location("d1_generate_parity",
                                               Path(__file__).resolve().parents[2] / "parity" / "d1_generate.py")
parity = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(parity)

D1_PLAIN = [
    [50, 50, 50, 50, 50, 50, 50, 50, 56, 76, 50, 50, 50, 50, 50, 56, 50, 50, 50, 50, 50, 56, 56, 50, 50, 53, 53, 53, 41,
     41, 42, 41],
    [50, 50, 22, 50, 50, 50, 50, 50, 50, 72, 50, 54, 54, 50, 50, 50, 53, 53, 53, 53, 53, 37, 37, 53, 53, 53, 38, 79, 53,
     53, 53, 65],
    [84, 37, 37, 33, 50, 50, 33, 57, 84, 68, 68, 53, 84, 84, 84, 57, 84, 84, 84, 84, 68, 68, 84, 84, 68, 68, 84, 56, 56,
     56, 56, 84],
    [84, 84, 84, 84, 84, 53, 56, 84, 84, 84, 84, 84, 56, 56, 84, 84, 84, 84, 84, 56, 84, 84, 84, 84, 84, 56, 84, 84, 84,
     79, 84, 56],
]
D1_MASK_TIE = [  # [MASK] (2) wins argmaxes and stays in the output, as in d1
    [2] * 32,
    [2, 2, 22] + [2] * 29,
    [
        84,
        2,
        84,
        33,
        84,
        2,
        33,
        2,
        2,
        33,
        33,
        57,
        2,
        2,
        2,
        2,
        84,
        84,
        57,
        78,
        2,
        37,
        53,
        53,
        84,
        2,
        2,
        2,
        84,
        53,
        84,
        84,
    ],
    D1_PLAIN[3],
]


@pytest.mark.parametrize("mask_tie,expected", [(False, D1_PLAIN), (True, D1_MASK_TIE)])
def test_compat_d1_gives_d1s_tokens(mask_tie, expected):
    torch.set_num_threads(1)
    policy, prompts, cfg = parity.tiny_case(mask_tie=mask_tie)
    assert parity.project_tokens(policy, prompts, cfg).tolist() == expected


# d1's generate() with LLaDA's model code on tiny_case() in bf16 on the CPU (d1 loads LLaDA in bf16)
D1_BF16 = [
    [50, 50, 50, 50, 50, 50, 50, 50, 56, 76, 50, 50, 50, 50, 50, 56, 50, 50, 50, 50, 50, 56, 56, 50, 50, 53, 53, 53, 41,
     41, 42, 41],
    [50, 50, 22, 50, 50, 50, 50, 50, 50, 72, 50, 54, 54, 50, 50, 50, 53, 53, 53, 53, 53, 37, 37, 53, 53, 53, 38, 79, 53,
     53, 53, 53],
    [84, 37, 37, 33, 50, 50, 33, 57, 84, 68, 68, 53, 84, 84, 84, 57, 84, 84, 84, 84, 68, 68, 84, 84, 68, 68, 84, 56, 56,
     56, 84, 84],
    [84, 84, 84, 84, 84, 53, 56, 84, 84, 84, 84, 84, 56, 56, 84, 84, 84, 84, 84, 56, 84, 84, 84, 84, 84, 56, 84, 84, 84,
     79, 84, 56],
]


def test_compat_d1_in_bf16_gives_d1s_tokens():
    """In bf16 the project's LLaDA forward rotates q and k in fp32 as LLaDA's code does
    (common/models/full_precision_rope.py), so d1's bf16 tokens come out, not its fp32 ones."""
    policy, prompts, cfg = parity.tiny_case()
    tokens = parity.project_tokens(policy.to(torch.bfloat16), prompts, cfg).tolist()
    assert tokens == D1_BF16 and tokens != D1_PLAIN


def test_the_default_sampler_decodes_otherwise():
    """Hidden padding, per-row positions and a [MASK] that can never win change the tokens: the
    compat mode is what makes the pinned figures, not the default path."""
    policy, prompts, cfg = parity.tiny_case(mask_tie=True)
    rows = [p[p != parity.PAD] for p in prompts]  # the default sampler takes unpadded prompts
    default = cfg.model_copy(update={"compat": "none"})
    out = generate(policy, rows, torch.zeros(len(rows), dtype=torch.long), default).completion_ids
    assert (out != parity.MASK).all()
    assert out.tolist() != D1_MASK_TIE


def test_compat_d1_refuses_what_d1_does_not_do():
    with pytest.raises(ValueError, match="temperature 0"):
        SamplerConfig(gen_length=32, block_length=8, steps=16, temperature=0.7, compat="d1")
    policy, prompts, cfg = parity.tiny_case()
    with pytest.raises(ValueError, match="padded to one width"):
        generate(policy, [prompts[0], prompts[1][3:]], torch.zeros(2, dtype=torch.long), cfg)
