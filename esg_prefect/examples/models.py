"""Building blocks shared by the example pipelines: seeded construction, CNN blocks, NMS, a greedy decoder.

Every example model is a real architecture with random weights drawn from a
fixed seed, so the examples cost what real models of that shape cost without
downloading anything. Two details keep random weights well behaved:

- :func:`build_seeded` draws the weights inside :func:`torch.random.fork_rng`,
  so loading a model never disturbs the caller's random state and the same
  seed always gives the same weights;
- :func:`calibrate_batchnorm` sets batch-norm statistics from one forward pass
  on a seeded example batch. With the default statistics (mean 0, variance 1)
  activations shrink or grow layer after layer, and near-equal logits would
  make top-k, NMS and argmax flip on rounding noise; calibrated statistics
  keep every layer's output near unit scale.

The :class:`GreedyDecoder` keeps a key/value cache, as real generation does:
cross-attention keys and values of the memory are projected once, and each step
feeds only the newest token. This is what makes decoding cheap per step and
batching pay off (one step of one sequence is a handful of matrix-vector products).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

M = TypeVar("M", bound=nn.Module)

_WORD_TEXT = """
    the of and to in is was for on that with as by at from his her it an were are which this be or has had
    not but their after first new two also its one they been he she have who more when during other into
    time year years all can most some would there about over many up out only between three under while
    where city world state people game team school film music series season album war government team
    group system area part work life day house family church river university company line water power
    book story name song history land market party road home way number point place report club event
    model study field role level order side form age center court office age body law art force design
    air army book show case data head light use set end best high long large small great good old young
    early late major local public national general final main short full black white red green blue
    north south east west american british english french german united royal central international
    made used known born became played released called named found built led won took began moved
    include includes including based held gave went came wrote produced served opened left returned
    received established worked died developed published continued remained appeared reached joined
    man woman men women child children king queen president member player leader director writer
    car train bus plane ship bridge tower street station park garden building room table chair door
    window wall floor bed kitchen bottle cup glass plate food bread fruit apple tree flower grass sky
    sun moon star cloud rain snow wind fire stone rock sand sea lake beach mountain hill forest island
    dog cat horse bird fish cow sheep animal person face hand eye hair shirt hat bag phone computer
    screen camera picture photo image video sign board ball bike boat truck kite umbrella clock lamp
    sitting standing walking running holding looking riding playing eating flying parked near next front
    behind above below top bottom left right inside outside around through across along against
    very much well still even just back down off again never always often usually perhaps however
    because although though since until unless whether both each every few several such same different
    important possible available similar common special free open close real true whole certain recent
    news sport business science health technology economy policy election energy climate research
    price money bank trade growth rate cost tax job jobs service services product products network
    said says say make makes take takes see seen get gets give given find think know want look use
"""
WORDS: tuple[str, ...] = tuple(dict.fromkeys(_WORD_TEXT.split()))
"""A built-in word list: the examples' tokenizer and decoders draw their vocabulary from it (no downloads)."""


def build_seeded(factory: Callable[[], M], seed: int) -> M:
    """Build ``factory()`` with weights drawn from ``seed``, leaving the global RNG untouched.

    Args:
        factory: builds the module (its layers initialise from torch's global RNG).
        seed: the seed; the same seed gives bit-identical weights.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return factory()


@torch.no_grad()
def calibrate_batchnorm(model: nn.Module, example: Tensor) -> None:
    """Set every batch-norm layer's statistics from one training-mode pass over ``example``.

    Why: see the module docstring; this is the data-dependent initialisation a
    trained network would get from its training data.
    """
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    saved = [m.momentum for m in norms]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # cumulative average: after one batch the statistics are exactly that batch's
    model.train()
    model(example)
    model.eval()
    for m, momentum in zip(norms, saved, strict=True):
        m.momentum = momentum


def finish(model: M, device: str, channels_last: bool = False) -> M:
    """Freeze ``model`` for inference: eval mode, no gradients, moved to ``device``.

    ``channels_last`` stores convolution weights in NHWC order, which the CPU
    convolution kernels run markedly faster (measured here: up to 2x on the ResNets);
    the stage then feeds its inputs in the same layout (:func:`to_model`).
    """
    model.eval()
    model.requires_grad_(False)
    model = model.to(torch.device(device))
    if channels_last:
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]  # stubs lack it
    return model


def to_model(batch: Tensor, model: nn.Module) -> Tensor:
    """Move an image batch to the model's device, in channels-last layout (see :func:`finish`)."""
    return batch.to(model_device(model)).contiguous(memory_format=torch.channels_last)


