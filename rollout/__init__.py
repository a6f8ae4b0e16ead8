"""Rollout side: the diffusion sampling engine and the rollout worker (Ray actor)."""
