# make demo: set up the light environment and speak the bundled example with the default voice.
# make test: set up the test environment (with the CosyVoice runtime) and run every test.
# make test-quick: the same environment, the quick tier only (unit and in-process tests: minutes).
# make lint: ruff's check and format check, as configured in pyproject.toml.
PYTHON ?= python3
VENV := .venv
TEST_VENV := .venv-test
PIP_FLAGS ?= --disable-pip-version-check --no-input

.PHONY: demo test test-quick lint env test-env clean-output

env: $(VENV)/.installed
test-env: $(TEST_VENV)/.installed

# torch 2.13.0 is the CPU build this kind of machine keeps on disk; elsewhere pip takes it from PyPI.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install $(PIP_FLAGS) -q torch==2.13.0
	$(VENV)/bin/pip install $(PIP_FLAGS) -q -e .
	touch $@

# torchaudio wheels pin an exact torch; 2.9.1 with torchaudio 2.9 is the pair that imports on CPU.
# cosyvoice2-eu bundles the official runtime; --no-deps skips its pins, which this path does not need.
# nemo-toolkit, --no-deps, only for its manifest reader in tests/test_export.py (see pyproject.toml).
# The ray extra: the Ray engine's tests start a local Ray cluster; validate: the quality gate's run pocketsphinx.
# The install peaks at about 10.7 GB of disk (torch's CUDA wheels unpacked beside the downloads) and
# leaves 9.4 GB; pip's own error when space runs out does not say how much it needed, so say it first.
TEST_ENV_PEAK_MB := 11000
$(TEST_VENV)/.installed: pyproject.toml
	@free_mb=$$(df -Pm . | awk 'NR == 2 {print $$4}'); \
	if [ "$$free_mb" -lt $(TEST_ENV_PEAK_MB) ]; then \
	  echo "make test: $$free_mb MB free on this disk; installing .venv-test needs about $(TEST_ENV_PEAK_MB) MB at its peak" >&2; \
	fi
	$(PYTHON) -m venv $(TEST_VENV)
	$(TEST_VENV)/bin/pip install $(PIP_FLAGS) -q torch==2.9.1 'torchaudio==2.9.*'
	$(TEST_VENV)/bin/pip install $(PIP_FLAGS) -q --no-deps cosyvoice2-eu==0.2.8 nemo-toolkit==3.0.0
	$(TEST_VENV)/bin/pip install $(PIP_FLAGS) -q -e '.[cosyvoice,test,export,export-test,ray,validate,zstd]'
	touch $@

demo: $(VENV)/.installed
	PYTHON=$(VENV)/bin/python ./run_all.sh --input examples/conversations.json --output-dir output/demo

# The tiers are pytest markers (pyproject.toml). The quick one leaves out whole runs (e2e), CosyVoice
# models, Ray clusters and the slowest tests: under 3 minutes on 2 cores.
QUICK_TIER := not e2e and not cosyvoice and not ray and not slow

# Every extra is installed here, so a missing optional library fails its tests instead of skipping
# them (tests/conftest.py need); the slowest tests are listed, to keep the tiers honest.
test: $(TEST_VENV)/.installed
	CONVTTS_TEST_REQUIRE_EXTRAS=1 $(TEST_VENV)/bin/python -m pytest -q --durations=15 tests

# A quick-tier test still running after 2 minutes is hung, not slow.
test-quick: $(TEST_VENV)/.installed
	$(TEST_VENV)/bin/python -m pytest -q -m "$(QUICK_TIER)" --timeout=120 tests

# ruff from pip install 'convtts[lint]' (the version pinned there), or RUFF=/path/to/ruff.
RUFF ?= ruff
lint:
	$(RUFF) check .
	$(RUFF) format --check .

clean-output:
	rm -rf output/demo
