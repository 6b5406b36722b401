"""Flow matching for several decoded rows at once: v1's masked flow, v2/v3's causal flow, rows grouped per pass.

Rows are padded on the right to the longest of their pass, and nothing a row computes sees the
padding: the estimator is re-driven (estimator.py: v1's group norms over the row's own frames, key
masks), v2's encoder gets zeros past each row's end where its look-ahead reads, v1's encoder and
v3's look-ahead convolution already do. So a row in a pass matches its solo rendering up to float
rounding: within 1e-5 of full scale in fp32 (measured 1e-7) for v1, v2 and v3 alike. The Euler
solve itself (eager, bucketed, CUDA graphs) is solver.py's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from convtts.speak.cosyvoice.engine.pass_memory import estimator_widths, flow_bytes_per_frame, rows_within
from convtts.speak.cosyvoice.engine.precision import matmul_mode, part_module, storage_dtype
from convtts.speak.cosyvoice.engine.profiles import PassCosts, configured, profile
from convtts.speak.cosyvoice.engine.requests import Row, own_random_stream
from convtts.speak.cosyvoice.engine.solver import ROW_BUCKETS, Solver, width_bucket

SPREAD = 1.25  # longest over shortest row in one pass (flow.grouping spread): padding costs work, not accuracy


def length_groups(
    rows: list[Row], frames_of=lambda row: len(row.kept), cap=lambda frames: 1 << 30, spread: float = SPREAD
) -> list[list[Row]]:
    """Rows by length, cut where the longest would pass `spread` times the shortest or the group
    would pass `cap(longest)` rows (the memory of one pass)."""
    groups: list[list[Row]] = []
    for row in sorted(rows, key=frames_of):
        if groups and frames_of(row) <= spread * frames_of(groups[-1][0]) and len(groups[-1]) < cap(frames_of(row)):
            groups[-1].append(row)
        else:
            groups.append([row])
    return groups


def cheapest_groups(rows: list, frames_of, cost, cap=lambda frames: 1 << 30) -> list[list]:
    """Rows by length, cut into consecutive groups of the least total `cost(rows, longest frames)`, no
    group over `cap(longest)` rows.

    A pass has a price of its own (launches, an eager solve's Python, a graph's fixed kernels) beside
    the padded work it does, so the best cut depends on the lengths at hand: rows of close lengths
    that a ratio bound would split pay that price once, and one long row among many short ones gets
    its own pass instead of padding them all. Exact over the cuts of the sorted rows (quadratic in
    the rows of one flush: at most a few hundred).
    """
    ordered = sorted(rows, key=frames_of)
    lengths = [frames_of(row) for row in ordered]
    best, cut = [0.0] + [float("inf")] * len(ordered), [0] * (len(ordered) + 1)
    for end in range(1, len(ordered) + 1):
        longest = lengths[end - 1]
        for start in range(max(0, end - cap(longest)), end):
            total = best[start] + cost(end - start, longest)
            if total < best[end]:
                best[end], cut[end] = total, start
    groups, end = [], len(ordered)
    while end > 0:
        groups.append(ordered[cut[end] : end])
        end = cut[end]
    return groups[::-1]


class Flow:
    """One engine's flow: its parts in the configured format, the Euler solver, the rows per pass."""

    def __init__(
        self,
        flow,
        precision: str = "fp32",
        device="cpu",
        graphs: bool = False,
        compile: bool = False,
        max_graphs: int = 16,
        max_mb: int = 4096,
        bucket: bool | None = None,
        spread: float = SPREAD,
        frame_buckets: int = 8,
        capture_after: int = 1,
        tail_spread: float | None = None,
        costs: PassCosts | None = None,
        row_buckets: tuple[int, ...] = ROW_BUCKETS,
        attention: str = "torch",
    ):
        self.flow, self.precision, self.device = flow, precision, device
        self.costs = costs  # None: passes cut by `spread` alone
        self.v1 = type(flow).__name__ == "MaskedDiffWithXvec"
        self.solver = Solver(
            flow.decoder,
            precision,
            graphs,
            compile,
            max_graphs,
            device,
            bucket,
            frame_buckets=frame_buckets,
            capture_after=capture_after,
            row_buckets=row_buckets,
            attention=attention,
        )
        self.max_mb, self.spread = max_mb, spread
        self.tail_spread = spread if tail_spread is None else tail_spread
        self.per_frame = flow_bytes_per_frame(estimator_widths(flow.decoder.estimator), precision)
        # v2's conformer encoder runs in the flow's format too (v1's is at the token rate, cheap;
        # v3 has none, only a look-ahead convolution)
        upsampling = type(getattr(flow, "encoder", None)).__name__ == "UpsampleConformerEncoder"
        self.encoder = part_module(flow.encoder, precision) if upsampling else None
        self.encoder_proj = part_module(flow.encoder_proj, precision) if self.encoder is not None else None

    @classmethod
    def configured(cls, flow, precision: str, cosy, device) -> Flow:
        """The flow as tts.cosyvoice configures it (cuda_graphs and tts.cosyvoice.flow), its passes cut
        by this GPU kind's costs (pass_costs)."""
        return cls(
            flow,
            precision,
            device,
            graphs=cosy.cuda_graphs,
            compile=cosy.flow.compile,
            max_graphs=cosy.flow.max_graphs,
            max_mb=cosy.flow.max_mb,
            spread=cosy.flow.spread,
            frame_buckets=cosy.flow.frame_buckets,
            capture_after=cosy.flow.capture_after,
            tail_spread=cosy.flow.tail_spread,
            costs=pass_costs(flow, cosy.flow, device)[0],
            row_buckets=cosy.flow.row_buckets,
            attention=cosy.flow.attention,
        )

    def groups(self, rows: list[Row], tail: bool = False) -> list[list[Row]]:
        """The rows' flow passes, each within the memory budget: the cheapest cut by the passes' costs
        (flow.grouping cost), or close lengths together (within `spread`); a worker's last rows within
        `tail_spread` (the rows still decoding wait on each pass, and the GPU has room for padding)."""

        def cap(frames: int) -> int:
            return rows_within(self.max_mb, width_bucket(frames, self.solver.frame_buckets) * self.per_frame / 2**20)

        if self.costs is None or tail:
            return length_groups(rows, self.frames, cap, self.tail_spread if tail else self.spread)
        return cheapest_groups(rows, self.frames, self.pass_seconds, cap)

    def pass_seconds(self, rows: int, frames: int) -> float:
        """What a pass of `rows` rows padded to `frames` frames costs by flow.*: a replay of a graph held for
        its bucket, or the capture of one, at the bucket's size, or an eager solve at its own size
        (solver.Solver.pads)."""
        key = self.solver.key(rows, frames)
        graphs = self.solver.graphs
        if self.solver.bucketed and graphs.holds(key):
            return self.costs.seconds(key[0] * key[1], replayed=True)
        if self.solver.pads(rows, frames):
            return self.costs.seconds(key[0] * key[1], captured=graphs.wants(key))
        return self.costs.seconds(rows * frames)

    def frames(self, row: Row) -> int:
        """Mel frames of the row's pass: its prompt's and its own."""
        prompt = flow_prompt_tokens(row).shape[1]
        if self.v1:
            feat = row.chunk.get("prompt_speech_feat", torch.zeros(1, 0, 80)).shape[1]
            return feat + int(len(row.kept) / self.flow.input_frame_rate * 22050 / 256)
        return (prompt + len(row.kept)) * self.flow.token_mel_ratio

    def mels(self, rows: list[Row]) -> list[torch.Tensor]:
        """Each row's mel [1, 80, frames] for its own tokens (the prompt's frames cut off), fp32."""
        with matmul_mode(self.precision):
            return flow_batch(self, rows) if self.v1 else flow_batch_causal(self, rows)


