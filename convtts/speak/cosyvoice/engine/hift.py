"""HiFT (v1/v2's HiFTGenerator, v3's CausalHiFTGenerator) for several mels at once, each row as it would be alone.

Upstream's modules are called one by one on rows padded on the right, with what a row alone
would see past its end put back where it matters:
- every layer's output is multiplied by the row's mask at that resolution, so a convolution that
  looks ahead (v1/v2's centred kernels, v3's look-ahead conv_pre and f0 input) sees zeros past the
  row's end, as the zero padding of the solo pass gives it;
- the source signal's STFT reflects each row at its own end (torch.stft reflects the batch's);
- the inverse STFT normalises each row by its own frames' window envelope (torch.istft by the
  batch's, which differs in a row's last hop);
- v2's sine source interpolates each row's phase with its last value held (upsampling by 480
  reads one frame past the end);
- each row's noise (random phases, Gaussian noise) is drawn by the caller from the row's own
  stream, in upstream's shapes and order (vocoder.py), and only padded here.
The f0 predictor, the source and the iSTFT stay in fp32 (v3's f0 predictor in float64, as
upstream runs it); the convolution stack runs in the dtype of the copy it is given.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from convtts.speak.cosyvoice.engine import snake


def lengths_mask(lengths: torch.Tensor, width: int, dtype=torch.float32) -> torch.Tensor:
    """(B, 1, width): 1 up to each row's length, 0 past it."""
    return (torch.arange(width, device=lengths.device)[None, :] < lengths[:, None]).unsqueeze(1).to(dtype)


def samples_per_frame(hift) -> int:
    return int(np.prod(upsample_rates(hift))) * int(hift.istft_params["hop_len"])


def upsample_rates(hift) -> list[int]:
    """The transposed (v1/v2) or nearest-upsampling (v3) convolutions' rates, from the modules."""
    rates = []
    for up in hift.ups:
        inner = getattr(up, "upsample", None)
        rates.append(int(inner.scale_factor) if inner is not None else int(up.stride[0]))
    return rates


def f0_rows(hift, mel: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, frames) f0 of masked mels: v3's causal predictor in float64 as upstream; v1/v2's with its
    centred convolutions seeing zeros past each row's end."""
    predictor = hift.f0_predictor
    if type(predictor).__name__ == "CausalConvRNNF0Predictor":
        return predictor.double()(mel.double(), finalize=True).float()
    x = mel
    for layer in predictor.condnet:
        x = layer(x)
        if not isinstance(layer, torch.nn.Conv1d):  # after each activation: ELU(0) = 0 keeps the zeros
            x = x * mask
    return torch.abs(predictor.classifier(x.transpose(1, 2)).squeeze(-1))


def sine_source(gen, f0: torch.Tensor, noise: dict) -> torch.Tensor:
    """SineGen (v1): harmonics of f0 (B, 1, L), each row's random phases and noise. Returns (B, L, H)."""
    harmonics = gen.harmonic_num + 1
    steps = torch.arange(1, harmonics + 1, device=f0.device, dtype=f0.dtype)[None, :, None]
    cycles = f0 * steps / gen.sampling_rate
    theta = 2 * np.pi * (torch.cumsum(cycles, dim=-1) % 1)
    waves = gen.sine_amp * torch.sin(theta + noise["phase"])
    uv = (f0 > gen.voiced_threshold).float()
    amp = uv * gen.noise_std + (1 - uv) * gen.sine_amp / 3
    return (waves * uv + amp * noise["sine"]).transpose(1, 2)


def sine2_source(gen, f0: torch.Tensor, noise: dict, frames: torch.Tensor) -> torch.Tensor:
    """SineGen2 (v2, and v3's causal one): f0 (B, L, 1); phase accumulated at the frame rate. Returns (B, L, H)."""
    harmonics = gen.harmonic_num + 1
    fn = f0 * torch.arange(1, harmonics + 1, device=f0.device, dtype=f0.dtype)[None, None, :]
    rad = (fn / gen.sampling_rate) % 1
    rad[:, 0, :] = rad[:, 0, :] + noise["initial"]
    rad = F.interpolate(rad.transpose(1, 2), scale_factor=1 / gen.upsample_scale, mode="linear").transpose(1, 2)
    rad = rad * lengths_mask(frames, rad.shape[1]).transpose(1, 2)  # past a row's end its phase stays put
    phase = torch.cumsum(rad, dim=1) * 2 * np.pi
    mode = "nearest" if getattr(gen, "causal", False) else "linear"
    phase = F.interpolate(phase.transpose(1, 2) * gen.upsample_scale, scale_factor=gen.upsample_scale, mode=mode)
    waves = torch.sin(phase.transpose(1, 2)) * gen.sine_amp
    uv = (f0 > gen.voiced_threshold).float()
    amp = uv * gen.noise_std + (1 - uv) * gen.sine_amp / 3
    return waves * uv + amp * noise["sine"]


def source_rows(hift, f0: torch.Tensor, noise: dict, frames: torch.Tensor) -> torch.Tensor:
    """The excitation (B, 1, L) from f0 (B, frames), as m_source makes it."""
    s = hift.f0_upsamp(f0[:, None]).transpose(1, 2)  # (B, L, 1)
    source = hift.m_source
    gen = source.l_sin_gen
    if type(gen).__name__ == "SineGen":
        waves = sine_source(gen, s.transpose(1, 2), noise)
    else:
        waves = sine2_source(gen, s, noise, frames)
    return source.l_tanh(source.l_linear(waves)).transpose(1, 2)


