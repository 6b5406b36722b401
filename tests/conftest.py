"""Shared helpers for the tests: the sample conversations in tests/data, running the real scripts,
watching the processes they start, optional libraries, and the test tiers (markers in pyproject.toml).

Test modules import these from here (`from conftest import ...`), never from one another.
"""

from __future__ import annotations

import fcntl
import importlib
import os
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from convtts.state.verify import check_complete

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"
# A checkout of the official CosyVoice runtime, for the tests that ask for it by name
# (tests/test_cosyvoice_v2_v3.py); every other test, and every run they start, uses the installed
# package whatever the environment says.
COSYVOICE_CHECKOUT = os.environ.pop("COSYVOICE_ROOT", "")
# `make test` installs every extra: there a missing optional library is a broken environment, not a
# reason to skip (see `need`).
REQUIRE_EXTRAS = os.environ.get("CONVTTS_TEST_REQUIRE_EXTRAS") == "1"


@pytest.fixture(scope="session", autouse=True)
def repository_log_untouched():
    """No test may leave logs in the repository's own log/ (run_all.sh's default): a user's logs live
    there, and CI runs on a clone."""
    before = set((REPO / "log").iterdir()) if (REPO / "log").is_dir() else set()
    yield
    after = set((REPO / "log").iterdir()) if (REPO / "log").is_dir() else set()
    assert after <= before, f"tests wrote to {REPO / 'log'}: {sorted(str(p) for p in after - before)}"


def need(module: str, extra: str):
    """Import an optional library, or skip the test (the whole module, when called at its top) saying
    which extra installs it and why the import failed. Under CONVTTS_TEST_REQUIRE_EXTRAS=1 (`make
    test`, which installs every extra) the import error is raised instead: nothing skips unseen."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if REQUIRE_EXTRAS:
            raise
        pytest.skip(
            f"needs {module.partition('.')[0]} (pip install 'convtts[{extra}]'): {exc}", allow_module_level=True
        )


# -- tiers ------------------------------------------------------------------------------------------

_E2E: set[str] = set()  # node ids of the collected tests marked e2e


def pytest_collection_modifyitems(items) -> None:
    _E2E.update(item.nodeid for item in items if item.get_closest_marker("e2e"))


def _require_e2e_marker() -> None:
    """A whole run costs seconds to minutes: a test that starts one must carry the e2e marker, so
    that `make test-quick` (-m 'not e2e ...') stays quick. PYTEST_CURRENT_TEST names the test whose
    setup, call or teardown is running, module-scoped fixtures included."""
    current = os.environ.get("PYTEST_CURRENT_TEST", "").rpartition(" ")[0]
    if current and current not in _E2E:
        pytest.fail(f"{current} runs run_all.sh: mark it @pytest.mark.e2e (see pyproject.toml)", pytrace=False)


def llava_conversations(images: int | None = None) -> list[dict]:
    """The LLaVA-Instruct style sample: 30 image conversations, two or three questions each, long answers."""
    records = orjson.loads((DATA / "llava_style.json").read_bytes())
    return records[:images] if images else records


def sharegpt_conversations() -> list[dict]:
    """The ShareGPT style sample: odd ids, several languages, code, links, empty turns, one-letter answers."""
    return read_jsonl(DATA / "sharegpt_style.jsonl")


def write_input(path: Path, records: list[dict], jsonl: bool = False) -> Path:
    if jsonl:
        path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    else:
        path.write_bytes(orjson.dumps(records, option=orjson.OPT_INDENT_2))
    return path


def script_env(**extra) -> dict:
    env = dict(os.environ)
    env["PYTHON"] = sys.executable
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "tests"), str(REPO)])
    env.update({k: str(v) for k, v in extra.items()})
    return env


def preprocess(*args) -> subprocess.CompletedProcess:
    """preprocess.py with these arguments, in a fresh interpreter, its output captured."""
    return subprocess.run(
        [sys.executable, str(REPO / "preprocess.py"), *map(str, args)],
        env=script_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


def python_reports(code: str, *args, env: dict | None = None, timeout: float = 300) -> dict:
    """Run `code` in a fresh interpreter with `args`; the JSON object its last line of output prints."""
    done = subprocess.run(
        [sys.executable, "-c", code, *map(str, args)],
        env=env or script_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return orjson.loads(done.stdout.strip().splitlines()[-1])


def steady_recording(path: Path, text: str) -> Path:
    """`text` spoken by the default voice with its noise off, written to `path` (a prompt recording):
    Piper's noise is unseeded, so a noisy recording would differ at every call."""
    import soundfile as sf

    from convtts.config import load_config
    from convtts.speak.piper import PiperBackend

    steady = "{length_scale: 1.0, noise_scale: 0.0, noise_w_scale: 0.0, volume: 1.0}"
    piper = PiperBackend(load_config(None, ["speakers.voices=[joe]", f"tts.piper.voices.joe={steady}"]))
    sf.write(path, piper.synthesize(text, "joe", 0), piper.sample_rate)
    piper.close()
    return path


