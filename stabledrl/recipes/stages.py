"""The stages `stabledrl train` wires into a job's driver (coordinator/job_setup.py, ``Stages``):
the warm start (an SFT recipe, cached) and the in-training protocol evaluation.

    Driver(cfg, stages=JOB_STAGES).run()
"""
from __future__ import annotations

from stabledrl.coordinator.job_setup import Stages
from stabledrl.evaluation.protocol import InTraining
from stabledrl.recipes.warmstart import warm_start

JOB_STAGES = Stages(warm_start=warm_start, protocol_eval=InTraining)