def stft_rows(hift, s: torch.Tensor, samples: torch.Tensor) -> torch.Tensor:
    """(B, n_fft + 2, frames) real and imaginary STFT of s (B, L), each row reflected at its own end."""
    n_fft, hop = hift.istft_params["n_fft"], hift.istft_params["hop_len"]
    width = s.shape[1]
    index = torch.arange(width, device=s.device)[None, :].expand(s.shape[0], -1)
    last = (samples - 1)[:, None]
    index = torch.where(index <= last, index, (2 * last - index).clamp(min=0))
    spec = torch.stft(s.gather(1, index), n_fft, hop, n_fft, window=hift.stft_window.to(s.device), return_complex=True)
    spec = torch.view_as_real(spec)
    return torch.cat([spec[..., 0], spec[..., 1]], dim=1)


def istft_rows(hift, magnitude: torch.Tensor, phase: torch.Tensor, frames: torch.Tensor) -> torch.Tensor:
    """(B, L) inverse STFT as torch.istft computes it, each row normalised by its own frames' envelope."""
    n_fft, hop = hift.istft_params["n_fft"], hift.istft_params["hop_len"]
    window = hift.stft_window.to(magnitude.device)
    magnitude = torch.clip(magnitude, max=1e2)
    spec = torch.complex(magnitude * torch.cos(phase), magnitude * torch.sin(phase))
    keep = lengths_mask(frames, spec.shape[2])  # (B, 1, frames)
    chunks = torch.fft.irfft(spec, n=n_fft, dim=1) * window[None, :, None] * keep
    total = n_fft + hop * (spec.shape[2] - 1)
    fold = dict(output_size=(1, total), kernel_size=(1, n_fft), stride=(1, hop))
    signal = F.fold(chunks, **fold).flatten(1)
    envelope = F.fold(window.square()[None, :, None] * keep, **fold).flatten(1)
    half = n_fft // 2
    signal, envelope = signal[:, half : total - half], envelope[:, half : total - half]
    return torch.where(envelope > 1e-11, signal / envelope.clamp(min=1e-11), torch.zeros_like(signal))


def resblock(block, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """ResBlock.forward with each convolution's output masked; in the engine's copy each convolution's bias,
    mask and the Snake or residual after it are one kernel (snake.conv_then)."""
    for conv1, conv2, act1, act2 in zip(block.convs1, block.convs2, block.activations1, block.activations2):
        xt = snake.conv_then(conv1, act1(x), mask, act2)
        x = snake.conv_then(conv2, xt, mask, residual=x)
    return x


def decode_rows(hift, mel: torch.Tensor, s: torch.Tensor, frames: torch.Tensor) -> torch.Tensor:
    """HiFTGenerator.decode (v3: finalize=True) for masked rows: (B, L) samples, clamped."""
    dtype = hift.conv_post.weight.dtype
    spf = samples_per_frame(hift)
    hop = int(hift.istft_params["hop_len"])
    spec_frames = frames * (spf // hop) + 1
    s_stft = stft_rows(hift, s.squeeze(1), frames * spf)
    s_stft = (s_stft * lengths_mask(spec_frames, s_stft.shape[2])).to(dtype)
    x = hift.conv_pre(mel.to(dtype)) * lengths_mask(frames, mel.shape[2], dtype)
    scale = 1
    for i, rate in enumerate(upsample_rates(hift)):
        scale *= rate
        x = hift.ups[i](F.leaky_relu(x, hift.lrelu_slope))
        level = frames * scale
        if i == hift.num_upsamples - 1:
            x = hift.reflection_pad(x)
            level = level + 1
        mask = lengths_mask(level, x.shape[2], dtype)
        x = x * mask
        si = resblock(hift.source_resblocks[i], hift.source_downs[i](s_stft) * mask, mask)
        x = x + si
        xs = sum(resblock(hift.resblocks[i * hift.num_kernels + j], x, mask) for j in range(hift.num_kernels))
        x = xs / hift.num_kernels
    x = hift.conv_post(F.leaky_relu(x)).float()
    half = hift.istft_params["n_fft"] // 2 + 1
    audio = istft_rows(hift, torch.exp(x[:, :half, :]), torch.sin(x[:, half:, :]), spec_frames)
    return torch.clamp(audio, -hift.audio_limit, hift.audio_limit)


def vocode_rows(hift, mels: list[torch.Tensor], noise: dict) -> tuple[torch.Tensor, list[int]]:
    """The mels [1, 80, frames] to samples in one pass: (rows, samples) padded, and each row's length.
    `noise` is padded per row (vocoder.py)."""
    device = mels[0].device
    frames = torch.tensor([m.shape[2] for m in mels], device=device)
    width = int(frames.max())
    mel = torch.zeros(len(mels), 80, width, device=device)
    for i, m in enumerate(mels):
        mel[i, :, : m.shape[2]] = m[0].float()
    mask = lengths_mask(frames, width)
    f0 = f0_rows(hift, mel, mask)
    s = source_rows(hift, f0, noise, frames)
    audio = decode_rows(hift, mel, s, frames)
    return audio, [m.shape[2] * samples_per_frame(hift) for m in mels]
