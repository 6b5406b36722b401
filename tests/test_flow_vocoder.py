"""The batched engine's flow and vocoder paths against each row rendered alone in eager fp32 (tiny random models, CPU).

Every path a setting can choose is compared with the reference (the row alone: upstream's
estimator, upstream's vocoder call): audio lengths exactly, samples within the path's stated
tolerance in full-scale units. Measured on these models: fp32 paths (padded passes, the padded
and bucketed shapes a CUDA graph captures, HiFT in batches) 1e-7; bf16 flow 1.6e-4, fp16 flow 3e-5;
bf16 vocoder 2.9e-3, fp16 vocoder 3.3e-4. v1 and v2 run here on the installed runtime; v3 through
bench/flow_vocoder.py in a process of its own on the checkout $COSYVOICE_ROOT names (so the bench's
CPU run is tested too).
"""

from __future__ import annotations

import copy
import json
import logging
import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import COSYVOICE_CHECKOUT, REPO, script_env
from convtts.config import ConfigError, CosyVoiceConfig, load_config
from convtts.speak.cosyvoice.engine.estimator import padded_forward
from convtts.speak.cosyvoice.engine.flow import Flow
from convtts.speak.cosyvoice.engine.groupnorm import masked_group_norm
from convtts.speak.cosyvoice.engine.pass_memory import RELEASED_FLOW, estimator_widths, flow_pass_mb
from convtts.speak.cosyvoice.engine.precision import cast_copy, matmul_mode
from convtts.speak.cosyvoice.engine.solver import width_bucket
from convtts.speak.cosyvoice.engine.vocoder import Vocoder
from convtts.testing.cosyvoice_model import build_model_dir
from convtts.testing.flow_vocoder import (
    Setting,
    build,
    deviation,
    each_alone,
    flow_inputs,
    make_rows,
    reference,
    render,
    token_lists,
)

FP32 = 1e-5  # float rounding of differently shaped kernels
FLOW_BF16, FLOW_FP16 = 2e-3, 5e-4
VOCODER_BF16, VOCODER_FP16 = 1e-2, 2e-3
SECONDS = [0.3, 0.6, 0.65, 0.7, 0.75]  # one row alone, four sharing flow and vocoder passes
SETTINGS = [
    (Setting("eager"), FP32),  # padded flow pass at its own width, HiFT in one pass of four rows
    (Setting("bucketed", bucket=True), FP32),  # rows and frames padded to the CUDA graphs' buckets
    # ...and through the graph cache: one step captured per bucket, replayed for each step
    (Setting("graph-steps", bucket=True, graph_stand_in=True), FP32),
    # ...with a pass of four rows padded to five (copies of its last row)
    (Setting("graph-steps-rows-padded", bucket=True, graph_stand_in=True, row_buckets=(1, 2, 3, 5)), FP32),
    # every row in one pass, padded to a coarse width: far more padding than any row's own
    (Setting("one-wide-pass", bucket=True, spread=100.0, frame_buckets=1), FP32),
    (Setting("flow-bf16", flow="bf16", bucket=True, vocoder_rows=1), FLOW_BF16),
    (Setting("flow-fp16", flow="fp16", vocoder_rows=1), FLOW_FP16),
    (Setting("vocoder-bf16", vocoder="bf16"), VOCODER_BF16),
    (Setting("vocoder-fp16", vocoder="fp16"), VOCODER_FP16),
]


# fp16 on a CPU is emulated and slow: its cast path is the same for every version, run on v1 (and v3's vocoder).
CASES = [(1, s, t) for s, t in SETTINGS] + [(2, s, t) for s, t in SETTINGS if "fp16" not in s.name]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """version -> the tiny model loaded by the installed runtime, built on first use."""
    from convtts.speak.cosyvoice.runtime import load_model

    loaded = {}

    def get(version: int):
        if version not in loaded:
            speakers = ["a"] if version == 1 else []
            folder = build_model_dir(
                tmp_path_factory.mktemp(f"fv{version}") / "tiny",
                "tiny",
                speakers,
                tokens_per_text_token=3,
                version=version,
            )
            loaded[version] = load_model(CosyVoiceConfig(model_dir=str(folder)))
        return loaded[version]

    return get


@pytest.fixture(scope="module")
def rows(models):
    """version -> (flow inputs, token lists, each row's reference audio)."""
    made = {}

    def get(version: int):
        if version not in made:
            model = models(version)
            chunk, tokens = flow_inputs(model, prompt_seconds=0.5), token_lists(model, SECONDS)
            made[version] = chunk, tokens, reference(model, chunk, tokens)
        return made[version]

    return get


