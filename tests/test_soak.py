"""A short fault soak: eight SIGKILLs of the whole run, a slot or a worker at seeded random moments, then a rerun.

The engine is bench/soak.py (its long form: `python bench/soak.py --kills 100`); here it runs on the
repository's LLaVA-style sample with two CPU slots of two workers and the default Piper voice.
"""
from __future__ import annotations

import sys

from conftest import REPO

sys.path.insert(0, str(REPO / "bench"))
from soak import SoakOptions, soak, summary_lines  # noqa: E402 - bench/ is not a package


def test_eight_random_kills_then_a_rerun_leave_every_utterance_once(tmp_path):
    figures = soak(SoakOptions(kills=8, seed=7, window=(2.0, 6.0), segments_per_kill=3, work_dir=tmp_path))
    print("\n".join(summary_lines(figures)))  # shown when the test fails

    assert figures["problems"] == []
    assert not figures["finished_before_all_kills"], "the input ran out before the kills: the soak proved less"
    kills = figures["kills"]
    assert kills["total"] == 8 and min(kills["run"], kills["slot"], kills["worker"]) >= 2
    assert figures["final_rerun"]["exit_code"] == 0
    assert figures["utterances"] == figures["planned"] > 0
    assert figures["duplicates"] == 0
    # a killed whole run was started again (or the final rerun followed), not given up on
    assert figures["restarts"] >= kills["run"]
