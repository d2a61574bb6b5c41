"""The text pipeline: tokenize, encode, classify the topic, summarize.

A chain::

    tokenize ──> encode ──> classify_text ──> summarize

Data flow, per request (every value is a tensor, number, string, list or dict of those):

- request (:func:`make_input`): an English-like text of 20 to 120 words;
- ``tokenize`` -> 1-d int64 token ids ``[CLS] ... [SEP]``, at most ``MAX_LEN`` (128) long
  (WordPiece over the built-in vocabulary; not a DNN);
- ``encode`` -> ``{"hidden": Lx256}``, the states of a 4-layer transformer encoder for the
  ``L`` real tokens (no padding is returned);
- ``classify_text`` -> ``{"label": int, "probs": 8 floats, "hidden": Lx256}``: one task-specific
  transformer layer, attention pooling and an MLP choose one of 8 topics; the encoder states
  travel on because ``summarize`` attends to them (the chain has no encode->summarize edge);
- ``summarize`` -> ``{"tokens": list[int], "text": str}``: a 2-layer transformer decoder with
  cross-attention decodes ``SUMMARY_TOKENS`` tokens greedily, starting from the topic's control
  token; it never ends (``[EOS]``) before its first token, so no summary is empty.

Texts of different lengths in one batch are padded to the longest and masked;
the encoder runs PyTorch's nested-tensor fast path, which skips the padding.
"""

from __future__ import annotations

import random
import re
import warnings
from typing import Any

import torch
from torch import Tensor, nn

from esg_prefect.examples.models import (
    CLS,
    CONTROL_IDS,
    N_TOPICS,
    PAD,
    SEP,
    TOKEN_ID,
    TOPIC_TOKENS,
    UNK,
    VOCAB,
    WORDS,
    GreedyDecoder,
    build_seeded,
    detokenize,
    finish,
    model_device,
    unbatch,
)
from esg_prefect.exceptions import InvalidInputError

MAX_LEN = 128
D_MODEL = 256
SUMMARY_TOKENS = 48
_SPLIT = re.compile(r"\w+|[^\w\s]")


def make_input(rng: random.Random) -> str:
    """A text of 20 to 120 words: sentences of vocabulary words, inflections, rare words, numbers, punctuation."""
    words: list[str] = []
    n = rng.randint(20, 120)
    sentence_start = True
    while len(words) < n:
        r = rng.random()
        if r < 0.08:
            w = "".join(rng.choice("bcdfghklmnprstvwz") + rng.choice("aeiou") for _ in range(rng.randint(2, 4)))
        elif r < 0.15:
            w = rng.choice(WORDS) + rng.choice(("s", "ed", "ing", "ly", "er"))
        elif r < 0.18:
            w = str(rng.randint(1, 2030))
        else:
            w = rng.choice(WORDS)
        if sentence_start:
            w = w.capitalize()
        sentence_start = rng.random() < 0.1
        words.append(w + ("." if sentence_start else "," if rng.random() < 0.05 else ""))
    return " ".join(words).rstrip(",.") + "."


# ---- tokenize ------------------------------------------------------------------------


class WordPieceTokenizer:
    """BERT's WordPiece: lowercase, split on spaces and punctuation, then greedy longest-match pieces.

    Over the built-in :data:`~esg_prefect.examples.models.VOCAB`; every word can
    be spelled with single-character pieces, so ``[UNK]`` only stands for
    characters outside the vocabulary.
    """

    def __init__(self, max_len: int = MAX_LEN, max_word_chars: int = 40) -> None:
        self.max_len = max_len
        self.max_word_chars = max_word_chars

    def word_ids(self, word: str) -> list[int]:
        """The ids of one word's pieces (``[UNK]`` when some part cannot be matched)."""
        if len(word) > self.max_word_chars:
            return [TOKEN_ID[UNK]]
        ids: list[int] = []
        start = 0
        while start < len(word):
            for end in range(len(word), start, -1):
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in TOKEN_ID:
                    ids.append(TOKEN_ID[piece])
                    start = end
                    break
            else:
                return [TOKEN_ID[UNK]]
        return ids

    def encode(self, text: str) -> list[int]:
        """``[CLS]`` + pieces + ``[SEP]``, truncated to ``max_len`` tokens."""
        ids = [TOKEN_ID[CLS]]
        for word in _SPLIT.findall(text.lower()):
            ids += self.word_ids(word)
            if len(ids) >= self.max_len - 1:
                break
        return [*ids[: self.max_len - 1], TOKEN_ID[SEP]]


def load_tokenize(device: str = "cpu") -> WordPieceTokenizer:
    """The tokenizer (pure Python; ``device`` is accepted for a uniform interface)."""
    return WordPieceTokenizer()


def run_tokenize(model: WordPieceTokenizer, inputs: list[Any]) -> list[Any]:
    """Texts -> 1-d int64 token-id tensors."""
    out: list[Any] = []
    for text in inputs:
        if not isinstance(text, str):
            raise InvalidInputError(f"tokenize: expected a str, got {type(text).__name__}")
        out.append(torch.tensor(model.encode(text), dtype=torch.int64))
    return out


def pad_batch(seqs: list[Tensor], pad_value: float = 0.0) -> tuple[Tensor, Tensor]:
    """Right-pad 1-d or 2-d sequences to the longest; returns the batch and a ``(B, L)`` mask, True at padding."""
    lengths = torch.tensor([len(s) for s in seqs])
    batch = nn.utils.rnn.pad_sequence(seqs, batch_first=True, padding_value=pad_value)
    pad = torch.arange(batch.shape[1])[None, :] >= lengths[:, None]
    return batch, pad