def flow_batch(runner: Flow, rows: list[Row]) -> list[torch.Tensor]:
    """v1 flow (MaskedDiffWithXvec.inference) for several rows at once."""
    flow, device = runner.flow, runner.device
    prompt_tokens = [flow_prompt_tokens(row).shape[1] for row in rows]
    feats = [row.chunk.get("prompt_speech_feat", torch.zeros(1, 0, 80)) for row in rows]
    embedded, lengths = embed_flow_tokens(flow, rows, device)
    h, _ = flow.encoder(embedded, lengths)
    h = flow.encoder_proj(h)
    mels = []
    for i, _row in enumerate(rows):
        len1, total = prompt_tokens[i], int(lengths[i])
        mel_len1 = feats[i].shape[1]
        mel_len2 = int((total - len1) / flow.input_frame_rate * 22050 / 256)
        mel, _ = flow.length_regulator.inference(
            h[i : i + 1, :len1], h[i : i + 1, len1:total], mel_len1, mel_len2, flow.input_frame_rate
        )
        mels.append((mel[0], mel_len1, mel_len2))
    return solve(runner, rows, mels, feats, flow_speakers(flow, rows, device))


def flow_prompt_tokens(row: Row) -> torch.Tensor:
    return row.chunk.get("flow_prompt_speech_token", torch.zeros(1, 0, dtype=torch.int32))


