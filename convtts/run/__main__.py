"""python -m convtts.run: one device slot, the same as parallel_cosyvoice.py."""

import sys

from convtts.run.command import main

sys.exit(main())
