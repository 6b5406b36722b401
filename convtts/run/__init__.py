"""Running on a device: a slot hands pieces of shards to its spawned workers, which speak and write them (entry:
python -m convtts.run)."""
