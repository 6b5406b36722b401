"""Flow matching for several decoded rows at once: v1's masked flow, v2/v3's causal flow, the Euler solve."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from convtts.speak.cosyvoice.engine.requests import Row, own_random_stream


SPREAD = 1.25  # longest over shortest row in one flow pass


def length_groups(rows: list[Row]) -> list[list[Row]]:
    """Rows by decoded length, cut where the longest would pass SPREAD times the shortest.

    A flow pass pads its rows to the longest, and the estimator's group norms count the padded
    frames: rows of close lengths keep each one near its solo rendering and waste little work.
    """
    groups: list[list[Row]] = []
    for row in sorted(rows, key=lambda r: len(r.kept)):
        if groups and len(row.kept) <= SPREAD * len(groups[-1][0].kept):
            groups[-1].append(row)
        else:
            groups.append([row])
    return groups


def flow_batch(flow, rows: list[Row], device) -> list[torch.Tensor]:
    """v1 flow (MaskedDiffWithXvec.inference) for several rows at once; returns each row's mel."""
    prompt_tokens = [flow_prompt_tokens(row).shape[1] for row in rows]
    feats = [row.chunk.get("prompt_speech_feat", torch.zeros(1, 0, 80)) for row in rows]
    embedded, lengths = embed_flow_tokens(flow, rows, device)
    h, _ = flow.encoder(embedded, lengths)
    h = flow.encoder_proj(h)
    mels = []
    for i, row in enumerate(rows):
        len1, total = prompt_tokens[i], int(lengths[i])
        mel_len1 = feats[i].shape[1]
        mel_len2 = int((total - len1) / flow.input_frame_rate * 22050 / 256)
        mel, _ = flow.length_regulator.inference(h[i:i + 1, :len1], h[i:i + 1, len1:total], mel_len1, mel_len2, flow.input_frame_rate)
        mels.append((mel[0], mel_len1, mel_len2))
    return solve(flow.decoder, rows, mels, feats, flow_speakers(flow, rows, device), device)


def flow_prompt_tokens(row: Row) -> torch.Tensor:
    return row.chunk.get("flow_prompt_speech_token", torch.zeros(1, 0, dtype=torch.int32))


def embed_flow_tokens(flow, rows: list[Row], device) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's prompt speech tokens and decoded tokens, padded on the right and embedded
    (padding zeroed), as the flow's inference embeds one row; returns them and the lengths."""
    # The frontend leaves prompt tensors on the model's device; the tokens are assembled on the CPU.
    tokens = [torch.cat([flow_prompt_tokens(row).reshape(-1).to("cpu", torch.long), torch.tensor(row.kept, dtype=torch.long)])
              for row in rows]
    lengths = torch.tensor([len(t) for t in tokens], dtype=torch.int32, device=device)
    padded = torch.nn.utils.rnn.pad_sequence(tokens, batch_first=True).to(device)
    keep = (torch.arange(padded.shape[1], device=device)[None, :] < lengths[:, None]).unsqueeze(-1)
    return flow.input_embedding(torch.clamp(padded, min=0)) * keep, lengths


def flow_speakers(flow, rows: list[Row], device) -> torch.Tensor:
    """The rows' speaker embeddings, normalised and projected as the flow's inference does."""
    embeddings = [row.chunk.get("flow_embedding", torch.zeros(1, 192)).to(device).reshape(1, -1) for row in rows]
    return flow.spk_embed_affine_layer(F.normalize(torch.cat(embeddings), dim=1))