@pytest.mark.parametrize("version, setting, tolerance", CASES, ids=[f"v{v}-{s.name}" for v, s, _ in CASES])
def test_each_path_renders_a_row_as_it_would_alone(models, rows, version, setting, tolerance):
    chunk, tokens, ref = rows(version)
    audio = render(models(version), chunk, tokens, setting).audio
    assert [len(a) for a in audio] == [len(r) for r in ref]
    assert deviation(audio, ref) <= tolerance, setting.name


@pytest.mark.parametrize("version", [1, 2])
def test_a_replayed_step_gives_the_padded_solve_bit_for_bit(models, rows, version):
    """The graph of one guided step, replayed ten times on shared buffers (a stand-in re-runs the step
    where a GPU would replay it), renders what the bucketed eager solve does, to the bit: only the
    CUDA graph itself differs on a GPU."""
    chunk, tokens, _ = rows(version)
    model = models(version)
    wide = dict(bucket=True, spread=100.0, frame_buckets=1)
    solo = render(model, chunk, tokens, Setting("bucketed", **wide)).audio
    parts = build(model, Setting("graph-steps", graph_stand_in=True, **wide))
    first = render(model, chunk, tokens, Setting("graph-steps"), parts).audio
    again = render(model, chunk, tokens, Setting("graph-steps"), parts).audio  # replays only
    graphs = parts[0].solver.graphs
    assert graphs.captures >= 1 and graphs.replays == graphs.counts()[0]
    for a, b, c in zip(solo, first, again):
        assert np.array_equal(a, b) and np.array_equal(a, c)


@pytest.mark.parametrize("version", [1, 2])
def test_rows_of_close_lengths_share_passes(models, rows, version):
    chunk, tokens, _ = rows(version)
    inner = models(version).model
    flow = Flow(inner.flow, "fp32", inner.device)
    groups = flow.groups(make_rows(chunk, tokens))
    assert sorted(len(g) for g in groups) == [1, 4]
    vocoder = Vocoder(inner.hift, "fp32", max_rows=3)
    assert vocoder._passes([40, 41, 42, 43, 20, 60]) == [[4], [0, 1, 2], [3], [5]]  # by length, at most 3 rows


@pytest.mark.parametrize("version", [1, 2])
def test_passes_stay_within_the_memory_budget(models, rows, version):
    chunk, tokens, _ = rows(version)
    inner, rows = models(version).model, make_rows(chunk, tokens)
    widest = width_bucket(max(Flow(inner.flow, "fp32", inner.device).frames(row) for row in rows))
    flow = Flow(
        inner.flow, "fp32", inner.device, max_mb=flow_pass_mb(inner.flow, "fp32", 2, widest)
    )  # two of the longest
    groups = flow.groups(rows)
    assert max(len(g) for g in groups) == 2 and sum(len(g) for g in groups) == len(tokens)


def test_the_flow_attention_kernel_is_left_to_torch_where_triton_does_not_run(models, caplog):
    """Asked for on a CPU (no interpreter here): a warning, and the passes keep torch's attention."""
    inner = models(1).model
    assert not Flow(inner.flow, "fp32", inner.device, attention="auto").solver.kernel
    with caplog.at_level(logging.WARNING):
        flow = Flow(inner.flow, "fp32", inner.device, attention="triton")
    assert not flow.solver.kernel and "flow.attention=triton needs a GPU with Triton" in caplog.text


