"""The image pipeline: detect objects, classify them, describe the scene, caption the picture.

A DAG with a parallel branch that joins at the end::

    preprocess ──> detect ──> classify ──┐
         └───────> scene ───────────────┴──> caption

Data flow, per request (every value is a tensor, number, string, list or dict of those):

- request (:func:`make_input`): a ``3x480x640`` uint8 RGB image (other sizes work too);
- ``preprocess`` -> ``3x224x224`` float32, resized (bilinear, antialiased) and normalised;
- ``detect`` -> ``{"image": 3x224x224, "boxes": Kx4 (x1, y1, x2, y2 in pixels), "scores": K,
  "labels": K int64}`` with ``0 <= K <= 10``, best first; the image travels on because
  ``classify`` crops from it;
- ``classify`` -> ``{"boxes": Cx4, "labels": C int64, "scores": C, "features": Cx256}`` for the
  ``C = min(K, 4)`` best boxes, classified by a ResNet-18-style network over 112x112 crops;
- ``scene`` (input: the ``preprocess`` output) -> a 256-d L2-normalised embedding (MobileNetV2-style);
- ``caption`` (input: :func:`caption_input` of the ``classify`` and ``scene`` outputs, i.e.
  ``{"objects": <classify output>, "scene": <scene output>}``) -> ``{"tokens": list[int], "text": str}``,
  12 tokens decoded greedily by a transformer decoder attending to the scene and object tokens.

Every ``run_*`` is a batch function: one input per request in, one output per
request out, in order; items of different sizes (box counts, image sizes) are
padded or grouped inside.
"""

from __future__ import annotations

import random
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from esg_prefect.examples.models import (
    BOS,
    CONTROL_IDS,
    TOKEN_ID,
    VOCAB,
    ConvBNAct,
    GreedyDecoder,
    InvertedResidual,
    ResNet,
    build_seeded,
    calibrate_batchnorm,
    detokenize,
    example_images,
    finish,
    model_device,
    nms,
    to_model,
    unbatch,
)
from esg_prefect.exceptions import InvalidInputError

SIZE = 224
MAX_BOXES = 10
MAX_CROPS = 4
CROP_SIZE = 112
N_DET_CLASSES = 20
N_CLASSES = 1000
EMBED_DIM = 256
CAPTION_TOKENS = 24
_MEAN = (0.485, 0.456, 0.406)
_STD = (0.229, 0.224, 0.225)


def make_input(rng: random.Random) -> Tensor:
    """A ``3x480x640`` uint8 picture: smooth background, a few solid shapes, sensor noise.

    Smooth structure (rather than white noise) keeps the detector's and
    classifier's activations in the range real photos give.
    """
    gen = torch.Generator().manual_seed(rng.getrandbits(62))
    coarse = torch.rand(1, 3, 6, 8, generator=gen) * 255
    img = F.interpolate(coarse, size=(480, 640), mode="bilinear", align_corners=False)[0].to(torch.int16)
    for _ in range(rng.randint(2, 8)):
        h, w = rng.randint(40, 240), rng.randint(40, 320)
        y, x = rng.randint(0, 480 - h), rng.randint(0, 640 - w)
        img[:, y : y + h, x : x + w] = torch.randint(0, 256, (3, 1, 1), generator=gen, dtype=torch.int16)
    img += torch.randint(-8, 9, img.shape, generator=gen, dtype=torch.int16)
    return img.clamp(0, 255).to(torch.uint8)


def _check_tensor(x: Any, stage: str, ndim: int) -> Tensor:
    if not isinstance(x, Tensor) or x.dim() != ndim or x.shape[0] != 3:
        got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise InvalidInputError(f"{stage}: expected a 3-channel {ndim}-d tensor, got {got}")
    return x


# ---- preprocess --------------------------------------------------------------------


class Preprocess(nn.Module):
    """Resize to ``224x224`` and normalise with the ImageNet statistics."""

    mean: Tensor
    std: Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mean", torch.tensor(_MEAN).view(1, 3, 1, 1))
        self.register_buffer("std", torch.tensor(_STD).view(1, 3, 1, 1))

    def forward(self, images: Tensor) -> Tensor:
        # Resizing the uint8 image first is ~8x faster than converting 480x640 pixels to float first.
        x = F.interpolate(images, size=(SIZE, SIZE), mode="bilinear", antialias=True)
        out: Tensor = (x.float() / 255.0 - self.mean) / self.std
        return out


def load_preprocess(device: str = "cpu") -> Preprocess:
    """The preprocessing module (no weights; a module so that it lives on the device)."""
    return finish(Preprocess(), device)


