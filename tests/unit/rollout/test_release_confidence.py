"""``sampler.confidence: d1 / stabledrl``: the commit sets of the releases' samplers.

The figures were printed by tests/parity/release_confidence.py, which ran d1's
``DiffuGRPOTrainer.generate`` and the StableDRL release's ``generate_spg`` on the synthetic blocks of
``block_logits`` (one greedy step, 4 of 32 positions committed), over the blocks where [MASK] is no
position's argmax; no code of either release is used here."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("release_confidence_parity",
                                               Path(__file__).resolve().parents[2] / "parity" / "release_confidence.py")
parity = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(parity)

# (release, [MASK] logit shift) -> (blocks compared, digest of the release's commit sets, the release's sets on
# the blocks where the project's float32 confidence commits otherwise)
RELEASES = {
    ("d1", 20.0): (200, "7b574f9a85dd91b0", {21: [6, 18, 19, 21], 24: [10, 19, 20, 26], 32: [4, 8, 13, 27],
                                             40: [7, 19, 21, 30], 81: [10, 12, 25, 29], 162: [4, 8, 16, 26],
                                             180: [12, 13, 18, 30], 194: [4, 24, 26, 28]}),
    ("stabledrl", 20.0): (200, "d4d4b6342cdb1642", {}),
    ("d1", 3.0): (180, "851374df06a8338d", {5: [8, 10, 22, 31], 21: [6, 18, 19, 21], 24: [10, 19, 20, 26],
                                            32: [4, 8, 13, 27], 40: [7, 19, 21, 30], 81: [10, 12, 25, 29],
                                            162: [4, 8, 16, 26], 180: [12, 13, 18, 30], 194: [4, 24, 26, 28],
                                            197: [2, 18, 20, 26]}),
    ("stabledrl", 3.0): (180, "c0448a49d679cd09", {5: [8, 10, 22, 31], 135: [7, 11, 22, 26], 197: [2, 18, 20, 26]}),
}


@pytest.mark.parametrize("release, shift", sorted(RELEASES))
def test_release_confidence_commits_what_the_release_commits(release, shift):
    """d1 ranks by a bf16 softmax with [MASK] in it and breaks ties with torch.topk over [prompt | canvas];
    the StableDRL release by the fp32 softmax with [MASK], topk over the canvas. The option reproduces every
    commit set; the float32 default differs on the blocks listed (bf16 ties, [MASK]'s share of the softmax)."""
    blocks, want, float32_differs = RELEASES[release, shift]
    kept = [b for b in range(parity.BLOCKS) if not parity.mask_wins(parity.block_logits(b, shift))]
    assert len(kept) == blocks
    ours = {b: parity.project_commits(parity.block_logits(b, shift), release) for b in kept}
    assert parity.digest(ours) == want
    default = {b: parity.project_commits(parity.block_logits(b, shift), "float32") for b in float32_differs}
    assert all(default[b] != sets and ours[b] == sets for b, sets in float32_differs.items())


def test_release_confidence_is_a_sampler_setting():
    from stabledrl.common.config.sampler import SamplerConfig

    assert SamplerConfig().confidence == "float32"
    assert SamplerConfig(confidence="d1").confidence == "d1"
    with pytest.raises(ValueError, match="confidence"):
        SamplerConfig(confidence="bf16")