def test_the_unet_estimators_do_not_see_the_padding():
    """Both U-Nets at two resolutions (the released v1 has two, the tiny one only one)."""
    from cosyvoice.flow.decoder import CausalConditionalDecoder, ConditionalDecoder

    torch.manual_seed(0)
    lengths, width = [37, 50, 23], 56
    for cls, upstream_shift in ((ConditionalDecoder, True), (CausalConditionalDecoder, False)):
        est = cls(
            in_channels=320,
            out_channels=80,
            channels=(32, 32),
            dropout=0.0,
            attention_head_dim=16,
            n_blocks=1,
            num_mid_blocks=2,
            num_heads=2,
            act_fn="gelu",
        ).eval()
        with torch.no_grad():
            for p in est.parameters():  # norms and biases away from their neutral start
                p.add_(torch.randn_like(p) * 0.05)
        x, mu, cond = (torch.randn(3, 80, width) for _ in range(3))
        spks, t = torch.randn(3, 80), torch.rand(3)
        mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).float().unsqueeze(1)
        with torch.inference_mode():
            theirs = est(x, mask, mu, t, spks, cond)
            alone = each_alone(est, lengths, x, mask, mu, t, spks, cond)
            # the engine's own copy (owned) has its transformer blocks' q, k and v joined into one product
            ours = [padded_forward(copy.deepcopy(est), owned)(x, mask, mu, t, spks, cond) for owned in (False, True)]
            for i, (n, row) in enumerate(zip(lengths, alone)):
                assert all((padded[i, :, :n] - row).abs().max() < 1e-4 * row.abs().max() for padded in ours)
                # upstream's own forward: v1's group norms count the padding, v2's layers do not
                assert ((theirs[i, :, :n] - row).abs().max() > 1e-2) == (upstream_shift and n < width)


