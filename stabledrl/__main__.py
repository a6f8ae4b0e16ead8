from stabledrl.cli.main import main

raise SystemExit(main())