def embed_flow_tokens(flow, rows: list[Row], device) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's prompt speech tokens and decoded tokens, padded on the right and embedded
    (padding zeroed), as the flow's inference embeds one row; returns them and the lengths."""
    # The frontend leaves prompt tensors on the model's device; the tokens are assembled on the CPU.
    tokens = [
        torch.cat([flow_prompt_tokens(row).reshape(-1).to("cpu", torch.long), torch.tensor(row.kept, dtype=torch.long)])
        for row in rows
    ]
    lengths = torch.tensor([len(t) for t in tokens], dtype=torch.int32, device=device)
    padded = torch.nn.utils.rnn.pad_sequence(tokens, batch_first=True).to(device)
    keep = (torch.arange(padded.shape[1], device=device)[None, :] < lengths[:, None]).unsqueeze(-1)
    return flow.input_embedding(torch.clamp(padded, min=0)) * keep, lengths


def flow_speakers(flow, rows: list[Row], device) -> torch.Tensor:
    """The rows' speaker embeddings, normalised and projected as the flow's inference does."""
    embeddings = [row.chunk.get("flow_embedding", torch.zeros(1, 192)).to(device).reshape(1, -1) for row in rows]
    return flow.spk_embed_affine_layer(F.normalize(torch.cat(embeddings), dim=1))


def solve(runner: Flow, rows, mels, feats, spks) -> list[torch.Tensor]:
    """v1: each row's noise from its own stream, prompt features as the condition, the Euler solve."""
    device = runner.device
    width = max(m.shape[0] for m, _, _ in mels)
    batch = len(rows)
    mu = torch.zeros(batch, 80, width, device=device, dtype=spks.dtype)
    cond = torch.zeros_like(mu)
    mask = torch.zeros(batch, 1, width, device=device, dtype=spks.dtype)
    x = torch.zeros_like(mu)
    for i, (row, (mel, len1, _len2)) in enumerate(zip(rows, mels)):
        size = mel.shape[0]
        mu[i, :, :size] = mel.transpose(0, 1)
        mask[i, :, :size] = 1
        if len1:
            cond[i, :, :len1] = feats[i][0].to(device).transpose(0, 1)
        with own_random_stream(row.stream):  # upstream: randn_like(mu), drawn after the decode
            x[i, :, :size] = torch.randn(1, 80, size)[0].to(device)
    x = runner.solver.solve(x, mask, mu, spks, cond, [m.shape[0] for m, _, _ in mels])
    return [x[i : i + 1, :, len1 : len1 + len2].float() for i, (_, len1, len2) in enumerate(mels)]


