"""python -m convtts: the node job, as run_all.sh (see --help)."""

from convtts.node import main

main()