def version_env(version: int) -> dict:
    """The scripts' environment for a model of this version: a v3 model needs the checkout (skipped without)."""
    env = script_env()
    if version == 3:
        if not COSYVOICE_CHECKOUT:
            pytest.skip("needs a checkout of the official CosyVoice repository: COSYVOICE_ROOT=/path/to/CosyVoice")
        env["COSYVOICE_ROOT"] = COSYVOICE_CHECKOUT
    return env


# A small job of two conversations in two shards, spoken at once: the damaged-state and trusted-marker
# tests damage and rerun its output.
SMALL_JOB_ARGS = (
    "--gpus",
    "cpu:1",
    "--workers",
    "1",
    "--count",
    "2",
    "--set",
    "shards.segments_per_shard=5",
    "--set",
    "tts.backend=paced_backend:PacedTone",
)
SMALL_JOB_ENV = {"CONVTTS_TEST_UTTERANCE_SECONDS": "0.01"}  # tones of the text's length, made at once


def run_all(*args, env: dict | None = None, timeout: float = 300, **popen) -> subprocess.CompletedProcess:
    _require_e2e_marker()
    return subprocess.run(
        ["bash", str(REPO / "run_all.sh"), *with_log_dir([str(arg) for arg in args])],
        env=env or script_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        **popen,
    )


def with_log_dir(args: list[str]) -> list[str]:
    """The run's logs beside its output folder when the test names none: run_all.sh's default is the
    repository's own log/, which a test must not write to."""
    if "--log-dir" in args or "--output-dir" not in args:
        return args
    out = Path(args[args.index("--output-dir") + 1])
    return [*args, "--log-dir", str(out.parent / f"{out.name}-log")]


def read_jsonl(path: Path) -> list[dict]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def read_jsonl_tolerant(path: Path) -> list[dict]:
    """The rows of a file a live run is appending to: a line being written is left out."""
    rows = []
    for line in path.read_bytes().split(b"\n"):
        try:
            rows.append(orjson.loads(line))
        except orjson.JSONDecodeError:
            pass
    return rows


def spoken_so_far(out: Path) -> list[dict]:
    """Manifest rows the workers of a live (or killed) run have written."""
    return [row for path in (out / "work").glob("shard-*.manifest.jsonl") for row in read_jsonl_tolerant(path)]


def plan_ids(out: Path) -> list[str]:
    ids = []
    for shard in sorted((out / "plan" / "shards").glob("shard-?????.jsonl")):
        ids += [row["id"] for row in read_jsonl(shard)]
    return ids


