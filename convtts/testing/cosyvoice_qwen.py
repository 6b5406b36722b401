"""Writes random-weight CosyVoice2 and CosyVoice3 model directories of the released layout, offline.

The layout of CosyVoice2-0.5B / Fun-CosyVoice3-0.5B: `cosyvoice2.yaml` or `cosyvoice3.yaml`,
`llm.pt`, `flow.pt`, `hift.pt`, `campplus.onnx`, `speech_tokenizer_v2.onnx` or `_v3.onnx`, and
`CosyVoice-BlankEN/` (a Qwen2 config, weights and tokenizer files that transformers loads, written
by convtts.testing.qwen_backbone).
Called through `python -m convtts.testing.cosyvoice_model --version 2|3`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from convtts.testing.cosyvoice_v1 import CFM, PIN  # PIN: both decode bounds set to N, as for v1
from convtts.testing.qwen_backbone import QWEN, write_blank_en

SAMPLE_RATE = 24000
TOKEN_RATE = 25  # v2/v3 speech tokens per second
MEL_PER_TOKEN = 2  # token_mel_ratio
HOP = 480  # samples per mel frame (HiFT: upsample 8 x 5 x 3, iSTFT hop 4)
SPEECH_VOCAB = 6561
DEFAULT_TOKENS_PER_TEXT_TOKEN = 7  # about real English at 25 speech tokens per second
BLANK_EN = "CosyVoice-BlankEN"
STOP_TOKENS = {2: 3, 3: 200}  # llm_decoder rows past speech_token_size that end the decode
LOGIT_SCALE = 60.0  # v3's decoder has no bias: scaled rows keep the zeroed stop rows out of reach

FLOW = {
    # v2: the UpsampleConformerEncoder is 512 wide whatever the yaml says (upstream hard-codes it).
    "full": dict(
        enc_heads=8,
        enc_ff=2048,
        enc_blocks=6,
        est_channels=[256],
        est_head_dim=64,
        est_blocks=4,
        est_mid_blocks=12,
        est_heads=8,
        dit_dim=1024,
        dit_depth=22,
        dit_heads=16,
        dit_head_dim=64,
        lookahead=1024,
        hift=512,
    ),
    "tiny": dict(
        enc_heads=2,
        enc_ff=64,
        enc_blocks=1,
        est_channels=[32],
        est_head_dim=16,
        est_blocks=1,
        est_mid_blocks=1,
        est_heads=2,
        dit_dim=32,
        dit_depth=1,
        dit_heads=2,
        dit_head_dim=16,
        lookahead=32,
        hift=32,
    ),
}

HEAD = """\
# A CosyVoice{version} model with random weights, written by convtts.testing.cosyvoice_model.
# Like the released model, loading it resets the global seeds.
__set_seed1: !apply:random.seed [{seed}]
__set_seed2: !apply:numpy.random.seed [{seed}]
__set_seed3: !apply:torch.manual_seed [{seed}]
__set_seed4: !apply:torch.cuda.manual_seed_all [{seed}]

sample_rate: {sample_rate}
llm_input_size: {hidden}
llm_output_size: {hidden}
spk_embed_dim: 192
qwen_pretrain_path: ''
token_frame_rate: {token_rate}
token_mel_ratio: {mel_per_token}
chunk_size: 25
num_decoding_left_chunks: -1

llm: !new:cosyvoice.llm.llm.{llm_class}
    llm_input_size: !ref <llm_input_size>
    llm_output_size: !ref <llm_output_size>
    speech_token_size: {speech_vocab}
    length_normalized_loss: True
    lsm_weight: 0
    mix_ratio: [5, 15]
    llm: !new:cosyvoice.llm.llm.Qwen2Encoder
        pretrain_path: !ref <qwen_pretrain_path>
    sampling: !name:cosyvoice.utils.common.ras_sampling
        top_p: 0.8
        top_k: 25
        win_size: 10
        tau_r: 0.1
{pin}
"""

# Keys both flows share (v2: CausalMaskedDiffWithXvec, v3: CausalMaskedDiffWithDiT).
FLOW_HEAD = """\
    output_size: 80
    spk_embed_dim: !ref <spk_embed_dim>
    output_type: mel
    vocab_size: {speech_vocab}
    input_frame_rate: !ref <token_frame_rate>
    only_mask_loss: True
    token_mel_ratio: !ref <token_mel_ratio>
    pre_lookahead_len: 3