def run_preprocess(model: Preprocess, inputs: list[Any]) -> list[Any]:
    """uint8 ``3xHxW`` images -> ``3x224x224`` float tensors; images of equal size are resized together."""
    dev = model_device(model)
    out: list[Any] = [None] * len(inputs)
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, x in enumerate(inputs):
        groups.setdefault(tuple(_check_tensor(x, "preprocess", 3).shape), []).append(i)
    with torch.inference_mode():
        for idx in groups.values():
            res = unbatch(model(torch.stack([inputs[i] for i in idx]).to(dev)).cpu())
            for j, i in enumerate(idx):
                out[i] = res[j]
    return out


# ---- detect -------------------------------------------------------------------------


class TinySSD(nn.Module):
    """A compact single-shot detector: a strided conv backbone and anchor heads at strides 8, 16 and 32.

    Three anchors per location (aspect ratios 1, 2, 1/2) at scales 32, 80 and
    160 pixels; box offsets are decoded SSD-style (variances 0.1 and 0.2).
    """

    anchors: Tensor

    def __init__(self) -> None:
        super().__init__()
        self.ratios = (1.0, 2.0, 0.5)
        a = len(self.ratios)
        self.stem = nn.Sequential(ConvBNAct(3, 24, 3, 2), ConvBNAct(24, 32, 3, 2), ConvBNAct(32, 32))
        self.c3 = nn.Sequential(ConvBNAct(32, 64, 3, 2), ConvBNAct(64, 64))
        self.c4 = nn.Sequential(ConvBNAct(64, 128, 3, 2), ConvBNAct(128, 128))
        self.c5 = ConvBNAct(128, 256, 3, 2)
        heads = [nn.Conv2d(c, a * (4 + N_DET_CLASSES), 3, padding=1) for c in (64, 128, 256)]
        for head in heads:
            # A rare-object prior (as RetinaNet's), so that only a few anchors clear the score threshold.
            head.bias.data.view(a, 4 + N_DET_CLASSES)[:, 4:] = -4.2  # type: ignore[union-attr]
        self.heads = nn.ModuleList(heads)
        self.register_buffer("anchors", self._anchors(), persistent=False)

    def _anchors(self) -> Tensor:
        out = []
        for stride, scale in ((8, 32.0), (16, 80.0), (32, 160.0)):
            n = SIZE // stride
            c = (torch.arange(n, dtype=torch.float32) + 0.5) * stride
            cy, cx = torch.meshgrid(c, c, indexing="ij")
            wh = torch.tensor([[scale * r**0.5, scale / r**0.5] for r in self.ratios])
            centers = torch.stack([cx, cy], dim=-1).view(n, n, 1, 2).expand(n, n, len(self.ratios), 2)
            out.append(torch.cat([centers, wh.expand(n, n, -1, -1)], dim=-1).reshape(-1, 4))
        return torch.cat(out)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Box offsets ``(B, N, 4)`` and class logits ``(B, N, 20)`` for the ``N`` anchors."""
        f3 = self.c3(self.stem(x))
        f4 = self.c4(f3)
        f5 = self.c5(f4)
        outs = [
            h(f).permute(0, 2, 3, 1).reshape(x.shape[0], -1, 4 + N_DET_CLASSES)
            for h, f in zip(self.heads, (f3, f4, f5), strict=True)
        ]
        raw = torch.cat(outs, dim=1)
        return raw[..., :4], raw[..., 4:]

    def decode(
        self, deltas: Tensor, logits: Tensor, threshold: float = 0.1, iou: float = 0.5
    ) -> list[dict[str, Tensor]]:
        """Scores, boxes and class-aware NMS per image: up to ``MAX_BOXES`` detections, best first."""
        anchors = self.anchors
        centers = anchors[:, :2] + deltas[..., :2] * 0.1 * anchors[:, 2:]
        sizes = anchors[:, 2:] * torch.exp(deltas[..., 2:] * 0.2).clamp(max=8.0)
        boxes = torch.cat([centers - sizes / 2, centers + sizes / 2], dim=-1).clamp(0, SIZE)
        scores, labels = torch.sigmoid(logits).max(dim=-1)
        results = []
        for b in range(deltas.shape[0]):
            cand = torch.nonzero(scores[b] > threshold).flatten()
            cand = cand[torch.argsort(scores[b, cand], descending=True, stable=True)[:200]]
            bx, sc, lb = boxes[b, cand], scores[b, cand], labels[b, cand]
            keep = nms(bx + lb[:, None].to(bx.dtype) * (SIZE + 1), sc, iou)[:MAX_BOXES]  # offset per class
            results.append({"boxes": bx[keep].cpu(), "scores": sc[keep].cpu(), "labels": lb[keep].cpu()})
        return results


def load_detect(device: str = "cpu") -> TinySSD:
    """The detector with seeded weights and calibrated batch norm."""
    model = build_seeded(TinySSD, seed=101)
    calibrate_batchnorm(model, example_images(8, SIZE, seed=102))
    return finish(model, device, channels_last=True)


def run_detect(model: TinySSD, inputs: list[Any]) -> list[Any]:
    """``3x224x224`` images -> per-image detections (see the module docstring)."""
    images = torch.stack([_check_tensor(x, "detect", 3) for x in inputs])
    with torch.inference_mode():
        deltas, logits = model(to_model(images, model))
        dets = model.decode(deltas, logits)
    return [{"image": img, **d} for img, d in zip(inputs, dets, strict=True)]


# ---- classify --------------------------------------------------------------------------


class CropClassifier(nn.Module):
    """A width-halved ResNet-18 over ``112x112`` crops of the detected boxes (1000 classes)."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = ResNet((2, 2, 2, 2), (32, 64, 128, 256))
        self.fc = nn.Linear(self.backbone.out_features, N_CLASSES)

    def forward(self, crops: Tensor) -> tuple[Tensor, Tensor]:
        """Class logits and pooled features of each crop."""
        feats = self.backbone(crops)
        logits: Tensor = self.fc(feats)
        return logits, feats


