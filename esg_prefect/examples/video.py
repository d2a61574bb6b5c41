"""The fan-out pipeline: a clip is split into frames, each frame is embedded, the clip is classified.

::

    split_frames ──(one call per frame)──> frame_model ──(gather)──> aggregate

Data flow (every value is a tensor, number, string, list or dict of those):

- request (:func:`make_input`): a clip, ``Tx3x112x112`` uint8 with ``T = 8`` frames (any ``T`` up to 32 works);
- ``split_frames`` -> a list of ``T`` normalised ``3x112x112`` float32 frames;
- ``frame_model`` is called once per frame (the fan-out: a clip makes ``T`` jobs of this
  stage, which a pool may batch across frames and clips): a ``3x112x112`` frame -> a 256-d
  embedding from a ResNet-10-style CNN;
- ``aggregate`` receives :func:`aggregate_input` of the clip's frame embeddings in frame order
  (a ``Tx256`` tensor) -> ``{"label": int, "score": float, "top5": list[int]}``: a 2-layer
  temporal transformer with a class token, plus mean pooling over time, then an MLP over 400
  action classes.

Clips of different lengths in one ``aggregate`` batch are padded and masked.
"""

from __future__ import annotations

import random
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from esg_prefect.examples.models import (
    ResNet,
    build_seeded,
    calibrate_batchnorm,
    example_images,
    finish,
    model_device,
    to_model,
    unbatch,
)
from esg_prefect.exceptions import InvalidInputError

FRAMES = 8
MAX_FRAMES = 32
SIZE = 112
EMBED_DIM = 256
N_ACTIONS = 400
_MEAN = (0.43, 0.39, 0.38)
_STD = (0.23, 0.22, 0.22)


def make_input(rng: random.Random) -> Tensor:
    """An ``8x3x112x112`` uint8 clip: a smooth background and two shapes that move from frame to frame."""
    gen = torch.Generator().manual_seed(rng.getrandbits(62))
    background = F.interpolate(torch.rand(1, 3, 4, 4, generator=gen), size=(SIZE, SIZE), mode="bilinear")[0]
    shapes = [
        (rng.randint(16, 48), rng.randint(0, 64), rng.randint(0, 64), rng.randint(-6, 6), rng.randint(-6, 6))
        for _ in range(2)
    ]
    colors = torch.rand(len(shapes), 3, 1, 1, generator=gen)
    frames = background.expand(FRAMES, -1, -1, -1).clone()
    for t in range(FRAMES):
        for (size, y, x, dy, dx), color in zip(shapes, colors, strict=True):
            y0, x0 = min(max(y + dy * t, 0), SIZE - size), min(max(x + dx * t, 0), SIZE - size)
            frames[t, :, y0 : y0 + size, x0 : x0 + size] = color
    frames += torch.randn(frames.shape, generator=gen) * 0.02
    return (frames.clamp(0, 1) * 255).round().to(torch.uint8)


# ---- split_frames --------------------------------------------------------------------------


class FrameSplitter(nn.Module):
    """Converts a uint8 clip to normalised float frames (no weights; a module so it lives on the device)."""

    mean: Tensor
    std: Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mean", torch.tensor(_MEAN).view(1, 3, 1, 1))
        self.register_buffer("std", torch.tensor(_STD).view(1, 3, 1, 1))

    def forward(self, clip: Tensor) -> Tensor:
        out: Tensor = (clip.float() / 255.0 - self.mean) / self.std
        return out


def load_split_frames(device: str = "cpu") -> FrameSplitter:
    """The frame splitter."""
    return finish(FrameSplitter(), device)


def run_split_frames(model: FrameSplitter, inputs: list[Any]) -> list[Any]:
    """Clips -> lists of frames."""
    dev = model_device(model)
    out: list[Any] = []
    with torch.inference_mode():
        for clip in inputs:
            if not isinstance(clip, Tensor) or clip.dim() != 4 or clip.shape[1] != 3 or not 0 < len(clip) <= MAX_FRAMES:
                got = tuple(clip.shape) if isinstance(clip, Tensor) else type(clip).__name__
                raise InvalidInputError(f"split_frames: expected a Tx3xHxW clip with 1 <= T <= {MAX_FRAMES}, got {got}")
            out.append(unbatch(model(clip.to(dev)).cpu()))
    return out


# ---- frame_model ---------------------------------------------------------------------------


