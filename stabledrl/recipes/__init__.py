"""Recipes built on the job: the warm start (a short SFT stage before RL, cached) and the
stability study (several methods over several seeds, with its report)."""
