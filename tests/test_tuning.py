"""The automatic worker count: cores on CPU; on a GPU also free memory over a worker's peak, logged with reasons."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from convtts.tuning import MAX_WORKERS_PER_GPU, choose_workers, cpu_cores


@pytest.fixture
def free_gpu(tmp_path, monkeypatch):
    """An nvidia-smi that reports the given free MiB for the GPU it is asked about."""

    def install(free_mb: int) -> None:
        script = tmp_path / "nvidia-smi"
        script.write_text(f'#!/bin/sh\ncase "$*" in *--id=3*memory.free*) echo {free_mb} ;; *) exit 9 ;; esac\n')
        script.chmod(0o755)
        monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")

    return install


def test_requested_count_wins(caplog):
    with caplog.at_level(logging.INFO):
        assert choose_workers(7, "cuda", 1, 2600) == 7
    assert "set by config" in caplog.text


def test_cpu_slots_share_the_cores():
    assert choose_workers(0, "cpu", 1, 2600) == cpu_cores()
    assert choose_workers(0, "cpu", cpu_cores() * 4, 2600) == 1


def test_gpu_count_is_bounded_by_free_memory(free_gpu, caplog, monkeypatch):
    monkeypatch.setattr("convtts.tuning.cpu_cores", lambda: 64)
    free_gpu(10_000)
    with caplog.at_level(logging.INFO):
        assert choose_workers(0, "cuda", 1, 3000) == 3  # 90% of 10000 MiB holds three 3000 MiB workers
    assert "10000 MiB free" in caplog.text and "3000 MiB per worker" in caplog.text
    free_gpu(140_000)
    assert choose_workers(0, "cuda", 1, 2600) == MAX_WORKERS_PER_GPU
    assert choose_workers(0, "cuda", 8, 2600) == 7  # (64 cores - 2 spare) shared by 8 slots
    monkeypatch.setattr("convtts.tuning.cpu_cores", lambda: 16)
    assert choose_workers(0, "cuda", 1, 2600) == 14  # one H200 on a 16-core node: the measured setting


def test_unreadable_gpu_memory_means_one_worker(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi at all
    monkeypatch.setattr("convtts.tuning.cpu_cores", lambda: 64)
    with caplog.at_level(logging.WARNING):
        assert choose_workers(0, "cuda", 1, 2600) == 1
    assert "could not read free GPU memory" in caplog.text


def test_a_batched_worker_counts_its_rows_and_the_log_says_so(caplog):
    from convtts.tuning import worker_gpu_mb

    caplog.set_level("INFO")
    assert worker_gpu_mb(2600, 500, 1) == 2600 and "rows" not in caplog.text
    assert worker_gpu_mb(2600, 500, 32) == 2600 + 31 * 500
    assert "a worker of 32 rows needs about 18100 MiB" in caplog.text


# -- batched workers of fixed rows: the pass budget shrinks before a worker is dropped ----------------


def test_a_slot_fits_its_workers_by_shrinking_their_passes_first(free_gpu, monkeypatch, caplog):
    from convtts.tuning import fit_passes

    monkeypatch.setattr("convtts.tuning.cpu_cores", lambda: 32)
    free_gpu(81_079)  # an H100: 16 workers of 2600 + 64 x 78 MiB do not fit, 8 do with 1529 MiB passes
    with caplog.at_level(logging.INFO):
        assert fit_passes(0, 1, 2600, 64, 78.0, 4096) == (8, 1529)
    assert "passes of 1529 MiB (at most 4096" in caplog.text
    free_gpu(143_156)  # an H200 of a 16-core node: the cores' 14 workers, with 1610 MiB passes
    monkeypatch.setattr("convtts.tuning.cpu_cores", lambda: 16)
    assert fit_passes(0, 1, 2600, 64, 78.0, 4096) == (14, 1610)
    assert fit_passes(0, 1, 2600, 64, 78.0, 4096, rows_per_gpu=768) == (12, 3144)  # 768 rows a GPU: 12 x 64
    assert fit_passes(0, 1, 2600, 96, 78.0, 4096, rows_per_gpu=768) == (8, 4096)  # or 8 x 96
    assert fit_passes(0, 1, 2600, 16, 78.0, 4096, rows_per_gpu=768) == (14, 4096)  # the cores bound 16-row workers
    assert fit_passes(0, 2, 2600, 64, 78.0, 4096) == (7, 4096)  # two slots share the cores
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert fit_passes(30, 1, 2600, 64, 78.0, 4096) == (30, 64)  # asked for: kept, and warned about
    assert "do not fit" in caplog.text


def test_a_slot_that_cannot_read_the_free_memory_runs_one_worker_with_its_passes_as_configured(monkeypatch):
    from convtts.tuning import fit_passes

    monkeypatch.setattr("convtts.tuning.free_gpu_mb", lambda: 0)
    assert fit_passes(0, 1, 2600, 64, 78.0, 4096) == (1, 4096)
    assert fit_passes(3, 1, 2600, 64, 78.0, 4096) == (3, 4096)


def test_the_shipped_gpu_config_gets_workers_and_passes_that_fit_an_h100(free_gpu, monkeypatch, tmp_path):
    import argparse

    from convtts.config import ConfigError, load_config
    from convtts.run.command import size_workers

    monkeypatch.setattr("convtts.tuning.cpu_cores", lambda: 32)
    free_gpu(81_079)
    config = load_config(
        Path(__file__).resolve().parents[1] / "configs" / "cosyvoice.yaml", [f"tts.cosyvoice.model_dir={tmp_path}"]
    )
    args = argparse.Namespace(workers=0, slots_on_node=1, world=1, device="cuda")
    workers, sized = size_workers(config, args)
    # the released CosyVoice-300M's rows at 30 words in bf16: 78.3 MiB of KV cache each
    # 96 rows: 768 a GPU would be 8 workers, the memory holds 5 (with 2881 MiB passes)
    assert (workers, sized.tts.cosyvoice.flow.max_mb) == (5, 2881)
    assert sized.tts.cosyvoice.batch_size == 96 and sized.tts.cosyvoice.model_dir == str(tmp_path)
    monkeypatch.setattr("convtts.tuning.cpu_cores", lambda: 16)
    free_gpu(143_156)  # an H200: its 768 rows as 8 workers of 96, then 128 rows each (batch_size_with_room)
    workers, sized = size_workers(config, args)
    assert (workers, sized.tts.cosyvoice.batch_size, sized.tts.cosyvoice.flow.max_mb) == (8, 128, 1888)
    with pytest.raises(ConfigError, match="must not be negative"):
        load_config(None, ["workers.rows_per_gpu=-1"])
    assert size_workers(config, argparse.Namespace(**{**vars(args), "device": "cpu"}))[1] == config  # CPU: as given


def test_rows_grow_only_where_every_worker_counted_at_batch_size_holds_them(free_gpu, monkeypatch, tmp_path, caplog):
    import argparse

    from convtts.config import ConfigError, load_config
    from convtts.run.command import size_workers

    shipped = Path(__file__).resolve().parents[1] / "configs" / "cosyvoice.yaml"
    args = argparse.Namespace(workers=0, slots_on_node=1, world=1, device="cuda")

    def sized(*sets: str) -> tuple[int, int, int]:
        config = load_config(shipped, [f"tts.cosyvoice.model_dir={tmp_path}", *sets])
        workers, resolved = size_workers(config, args)
        return workers, resolved.tts.cosyvoice.batch_size, resolved.tts.cosyvoice.flow.max_mb

    monkeypatch.setattr("convtts.tuning.cpu_cores", lambda: 16)
    free_gpu(81_079)  # an H100: its memory holds 5 workers of 96 and no more rows, so no worker is given up for them
    with caplog.at_level(logging.INFO):
        assert sized() == (5, 96, 2881)
    assert "5 workers of 128 rows would leave passes of 377 MiB, under 1024" in caplog.text
    free_gpu(143_156)  # an H200
    assert sized("tts.cosyvoice.batch_size_with_room=0") == (8, 96, 4096)  # off
    assert sized("tts.cosyvoice.batch_size=64") == (12, 64, 1528)  # 12 workers of 128 would not fit
    assert sized("workers.per_slot=4") == (4, 128, 4096)  # a count asked for, and room for 128 rows each
    assert sized("tts.cosyvoice.batch_size_with_room=160") == (8, 96, 4096)  # 8 x 160 would not fit: as counted
    monkeypatch.setenv("PATH", str(tmp_path / "none"))  # nvidia-smi cannot say: one worker, its rows as configured
    assert sized() == (1, 96, 4096)
    with pytest.raises(ConfigError, match="batch_size_with_room must be between 0"):
        load_config(shipped, ["tts.cosyvoice.batch_size_with_room=300"])


def test_the_v2_and_v3_configs_take_four_workers_of_256_rows_on_an_h200(free_gpu, monkeypatch, tmp_path):
    """rows_per_gpu 256 counted at 64 rows: 4 workers, each given 256 rows where the GPU holds them."""
    import argparse

    from convtts.config import load_config
    from convtts.run.command import size_workers

    model = tmp_path / "CosyVoice2-0.5B"
    (model / "CosyVoice-BlankEN").mkdir(parents=True)
    (model / "cosyvoice2.yaml").write_text("{}\n")
    (model / "CosyVoice-BlankEN" / "config.json").write_text(
        '{"num_hidden_layers": 24, "hidden_size": 896, "num_attention_heads": 14, "num_key_value_heads": 2}'
    )
    args = argparse.Namespace(workers=0, slots_on_node=1, world=1, device="cuda")
    monkeypatch.setattr("convtts.tuning.cpu_cores", lambda: 16)
    for name in ("cosyvoice2.yaml", "cosyvoice3.yaml"):
        config = load_config(
            Path(__file__).resolve().parents[1] / "configs" / name, [f"tts.cosyvoice.model_dir={model}"]
        )
        free_gpu(143_156)  # an H200
        workers, resolved = size_workers(config, args)
        assert (workers, resolved.tts.cosyvoice.batch_size) == (4, 256), name
        free_gpu(35_000)  # a GPU whose memory holds 4 workers of 64 and not of 256
        workers, resolved = size_workers(config, args)
        assert (workers, resolved.tts.cosyvoice.batch_size) == (4, 64), name


# -- automatic rows (tts.cosyvoice.batch_size: 0) -------------------------------------------------


def test_automatic_rows_fill_a_gpu_with_eight_workers(free_gpu, caplog, monkeypatch):
    from convtts.tuning import choose_layout

    monkeypatch.setattr("convtts.tuning.cpu_cores", lambda: 16)
    free_gpu(143_156)  # an H200
    with caplog.at_level(logging.INFO):
        # 90% of 143156 MiB over 8 workers = 16105; less 2600 per worker, over 250 per row: 54 rows, 48 in steps of 8
        assert choose_layout(0, "cuda", 1, 2600, 250.0) == (8, 48)
    assert "rows: 48" in caplog.text and "250 MiB per row" in caplog.text and "8 batched workers per GPU" in caplog.text
    assert choose_layout(0, "cuda", 1, 2600, 40.0) == (8, 64)  # capped: 64 rows measured best
    assert choose_layout(3, "cuda", 1, 2600, 250.0) == (3, 64)  # three workers asked for: more memory each


def test_automatic_rows_run_fewer_workers_before_starving_them(free_gpu, monkeypatch):
    from convtts.tuning import choose_layout

    monkeypatch.setattr("convtts.tuning.cpu_cores", lambda: 16)
    free_gpu(40_000)
    # 8 workers would get 6 rows each; 4 workers get (9000 - 2600) / 300 = 21, 16 in steps of 8
    assert choose_layout(0, "cuda", 1, 2600, 300.0) == (4, 16)
    free_gpu(3_000)
    assert choose_layout(0, "cuda", 1, 2600, 300.0) == (1, 1)  # no room for rows: one worker, one row
    assert choose_layout(0, "cpu", 1, 2600, 300.0) == (16, 8)  # all 16 cores, 8 rows each


def test_a_rows_memory_follows_the_model_the_text_and_the_precision(tmp_path):
    from convtts.config import load_config
    from convtts.speak import backend_resources
    from convtts.speak.cosyvoice.row_memory import FLOW_MB_PER_ROW, llm_shape, row_kv_mb, row_tokens

    released = tmp_path / "released"
    released.mkdir()
    (released / "cosyvoice.yaml").write_text(
        "llm_output_size: 1024\nllm: !new:cosyvoice.llm.llm.TransformerLM\n    llm_output_size: !ref "
        "<llm_output_size>\n"
        "    sampling: !name:cosyvoice.utils.common.ras_sampling\n        top_k: 25\n"
        "    llm: !new:cosyvoice.transformer.encoder.TransformerEncoder\n        output_size: !ref <llm_output_size>\n"
        "        num_blocks: 14\n        attention_heads: 16\n"
    )
    assert llm_shape(str(released)) == (14, 1024)
    config = load_config(None, [f"tts.cosyvoice.model_dir={released}", "text.max_words=10"])
    assert row_tokens(config) == 3 + 28 + 28 * 20  # specials, 2 text tokens a word + 8, 20 speech tokens each
    fp32 = row_kv_mb(config)
    assert fp32 == 14 * 2 * 1024 * row_tokens(config) * 4 / 2**20
    half = load_config(
        None, [f"tts.cosyvoice.model_dir={released}", "text.max_words=10", "tts.cosyvoice.precision.llm=bf16"]
    )
    assert row_kv_mb(half) == fp32 / 2
    fixed = load_config(
        None, [f"tts.cosyvoice.model_dir={released}", "tts.cosyvoice.max_row_tokens=2048", "tts.backend=cosyvoice"]
    )
    assert row_tokens(fixed) == 2048 and backend_resources(fixed, "cuda").row_mb == row_kv_mb(fixed) + FLOW_MB_PER_ROW
    qwen = tmp_path / "qwen"
    (qwen / "CosyVoice-BlankEN").mkdir(parents=True)
    (qwen / "cosyvoice2.yaml").write_text("{}\n")
    (qwen / "CosyVoice-BlankEN" / "config.json").write_text(
        '{"num_hidden_layers": 24, "hidden_size": 896, "num_attention_heads": 14, "num_key_value_heads": 2}'
    )
    assert llm_shape(str(qwen)) == (24, 128)


def test_the_slot_hands_its_workers_the_rows_it_chose(tmp_path):
    import argparse

    from convtts.config import load_config
    from convtts.run.command import size_workers

    config = load_config(
        None, ["tts.backend=cosyvoice", f"tts.cosyvoice.model_dir={tmp_path}", "tts.cosyvoice.batch_size=0"]
    )
    args = argparse.Namespace(workers=2, slots_on_node=1, world=1, device="cpu")
    workers, resolved = size_workers(config, args)
    assert (workers, resolved.tts.cosyvoice.batch_size) == (2, 8)
    assert resolved.tts.cosyvoice.model_dir == str(tmp_path) and resolved.workers == config.workers
    fixed = load_config(
        None, ["tts.backend=cosyvoice", f"tts.cosyvoice.model_dir={tmp_path}", "tts.cosyvoice.batch_size=16"]
    )
    assert size_workers(fixed, args) == (2, fixed)
