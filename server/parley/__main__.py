from parley.cli import main

raise SystemExit(main())
