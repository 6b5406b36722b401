#!/usr/bin/env python3
"""One device slot: speak this slot's shards with K worker processes (python -m convtts.run); see --help."""

import sys

from convtts.run.command import main

if __name__ == "__main__":
    sys.exit(main())
