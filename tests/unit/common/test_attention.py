import torch

from stabledrl.common.attention import PAD_BLOCK, block_causal_mask, block_ids, full_mask
from stabledrl.common.models import build_tiny_policy
from stabledrl.common.types import left_pad


def test_block_ids_align_to_response_start_whatever_the_padding():
    ids, pm = left_pad([torch.arange(5), torch.arange(2)], pad_id=0)
    blocks = block_ids(pm, completion_width=6, block_size=4)
    assert blocks[0].tolist() == [-2, -1, -1, -1, -1, 0, 0, 0, 0, 1, 1]
    assert blocks[1, :3].tolist() == [PAD_BLOCK] * 3
    assert blocks[1, 3:].tolist() == [-1, -1, 0, 0, 0, 0, 1, 1]


def test_sdpa_honours_custom_4d_mask_and_padding_is_invisible():
    """The backend must obey our masks: a left-padded row gives the same logits as the unpadded one."""
    policy = build_tiny_policy("sdar", block_size=4)
    prompt = torch.tensor([5, 6, 7])
    completion = torch.tensor([10, 11, 12, 13, 14, 15, 16, 17])
    logits = []
    for width in (3, 7):
        ids, pm = left_pad([prompt], pad_id=0, width=width)
        x = torch.cat([ids, completion[None]], 1)
        valid = torch.cat([pm, torch.ones(1, 8, dtype=torch.bool)], 1)
        pos = (valid.long().cumsum(1) - 1).clamp(min=0)
        mask = block_causal_mask(block_ids(pm, 8, 4), valid)
        with torch.no_grad():
            logits.append(policy(x, attention_mask=mask, position_ids=pos, logits_from=width).logits)
    torch.testing.assert_close(logits[0], logits[1], atol=1e-5, rtol=1e-5)


def test_block_causal_mask_hides_later_blocks():
    policy = build_tiny_policy("sdar", block_size=4)
    _, pm = left_pad([torch.arange(4)], pad_id=0)
    x = torch.randint(4, 90, (1, 12))
    valid = torch.ones(1, 12, dtype=torch.bool)
    mask = block_causal_mask(block_ids(pm, 8, 4), valid)
    y = x.clone()
    y[0, 8:] = 3  # change the last block only
    with torch.no_grad():
        a = policy(x, attention_mask=mask).logits
        b = policy(y, attention_mask=mask).logits
    torch.testing.assert_close(a[:, :8], b[:, :8])
    assert (a[:, 8:] - b[:, 8:]).abs().max() > 1e-4


def test_full_mask_pad_rows_see_only_themselves():
    valid = torch.tensor([[False, True, True]])
    m = full_mask(valid)[0, 0]
    assert m.tolist() == [[True, False, False], [False, True, True], [False, True, True]]
