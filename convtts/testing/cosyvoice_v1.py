"""The random-weight CosyVoice v1 (CosyVoice-300M-SFT) layout: its yaml, ONNX stand-ins and decode pin.

Written through `python -m convtts.testing.cosyvoice_model` (build_model_dir); the upstream
runtime loads the directory like CosyVoice-300M-SFT and speaks noise, and the decode length can be
pinned, so audio length is known (expected_samples).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np

SAMPLE_RATE = 22050
TOKEN_RATE = 50  # v1 speech tokens per second
HOP = 256  # samples per mel frame (HiFT: upsample 8 x 8, iSTFT hop 4)
SPEAKERS = ("中文女", "中文男", "日语男", "粤语女", "英文女", "英文男", "韩语女")  # the released SFT names
TEXT_VOCAB = 51866  # whisper's multilingual tokenizer, as the real model
SPEECH_VOCAB = 4096  # speech_tokenizer_v1 codes
DEFAULT_TOKENS_PER_TEXT_TOKEN = 14  # about real English speech at 50 tokens per second

# Widths of the two variants; "full" is the released CosyVoice-300M (311M llm, 105M flow, 20M hift).
SIZES = {
    "full": dict(
        text_in=512,
        llm=1024,
        llm_heads=16,
        llm_ff=4096,
        text_blocks=6,
        llm_blocks=14,
        flow=512,
        flow_heads=8,
        flow_ff=2048,
        flow_blocks=6,
        est_channels=[256, 256],
        est_head_dim=64,
        est_blocks=4,
        est_mid_blocks=12,
        est_heads=8,
        hift=512,
    ),
    "tiny": dict(
        text_in=32,
        llm=32,
        llm_heads=2,
        llm_ff=64,
        text_blocks=1,
        llm_blocks=1,
        flow=32,
        flow_heads=2,
        flow_ff=64,
        flow_blocks=1,
        est_channels=[32],
        est_head_dim=16,
        est_blocks=1,
        est_mid_blocks=1,
        est_heads=2,
        hift=32,
    ),
}

# The flow's conditional flow matching, as every released model configures it (v2/v3: the causal class).
CFM = """\
    decoder: !new:cosyvoice.flow.flow_matching.{cfm_class}
        in_channels: 240
        n_spks: 1
        spk_emb_dim: 80
        cfm_params: !new:omegaconf.DictConfig
            content:
                sigma_min: 1.0e-06
                solver: euler
                t_scheduler: cosine
                training_cfg_rate: 0.2
                inference_cfg_rate: 0.7
                reg_loss_type: l1
"""

YAML = """\
# A CosyVoice v1 (CosyVoice-300M-SFT layout) model with random weights, written by convtts.testing.cosyvoice_model.
# Like the released model, loading it resets the global seeds.
__set_seed1: !apply:random.seed [{seed}]
__set_seed2: !apply:numpy.random.seed [{seed}]
__set_seed3: !apply:torch.manual_seed [{seed}]
__set_seed4: !apply:torch.cuda.manual_seed_all [{seed}]

sample_rate: {sample_rate}
spk_embed_dim: 192