def crop_boxes(images: Tensor, image_index: Tensor, boxes: Tensor, size: int = CROP_SIZE) -> Tensor:
    """Bilinear ``size x size`` crops of ``boxes`` (pixels) from ``images[image_index]``: RoI-align in pure torch."""
    _, _, h, w = images.shape
    b = boxes.clone()
    b[:, 2:] = torch.maximum(b[:, 2:], b[:, :2] + 4.0)  # no degenerate boxes
    theta = torch.zeros(len(b), 2, 3, dtype=images.dtype, device=images.device)
    theta[:, 0, 0] = (b[:, 2] - b[:, 0]) / w
    theta[:, 1, 1] = (b[:, 3] - b[:, 1]) / h
    theta[:, 0, 2] = (b[:, 0] + b[:, 2]) / w - 1
    theta[:, 1, 2] = (b[:, 1] + b[:, 3]) / h - 1
    grid = F.affine_grid(theta, [len(b), images.shape[1], size, size], align_corners=False)
    return F.grid_sample(images[image_index], grid, mode="bilinear", align_corners=False)


def load_classify(device: str = "cpu") -> CropClassifier:
    """The crop classifier with seeded weights and calibrated batch norm."""
    model = build_seeded(CropClassifier, seed=201)
    calibrate_batchnorm(model, example_images(8, CROP_SIZE, seed=202))
    return finish(model, device, channels_last=True)


def run_classify(model: CropClassifier, inputs: list[Any]) -> list[Any]:
    """Detections -> classes and features of the best ``MAX_CROPS`` boxes; all crops of the batch run together."""
    dev = model_device(model)
    counts = [min(len(d["boxes"]), MAX_CROPS) for d in inputs]
    boxes = [d["boxes"][:n].clone() for d, n in zip(inputs, counts, strict=True)]
    out: list[Any] = []
    with torch.inference_mode():
        if sum(counts):
            images = torch.stack([_check_tensor(d["image"], "classify", 3) for d in inputs]).to(dev)
            index = torch.repeat_interleave(torch.arange(len(inputs)), torch.tensor(counts)).to(dev)
            logits, feats = model(to_model(crop_boxes(images, index, torch.cat(boxes).to(dev)), model))
            scores, labels = torch.softmax(logits, dim=-1).max(dim=-1)
            scores, labels, feats = scores.cpu(), labels.cpu(), feats.cpu()
        else:
            scores = labels = feats = torch.empty(0)
        start = 0
        for n, bx in zip(counts, boxes, strict=True):
            if n:
                sl = slice(start, start + n)
                out.append(
                    {
                        "boxes": bx,
                        "labels": labels[sl].clone(),
                        "scores": scores[sl].clone(),
                        "features": feats[sl].clone(),
                    }
                )
            else:
                dim = model.backbone.out_features
                out.append(
                    {
                        "boxes": bx,
                        "labels": torch.empty(0, dtype=torch.int64),
                        "scores": torch.empty(0),
                        "features": torch.empty(0, dim),
                    }
                )
            start += n
    return out


# ---- scene -----------------------------------------------------------------------------


