"""preprocess.py after a pause (CONVTTS_TEST_PLAN_SECONDS, default 3): a plan that takes a while, for the start-up
tests.

run_all.sh's orchestrator takes it as CONVTTS_PLAN_SCRIPT; the check it runs first (--validate) is not delayed.
"""

import os
import sys
import time

from convtts.plan.command import main

if "--validate" not in sys.argv:
    time.sleep(float(os.environ.get("CONVTTS_TEST_PLAN_SECONDS", "3")))
sys.exit(main())