def model_device(model: nn.Module) -> torch.device:
    """The device holding the model's parameters (CPU for a parameterless module)."""
    for p in model.parameters():
        return p.device
    for b in model.buffers():
        return b.device
    return torch.device("cpu")


def unbatch(batch: Tensor) -> list[Tensor]:
    """Split a batch into standalone per-item tensors.

    Why copies: a row of a batch is a view that keeps the whole batch's storage
    alive, and serialising it (``torch.save``) writes the whole storage; each
    request's output must own just its own data.
    """
    return [row.clone() for row in batch]


def example_images(batch: int, size: int, seed: int) -> Tensor:
    """A seeded batch of smooth, image-like float tensors (normalised scale) for calibration."""
    gen = torch.Generator().manual_seed(seed)
    coarse = torch.randn(batch, 3, max(size // 16, 2), max(size // 16, 2), generator=gen)
    fine = torch.randn(batch, 3, size, size, generator=gen) * 0.3
    return F.interpolate(coarse, size=(size, size), mode="bilinear", align_corners=False) + fine


# ---- CNN blocks ------------------------------------------------------------------


class ConvBNAct(nn.Sequential):
    """Convolution, batch norm and an optional activation (``"relu"``, ``"relu6"`` or ``None``)."""

    def __init__(
        self, cin: int, cout: int, kernel: int = 3, stride: int = 1, groups: int = 1, act: str | None = "relu"
    ):
        layers: list[nn.Module] = [
            nn.Conv2d(cin, cout, kernel, stride, padding=kernel // 2, groups=groups, bias=False),
            nn.BatchNorm2d(cout),
        ]
        if act == "relu":
            layers.append(nn.ReLU(inplace=True))
        elif act == "relu6":
            layers.append(nn.ReLU6(inplace=True))
        elif act is not None:
            raise ValueError(f"act must be 'relu', 'relu6' or None, got {act!r}")
        super().__init__(*layers)


class BasicBlock(nn.Module):
    """The ResNet-18/34 residual block: two 3x3 convolutions and a (projected) shortcut."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(ConvBNAct(cin, cout, 3, stride), ConvBNAct(cout, cout, 3, 1, act=None))
        self.shortcut: nn.Module = (
            ConvBNAct(cin, cout, 1, stride, act=None) if stride != 1 or cin != cout else nn.Identity()
        )
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.relu(self.body(x) + self.shortcut(x))
        return out


class ResNet(nn.Module):
    """A ResNet of basic blocks (ResNet-18 is ``blocks=(2, 2, 2, 2), widths=(64, 128, 256, 512)``).

    ``forward`` returns the globally pooled features (``widths[-1]`` wide); the
    caller adds its own head, because the examples need the features too.
    """

    def __init__(self, blocks: Sequence[int], widths: Sequence[int]) -> None:
        super().__init__()
        self.stem = nn.Sequential(ConvBNAct(3, widths[0], 7, 2), nn.MaxPool2d(3, 2, 1))
        stages: list[nn.Module] = []
        cin = widths[0]
        for i, (n, w) in enumerate(zip(blocks, widths, strict=True)):
            for j in range(n):
                stages.append(BasicBlock(cin, w, 2 if (j == 0 and i > 0) else 1))
                cin = w
        self.stages = nn.Sequential(*stages)
        self.out_features = cin

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.stages(self.stem(x))
        return out.mean(dim=(2, 3))


class InvertedResidual(nn.Module):
    """The MobileNetV2 block: 1x1 expansion, 3x3 depthwise, linear 1x1 projection, shortcut when shapes match."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = cin * expand
        layers: list[nn.Module] = [] if expand == 1 else [ConvBNAct(cin, hidden, 1, act="relu6")]
        layers += [
            ConvBNAct(hidden, hidden, 3, stride, groups=hidden, act="relu6"),
            ConvBNAct(hidden, cout, 1, act=None),
        ]
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.body(x)
        return x + out if self.residual else out


# ---- boxes -----------------------------------------------------------------------


def box_iou(a: Tensor, b: Tensor) -> Tensor:
    """Pairwise IoU of boxes ``(N, 4)`` and ``(M, 4)`` in ``(x1, y1, x2, y2)`` form: an ``(N, M)`` matrix."""
    area_a = (a[:, 2] - a[:, 0]).clamp(min=0) * (a[:, 3] - a[:, 1]).clamp(min=0)
    area_b = (b[:, 2] - b[:, 0]).clamp(min=0) * (b[:, 3] - b[:, 1]).clamp(min=0)
    lt = torch.maximum(a[:, None, :2], b[None, :, :2])
    rb = torch.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(dim=2)
    return inter / (area_a[:, None] + area_b[None, :] - inter).clamp(min=1e-9)


def nms(boxes: Tensor, scores: Tensor, iou_threshold: float) -> Tensor:
    """Greedy non-maximum suppression in pure torch: indices of kept boxes, best score first.

    Same result as ``torchvision.ops.nms``. The IoU matrix is computed at once;
    the greedy pass runs over Python lists because it is inherently sequential
    and the candidate set is small (the detector keeps at most a few hundred).
    """
    if boxes.numel() == 0:
        return torch.empty(0, dtype=torch.int64, device=boxes.device)
    order = torch.argsort(scores, descending=True, stable=True)
    over = (box_iou(boxes[order], boxes[order]) > iou_threshold).tolist()
    suppressed = [False] * len(over)
    keep: list[int] = []
    for i, row in enumerate(over):
        if suppressed[i]:
            continue
        keep.append(i)
        for j in range(i + 1, len(row)):
            if row[j]:
                suppressed[j] = True
    return order[torch.tensor(keep, dtype=torch.int64, device=boxes.device)]


# ---- a transformer decoder with a key/value cache --------------------------------


class _DecoderLayer(nn.Module):
    """Pre-norm decoder layer: cached causal self-attention, cross-attention, feed-forward."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.norm1, self.norm2, self.norm3 = nn.LayerNorm(d_model), nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.self_out = nn.Linear(d_model, d_model)
        self.cross_q = nn.Linear(d_model, d_model)
        self.cross_kv = nn.Linear(d_model, 2 * d_model)
        self.cross_out = nn.Linear(d_model, d_model)
        self.ff = nn.Sequential(nn.Linear(d_model, d_ff), nn.GELU(), nn.Linear(d_ff, d_model))

    def _heads(self, x: Tensor) -> Tensor:
        b, t, d = x.shape
        return x.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2)

    def memory_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Project the memory to cross-attention keys and values once per sequence."""
        k, v = self.cross_kv(memory).chunk(2, dim=-1)
        return self._heads(k), self._heads(v)

    def step(self, x: Tensor, cache: list[Tensor], mem: tuple[Tensor, Tensor], mem_mask: Tensor) -> Tensor:
        """One decoding step for the newest token ``x`` (``(B, 1, d)``); ``cache`` holds past keys/values."""
        b = x.shape[0]
        q, k, v = (self._heads(t) for t in self.qkv(self.norm1(x)).chunk(3, dim=-1))
        if cache:
            k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
        cache[:] = [k, v]
        # No causal mask needed: the cache only holds earlier tokens.
        att = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, 1, -1)
        x = x + self.self_out(att)
        q = self._heads(self.cross_q(self.norm2(x)))
        att = F.scaled_dot_product_attention(q, mem[0], mem[1], attn_mask=mem_mask).transpose(1, 2).reshape(b, 1, -1)
        x = x + self.cross_out(att)
        out: Tensor = x + self.ff(self.norm3(x))
        return out


class GreedyDecoder(nn.Module):
    """A small transformer decoder with cross-attention that decodes greedily with a key/value cache.

    Args:
        vocab_size: input and output vocabulary.
        d_model, n_heads, n_layers, d_ff: transformer sizes.
        max_len: longest sequence the position table covers.
    """

    banned: Tensor

    def __init__(self, vocab_size: int, d_model: int, n_heads: int, n_layers: int, d_ff: int, max_len: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Parameter(torch.randn(max_len, d_model) * 0.02)
        self.layers = nn.ModuleList(_DecoderLayer(d_model, n_heads, d_ff) for _ in range(n_layers))
        self.norm = nn.LayerNorm(d_model)
        # Untied from the embedding: with random weights a tied output layer just echoes its input token.
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        self.register_buffer("banned", torch.zeros(vocab_size, dtype=torch.bool))

    def ban(self, token_ids: Sequence[int]) -> None:
        """Never emit these tokens (padding, unknown and other control tokens)."""
        self.banned[list(token_ids)] = True

    def generate(self, memory: Tensor, memory_pad: Tensor, first: Tensor, steps: int, min_tokens: int = 0) -> Tensor:
        """Greedily decode ``steps`` tokens after ``first`` (``(B,)`` token ids).

        Args:
            memory: ``(B, M, d_model)`` states to attend to.
            memory_pad: ``(B, M)`` bool, True where ``memory`` is padding; each row keeps >= 1 real entry.
            first: the start token of each sequence.
            steps: tokens to emit; each row is decoded independently of the others.
            min_tokens: the first steps that never emit ``[EOS]``, so that a text has at least
                that many tokens (a row whose best token was another keeps it: greedy is unchanged).

        Returns:
            ``(B, steps)`` int64 token ids.
        """
        mem_mask = (~memory_pad)[:, None, None, :]  # SDPA: True takes part in attention
        layers = [cast(_DecoderLayer, m) for m in self.layers]
        mems = [layer.memory_kv(memory) for layer in layers]
        caches: list[list[Tensor]] = [[] for _ in layers]
        token = first
        out: list[Tensor] = []
        for t in range(steps):
            x = self.embed(token)[:, None, :] + self.pos[t]
            for layer, cache, mem in zip(layers, caches, mems, strict=True):
                x = layer.step(x, cache, mem, mem_mask)
            logits = self.head(self.norm(x[:, 0])).masked_fill(self.banned, float("-inf"))
            if t < min_tokens:
                logits[:, TOKEN_ID[EOS]] = float("-inf")
            token = logits.argmax(dim=-1)
            out.append(token)
        return torch.stack(out, dim=1)


# ---- vocabulary --------------------------------------------------------------------

PAD, UNK, CLS, SEP, BOS, EOS = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[BOS]", "[EOS]"
N_TOPICS = 8
TOPIC_TOKENS: tuple[str, ...] = tuple(f"[T{i}]" for i in range(N_TOPICS))
_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789"
_PUNCT = ".,;:!?'\"-()%$&/"
_SUFFIXES = ("s", "es", "ed", "ing", "ly", "er", "ers", "est", "ion", "tion", "al", "ment", "ness", "ity", "ic", "ous")
VOCAB: tuple[str, ...] = tuple(
    dict.fromkeys(
        (
            *(PAD, UNK, CLS, SEP, BOS, EOS, *TOPIC_TOKENS, *WORDS, *_CHARS, *_PUNCT),
            *("##" + c for c in _CHARS),
            *("##" + s for s in _SUFFIXES),
        )
    )
)
"""Token strings by id: control tokens, whole words, characters and word pieces (``##`` continues a word)."""
TOKEN_ID: dict[str, int] = {tok: i for i, tok in enumerate(VOCAB)}
CONTROL_IDS: tuple[int, ...] = tuple(TOKEN_ID[t] for t in (PAD, UNK, CLS, SEP, BOS, *TOPIC_TOKENS))


def detokenize(ids: Sequence[int]) -> str:
    """Token ids back to text: stops at ``[EOS]``, skips control tokens, glues ``##`` pieces to their word."""
    words: list[str] = []
    for i in ids:
        tok = VOCAB[i]
        if tok == EOS:
            break
        if i in CONTROL_IDS:
            continue
        if tok.startswith("##") and words:
            words[-1] += tok[2:]
        else:
            words.append(tok.removeprefix("##"))
    return " ".join(words)