class SceneEmbedder(nn.Module):
    """MobileNetV2 at width 0.5 with a 256-d L2-normalised embedding head."""

    CONFIG = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))

    def __init__(self, width: float = 0.5) -> None:
        super().__init__()

        def ch(c: int) -> int:
            return max(8, int(c * width + 4) // 8 * 8)

        layers: list[nn.Module] = [ConvBNAct(3, ch(32), 3, 2, act="relu6")]
        cin = ch(32)
        for t, c, n, s in self.CONFIG:
            for i in range(n):
                layers.append(InvertedResidual(cin, ch(c), s if i == 0 else 1, t))
                cin = ch(c)
        layers.append(ConvBNAct(cin, 1280, 1, act="relu6"))
        self.features = nn.Sequential(*layers)
        self.embed = nn.Linear(1280, EMBED_DIM)

    def forward(self, x: Tensor) -> Tensor:
        return F.normalize(self.embed(self.features(x).mean(dim=(2, 3))), dim=-1)


def load_scene(device: str = "cpu") -> SceneEmbedder:
    """The scene embedder with seeded weights and calibrated batch norm."""
    model = build_seeded(SceneEmbedder, seed=301)
    calibrate_batchnorm(model, example_images(8, SIZE, seed=302))
    return finish(model, device, channels_last=True)


def run_scene(model: SceneEmbedder, inputs: list[Any]) -> list[Any]:
    """``3x224x224`` images -> 256-d embeddings."""
    images = torch.stack([_check_tensor(x, "scene", 3) for x in inputs])
    with torch.inference_mode():
        emb = model(to_model(images, model)).cpu()
    return unbatch(emb)


# ---- caption ---------------------------------------------------------------------------


def caption_input(classified: dict[str, Any], scene: Tensor) -> dict[str, Any]:
    """The join: ``caption`` receives the ``classify`` output and the ``scene`` output of one request."""
    return {"objects": classified, "scene": scene}


class Captioner(nn.Module):
    """Fuses the scene embedding and the object tokens, then decodes a caption greedily."""

    def __init__(self, d_model: int = 256) -> None:
        super().__init__()
        self.scene_proj = nn.Linear(EMBED_DIM, d_model)
        self.obj_proj = nn.Linear(256, d_model)
        self.box_proj = nn.Linear(4, d_model)
        self.label_embed = nn.Embedding(N_CLASSES, d_model)
        self.decoder = GreedyDecoder(len(VOCAB), d_model, n_heads=4, n_layers=4, d_ff=1024, max_len=32)
        self.decoder.ban(CONTROL_IDS)

    def memory(self, inputs: list[dict[str, Any]], dev: torch.device) -> tuple[Tensor, Tensor]:
        """The padded memory (scene token, then one token per object) and its padding mask."""
        n_obj = [len(x["objects"]["labels"]) for x in inputs]
        width = 1 + max(n_obj)
        d = self.scene_proj.out_features
        mem = torch.zeros(len(inputs), width, d, device=dev)
        pad = torch.ones(len(inputs), width, dtype=torch.bool, device=dev)
        mem[:, 0] = self.scene_proj(torch.stack([x["scene"] for x in inputs]).to(dev))
        pad[:, 0] = False
        if sum(n_obj):
            objs = [x["objects"] for x in inputs]
            feats = torch.cat([o["features"] for o in objs]).to(dev)
            boxes = torch.cat([o["boxes"] for o in objs]).to(dev) / SIZE
            labels = torch.cat([o["labels"] for o in objs]).to(dev)
            tokens = self.obj_proj(feats) + self.box_proj(boxes) + self.label_embed(labels)
            rows = torch.repeat_interleave(torch.arange(len(inputs)), torch.tensor(n_obj)).to(dev)
            cols = torch.cat([torch.arange(1, 1 + n) for n in n_obj]).to(dev)
            mem[rows, cols] = tokens
            pad[rows, cols] = False
        return mem, pad


def load_caption(device: str = "cpu") -> Captioner:
    """The captioner with seeded weights."""
    return finish(build_seeded(Captioner, seed=401), device)


def run_caption(model: Captioner, inputs: list[Any]) -> list[Any]:
    """``{"objects", "scene"}`` dicts -> ``{"tokens", "text"}`` captions of ``CAPTION_TOKENS`` tokens."""
    dev = model_device(model)
    with torch.inference_mode():
        mem, pad = model.memory(inputs, dev)
        first = torch.full((len(inputs),), TOKEN_ID[BOS], dtype=torch.int64, device=dev)
        tokens = model.decoder.generate(mem, pad, first, CAPTION_TOKENS).cpu().tolist()
    return [{"tokens": t, "text": detokenize(t)} for t in tokens]
