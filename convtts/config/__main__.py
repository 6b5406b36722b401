"""python -m convtts.config NAME: print a shipped config, or list them."""

from convtts.config.load import main

raise SystemExit(main())
