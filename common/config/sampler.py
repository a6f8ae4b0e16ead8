"""Sampler settings: how a rollout turns prompts into completions (docs/algorithms.md §6).

Defaults are the released StableDRL/SPG rollout settings for LLaDA-8B (gen 256, 128 steps,
block 32, temperature 0.9, low-confidence remasking, no cache). A block-diffusion policy
(SDAR / TraDo) generates in its own trained block size: leave ``block_length`` at ``None`` (or set
it equal to the policy's) and the sampler takes ``policy.block_size``.

Every cross-field rule is checked where the values are known and names the field that breaks it:
at construction for the fields themselves, and in ``layout(policy_block_size)`` once the policy
(and so a ``block_length=None``) is known.
"""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field, ValidationInfo, field_validator, model_validator

from stabledrl.common.config.base import ConfigError, StrictModel


class SamplerConfig(StrictModel):
    """One rollout engine's sampling settings."""

    gen_length: int = Field(
        256, ge=1, description="completion canvas length C (tokens); EOS-filled after the first EOS"
    )
    block_length: Optional[int] = Field(
        32,
        ge=1,
        description="semi-autoregressive block (full attention); None = the policy's block size. "
        "Block-diffusion policies require None or their own block size.",
    )
    steps: Optional[int] = Field(
        128,
        ge=1,
        description="denoising steps over the whole canvas, split evenly over the blocks (one forward each); "
        "None = one token per step (steps = gen_length)",
    )
    temperature: float = Field(
        0.9, ge=0.0, description="0 = argmax; T > 0 = Gumbel-max sample from softmax(logits / T)"
    )
    remasking: Literal["low_confidence", "random"] = Field(
        "low_confidence",
        description="which masked positions of the block are committed each step: the k most confident "
        "(confidence = probability of the chosen token), or k uniformly at random",
    )
    threshold: Optional[float] = Field(
        None,
        gt=0.0,
        le=1.0,
        description="parallel decoding: commit every masked position of the block whose confidence exceeds this "
        "(at least one per step) instead of the fixed k per step; needs remasking=low_confidence",
    )
    cache: Literal["auto", "none", "prefix", "dual"] = Field(
        "auto",
        description="KV cache. Full attention: none (exact), prefix or dual (approximate, Fast-dLLM, refreshed once "
        "per block). Block diffusion: prefix = the exact cache of finished blocks, none = reference path "
        "without cache, dual is invalid. auto = the fastest exact choice (full: none, block: prefix).",
    )
    noise_dtype: Literal["float64", "float32", "bfloat16", "float32_then_bfloat16", "float32_product"] = Field(
        "float64",
        description="precision of the Gumbel-max draw. float64 (LLaDA's choice, the default) and float32: the uniform "
        "draw and the noise in that dtype. bfloat16: d1's sampler, u drawn and exp(l)/(-log u)^T computed in bf16. "
        "float32_product: the StableDRL release's as its FSDP launch runs it, exp(l)/(-log(u + 1e-9))^T in fp32, "
        "kept in fp32 (the release casts to model.dtype, fp32 once FSDP holds accelerate's upcast parameters: "
        "tests/parity/stabledrl_noise_dtype.py); float32_then_bfloat16: the same cast to bf16 before the argmax "
        "(model.dtype before FSDP's first forward). Coarser noise rounds the perturbed scores, so near-ties go to "
        "the higher logit more often than softmax(l/T) says: the effective temperature drops (arXiv 2409.02908)",
    )
    confidence: Literal["float32", "d1", "stabledrl"] = Field(
        "float32",
        description="the confidence low-confidence remasking ranks by, and how ties part. float32 (the default): "
        "p(x0) from a float32 logsumexp over the vocabulary without [MASK], ties to the earlier position. d1: "
        "d1's sampler, softmax(logits.to(bf16)) over the whole vocabulary with [MASK], read in bf16 (near-equal "
        "confidences tie), the k chosen by torch.topk over d1's row [prompt | canvas]. stabledrl: the StableDRL "
        "release's under its FSDP launch, the same softmax in fp32, torch.topk over the canvas alone "
        "(rollout/sampling/decode.py). With a threshold, ties part as float32's. [MASK] never wins the argmax here",
    )
    noise_source: Literal["generator", "counter"] = Field(
        "generator",
        description="where each row's Gumbel uniforms come from. generator (the default): a torch generator per row, "
        "one draw per row and step (at SDAR-8B's 128 rows x 4 positions x 151,936 tokens, 128 kernels and ~3 ms a "
        "step on an H100). counter: a counter-based draw, u = splitmix64(row seed + (the row's step, position, "
        "token) x golden ratio), computed inside the token choice for all rows at once: with sampler.compile one "
        "fused pass (0.94 against 2.94 ms a step at SDAR-8B's shape on an H100), without it a dozen integer passes "
        "(12.7 against 5.9 ms: use it compiled); a row's tokens still depend only on its own seed and canvas, "
        "never on its batch neighbours or on how long it waited, but they differ from the generator's. "
        "float64 / float32 noise only "
        "(the uniform-block sampler's canvas noise keeps its generators)",
    )
    stop_at_eos: bool = Field(
        True, description="stop a row once it has an EOS with everything before it decoded; stop when all rows have"
    )
    max_batch_size: int = Field(64, ge=1, description="rows per sampler call; the engine splits larger requests")
    max_tokens_per_forward: Optional[int] = Field(
        None, ge=1, description="bound on the activations of the rollout worker: tokens one forward may carry, "
        "rows x canvas width (the call's longest prompt + gen_length) for the sampler, x the estimator's views for the "
        "behaviour estimate; a request's rows are split into calls that fit (and hold at most max_batch_size rows; a "
        "row longer than the bound runs alone). The activations, the logits of the decoded block and a cache grow "
        "with it (BENCHMARKS.md, the colocated memory). Splitting changes no token: a row depends only on its own "
        "seed. None: max_batch_size rows a call"
    )
    cuda_graph: bool = Field(
        False,
        description="replay the cached step as a CUDA graph (with grouped-query heads folded into the query): "
        "block diffusion's in-block step under the exact cache (cache prefix/auto), full attention's dual-cache "
        "step (cache dual); other caches are refused. Each shape is captured once per engine and replayed, the "
        "prompt width is rounded up to a multiple of 32; tokens equal the eager path's in fp32. Without CUDA the "
        "same static steps run uncaptured (one log line)",
    )
    compile: bool = Field(
        False,
        description="the sampler's forwards through torch.compile: the elementwise work between the matmuls (norms, "
        "rotary, activations, residual adds) fused into a few kernels per layer. Two places: with cuda_graph, each "
        "graphed step before its capture (the first shape with static sizes, the second recompiled with dynamic "
        "ones that every later prompt width reuses: two compilations a process, each over a minute at 8B; "
        "measured at SDAR-8B on an H100: no speed-up, 0.96x the uncompiled graph), and the dual cache's refresh at "
        "each block start through the compiled decoder layers below (together, at LLaDA-8B in d1's colocated job "
        "of 12 rows on an H200: generation at 62% of the matmul rate, the graph alone 44%); without, the exact "
        "full forward of full attention (cache none): its decoder layers compiled once, a new canvas width "
        "recompiling once with "
        "dynamic sizes (measured at LLaDA-8B, 32 rows x 384 tokens on an H100: 1.30x the eager forward). "
        "Other eager cached paths are refused. Either way each step's token choice (the Gumbel draw's arithmetic, "
        "argmax and confidence) is compiled as well: one pass over the block's logits instead of a dozen. "
        "Compiled kernels round differently from eager ones, so "
        "tokens match the eager path's in distribution, not bit for bit",
    )

    compat: Literal["none", "d1"] = Field(
        "none",
        description="'d1': decode exactly as d1's eval generate() does (rollout/sampling/d1_compat.py: the batch as "
        "padded by the caller with the padding visible, full forwards, the mask token may win the argmax, fp16 "
        "autocast on CUDA, the whole window returned); LLaDA-style policies, temperature 0 and remasking "
        "low_confidence only",
    )

    @field_validator("block_length")
    @classmethod
    def _block_divides_gen(cls, v: Optional[int], info: ValidationInfo) -> Optional[int]:
        gen = info.data.get("gen_length")
        if v is not None and gen is not None and gen % v:
            raise ValueError(f"block_length={v} must divide gen_length={gen}")
        return v

    @field_validator("steps")
    @classmethod
    def _steps_fit_blocks(cls, v: Optional[int], info: ValidationInfo) -> Optional[int]:
        gen, block = info.data.get("gen_length"), info.data.get("block_length")
        if v is not None and gen is not None and block is not None:
            _steps_problem(v, gen, block, raise_as=ValueError)
        return v

    @field_validator("threshold")
    @classmethod
    def _threshold_needs_confidence(cls, v: Optional[float], info: ValidationInfo) -> Optional[float]:
        if v is not None and info.data.get("remasking") != "low_confidence":
            raise ValueError("threshold decoding ranks by confidence; it needs remasking='low_confidence'")
        return v

    @field_validator("cuda_graph")
    @classmethod
    def _graph_needs_a_cache(cls, v: bool, info: ValidationInfo) -> bool:
        if v and info.data.get("cache") == "none":
            raise ValueError(_NO_GRAPHED_STEP)
        return v

    @model_validator(mode="after")
    def _recheck_on_assignment(self) -> "SamplerConfig":
        # field validators see only earlier fields at construction; assignment re-runs this check
        if self.block_length is not None:
            self.layout(self.block_length)
        if self.threshold is not None and self.remasking != "low_confidence":
            raise ValueError("threshold: needs remasking='low_confidence'")
        if self.cuda_graph and self.cache == "none":
            raise ValueError(f"cuda_graph: {_NO_GRAPHED_STEP}")
        if self.compile and not self.cuda_graph and self.cache not in ("none", "auto"):
            raise ValueError(f"compile: {_NO_COMPILED_PATH} (cache={self.cache!r})")
        if self.noise_source == "counter" and self.noise_dtype not in ("float64", "float32"):
            raise ValueError(f"noise_source: 'counter' draws float64 or float32 noise; noise_dtype="
                             f"{self.noise_dtype!r} is a release's own arithmetic over a torch generator's draws "
                             "(use noise_source 'generator')")
        if self.compat == "d1" and (self.temperature != 0 or self.remasking != "low_confidence" or self.threshold
                                    is not None or self.cuda_graph or self.compile):
            raise ValueError("compat: 'd1' reproduces d1's greedy eval: it needs temperature 0, remasking "
                             "low_confidence, no threshold, no cuda_graph and no compile")
        return self

    def layout(self, policy_block_size: int, *, block_diffusion: bool = False) -> tuple[int, int, int]:
        """(block_length, num_blocks, steps_per_block) for a policy; ConfigError names the bad field."""
        block = self.block_length if self.block_length is not None else int(policy_block_size)
        if block_diffusion and block != policy_block_size:
            raise ConfigError(
                f"block_length={block} differs from the block-diffusion policy's block size {policy_block_size}; "
                "set block_length to None or to the policy's block size"
            )
        if self.gen_length % block:
            raise ConfigError(f"block_length={block} must divide gen_length={self.gen_length}")
        steps = self.steps if self.steps is not None else self.gen_length
        _steps_problem(steps, self.gen_length, block, raise_as=ConfigError)
        num_blocks = self.gen_length // block
        return block, num_blocks, steps // num_blocks

    def resolved_cache(self, block_diffusion: bool) -> Literal["none", "prefix", "dual"]:
        """The cache a policy family runs with; ConfigError where it cannot (or cannot be graphed)."""
        if self.cache == "auto":
            mode = "prefix" if block_diffusion else "none"
        elif block_diffusion and self.cache == "dual":
            raise ConfigError(
                "cache='dual' has no meaning for block diffusion (later blocks are invisible); use prefix or none"
            )
        else:
            mode = self.cache
        if self.cuda_graph and mode != ("prefix" if block_diffusion else "dual"):
            family = "block-diffusion" if block_diffusion else "full-attention"
            raise ConfigError(
                f"cuda_graph=True with cache={self.cache!r} ({mode!r} for a {family} policy): {_NO_GRAPHED_STEP}"
            )
        if self.compile and not self.cuda_graph and (block_diffusion or mode != "none"):
            family = "block-diffusion" if block_diffusion else "full-attention"
            raise ConfigError(f"compile=True with cache={self.cache!r} ({mode!r} for a {family} policy): "
                              f"{_NO_COMPILED_PATH}")
        return mode


_NO_COMPILED_PATH = (
    "the compiled paths are the graphed steps (cuda_graph=True) and the exact full forward of a full-attention "
    "policy (cache 'none', or 'auto' for LLaDA and Dream); set one of those or compile=False"
)
_NO_GRAPHED_STEP = (
    "CUDA graphs replay a cached step of static shape: the exact cache of block diffusion (cache 'prefix' or "
    "'auto') or the dual cache of full attention (cache 'dual'); set one of those or cuda_graph=False"
)


def _steps_problem(steps: int, gen: int, block: int, *, raise_as: type[Exception]) -> None:
    num_blocks = gen // block
    if steps % num_blocks:
        raise raise_as(f"steps={steps} must be a multiple of the number of blocks gen_length/block_length={num_blocks}")
    if steps > gen:
        raise raise_as(f"steps={steps} exceeds gen_length={gen}: a step commits at least one token")
