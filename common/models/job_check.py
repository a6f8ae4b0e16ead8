"""A job's model against the rest of its config, read from the preset or the checkpoint's
config.json without loading weights: what the config alone cannot check (it knows no model family).
Called before any actor starts (`stabledrl train`, ``stabledrl.train``).
"""
from __future__ import annotations

from stabledrl.common.config.base import ConfigError
from stabledrl.common.config.job import JobConfig
from stabledrl.common.models.families import FAMILIES, CheckpointError, checkpoint_block_size, detect_family
from stabledrl.common.models.model_dir import read_json_file, resolve_model_dir
from stabledrl.common.models.presets import PRESETS, TINY_CANVAS


def check_sampler_layout(cfg: JobConfig) -> None:
    """The sampler's block layout against the policy's block size, its cache, graphs and compile
    (and ``learner.compile``) against its family, read from the preset or the checkpoint's
    config.json without loading weights
    (ConfigError naming the field)."""
    if cfg.model.preset is not None:
        family = PRESETS[cfg.model.preset]
        raw = {"canvas_length": TINY_CANVAS} if family == "diffusion_gemma" else {}
    else:
        try:  # a hub id resolves from the local cache here, before any actor starts
            config_file = resolve_model_dir(cfg.model.path, cfg.model.revision) / "config.json"
            if not config_file.is_file():
                raise ConfigError(f"model.path: {cfg.model.path} has no config.json")
            raw = read_json_file(config_file)
            family, _ = detect_family(raw, cfg.model.family)
        except CheckpointError as e:
            raise ConfigError(f"model.path: {e}") from None
    block = checkpoint_block_size(family, raw, cfg.model.block_size)
    block_diffusion = FAMILIES[family].attention == "block"
    try:
        cfg.sampler.layout(block, block_diffusion=block_diffusion)
        cfg.sampler.resolved_cache(block_diffusion)  # the cache, cuda_graph and compile for this family
    except ConfigError as e:  # each message starts with the sampler field, "cache='dual' ...", "steps=5 ..."
        raise ConfigError(f"sampler.{e}") from None
    if cfg.learner.compile and family == "diffusion_gemma":
        raise ConfigError("learner.compile: DiffusionGemma's layers are not the Llama / Qwen classes whose norms and "
                          "activation it compiles; set learner.compile=false")
