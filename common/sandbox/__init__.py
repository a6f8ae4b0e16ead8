"""The reward sandbox: reward calls in a confined child process (scorer.py the parent side, child.py
the child, confine.py the kernel's limits)."""