def wait_for(predicate, timeout: float = 180.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError("timed out waiting")


def worker_pids(group: int) -> list[int]:
    """Spawned workers in this process group: processes started by multiprocessing's spawn."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            same_group = os.getpgid(int(proc.name)) == group
        except (OSError, ProcessLookupError):
            continue
        if same_group and b"multiprocessing.spawn" in cmdline:
            pids.append(int(proc.name))
    return pids


def forked_workers(group: int) -> list[int]:
    """Workers forked by multiprocessing's forkserver in this process group (the server's children)."""
    servers = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            same_group = os.getpgid(int(proc.name)) == group
        except (OSError, ProcessLookupError, ValueError, IndexError):
            continue
        if same_group and b"multiprocessing.forkserver" in cmdline:
            servers[int(proc.name)] = parent
    return sorted(pid for pid, parent in servers.items() if parent in servers)


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purpose
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# A stand-in nvidia-cuda-mps-control (no GPU here): records each request in $MPS_TEST_LOG. -d starts
# the daemon (exit code $MPS_TEST_START_EXIT, or 1 for the GPU $MPS_TEST_FAIL_VISIBLE); other requests come on
# stdin (get_server_list, quit). Each line names the daemon's pipe folder (at the start, the GPUs it sees; after,
# whether the folder was still there).
FAKE_MPS = """#!/bin/sh
if [ "$1" = "-d" ]; then
  echo "start pipe=$CUDA_MPS_PIPE_DIRECTORY log=$CUDA_MPS_LOG_DIRECTORY visible=$CUDA_VISIBLE_DEVICES" >>"$MPS_TEST_LOG"
  [ -n "$MPS_TEST_FAIL_VISIBLE" ] && [ "$CUDA_VISIBLE_DEVICES" = "$MPS_TEST_FAIL_VISIBLE" ] && exit 1
  exit "${MPS_TEST_START_EXIT:-0}"
fi
read request
[ -d "$CUDA_MPS_PIPE_DIRECTORY" ] && there=yes || there=no
echo "$request pipe=$CUDA_MPS_PIPE_DIRECTORY there=$there" >> "$MPS_TEST_LOG"
"""


def write_fake_mps(bin_dir: Path) -> Path:
    """Put the stand-in nvidia-cuda-mps-control in bin_dir (put bin_dir first on PATH)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    tool = bin_dir / "nvidia-cuda-mps-control"
    tool.write_text(FAKE_MPS)
    tool.chmod(0o755)
    return tool


def mps_requests(record: Path) -> list[str]:
    """The requests the stand-in MPS control recorded, in order: start, get_server_list, quit."""
    return [line.split()[0] for line in record.read_text().splitlines()] if record.exists() else []


def speak_with_two_refused(backend, texts: list[str], speaker: str) -> dict:
    """Speak texts in one batch (seed 1000 + index) with item 2 in an unknown voice and item 4 empty.

    Asserts those two fail, each with a SynthesisError of its own; returns every result by index.
    """
    from convtts.speak.base import SynthesisError

    mixed = [(i, text, speaker, 1000 + i) for i, text in enumerate(texts)]
    mixed[2] = (2, texts[2], "nobody", 1002)  # refused by the frontend
    mixed[4] = (4, "", speaker, 1004)  # nothing to speak
    results = dict(backend.synthesize_many(mixed))
    assert isinstance(results[2], SynthesisError) and "nobody" in str(results[2])
    assert isinstance(results[4], SynthesisError)
    return results


def run_short_of_memory(monkeypatch, engine_class, rows: int) -> None:
    """Make engine_class's decode step raise CUDA's out-of-memory error while more than `rows` rows are live."""
    import torch

    step = engine_class._step

    def short_of_memory(engine):
        if len(engine.rows) > rows:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return step(engine)

    monkeypatch.setattr(engine_class, "_step", short_of_memory)


def peak_rows(monkeypatch, engine_class) -> list[int]:
    """A list that engine_class's decode steps append their live rows to."""
    step, live = engine_class._step, []

    def counted(engine):
        live.append(len(engine.rows))
        return step(engine)

    monkeypatch.setattr(engine_class, "_step", counted)
    return live


