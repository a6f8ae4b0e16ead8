"""The job driver: builds actors, owns the policy version and staleness, pushes weights."""
