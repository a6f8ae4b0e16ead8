"""``python -m coordinator ...`` is ``stabledrl ...`` (cli/main.py), for scripts written before the
command-line tools had a room of their own."""
from cli.main import main

raise SystemExit(main())
