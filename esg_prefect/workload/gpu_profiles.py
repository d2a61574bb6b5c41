"""GPU latency profiles derived from NVIDIA's published inference tables, plus a GPU-share model.

The simulator needs ``L(stage, batch, gpu_share, GPU type)`` for real models
on real GPUs. NVIDIA publishes measured inference latency against batch size
for many models on T4, V100 and A100 in the READMEs of
``NVIDIA/DeepLearningExamples`` (transcribed in the shared trace folder as
``profiles/nvidia_dle_inference_latency.csv``, every row with its source and
licence). This module picks one table per (stage, GPU type) from
permissively licensed model directories (Apache-2.0, BSD-3-Clause, MIT), and
writes a :class:`~esg_prefect.model.profile.LatencyProfile` CSV:
``esg_prefect/data/profiles/nvidia_gpu.csv``, with the source of every table in
``nvidia_gpu_sources.csv`` beside it. Run ``python scripts/make_gpu_profiles.py``
to rebuild both; the result is byte-for-byte reproducible.

The GPU-share model (the tables measure whole GPUs only)
----------------------------------------------------------

A worker holding a share ``s`` of a GPU (MPS active-thread percentage, i.e.
a share of the SMs) runs a batch as fast as the whole GPU as long as the
batch cannot use more than ``s`` of the GPU anyway, and proportionally slower
below that::

    L(b, s) = L(b, 1) * max(1, u(b) / s),   u(b) = max(thr(b) / max_b' thr(b'), U_FLOOR)

``u(b)`` is how much of the GPU batch ``b`` uses, measured by the table
itself: its throughput as a fraction of the best throughput of any batch size
in the same table. This is a roofline-style "knee" model: small batches leave
most SMs idle, so a small share barely slows them; a batch that saturates
the GPU slows in proportion to the share taken away. The same knee shape is
what GPU-sharing systems report for inference (GSLICE, SoCC '20; INFless,
ASPLOS '22; FaST-GShare, ICPP '23): latency flat down to some share, then
rising. The floor ``U_FLOOR = 0.25`` is this project's assumption: kernels of
even a batch of 1 spread over many SMs, so no model is treated as needing
less than a quarter of the GPU; it makes the model conservative exactly
where throughput alone would make small shares look free. The slowdown
applies to the mean and to the p95 alike. Interference between co-located
workers (memory bandwidth, caches) is *not* in the profile: the simulator
adds it at run time (``SimSpec.interference_per_corunner``) and the
scheduler does not see it, as a real scheduler would not.

Other derivation rules
----------------------

* Batch sizes up to 32 (the largest of the default configuration space).
* ``mean_ms`` is the published average latency, ``p95_ms`` the published
  p95 (blank where not published). In a few TensorFlow BERT tables the average
  exceeds the p95 (warm-up outliers in the average); there the p50, or if
  absent the p90, is used as the mean.
* GPU types are named as the price sheet names them: V100-16GB/32GB as
  ``V100``, A100-40GB/80GB as ``A100``.
* Only GPU rows, at 1 vCPU: NVIDIA's tables time the GPU work only, so host
  vCPUs do not change them; a configuration space with more vCPUs finds no
  GPU point for them (the simulator's standard case uses ``vcpus=(1,)``).
* Cold start (``cold_start_ms``, the same on every GPU type), two platforms,
  two files with the same latencies:

  - ``nvidia_gpu.csv`` (the default, "model swap"): workers are started ahead
    with their CUDA context and the weights wait in host memory, as in
    PipeSwitch (Bai et al., OSDI '20) and the GPU-serverless systems after it;
    starting a worker for a stage costs 50 ms plus the FP32 weights over PCIe
    at 12 GB/s (about PCIe 3.0 x16 in practice);
  - ``nvidia_gpu_container.csv`` ("container"): a worker is a fresh container
    that loads its model from disk: 1,500 ms to start the process and its
    CUDA context plus 1 ms per MB of weights (about 1 GB/s).

  Both are this project's assumptions, stated as such; weight sizes are the
  models' approximate FP32 parameter sizes.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from esg_prefect.exceptions import ProfileError
from esg_prefect.model.profile_source import PROFILE_DIR

U_FLOOR = 0.25
"""Least fraction of a GPU any batch is taken to need (see the module docstring)."""

SHARES: tuple[float, ...] = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
MAX_BATCH = 32
PERMISSIVE = ("Apache-2.0", "BSD-3-Clause", "MIT")
SOURCE_COMMIT = "729963dd47e7c8bd462ad10bfac7a7b0b604e6dd"
SOURCES_FILE = PROFILE_DIR / "nvidia_gpu_sources.csv"


@dataclass(frozen=True, slots=True)
class ColdStartModel:
    """Time to start a worker for a stage: a fixed part plus the weights at some bandwidth."""

    name: str
    base_ms: float
    ms_per_mb: float

    def cold_start_ms(self, weights_mb: float) -> float:
        """Cold start of a model with ``weights_mb`` of weights, rounded to 0.1 ms."""
        return round(self.base_ms + self.ms_per_mb * weights_mb, 1)


COLD_STARTS: tuple[tuple[str, ColdStartModel], ...] = (
    ("nvidia_gpu.csv", ColdStartModel("model swap (PipeSwitch-style standby workers)", 50.0, 1000.0 / 12000.0)),
    ("nvidia_gpu_container.csv", ColdStartModel("container start, weights from disk", 1500.0, 1.0)),
)
"""Profile files written, and the cold-start model of each (module docstring)."""


def share_slowdown(utilisation: float, share: float, floor: float = U_FLOOR) -> float:
    """Factor by which a batch that uses ``utilisation`` of a GPU slows on a ``share`` of it.

    Examples:
        >>> share_slowdown(0.9, 0.3)
        3.0
        >>> share_slowdown(0.1, 0.5)   # below the floor: treated as needing 0.25
        1.0
        >>> share_slowdown(0.1, 0.1)
        2.5
    """
    if not 0.0 < share <= 1.0:
        raise ProfileError(f"share must be in (0, 1], got {share!r}")
    return max(1.0, max(utilisation, floor) / share)


@dataclass(frozen=True, slots=True)
class TableSelector:
    """Which published table gives a stage's latencies on one GPU type."""

    hardware: str
    framework: str
    model_dir: str
    submodel: str
    gpu: str
    precision: str
    serving: str
    backend: str = ""
    variant: str | None = None  # exact caption; None: any (the other fields are unique)
    seq_len: str = ""

    def matches(self, row: dict[str, str]) -> bool:
        """Whether ``row`` belongs to this table."""
        return (
            row["framework"] == self.framework
            and row["model_dir"] == self.model_dir
            and row["submodel"] == self.submodel
            and row["gpu"] == self.gpu
            and row["precision"] == self.precision
            and row["serving"] == self.serving
            and row["backend"] == self.backend
            and row["seq_len"] == self.seq_len
            and (self.variant is None or row["variant"] == self.variant)
        )


