"""Evaluation outside a training job: `stabledrl eval` (offline.py), the papers' protocols over a
cluster (protocol_command.py, protocol.py, results.py) and the regrading of d1's published
generations (regrade_d1.py)."""
