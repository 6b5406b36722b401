"""python -m convtts.results.export: the same as export.py."""

import sys

from convtts.results.export.command import main

sys.exit(main())