@dataclass(frozen=True, slots=True)
class StageSource:
    """A stage (one model) and the tables that profile it."""

    stage: str
    title: str
    weights_mb: float
    tables: tuple[TableSelector, ...]


def _triton(hw: str, model_dir: str, gpu: str, backend: str = "", seq_len: str = "") -> TableSelector:
    return TableSelector(hw, "PyTorch", model_dir, "", gpu, "FP16", "triton_offline", backend, None, seq_len)


def _tf_convnet(hw: str, model: str, gpu: str) -> TableSelector:
    return TableSelector(
        hw,
        "TensorFlow",
        f"Classification/ConvNets/{model}",
        "",
        gpu,
        "AMP(FP16)",
        "framework_benchmark",
        variant="Mixed Precision Inference Latency",
    )


def _bert(hw: str, gpu: str) -> TableSelector:
    return TableSelector(
        hw, "TensorFlow", "LanguageModeling/BERT", "base", gpu, "FP16", "framework_benchmark", seq_len="128"
    )


def _txl(hw: str, gpu: str) -> TableSelector:
    return TableSelector(
        hw,
        "PyTorch",
        "LanguageModeling/Transformer-XL",
        "",
        gpu,
        "FP16",
        "framework_benchmark",
        variant="FP16, TorchScript",
        seq_len="64",
    )


_RN50 = "Classification/ConvNets/triton/resnet50"
_FP = "SpeechSynthesis/FastPitch/triton"
_TRT = "ONNX Runtime TensorRT"

STAGES: tuple[StageSource, ...] = (
    StageSource(
        "resnet50",
        "ResNet-50 v1.5, Triton (ONNX Runtime + TensorRT, FP16)",
        98.0,
        (
            _triton("T4", _RN50, "T4", _TRT),
            _triton("V100", _RN50, "V100-32GB", _TRT),
            _triton("A100", _RN50, "A100-80GB", _TRT),
        ),
    ),
    StageSource(
        "resnext101",
        "ResNeXt101-32x4d, TensorFlow AMP",
        170.0,
        tuple(
            _tf_convnet(hw, "resnext101-32x4d", g)
            for hw, g in (("T4", "T4"), ("V100", "V100-16GB"), ("A100", "A100-40GB"))
        ),
    ),
    StageSource(
        "se-resnext101",
        "SE-ResNeXt101-32x4d, TensorFlow AMP",
        187.0,
        tuple(
            _tf_convnet(hw, "se-resnext101-32x4d", g)
            for hw, g in (("T4", "T4"), ("V100", "V100-16GB"), ("A100", "A100-40GB"))
        ),
    ),
    StageSource(
        "bert-base",
        "BERT-base SQuAD inference, TensorFlow FP16, sequence length 128",
        420.0,
        (_bert("T4", "T4"), _bert("V100", "V100-16GB"), _bert("A100", "A100")),
    ),
    StageSource(
        "transformer-xl",
        "Transformer-XL base, PyTorch FP16 TorchScript, target length 64",
        580.0,
        (_txl("T4", "T4"), _txl("V100", "V100-16GB"), _txl("A100", "A100-40GB")),
    ),
    StageSource(
        "fastpitch",
        "FastPitch, Triton (FP16), input length 128",
        180.0,
        (
            _triton("T4", _FP, "T4", seq_len="128"),
            _triton("V100", _FP, "V100-32GB", seq_len="128"),
            _triton("A100", _FP, "A100-80GB", seq_len="128"),
        ),
    ),
)


