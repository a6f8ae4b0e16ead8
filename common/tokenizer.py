"""Character-level tokenizer for the tasks stabledrl generates (no download needed).

Built as a real ``transformers.PreTrainedTokenizerFast`` so it saves to and loads from a model
directory like any released tokenizer. Real checkpoints bring their own ``tokenizer.json``.
"""
from __future__ import annotations

from transformers import PreTrainedTokenizerFast

PAD, EOS, MASK, BOS = "<pad>", "<eos>", "<mask>", "<bos>"
SPECIALS = [PAD, EOS, MASK, BOS]
# Everything the generated tasks print: digits, arithmetic, boxed answers, sudoku grids, prose.
DEFAULT_ALPHABET = (
    "0123456789+-*/=()[]{}<>.,:;!?'\"\\|_#%&^~ \n"
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
)


def build_char_tokenizer(alphabet: str = DEFAULT_ALPHABET) -> PreTrainedTokenizerFast:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    chars = list(dict.fromkeys(alphabet))
    vocab = {tok: i for i, tok in enumerate(SPECIALS + chars)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=PAD))
    core.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token=PAD, eos_token=EOS, mask_token=MASK, bos_token=BOS
    )
    return tok
