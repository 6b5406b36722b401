#!/usr/bin/env python3
"""Export a finished output directory for training (python -m convtts.results.export); see --help."""

import sys

from convtts.results.export.command import main

if __name__ == "__main__":
    sys.exit(main())
