"""The layout a checkpoint tag was written at, read from DeepSpeed's file names (learner/reshard.py):
fp32 engines write ``zero_pp_rank_R_..._optim_states.pt``, bf16 engines the same names prefixed
``bf16_``; a bf16 run's tag must not read as one with no optimizer state."""
import pytest

from stabledrl.common.trust.checkpoint_files import CheckpointError
from stabledrl.learner.reshard import Layout, optim_file, saved_layout


@pytest.mark.parametrize("prefix", ["", "bf16_"])
@pytest.mark.parametrize("stage", [2, 3])
def test_saved_layout_reads_fp32_and_bf16_names(tmp_path, prefix, stage):
    for rank in range(2):
        (tmp_path / f"{prefix}zero_pp_rank_{rank}_mp_rank_00_optim_states.pt").write_bytes(b"x")
        if stage == 3:
            (tmp_path / f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt").write_bytes(b"x")
    if stage == 2:
        (tmp_path / "mp_rank_00_model_states.pt").write_bytes(b"x")
    assert saved_layout(tmp_path) == Layout(2, stage)
    assert optim_file(tmp_path, 1).name == f"{prefix}zero_pp_rank_1_mp_rank_00_optim_states.pt"


def test_a_tag_without_optimizer_state_is_refused(tmp_path):
    (tmp_path / "mp_rank_00_model_states.pt").write_bytes(b"x")
    with pytest.raises(CheckpointError, match="optimizer-state files of ranks"):
        saved_layout(tmp_path)