def solve(decoder, rows, mels, feats, spks, device) -> list[torch.Tensor]:
    """Upstream's Euler solve with classifier-free guidance, for padded rows under one mask."""
    width = max(m.shape[0] for m, _, _ in mels)
    batch = len(rows)
    mu = torch.zeros(batch, 80, width, device=device, dtype=spks.dtype)
    cond = torch.zeros_like(mu)
    mask = torch.zeros(batch, 1, width, device=device, dtype=spks.dtype)
    x = torch.zeros_like(mu)
    for i, (row, (mel, len1, len2)) in enumerate(zip(rows, mels)):
        size = mel.shape[0]
        mu[i, :, :size] = mel.transpose(0, 1)
        mask[i, :, :size] = 1
        if len1:
            cond[i, :, :len1] = feats[i][0].to(device).transpose(0, 1)
        with own_random_stream(row.request):  # upstream: randn_like(mu), drawn after the decode
            x[i, :, :size] = torch.randn(1, 80, size)[0].to(device)
    x = euler(decoder, x, mask, mu, spks, cond)
    return [x[i:i + 1, :, len1:len1 + len2].float() for i, (_, len1, len2) in enumerate(mels)]


def euler(decoder, x, mask, mu, spks, cond, **options) -> torch.Tensor:
    """Upstream's 10 Euler steps with classifier-free guidance (solve_euler), for any number of rows.

    The first half of each estimator call is conditioned, the second has mu, speaker and prompt
    zeroed; `options` go to the estimator (v2/v3 take streaming=False).
    """
    batch = x.shape[0]
    t_span = torch.linspace(0, 1, 11, device=x.device, dtype=mu.dtype)  # upstream's n_timesteps=10
    if decoder.t_scheduler == "cosine":
        t_span = 1 - torch.cos(t_span * 0.5 * torch.pi)
    t, dt = t_span[0].unsqueeze(0), t_span[1] - t_span[0]
    zeros = torch.zeros_like(mu)
    rate = decoder.inference_cfg_rate
    for step in range(1, len(t_span)):
        out = decoder.forward_estimator(
            torch.cat([x, x]), torch.cat([mask, mask]), torch.cat([mu, zeros]),
            t.expand(2 * batch).contiguous(), torch.cat([spks, torch.zeros_like(spks)]), torch.cat([cond, zeros]),
            **options,
        )
        guided, free = torch.split(out, [batch, batch], dim=0)
        x = x + dt * ((1.0 + rate) * guided - rate * free)
        t = t + dt
        if step < len(t_span) - 1:
            dt = t_span[step + 1] - t
    return x


def flow_batch_causal(flow, rows: list[Row], device) -> list[torch.Tensor]:
    """v2/v3 flow (CausalMaskedDiffWithXvec / CausalMaskedDiffWithDiT .inference) for several rows at once.

    Rows are padded on the right. Every layer that mixes frames is causal (convolutions padded on
    the left) or masked (attention), and the norms are per frame, so a row's frames do not see the
    padding: a row in a batch matches its solo rendering up to float rounding. Like upstream, each
    row starts from the decoder's fixed noise and gets the mel frames after its prompt's.
    """
    feats = [row.chunk.get("prompt_speech_feat", torch.zeros(1, 0, 80))[0] for row in rows]
    embedded, lengths = embed_flow_tokens(flow, rows, device)
    if hasattr(flow, "encoder"):  # v2: a conformer encoder that upsamples to mel frames
        h, _ = flow.encoder(embedded, lengths, streaming=False)
        h = flow.encoder_proj(h)
    else:  # v3: the look-ahead convolution, each token repeated for its mel frames
        h = flow.pre_lookahead_layer(embedded).repeat_interleave(flow.token_mel_ratio, dim=1)
    frames = [int(n) * flow.token_mel_ratio for n in lengths.tolist()]
    width = h.shape[1]
    mask = (torch.arange(width, device=device)[None, :] < torch.tensor(frames, device=device)[:, None]).unsqueeze(1).to(h.dtype)
    mu = h.transpose(1, 2).contiguous() * mask
    cond = torch.zeros_like(mu)
    for i, feat in enumerate(feats):
        cond[i, :, :feat.shape[0]] = feat.to(device).transpose(0, 1)
    noise = flow.decoder.rand_noise[:, :, :width].to(device=device, dtype=mu.dtype)
    x = euler(flow.decoder, noise.expand(len(rows), -1, -1).contiguous(), mask, mu, flow_speakers(flow, rows, device), cond,
              streaming=False)
    return [x[i:i + 1, :, feat.shape[0]:frames[i]].float() for i, feat in enumerate(feats)]
