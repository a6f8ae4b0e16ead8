"""stabledrl: distributed RL post-training for diffusion language models on Ray and DeepSpeed.

The package is one namespace over the project's folders: ``stabledrl.common`` (config, types,
model families, estimators, tasks, the reward sandbox, the weight transport), ``stabledrl.rollout``,
``stabledrl.learner``, ``stabledrl.coordinator``, and the user-facing ``stabledrl.cli``,
``stabledrl.evaluation`` and ``stabledrl.recipes``.

The public API, for a notebook or a script::

    import stabledrl
    cfg = stabledrl.load_config("deploy/configs/quickstart.yaml", ["run.steps=20"])
    run_dir = stabledrl.train(cfg)                      # the whole job, as `stabledrl train`
    result = stabledrl.evaluate(cfg, model=run_dir / "final_model", k=4)
    print(result["pass@1"])

Names are imported on first use, so ``import stabledrl`` loads neither torch nor Ray.
"""
from __future__ import annotations

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

try:
    __version__ = version("stabledrl")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

# public name -> the module that defines it
_EXPORTS = {
    "train": "stabledrl.api",
    "evaluate": "stabledrl.api",
    "load_config": "stabledrl.api",
    "ConfigError": "stabledrl.common.config.base",
    "JobConfig": "stabledrl.common.config.job",
    "ModelConfig": "stabledrl.common.config.model",
    "LearnerConfig": "stabledrl.common.config.learner",
}
__all__ = ["__version__", *_EXPORTS]

if TYPE_CHECKING:  # for editors and type checkers; at run time the names load lazily
    from stabledrl.api import evaluate as evaluate, load_config as load_config, train as train
    from stabledrl.common.config.base import ConfigError as ConfigError
    from stabledrl.common.config.job import JobConfig as JobConfig
    from stabledrl.common.config.learner import LearnerConfig as LearnerConfig
    from stabledrl.common.config.model import ModelConfig as ModelConfig


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'stabledrl' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
