"""The quality gate: each take is scored (length, silence, clipping, an ASR round trip) before it is written."""