def test_masked_group_norm_is_group_norm_over_a_rows_frames():
    torch.manual_seed(1)
    norm = torch.nn.GroupNorm(4, 16).eval()
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-0.5, 0.5)
    x = torch.randn(2, 16, 30)
    mask = torch.ones(2, 1, 30)
    mask[1, :, 18:] = 0
    out = masked_group_norm(x, norm, mask)
    torch.testing.assert_close(out[0], norm(x[:1])[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[1, :, :18], norm(x[1:, :, :18])[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("version", [1, 2])
def test_a_cast_and_folded_copy_leaves_upstreams_hift_as_it_was(models, version):
    from torch.nn.utils import parametrize

    hift = models(version).model.hift
    mel = torch.randn(1, 80, 12)
    with torch.inference_mode():
        torch.manual_seed(3)
        before, _ = hift.inference(speech_feat=mel)
        twin = cast_copy(hift, "bf16", keep_fp32=("f0_predictor", "m_source"), fold=True)
        torch.manual_seed(3)
        after, _ = hift.inference(speech_feat=mel)
    assert torch.equal(before, after)
    assert any(parametrize.is_parametrized(m) for m in hift.modules())
    assert not any(parametrize.is_parametrized(m) for m in twin.modules())
    assert twin.conv_post.weight.dtype == torch.bfloat16 and twin.f0_predictor.classifier.weight.dtype == torch.float32


def test_a_cast_copy_keeps_its_fp32_parts_values():
    """The parts a bf16 copy keeps in fp32 hold the original's values, not ones rounded to bf16 and back."""
    module = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    with torch.no_grad():
        module[1].weight.fill_(1.0001)  # 1.0 in bf16
    twin = cast_copy(module, "bf16", keep_fp32=("1",))
    assert twin[0].weight.dtype == torch.bfloat16
    assert torch.equal(twin[1].weight, module[1].weight) and twin[1].weight.data_ptr() != module[1].weight.data_ptr()


DIT_CHECK = """
import json, sys
import torch
from convtts.config import CosyVoiceConfig
from convtts.speak.cosyvoice.runtime import import_runtime
import_runtime(CosyVoiceConfig(runtime_root=sys.argv[1]))
from cosyvoice.flow.DiT.dit import DiT
from convtts.speak.cosyvoice.engine.estimator import padded_forward
from convtts.speak.cosyvoice.engine.solver import Solver
from convtts.testing.flow_vocoder import each_alone

torch.manual_seed(0)
shape = dict(dim=64, depth=3, heads=4, dim_head=16, ff_mult=2, mel_dim=80, mu_dim=80, spk_dim=80, out_channels=80)
est = DiT(**shape, static_chunk_size=50, num_decoding_left_chunks=-1).eval().double()
for p in est.parameters():
    torch.nn.init.normal_(p, std=0.05)
frames = [300, 250, 120]  # past 256: where bf16 positions stop being whole numbers
x, mu, cond = (torch.randn(3, 80, 300, dtype=torch.float64) for _ in range(3))
spks, t = torch.randn(3, 80, dtype=torch.float64), torch.rand(3, dtype=torch.float64)
mask = torch.zeros(3, 1, 300, dtype=torch.float64)
for i, n in enumerate(frames):
    mask[i, :, :n] = 1
out = {}
def gap(padded, rows):
    return float(max((padded[i, :, :n] - row).abs().max() for i, (n, row) in enumerate(zip(frames, rows))))

with torch.inference_mode():
    padded = padded_forward(est)(x, mask, mu, t, spks, cond)
    upstream = each_alone(est, frames, x, mask, mu, t, spks, cond)
    out["scale"] = max(float(row.abs().max()) for row in upstream)
    out["padded_vs_alone"] = gap(padded, upstream)
    out["padded_vs_ours_alone"] = gap(padded, each_alone(padded_forward(est), frames, x, mask, mu, t, spks, cond))
    weights = [b.attn.to_k.weight.data_ptr() for b in est.transformer_blocks]
    joined = padded_forward(est, owned=True)(x, mask, mu, t, spks, cond)
    out["joined_vs_not"] = float((joined - padded).abs().max())
    attn = est.transformer_blocks[0].attn
    out["views_of_one_weight"] = attn.to_k.weight.data_ptr() == attn.to_q.weight.data_ptr() + attn.to_q.weight.nbytes
    out["moved"] = weights != [b.attn.to_k.weight.data_ptr() for b in est.transformer_blocks]

    class Decoder:
        estimator, t_scheduler, inference_cfg_rate = est.float(), "cosine", 0.7

    copy = Solver(Decoder, "bf16", graphs=False, compile=False, max_graphs=0, device="cpu").estimator
    out["rotary"] = str(copy.rotary_embed.inv_freq.dtype)
    out["blocks"] = str(copy.transformer_blocks[0].attn.to_q.weight.dtype)
print(json.dumps(out))
"""


def test_the_dit_blocks_as_re_driven_give_each_row_its_own_frames():
    """v3's DiT blocks (fused modulations, rotary in place, q, k and v in one product): a padded pass of
    rows of 300, 250 and 120 frames gives each row its own pass alone, exactly in fp64, and upstream's
    DiT.forward alone up to the timestep embedding's fp32; the
    joined projection is the same product, its parameters views of one weight; a bf16 copy keeps its
    rotary angles in fp32."""
    if not COSYVOICE_CHECKOUT:
        pytest.skip("needs a checkout of the official CosyVoice repository: COSYVOICE_ROOT=/path/to/CosyVoice")
    done = subprocess.run(
        [sys.executable, "-c", DIT_CHECK, COSYVOICE_CHECKOUT],
        env=script_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["scale"] > 1.0 and out["padded_vs_ours_alone"] <= 1e-12 * out["scale"], out
    assert out["padded_vs_alone"] <= 1e-6 * out["scale"], out  # our timestep embedding is taken in fp32
    assert out["joined_vs_not"] == 0.0 and out["views_of_one_weight"] and out["moved"], out
    assert out["rotary"] == "torch.float32" and out["blocks"] == "torch.bfloat16", out


def test_tf32_is_set_for_a_part_and_put_back():
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    before = matmul.allow_tf32, cudnn.allow_tf32
    with matmul_mode("tf32"):
        assert matmul.allow_tf32 and cudnn.allow_tf32
        with matmul_mode("fp32"):
            assert not matmul.allow_tf32 and not cudnn.allow_tf32  # strict: convolutions too
        assert matmul.allow_tf32 and cudnn.allow_tf32
    assert (matmul.allow_tf32, cudnn.allow_tf32) == before


def test_the_released_widths_are_the_architectures():
    """pass_memory.py sizes workers from the released estimators' widths before any model is loaded."""
    from cosyvoice.flow.decoder import ConditionalDecoder

    from convtts.testing.cosyvoice_v1 import SIZES

    full = SIZES["full"]
    est = ConditionalDecoder(
        in_channels=320,
        out_channels=80,
        channels=tuple(full["est_channels"]),
        dropout=0.0,
        attention_head_dim=full["est_head_dim"],
        n_blocks=1,
        num_mid_blocks=1,
        num_heads=full["est_heads"],
        act_fn="gelu",
    )
    assert estimator_widths(est) == RELEASED_FLOW[1]


def test_flow_settings_are_checked_up_front():
    cosy = load_config(None, ["tts.cosyvoice.flow.vocoder_rows=4", "tts.cosyvoice.cuda_graphs=false"]).tts.cosyvoice
    assert cosy.flow.vocoder_rows == 4 and cosy.cuda_graphs is False and cosy.flow.max_graphs == 32
    assert cosy.flow.attention == "auto"
    fine = load_config(None, ["tts.cosyvoice.flow.row_buckets=[1, 2, 3, 4, 6, 8]"]).tts.cosyvoice.flow
    assert fine.row_buckets == (1, 2, 3, 4, 6, 8)
    for bad, key in (
        ("tts.cosyvoice.flow.vocoder_rows=0", "vocoder_rows"),
        ("tts.cosyvoice.flow.max_mb=10", "max_mb"),
        ("tts.cosyvoice.flow.max_graphs=-1", "max_graphs"),
        ("tts.cosyvoice.flow.spread=0.9", "spread"),
        ("tts.cosyvoice.flow.frame_buckets=3", "frame_buckets"),
        ("tts.cosyvoice.flow.capture_after=0", "capture_after"),
        ("tts.cosyvoice.flow.row_buckets=[2, 4]", "row_buckets"),
        ("tts.cosyvoice.flow.row_buckets=[1, 4, 4]", "row_buckets"),
        ("tts.cosyvoice.cuda_graphs=yes please", "cuda_graphs"),
        ("tts.cosyvoice.flow.graphs=true", "graphs"),
        ("tts.cosyvoice.flow.attention=cudnn", "flow.attention must be one of"),
    ):
        with pytest.raises(ConfigError, match=key):
            load_config(None, [bad])


def test_v3_paths_through_the_bench_on_a_cpu(tmp_path):
    """bench/flow_vocoder.py on a tiny v3 model (DiT flow, causal HiFT): every setting within its tolerance."""
    if not COSYVOICE_CHECKOUT:
        pytest.skip("needs a checkout of the official CosyVoice repository: COSYVOICE_ROOT=/path/to/CosyVoice")
    env = script_env(COSYVOICE_ROOT=COSYVOICE_CHECKOUT)
    model = tmp_path / "v3"
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "convtts.testing.cosyvoice_model",
            "--version",
            "3",
            "--size",
            "tiny",
            "--out",
            str(model),
            "--tokens-per-text-token",
            "3",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    out = tmp_path / "v3.json"
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "flow_vocoder.py"),
            "--version",
            "3",
            "--model-dir",
            str(model),
            "--runtime-root",
            COSYVOICE_CHECKOUT,
            "--rows",
            "4",
            "--seconds",
            "0.6:0.75",
            "--prompt-seconds",
            "0.5",
            "--flow",
            "fp32,bf16",
            "--graphs",
            "on",
            "--bucket",
            "--vocoder",
            "fp32:16,bf16:16,fp16:16",
            "--repeat",
            "1",
            "--out",
            str(out),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    figures = {s["setting"]: s for s in json.loads(out.read_text())["settings"]}
    tolerance = {
        "flow-fp32-graphs-on": FP32,
        "flow-bf16-graphs-on": FLOW_BF16,
        "vocoder-fp32-rows-16": FP32,
        "vocoder-bf16-rows-16": VOCODER_BF16,
        "vocoder-fp16-rows-16": VOCODER_FP16,
    }
    assert set(figures) == set(tolerance)
    for name, limit in tolerance.items():
        assert figures[name]["lengths_match"] and figures[name]["deviation_full_scale"] <= limit, figures[name]
        assert figures[name]["audio_seconds"] > 2.4


@pytest.mark.slow  # a trace: 16 s on 2 cores
def test_the_padded_estimator_traces_as_one_graph():
    """flow.compile hands it to torch.compile: no graph break (aot_eager checks the tracing; the
    GPU's inductor compiles the same graph)."""
    from cosyvoice.flow.decoder import ConditionalDecoder

    torch.manual_seed(2)
    est = ConditionalDecoder(
        in_channels=320,
        out_channels=80,
        channels=(32, 32),
        dropout=0.0,
        attention_head_dim=16,
        n_blocks=1,
        num_mid_blocks=1,
        num_heads=2,
        act_fn="gelu",
    ).eval()
    forward = padded_forward(est)
    x, mu, cond = (torch.randn(2, 80, 40) for _ in range(3))
    mask = torch.ones(2, 1, 40)
    mask[1, :, 30:] = 0
    with torch.inference_mode():
        traced = torch.compile(forward, backend="aot_eager", fullgraph=True, dynamic=False)
        args = (x, mask, mu, torch.rand(2), torch.randn(2, 80), cond)
        torch.testing.assert_close(traced(*args), forward(*args))


def test_pass_widths_are_padded_by_at_most_one_bucket():
    """frame_buckets widths a doubling: a pass grows by at most 1/frame_buckets of its frames (or to 16),
    and coarser buckets give fewer shapes to capture."""
    for per_octave in (1, 2, 4, 8, 16, 32):
        widths = {width_bucket(frames, per_octave) for frames in range(1, 2049)}
        for frames in range(1, 2049):
            width = width_bucket(frames, per_octave)
            assert frames <= width <= max(frames * (1 + 1 / per_octave), -(-frames // 16) * 16), (per_octave, frames)
        if per_octave > 1:
            assert len(widths) < len({width_bucket(f, per_octave * 2) for f in range(1, 2049)})
    assert width_bucket(500) == 512 and width_bucket(500, 2) == 512 and width_bucket(520, 2) == 768


def test_a_wider_spread_makes_fewer_passes(models, rows):
    """flow.spread reaches the passes (grouping spread): every row of the first test's five in one pass at 100."""
    chunk, tokens, _ = rows(1)
    inner = models(1).model
    spread = ["tts.cosyvoice.flow.grouping=spread", "tts.cosyvoice.flow.frame_buckets=2"]
    cosy = load_config(None, [*spread, "tts.cosyvoice.flow.spread=100", "tts.cosyvoice.flow.row_buckets=[1, 3]"])
    wide = Flow.configured(inner.flow, "fp32", cosy.tts.cosyvoice, inner.device)
    assert wide.spread == 100.0 and wide.solver.frame_buckets == 2 and wide.solver.key(2, 100)[0] == 3
    assert [len(g) for g in wide.groups(make_rows(chunk, tokens))] == [len(tokens)]
    narrow = Flow.configured(inner.flow, "fp32", load_config(None, spread).tts.cosyvoice, inner.device)
    assert len(narrow.groups(make_rows(chunk, tokens))) == 2


def test_the_pass_costs_reach_the_passes(models, rows):
    """flow.grouping cost (the default) cuts by flow.pass_ms and frame_us: the five rows in one pass
    while a pass costs much more than their padding, each length alone when padding is what costs."""
    chunk, tokens, _ = rows(1)
    inner = models(1).model
    one = Flow.configured(inner.flow, "fp32", CosyVoiceConfig(), inner.device)
    assert [len(g) for g in one.groups(make_rows(chunk, tokens))] == [len(tokens)]
    costly = load_config(None, ["tts.cosyvoice.flow.pass_ms=0", "tts.cosyvoice.flow.frame_us=1"]).tts.cosyvoice
    apart = Flow.configured(inner.flow, "fp32", costly, inner.device)
    lengths = {apart.frames(row) for row in make_rows(chunk, tokens)}
    assert len(apart.groups(make_rows(chunk, tokens))) == len(lengths)


def test_the_pass_cost_bench_lists_what_a_pass_runs(tmp_path):
    """bench/pass_cost.py --profile on a CPU (tiny v1): each pass's time by kind of operator and its
    costliest ones, beside the pass times."""
    folder = build_model_dir(tmp_path / "tiny", "tiny", ["a"], tokens_per_text_token=3, version=1)
    out = tmp_path / "costs.json"
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "pass_cost.py"), "--model-dir", str(folder), "--rows", "1,3"]
        + ["--seconds", "0.5", "--repeat", "1", "--profile", "--out", str(out)],
        env=script_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    figures, wider = report["passes"]
    assert wider["row_frames"] == 3 * figures["row_frames"] > 0
    profile = report["profile"]  # fitted to the two passes: a price of its own and one a row-frame
    assert profile["estimator"] == "ConditionalDecoder" and profile["flow"]["pass_ms"] >= 0
    assert profile["flow"]["frame_us"] is not None and profile["vocoder"]["pass_ms"] is not None
    assert figures["flow"]["eager_s"] > 0 and figures["vocoder"]["one_pass_s"] > 0
    assert figures["flow"]["kernel"] is False  # the shipped auto, on a CPU: torch's attention
    for part in ("flow", "vocoder"):
        listed = figures["kernels"][part]
        assert listed["cpu_ms"] > 0 and listed["launches"] > 100, listed
        assert sum(listed["by_kind_ms"].values()) == pytest.approx(listed["cpu_ms"], rel=0.01)
        assert listed["top"][0][1] >= listed["top"][-1][1] > 0
        operators = listed["by_operator"]
        assert operators[0][1] >= operators[-1][1] > 0 and " > aten::" in operators[0][0], operators
    assert figures["kernels"]["flow"]["by_kind_ms"].get("matmul", 0) > 0