class FrameEmbedder(nn.Module):
    """A ResNet-10-style CNN (one basic block per stage, widths 48-384) with a 256-d embedding head."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = ResNet((1, 1, 1, 1), (48, 96, 192, 384))
        self.embed = nn.Linear(self.backbone.out_features, EMBED_DIM)

    def forward(self, frames: Tensor) -> Tensor:
        out: Tensor = self.embed(self.backbone(frames))
        return out


def load_frame_model(device: str = "cpu") -> FrameEmbedder:
    """The frame embedder with seeded weights and calibrated batch norm."""
    model = build_seeded(FrameEmbedder, seed=801)
    calibrate_batchnorm(model, example_images(8, SIZE, seed=802))
    return finish(model, device, channels_last=True)


def run_frame_model(model: FrameEmbedder, inputs: list[Any]) -> list[Any]:
    """Frames (``3x112x112``) -> 256-d embeddings."""
    for x in inputs:
        if not isinstance(x, Tensor) or x.dim() != 3 or x.shape[0] != 3:
            raise InvalidInputError(f"frame_model: expected a 3xHxW frame, got {x!r:.80}")
    with torch.inference_mode():
        return unbatch(model(to_model(torch.stack(inputs), model)).cpu())


# ---- aggregate -----------------------------------------------------------------------------


def aggregate_input(frame_features: list[Tensor]) -> Tensor:
    """The gather: one clip's frame embeddings, in frame order, as the ``Tx256`` input of ``aggregate``."""
    return torch.stack(frame_features)


class TemporalHead(nn.Module):
    """A class token and a 2-layer temporal transformer (d_model 384) plus mean pooling, then an MLP."""

    def __init__(self, d_model: int = 384) -> None:
        super().__init__()
        self.proj = nn.Linear(EMBED_DIM, d_model)
        self.cls = nn.Parameter(torch.randn(1, 1, d_model) * 0.02)
        self.pos = nn.Parameter(torch.randn(MAX_FRAMES + 1, d_model) * 0.02)
        layer = nn.TransformerEncoderLayer(d_model, 6, 4 * d_model, dropout=0.0, activation="gelu", batch_first=True)
        self.temporal = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.mlp = nn.Sequential(nn.Linear(2 * d_model, 512), nn.GELU(), nn.Linear(512, N_ACTIONS))

    def forward(self, feats: Tensor, pad: Tensor) -> Tensor:
        """Class probabilities from ``(B, T, 256)`` features with a ``(B, T)`` padding mask."""
        x = torch.cat([self.cls.expand(len(feats), -1, -1), self.proj(feats)], dim=1) + self.pos[: feats.shape[1] + 1]
        pad = torch.cat([torch.zeros_like(pad[:, :1]), pad], dim=1)
        h = self.temporal(x, src_key_padding_mask=pad)
        keep = (~pad[:, 1:, None]).to(h.dtype)
        mean = (h[:, 1:] * keep).sum(dim=1) / keep.sum(dim=1)
        return torch.softmax(self.mlp(torch.cat([h[:, 0], mean], dim=-1)), dim=-1)


def load_aggregate(device: str = "cpu") -> TemporalHead:
    """The temporal head with seeded weights."""
    return finish(build_seeded(TemporalHead, seed=901), device)


def run_aggregate(model: TemporalHead, inputs: list[Any]) -> list[Any]:
    """``Tx256`` frame embeddings -> ``{"label", "score", "top5"}`` per clip."""
    for x in inputs:
        if not isinstance(x, Tensor) or x.dim() != 2 or not 0 < len(x) <= MAX_FRAMES:
            raise InvalidInputError(
                f"aggregate: expected Tx{EMBED_DIM} features with 1 <= T <= {MAX_FRAMES}, got {x!r:.80}"
            )
    feats = nn.utils.rnn.pad_sequence(list(inputs), batch_first=True)
    pad = torch.arange(feats.shape[1])[None, :] >= torch.tensor([len(x) for x in inputs])[:, None]
    dev = model_device(model)
    with torch.inference_mode():
        probs = model(feats.to(dev), pad.to(dev)).cpu()
    top = probs.topk(5, dim=-1)
    return [
        {"label": int(i[0]), "score": float(p[0]), "top5": i.tolist()}
        for p, i in zip(top.values, top.indices, strict=True)
    ]
