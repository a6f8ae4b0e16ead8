"""Model families behind one policy interface (see base.py; the families in families.py)."""
from stabledrl.common.models.base import DiffusionPolicy, FamilySpec, PolicyOutput
from stabledrl.common.models.export import export_hf, save_original_checkpoint, write_preset
from stabledrl.common.models.diffusion_gemma import ContextCache, DiffusionGemmaPolicy
from stabledrl.common.models.families import FAMILIES, CheckpointError, detect_family
from stabledrl.common.models.loading import load_policy, read_state_dict, resolve_token_ids
from stabledrl.common.models.tokenizer_files import load_tokenizer
from stabledrl.common.models.presets import PRESETS, build_tiny_policy

__all__ = [
    "DiffusionPolicy",
    "FamilySpec",
    "PolicyOutput",
    "DiffusionGemmaPolicy",
    "ContextCache",
    "FAMILIES",
    "PRESETS",
    "CheckpointError",
    "build_tiny_policy",
    "detect_family",
    "load_policy",
    "load_tokenizer",
    "read_state_dict",
    "resolve_token_ids",
    "save_original_checkpoint",
    "export_hf",
    "write_preset",
]