def encode_causal(runner: Flow, embedded: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """v2: the conformer encoder that upsamples to mel frames; v3: the look-ahead convolution,
    each token repeated for its mel frames. fp32 out."""
    flow = runner.flow
    if runner.encoder is None:
        return flow.pre_lookahead_layer(embedded).repeat_interleave(flow.token_mel_ratio, dim=1)
    dtype = storage_dtype(runner.precision)
    h = upsample_encoder(runner.encoder, embedded.to(dtype), lengths)
    return runner.encoder_proj(h).float()


def upsample_encoder(encoder, xs: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """v2's UpsampleConformerEncoder.forward (not streaming), with each row's embedded frames zeroed
    past its end before the look-ahead convolution, which reads 3 frames ahead: alone, a row's
    last frames see zero padding there; in a batch they would see the padding's embedding (bias and
    norm of zero tokens) and, through attention, every frame of the row would shift."""
    from cosyvoice.utils.mask import add_optional_chunk_mask, make_pad_mask

    masks = ~make_pad_mask(lengths, xs.size(1)).unsqueeze(1)  # (B, 1, T)
    if encoder.global_cmvn is not None:
        xs = encoder.global_cmvn(xs)
    xs, pos_emb, masks = encoder.embed(xs, masks)
    xs = xs * masks.transpose(1, 2).to(xs.dtype)
    chunk_masks = add_optional_chunk_mask(xs, masks, False, False, 0, 0, -1)
    xs = encoder.forward_layers(encoder.pre_lookahead_layer(xs), chunk_masks, pos_emb, masks)
    xs, lengths = encoder.up_layer(xs.transpose(1, 2).contiguous(), lengths)
    xs = xs.transpose(1, 2).contiguous()
    masks = ~make_pad_mask(lengths, xs.size(1)).unsqueeze(1)
    xs, pos_emb, masks = encoder.up_embed(xs, masks)
    chunk_masks = add_optional_chunk_mask(xs, masks, False, False, 0, 0, -1)
    xs = encoder.forward_up_layers(xs, chunk_masks, pos_emb, masks)
    return encoder.after_norm(xs) if encoder.normalize_before else xs


def flow_batch_causal(runner: Flow, rows: list[Row]) -> list[torch.Tensor]:
    """v2/v3 flow (CausalMaskedDiffWithXvec / CausalMaskedDiffWithDiT .inference) for several rows at once.

    Every layer that mixes frames is causal (convolutions padded on the left), masked (attention)
    or given zeros past the row's end (v2's look-ahead, upsample_encoder), and the norms are per
    frame, so a row's frames do not see the padding. Like upstream, each row starts from the
    decoder's fixed noise and gets the mel frames after its prompt's.
    """
    flow, device = runner.flow, runner.device
    feats = [row.chunk.get("prompt_speech_feat", torch.zeros(1, 0, 80))[0] for row in rows]
    embedded, lengths = embed_flow_tokens(flow, rows, device)
    h = encode_causal(runner, embedded, lengths)
    frames = [int(n) * flow.token_mel_ratio for n in lengths.tolist()]
    width = h.shape[1]
    mask = (
        (torch.arange(width, device=device)[None, :] < torch.tensor(frames, device=device)[:, None])
        .unsqueeze(1)
        .to(h.dtype)
    )
    mu = h.transpose(1, 2).contiguous() * mask
    cond = torch.zeros_like(mu)
    for i, feat in enumerate(feats):
        cond[i, :, : feat.shape[0]] = feat.to(device).transpose(0, 1)
    noise = flow.decoder.rand_noise[:, :, :width].to(device=device, dtype=mu.dtype)
    x = runner.solver.solve(
        noise.expand(len(rows), -1, -1).contiguous(), mask, mu, flow_speakers(flow, rows, device), cond, frames
    )
    return [x[i : i + 1, :, feat.shape[0] : frames[i]].float() for i, feat in enumerate(feats)]


def pass_costs(flow, flow_config, device) -> tuple[PassCosts, PassCosts] | tuple[None, None]:
    """The flow's and the vocoder's pass costs on this device (profiles.py, with what
    tts.cosyvoice.flow sets); (None, None) where flow.grouping is spread."""
    if flow_config.grouping != "cost":
        return None, None
    import torch

    device = torch.device(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return configured(profile(name, type(flow.decoder.estimator).__name__), flow_config)
