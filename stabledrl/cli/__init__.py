"""The command-line tools: ``stabledrl train | eval | plot | scale | study`` (main.py builds the parser).

Nothing in the job's processes imports this package: the driver (coordinator/), the rollout
workers (rollout/) and the learner ranks (learner/) run without it.
"""
