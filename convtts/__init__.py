"""convtts: build a text-speech dataset from LLaVA / ShareGPT conversation files."""

__version__ = "0.1.0"

# Exit codes shared by the entry scripts and run_all.sh (cron acts on them).
EXIT_OK = 0
EXIT_FAILURES = 1  # some utterances failed after retries; rerunning retries them
EXIT_BAD_INPUT = 2  # bad input or config; nothing was started
EXIT_LOCKED = 3  # another run holds the output directory's lock
EXIT_DISK_FULL = 4  # the output filesystem is full (slots, merge, preprocess); run_all.sh says so and exits 1