# ---- encode ---------------------------------------------------------------------------


class TextEncoder(nn.Module):
    """A BERT-style encoder: 4 post-norm layers, d_model 256, 4 heads, feed-forward 1024, positions up to 128."""

    def __init__(self, n_layers: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(len(VOCAB), D_MODEL, padding_idx=TOKEN_ID[PAD])
        self.pos = nn.Parameter(torch.randn(MAX_LEN, D_MODEL) * 0.02)
        self.norm = nn.LayerNorm(D_MODEL)
        layer = nn.TransformerEncoderLayer(D_MODEL, 4, 1024, dropout=0.0, activation="gelu", batch_first=True)
        self.layers = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=True)

    def forward(self, ids: Tensor, pad: Tensor) -> Tensor:
        x = self.norm(self.embed(ids) + self.pos[: ids.shape[1]])
        out: Tensor = self.layers(x, src_key_padding_mask=pad)
        return out


def load_encode(device: str = "cpu") -> TextEncoder:
    """The encoder with seeded weights."""
    return finish(build_seeded(TextEncoder, seed=501), device)


def run_encode(model: TextEncoder, inputs: list[Any]) -> list[Any]:
    """Token ids -> ``{"hidden": Lx256}`` per text."""
    for x in inputs:
        if not isinstance(x, Tensor) or x.dim() != 1 or not 0 < len(x) <= MAX_LEN:
            raise InvalidInputError(f"encode: expected 1-d token ids of length 1..{MAX_LEN}, got {x!r:.80}")
    ids, pad = pad_batch(list(inputs), TOKEN_ID[PAD])
    dev = model_device(model)
    with torch.inference_mode(), warnings.catch_warnings():
        # The fast path converts to nested tensors and warns once that their API is a prototype.
        warnings.filterwarnings("ignore", message="The PyTorch API of nested tensors", category=UserWarning)
        hidden = model(ids.to(dev), pad.to(dev)).cpu()
    return [{"hidden": hidden[i, : len(x)].clone()} for i, x in enumerate(inputs)]


# ---- classify_text ---------------------------------------------------------------------


class TopicClassifier(nn.Module):
    """A task layer over the shared encoder, attention pooling and a 2-layer MLP over 8 topics."""

    def __init__(self) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(D_MODEL, 4, 1024, dropout=0.0, activation="gelu", batch_first=True)
        # Wrapped in an encoder for its nested-tensor fast path, which skips the padding.
        self.task_layer = nn.TransformerEncoder(layer, 1, enable_nested_tensor=True)
        self.query = nn.Parameter(torch.randn(D_MODEL))
        self.mlp = nn.Sequential(nn.Linear(D_MODEL, 512), nn.GELU(), nn.Linear(512, N_TOPICS))

    def forward(self, hidden: Tensor, pad: Tensor) -> Tensor:
        h: Tensor = self.task_layer(hidden, src_key_padding_mask=pad)
        weights = torch.softmax((h @ self.query).masked_fill(pad, float("-inf")), dim=1)
        pooled = (weights[..., None] * h.masked_fill(pad[..., None], 0.0)).sum(dim=1)
        return torch.softmax(self.mlp(pooled), dim=-1)


def load_classify_text(device: str = "cpu") -> TopicClassifier:
    """The topic classifier with seeded weights."""
    return finish(build_seeded(TopicClassifier, seed=601), device)


def run_classify_text(model: TopicClassifier, inputs: list[Any]) -> list[Any]:
    """``{"hidden"}`` -> ``{"label", "probs", "hidden"}`` per text."""
    hidden, pad = pad_batch([x["hidden"] for x in inputs])
    dev = model_device(model)
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The PyTorch API of nested tensors", category=UserWarning)
        probs = model(hidden.to(dev), pad.to(dev)).cpu()
    return [
        {"label": int(p.argmax()), "probs": p, "hidden": x["hidden"]}
        for p, x in zip(unbatch(probs), inputs, strict=True)
    ]


# ---- summarize -------------------------------------------------------------------------


class Summarizer(nn.Module):
    """A 6-layer transformer decoder attending to the encoder states (distilBART-like depth, narrower)."""

    def __init__(self) -> None:
        super().__init__()
        self.memory_norm = nn.LayerNorm(D_MODEL)
        self.decoder = GreedyDecoder(len(VOCAB), D_MODEL, n_heads=4, n_layers=6, d_ff=1024, max_len=64)
        self.decoder.ban(CONTROL_IDS)


def load_summarize(device: str = "cpu") -> Summarizer:
    """The summarizer with seeded weights."""
    return finish(build_seeded(Summarizer, seed=701), device)


def run_summarize(model: Summarizer, inputs: list[Any]) -> list[Any]:
    """``{"label", "hidden", ...}`` -> ``{"tokens", "text"}`` summaries of ``SUMMARY_TOKENS`` tokens."""
    hidden, pad = pad_batch([x["hidden"] for x in inputs])
    first = torch.tensor([TOKEN_ID[TOPIC_TOKENS[int(x["label"])]] for x in inputs])
    dev = model_device(model)
    with torch.inference_mode():
        memory = model.memory_norm(hidden.to(dev))
        # A token before [EOS]: a summary that ended at once was empty (request_seed=0, among others).
        ids = model.decoder.generate(memory, pad.to(dev), first.to(dev), SUMMARY_TOKENS, min_tokens=1)
        tokens = ids.cpu().tolist()
    return [{"tokens": t, "text": detokenize(t)} for t in tokens]
