"""Reading and planning: the input file, text cleaning and splitting, ids, voices, shards (entry: python -m
convtts.plan)."""
