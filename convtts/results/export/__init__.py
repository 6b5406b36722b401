"""Exports of a finished output directory to the formats people train on: Hugging Face datasets,
lhotse, WebDataset and NeMo. Entry: export.py (python -m convtts.results.export); the run (units, resume, state) is
in runner.py."""
