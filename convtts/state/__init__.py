"""The output directory on disk: its names (layout), atomic writes and the checks a rerun trusts (shardio, verify),
the manifest row's fields (rows)."""