llm: !new:cosyvoice.llm.llm.TransformerLM
    text_encoder_input_size: {text_in}
    llm_input_size: {llm}
    llm_output_size: {llm}
    text_token_size: {text_vocab}
    speech_token_size: {speech_vocab}
    length_normalized_loss: True
    lsm_weight: 0
    spk_embed_dim: !ref <spk_embed_dim>
    text_encoder: !new:cosyvoice.transformer.encoder.ConformerEncoder
        input_size: {text_in}
        output_size: {llm}
        attention_heads: {llm_heads}
        linear_units: {llm_ff}
        num_blocks: {text_blocks}
        dropout_rate: 0.1
        positional_dropout_rate: 0.1
        attention_dropout_rate: 0.0
        normalize_before: True
        input_layer: linear
        pos_enc_layer_type: rel_pos_espnet
        selfattention_layer_type: rel_selfattn
        use_cnn_module: False
        macaron_style: False
        use_dynamic_chunk: False
        use_dynamic_left_chunk: False
        static_chunk_size: 1
    llm: !new:cosyvoice.transformer.encoder.TransformerEncoder
        input_size: {llm}
        output_size: {llm}
        attention_heads: {llm_heads}
        linear_units: {llm_ff}
        num_blocks: {llm_blocks}
        dropout_rate: 0.1
        positional_dropout_rate: 0.1
        attention_dropout_rate: 0.0
        input_layer: linear_legacy
        pos_enc_layer_type: rel_pos_espnet
        selfattention_layer_type: rel_selfattn
        static_chunk_size: 1
    sampling: !name:cosyvoice.utils.common.ras_sampling
        top_p: 0.8
        top_k: 25
        win_size: 10
        tau_r: 0.1
{pin}
flow: !new:cosyvoice.flow.flow.MaskedDiffWithXvec
    input_size: {flow}
    output_size: 80
    spk_embed_dim: !ref <spk_embed_dim>
    output_type: mel
    vocab_size: {speech_vocab}
    input_frame_rate: {token_rate}
    only_mask_loss: True
    encoder: !new:cosyvoice.transformer.encoder.ConformerEncoder
        input_size: {flow}
        output_size: {flow}
        attention_heads: {flow_heads}
        linear_units: {flow_ff}
        num_blocks: {flow_blocks}
        dropout_rate: 0.1
        positional_dropout_rate: 0.1
        attention_dropout_rate: 0.1
        normalize_before: True
        input_layer: linear
        pos_enc_layer_type: rel_pos_espnet
        selfattention_layer_type: rel_selfattn
        use_cnn_module: False
        macaron_style: False
    length_regulator: !new:cosyvoice.flow.length_regulator.InterpolateRegulator
        channels: 80
        sampling_ratios: [1, 1, 1, 1]
{cfm}        estimator: !new:cosyvoice.flow.decoder.ConditionalDecoder
            in_channels: 320
            out_channels: 80
            channels: {est_channels}
            dropout: 0.0
            attention_head_dim: {est_head_dim}
            n_blocks: {est_blocks}
            num_mid_blocks: {est_mid_blocks}
            num_heads: {est_heads}
            act_fn: gelu

hift: !new:cosyvoice.hifigan.generator.HiFTGenerator
    in_channels: 80
    base_channels: {hift}
    nb_harmonics: 8
    sampling_rate: !ref <sample_rate>
    nsf_alpha: 0.1
    nsf_sigma: 0.003
    nsf_voiced_threshold: 10
    upsample_rates: [8, 8]
    upsample_kernel_sizes: [16, 16]
    istft_params:
        n_fft: 16
        hop_len: 4
    resblock_kernel_sizes: [3, 7, 11]
    resblock_dilation_sizes: [[1, 3, 5], [1, 3, 5], [1, 3, 5]]
    source_resblock_kernel_sizes: [7, 11]
    source_resblock_dilation_sizes: [[1, 3, 5], [1, 3, 5]]
    lrelu_slope: 0.1
    audio_limit: 0.99
    f0_predictor: !new:cosyvoice.hifigan.f0_predictor.ConvRNNF0Predictor
        num_class: 1
        in_channels: 80
        cond_channels: {hift}

# Text frontend: whisper's multilingual tiktoken vocabulary, a file inside openai-whisper (offline).
get_tokenizer: !name:whisper.tokenizer.get_tokenizer
    multilingual: True
    num_languages: 100
    language: en
    task: transcribe
allowed_special: all
feat_extractor: !name:matcha.utils.audio.mel_spectrogram
    n_fft: 1024
    num_mels: 80
    sampling_rate: !ref <sample_rate>
    hop_size: {hop}
    win_size: 1024
    fmin: 0
    fmax: 8000
    center: False