def _num(row: dict[str, str], key: str) -> float | None:
    v = row.get(key, "").strip()
    return float(v) if v else None


@dataclass(frozen=True, slots=True)
class DerivedRow:
    """One row of the derived profile."""

    stage: str
    hardware: str
    batch: int
    gpu_share: float
    mean_ms: float
    p95_ms: float | None
    cold_start_ms: float


def derive(
    source_rows: Iterable[dict[str, str]],
    cold: ColdStartModel = COLD_STARTS[0][1],
    stages: Sequence[StageSource] = STAGES,
    floor: float = U_FLOOR,
) -> tuple[list[DerivedRow], list[dict[str, str]]]:
    """Derived profile rows and one source row per (stage, GPU type) table used.

    Raises:
        ProfileError: when a selector matches no row, a table mixes batch
            sizes twice, or a table's licence is not permissive.
    """
    rows = list(source_rows)
    out: list[DerivedRow] = []
    sources: list[dict[str, str]] = []
    for st in stages:
        for sel in st.tables:
            table = [r for r in rows if sel.matches(r)]
            if not table:
                raise ProfileError(f"no published table matches {sel}")
            licences = {r["license"] for r in table}
            if not licences <= set(PERMISSIVE):
                raise ProfileError(f"table {sel} has licence {sorted(licences)}; only {PERMISSIVE} may be shipped")
            batches = [int(float(r["batch_size"])) for r in table]
            if len(set(batches)) != len(batches):
                raise ProfileError(f"table {sel} has repeated batch sizes {sorted(batches)}: make the selector exact")
            peak = max(float(r["throughput_per_s"]) for r in table)
            for r, b in sorted(zip(table, batches, strict=True), key=lambda x: x[1]):
                if b > MAX_BATCH:
                    continue
                mean = _num(r, "lat_avg_ms")
                p95 = _num(r, "lat_p95_ms")
                if mean is None:
                    raise ProfileError(f"table {sel}, batch {b}: no average latency")
                if p95 is not None and mean > p95:
                    mean = _num(r, "lat_p50_ms") or _num(r, "lat_p90_ms") or p95
                util = float(r["throughput_per_s"]) / peak
                for s in SHARES:
                    f = share_slowdown(util, s, floor)
                    out.append(
                        DerivedRow(
                            st.stage,
                            sel.hardware,
                            b,
                            s,
                            round(mean * f, 4),
                            None if p95 is None else round(p95 * f, 4),
                            cold.cold_start_ms(st.weights_mb),
                        )
                    )
            first = table[0]
            sources.append(
                {
                    "stage": st.stage,
                    "hardware": sel.hardware,
                    "model": st.title,
                    "published_gpu": sel.gpu,
                    "precision": sel.precision,
                    "serving": sel.serving,
                    "backend": sel.backend,
                    "variant": first["variant"],
                    "batches": " ".join(str(b) for b in sorted(batches) if b <= MAX_BATCH),
                    "source_repository": "NVIDIA/DeepLearningExamples",
                    "source_commit": SOURCE_COMMIT,
                    "source_path": first["source_path"],
                    "source_section": first["source_section"],
                    "license": first["license"],
                    "weights_mb": f"{st.weights_mb:g}",
                }
            )
    return out, sources


def profile_csv(rows: Sequence[DerivedRow]) -> str:
    """The derived rows in LatencyProfile's CSV format."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["stage", "hardware", "batch", "vcpus", "gpu_share", "mean_ms", "p95_ms", "cold_start_ms"])
    for r in rows:
        p95 = "" if r.p95_ms is None else f"{r.p95_ms:g}"
        w.writerow([r.stage, r.hardware, r.batch, 1, f"{r.gpu_share:g}", f"{r.mean_ms:g}", p95, f"{r.cold_start_ms:g}"])
    return buf.getvalue()


def sources_csv(sources: Sequence[dict[str, str]]) -> str:
    """The source table of each (stage, GPU type), as CSV."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(sources[0]), lineterminator="\n")
    w.writeheader()
    w.writerows(sources)
    return buf.getvalue()


def build(source: Path, out_dir: Path = PROFILE_DIR) -> int:
    """Read NVIDIA's transcribed tables from ``source``; write each profile of :data:`COLD_STARTS`
    and the sources file into ``out_dir``. Returns the rows per profile."""
    with open(source, encoding="utf-8", newline="") as fh:
        table = list(csv.DictReader(fh))
    n = 0
    for filename, cold in COLD_STARTS:
        rows, sources = derive(table, cold)
        (out_dir / filename).write_text(profile_csv(rows), encoding="utf-8")
        n = len(rows)
    (out_dir / SOURCES_FILE.name).write_text(sources_csv(sources), encoding="utf-8")
    return n