"""

FLOW_V2 = """\
flow: !new:cosyvoice.flow.flow.CausalMaskedDiffWithXvec
    input_size: 512
{head}\
    encoder: !new:cosyvoice.transformer.upsample_encoder.UpsampleConformerEncoder
        output_size: 512
        attention_heads: {enc_heads}
        linear_units: {enc_ff}
        num_blocks: {enc_blocks}
        dropout_rate: 0.1
        positional_dropout_rate: 0.1
        attention_dropout_rate: 0.1
        normalize_before: True
        input_layer: linear
        pos_enc_layer_type: rel_pos_espnet
        selfattention_layer_type: rel_selfattn
        input_size: 512
        use_cnn_module: False
        macaron_style: False
        static_chunk_size: !ref <chunk_size>
{cfm}\
        estimator: !new:cosyvoice.flow.decoder.CausalConditionalDecoder
            in_channels: 320
            out_channels: 80
            channels: {est_channels}
            dropout: 0.0
            attention_head_dim: {est_head_dim}
            n_blocks: {est_blocks}
            num_mid_blocks: {est_mid_blocks}
            num_heads: {est_heads}
            act_fn: gelu
            static_chunk_size: !ref <chunk_size> * <token_mel_ratio>
            num_decoding_left_chunks: !ref <num_decoding_left_chunks>
"""

FLOW_V3 = """\
flow: !new:cosyvoice.flow.flow.CausalMaskedDiffWithDiT
    input_size: 80
{head}\
    pre_lookahead_layer: !new:cosyvoice.transformer.upsample_encoder.PreLookaheadLayer
        in_channels: 80
        channels: {lookahead}
        pre_lookahead_len: 3
{cfm}\
        estimator: !new:cosyvoice.flow.DiT.dit.DiT
            dim: {dit_dim}
            depth: {dit_depth}
            heads: {dit_heads}
            dim_head: {dit_head_dim}
            ff_mult: 2
            mel_dim: 80
            mu_dim: 80
            spk_dim: 80
            out_channels: 80
            static_chunk_size: !ref <chunk_size> * <token_mel_ratio>
            num_decoding_left_chunks: !ref <num_decoding_left_chunks>
"""

HIFT = """
hift: !new:cosyvoice.hifigan.generator.{hift_class}
    in_channels: 80
    base_channels: {hift}
    nb_harmonics: 8
    sampling_rate: !ref <sample_rate>
    nsf_alpha: 0.1
    nsf_sigma: 0.003
    nsf_voiced_threshold: 10
    upsample_rates: [8, 5, 3]
    upsample_kernel_sizes: [16, 11, 7]
    istft_params:
        n_fft: 16
        hop_len: 4
    resblock_kernel_sizes: [3, 7, 11]
    resblock_dilation_sizes: [[1, 3, 5], [1, 3, 5], [1, 3, 5]]
    source_resblock_kernel_sizes: [7, 7, 11]
    source_resblock_dilation_sizes: [[1, 3, 5], [1, 3, 5], [1, 3, 5]]
    lrelu_slope: 0.1
    audio_limit: 0.99
{hift_extra}\
    f0_predictor: !new:cosyvoice.hifigan.f0_predictor.{f0_class}
        num_class: 1
        in_channels: 80
        cond_channels: {hift}

get_tokenizer: !name:cosyvoice.tokenizer.tokenizer.get_qwen_tokenizer
    token_path: !ref <qwen_pretrain_path>
    skip_special_tokens: True
{tokenizer_extra}\
allowed_special: all
feat_extractor: !name:matcha.utils.audio.mel_spectrogram
    n_fft: 1920
    num_mels: 80
    sampling_rate: !ref <sample_rate>
    hop_size: {hop}
    win_size: 1920
    fmin: 0
    fmax: {fmax}
    center: False
