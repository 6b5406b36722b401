#!/usr/bin/env python3
"""Check the config and input, then make (or keep) the plan (python -m convtts.plan); see --help."""

import sys

from convtts.plan.command import main

if __name__ == "__main__":
    sys.exit(main())
