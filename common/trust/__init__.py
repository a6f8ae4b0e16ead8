"""What decides which code a run executes: the run's seal (seal.py), checkpoint files opened without
running code they carry (checkpoint_files.py), and the run directory's checks before Ray starts
(run_dir.py)."""