"""

VERSIONS = {
    2: dict(
        llm_class="Qwen2LM",
        flow=FLOW_V2,
        hift_class="HiFTGenerator",
        f0_class="ConvRNNF0Predictor",
        hift_extra="",
        tokenizer_extra="",
        fmax=8000,
    ),
    3: dict(
        llm_class="CosyVoice3LM",
        flow=FLOW_V3,
        hift_class="CausalHiFTGenerator",
        f0_class="CausalConvRNNF0Predictor",
        hift_extra="    conv_pre_look_right: 4\n",
        tokenizer_extra="    version: cosyvoice3\n",
        fmax="null",
    ),
}


def render_yaml(version: int, size: str, ratio: float | None, seed: int = 1986) -> str:
    """The model's cosyvoice2.yaml / cosyvoice3.yaml; `ratio` None leaves upstream's 2..20 bounds."""
    parts = VERSIONS[version]
    pin = "" if ratio is None else PIN.format(llm_class=parts["llm_class"], ratio=float(ratio))
    head = HEAD.format(
        version=version,
        seed=seed,
        sample_rate=SAMPLE_RATE,
        hidden=QWEN[size]["hidden_size"],
        token_rate=TOKEN_RATE,
        mel_per_token=MEL_PER_TOKEN,
        llm_class=parts["llm_class"],
        speech_vocab=SPEECH_VOCAB,
        pin=pin,
    )
    flow = parts["flow"].format(
        head=FLOW_HEAD.format(speech_vocab=SPEECH_VOCAB), cfm=CFM.format(cfm_class="CausalConditionalCFM"), **FLOW[size]
    )
    hift = HIFT.format(hop=HOP, **{k: v for k, v in parts.items() if k not in ("llm_class", "flow")}, **FLOW[size])
    return head + flow + hift


def expected_samples(speech_tokens: int) -> int:
    """Audio samples for one chunk of T speech tokens: 2 mel frames per token, 480 samples per frame."""
    return speech_tokens * MEL_PER_TOKEN * HOP


# --- the model directory ------------------------------------------------------------------------


def silence_stop_tokens(llm, version: int) -> None:
    """Make the llm's stop tokens never drawn, so a pinned decode runs to its exact length.

    Upstream masks only the end-of-speech token before the minimum length; the other stop rows
    (3 in v2, 200 in v3) would end a random model's decode early. v2's decoder has a bias, pushed
    far down there; v3's has none, so its stop rows are zeroed and the speech rows scaled up: the
    top-25 speech logits then lie tens of units above the stop tokens' zero.
    """
    import torch

    first, count = llm.speech_token_size, STOP_TOKENS[version]
    decoder = llm.llm_decoder
    with torch.no_grad():
        if decoder.bias is not None:
            decoder.bias[first : first + count] -= 1.0e4
        else:
            decoder.weight[:first] *= LOGIT_SCALE
            decoder.weight[first : first + count] = 0.0


def build_qwen_model_dir(
    out: Path, version: int, size: str, speakers: list[str], ratio: float | None, seed: int, endless: bool = False
) -> dict:
    """Write a v2 or v3 directory; returns what the info file records. Needs the runtime imported.

    `ratio` pins the decode length; `endless` (ratio None) keeps upstream's bounds with the stop tokens
    never drawn: every chunk runs to the maximum, as a trained model does on a text it cannot say."""
    import torch
    from hyperpyyaml import load_hyperpyyaml

    from convtts.testing.cosyvoice_v1 import campplus_graph, speech_tokenizer_graph

    write_blank_en(out / BLANK_EN, size, seed)
    modules = load_hyperpyyaml(
        render_yaml(version, size, ratio, seed=seed), overrides={"qwen_pretrain_path": str(out / BLANK_EN)}
    )
    llm = modules["llm"].float()
    if ratio is not None or endless:
        silence_stop_tokens(llm, version)
    for name, module in (("llm", llm), ("flow", modules["flow"]), ("hift", modules["hift"])):
        torch.save(module.state_dict(), out / f"{name}.pt")
    if speakers:  # the released v2/v3 directories carry an empty table; voices come from prompts
        generator = torch.Generator().manual_seed(seed)
        torch.save({n: {"embedding": torch.randn(1, 192, generator=generator)} for n in speakers}, out / "spk2info.pt")
    rng = np.random.default_rng(seed)
    (out / "campplus.onnx").write_bytes(campplus_graph(rng).SerializeToString())
    tokenizer = speech_tokenizer_graph(
        rng, vocab=SPEECH_VOCAB, step=100 // TOKEN_RATE, name=f"speech_tokenizer_v{version}"
    )
    (out / f"speech_tokenizer_v{version}.onnx").write_bytes(tokenizer.SerializeToString())
    (out / f"cosyvoice{version}.yaml").write_text(render_yaml(version, size, ratio), encoding="utf-8")
    return {
        "parameters": {name: sum(p.numel() for p in modules[name].parameters()) for name in ("llm", "flow", "hift")}
    }