"""

# The llm's inference (TransformerLM; Qwen2LM for v2/v3) takes its decode bounds as keyword defaults
# (2 and 20 speech tokens per text token) that no config reaches; this entry replaces the bound method on the built
# llm by one
# with both bounds set to N, so every chunk decodes exactly int(text_tokens * N) speech tokens.
PIN = """
__pin_decode_length: !apply:setattr
    - !ref <llm>
    - inference
    - !new:functools.partial
        - !name:cosyvoice.llm.llm.{llm_class}.inference
            min_token_text_ratio: {ratio}
            max_token_text_ratio: {ratio}
        - !ref <llm>
"""


def render_yaml(size: str, tokens_per_text_token: float | None, seed: int = 1986) -> str:
    """The model's cosyvoice.yaml; `tokens_per_text_token` None leaves upstream's 2..20 bounds."""
    pin = (
        ""
        if tokens_per_text_token is None
        else PIN.format(llm_class="TransformerLM", ratio=float(tokens_per_text_token))
    )
    return YAML.format(
        seed=seed,
        sample_rate=SAMPLE_RATE,
        cfm=CFM.format(cfm_class="ConditionalCFM"),
        text_vocab=TEXT_VOCAB,
        speech_vocab=SPEECH_VOCAB,
        token_rate=TOKEN_RATE,
        hop=HOP,
        pin=pin,
        **SIZES[size],
    )


def speech_tokens(text_tokens: int, tokens_per_text_token: float) -> int:
    """Speech tokens the pinned llm emits for one chunk of `text_tokens` (upstream's int() bound)."""
    return int(text_tokens * tokens_per_text_token)


def expected_samples(text_tokens: int | Iterable[int], tokens_per_text_token: float, speed: float = 1.0) -> int:
    """Audio samples a pinned v1 model returns for text chunks of these token counts.

    Per chunk of T speech tokens the flow makes int(T / 50 * 22050 / 256) mel frames and HiFT
    256 samples per frame; chunks are concatenated. A speed other than 1 rescales the frames.
    """
    counts = [text_tokens] if isinstance(text_tokens, int) else list(text_tokens)
    total = 0
    for count in counts:
        frames = int(speech_tokens(count, tokens_per_text_token) / TOKEN_RATE * SAMPLE_RATE / HOP)
        if speed != 1.0:
            frames = int(frames / speed)
        total += frames * HOP
    return total


def text_token_counts(frontend, text: str, text_frontend: bool = True) -> list[int]:
    """Text tokens per chunk, as upstream's inference_* computes them (normalise, split, encode)."""
    chunks = frontend.text_normalize(text, split=True, text_frontend=text_frontend)
    return [len(frontend.tokenizer.encode(chunk, allowed_special=frontend.allowed_special)) for chunk in chunks]


def campplus_graph(rng: np.random.Generator):
    """Stand-in speaker encoder: fbank `input` [1, T, 80] -> `output` [1, 192] (time mean, projection)."""
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array((rng.standard_normal((80, 192)) * 0.1).astype(np.float32), "proj")
    nodes = [
        helper.make_node("ReduceMean", ["input"], ["pooled"], axes=[1], keepdims=0),  # opset 17: axes attribute
        helper.make_node("MatMul", ["pooled", "proj"], ["output"]),
    ]
    graph = helper.make_graph(
        nodes,
        "campplus_standin",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, "T", 80])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 192])],
        initializer=[weight],
    )
    return _model(graph)


def speech_tokenizer_graph(
    rng: np.random.Generator, vocab: int = SPEECH_VOCAB, step: int = 2, name: str = "speech_tokenizer_v1"
):
    """Stand-in tokenizer: whisper log-mel `feats` [1, 128, T] at 100 Hz, `feats_length` [1] ->
    `indices` [1, ceil(T/step)] int32 codes (every step-th frame, projected, argmax): 50 Hz for
    v1 (step 2), 25 Hz for v2 and v3 (step 4)."""
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array((rng.standard_normal((128, vocab)) * 0.1).astype(np.float32), "codebook")
    consts = [
        numpy_helper.from_array(np.array([v], dtype=np.int64), n)
        for n, v in (("start", 0), ("end", 2**62), ("axis", 1), ("step", step))
    ]
    nodes = [
        helper.make_node("Transpose", ["feats"], ["frames"], perm=[0, 2, 1]),
        helper.make_node("Slice", ["frames", "start", "end", "axis", "step"], ["half"]),
        helper.make_node("MatMul", ["half", "codebook"], ["scores"]),
        helper.make_node("ArgMax", ["scores"], ["codes"], axis=-1, keepdims=0),
        helper.make_node("Cast", ["codes"], ["indices"], to=TensorProto.INT32),
    ]
    graph = helper.make_graph(
        nodes,
        f"{name}_standin",
        [
            helper.make_tensor_value_info("feats", TensorProto.FLOAT, [1, 128, "T"]),
            helper.make_tensor_value_info("feats_length", TensorProto.INT32, [1]),
        ],
        [helper.make_tensor_value_info("indices", TensorProto.INT32, [1, "U"])],
        initializer=[weight, *consts],
    )
    return _model(graph)


