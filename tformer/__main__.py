from tformer.cli import main

raise SystemExit(main())