def lock_free(out: Path) -> bool:
    """Whether the output's lock could be taken now (no run holds it)."""
    with open(out / ".lock", "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(fh, fcntl.LOCK_UN)
        return True


def assert_complete(out: Path) -> list[dict]:
    """Every planned id exactly once in the manifest; every audio file decodes and matches its row."""
    problems = check_complete(out)
    assert not problems, "\n".join(problems[:20])
    return read_jsonl(out / "manifest.jsonl")


@pytest.fixture
def small_input(tmp_path) -> Path:
    """Four sample conversations: fifty segments at 30 words."""
    return write_input(tmp_path / "convs.json", llava_conversations(4))


# -- small LLMs of the released layouts, for the decode steps' tests ---------------------------------


def v1_llm(blocks: int = 3, heads: int = 4):
    """A TransformerLM of the released layout (tiny widths, several layers and heads), random weights."""
    import torch
    from hyperpyyaml import load_hyperpyyaml

    from convtts.testing import cosyvoice_v1 as v1

    sizes = dict(v1.SIZES["tiny"], llm_blocks=blocks, llm_heads=heads)
    text = v1.YAML.format(
        seed=7,
        sample_rate=v1.SAMPLE_RATE,
        cfm=v1.CFM.format(cfm_class="ConditionalCFM"),
        text_vocab=v1.TEXT_VOCAB,
        speech_vocab=v1.SPEECH_VOCAB,
        token_rate=v1.TOKEN_RATE,
        hop=v1.HOP,
        pin="",
        **sizes,
    )
    torch.manual_seed(7)
    return load_hyperpyyaml(text)["llm"].eval()


def qwen_checkpoint(path: Path) -> Path:
    """A Qwen2 checkpoint with three layers and grouped-query attention (4 query heads on 2 key heads)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(11)
    config = Qwen2Config(
        vocab_size=300,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
    )
    Qwen2ForCausalLM(config).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def qwen_dir(tmp_path_factory):
    """A Qwen2 checkpoint with three layers and grouped-query attention (4 query heads on 2 key heads)."""
    return qwen_checkpoint(tmp_path_factory.mktemp("qwen") / "backbone")


def qwen_llm(path):
    """A Qwen2LM (v2's LLM class) over the checkpoint, as upstream's yaml builds it."""
    import functools

    import torch
    from cosyvoice.llm.llm import Qwen2Encoder, Qwen2LM
    from cosyvoice.utils.common import ras_sampling

    from convtts.speak.cosyvoice.upstream_patches import decode_steps_see_the_whole_cache

    decode_steps_see_the_whole_cache()  # as every model load does (transformers 5 masks)
    torch.manual_seed(12)
    sampling = functools.partial(ras_sampling, top_p=0.8, top_k=25, win_size=10, tau_r=0.1)
    return Qwen2LM(32, 32, 120, Qwen2Encoder(str(path)), sampling).float().eval()


def sequence(row: int, text_tokens: int, seed: int, max_len: int = 200, v1: bool = True):
    """A decode Sequence of random text tokens (and v1's speaker embedding or v2's prompt tokens) in `row`."""
    import torch

    from convtts.speak.cosyvoice.engine.requests import Request, Sequence

    generator = torch.Generator().manual_seed(seed)
    chunk = {"text": torch.randint(0, 250, (1, text_tokens), generator=generator, dtype=torch.int32)}
    if v1:
        chunk["llm_embedding"] = torch.randn(1, 192, generator=generator)
    else:
        chunk["llm_prompt_speech_token"] = torch.randint(0, 100, (1, 4), generator=generator, dtype=torch.int32)
    seq = Sequence(Request(seed, [chunk], seed), chunk, 0, min_len=0, max_len=max_len)
    seq.row = row
    return seq
