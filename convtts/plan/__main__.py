"""python -m convtts.plan: the same as preprocess.py."""

import sys

from convtts.plan.command import main

sys.exit(main())