def _model(graph):
    from onnx import checker, helper

    # Opset 17 / IR 8: loadable by every onnxruntime the project meets (1.14 and later).
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="convtts")
    model.ir_version = 8
    checker.check_model(model)
    return model


UPSTREAM_MIN_RATIO, UPSTREAM_MAX_RATIO = 2.0, 20.0  # TransformerLM.inference's default bounds
EOS_DOWN = -1.0e4  # end-of-speech logit shift that makes the token's probability exactly 0


def decode_settings(
    tokens_per_text_token: float | None, eos_bias: str | None
) -> tuple[float | None, float, float | None]:
    """(ratio pinned in the yaml, shift of the end-of-speech logit, exact tokens per text token or None).

    A pin sets both bounds to N; the end-of-speech logit goes far down as well so that it is never
    drawn (upstream retries a draw of it before the minimum 100 times, then the llm thread dies).
    --eos-bias low keeps upstream's bounds and runs to the maximum (20); high stops at the minimum
    (2). High is done by pinning, not by raising the logit: a dominant end-of-speech logit makes
    every draw before the minimum end-of-speech, the llm thread raises, and upstream returns the
    one token decoded so far as if nothing had happened. none leaves the random model's own length.
    """
    if eos_bias is None:
        ratio = DEFAULT_TOKENS_PER_TEXT_TOKEN if tokens_per_text_token is None else float(tokens_per_text_token)
        return ratio, EOS_DOWN, ratio
    if tokens_per_text_token is not None:
        raise ValueError("give tokens_per_text_token or eos_bias, not both")
    return {
        "high": (UPSTREAM_MIN_RATIO, EOS_DOWN, UPSTREAM_MIN_RATIO),
        "low": (None, EOS_DOWN, UPSTREAM_MAX_RATIO),
        "none": (None, 0.0, None),
    }[eos_bias]


def build_v1(out: Path, size: str, speakers: list[str], pin: float | None, shift: float, seed: int) -> dict:
    import torch
    from hyperpyyaml import load_hyperpyyaml

    # Built under our seed; the yaml written beside the weights keeps the released model's
    # seed lines (every load resets the global seeds to 1986, as upstream does).
    modules = load_hyperpyyaml(render_yaml(size, pin, seed=seed))
    llm = modules["llm"]
    with torch.no_grad():
        llm.llm_decoder.bias[llm.speech_token_size] += shift
    for name in ("llm", "flow", "hift"):
        torch.save(modules[name].state_dict(), out / f"{name}.pt")
    generator = torch.Generator().manual_seed(seed)
    spk2info = {name: {"embedding": torch.randn(1, 192, generator=generator)} for name in speakers}
    torch.save(spk2info, out / "spk2info.pt")
    rng = np.random.default_rng(seed)
    (out / "campplus.onnx").write_bytes(campplus_graph(rng).SerializeToString())
    (out / "speech_tokenizer_v1.onnx").write_bytes(speech_tokenizer_graph(rng).SerializeToString())
    (out / "cosyvoice.yaml").write_text(render_yaml(size, pin), encoding="utf-8")
    return {
        "parameters": {name: sum(p.numel() for p in modules[name].parameters()) for name in ("llm", "flow", "hift")}
    }
