"""Learner side: losses (pure functions, one registry), the DeepSpeed engine, the learner worker."""
