"""Rebuild esg_prefect/data/profiles/nvidia_gpu*.csv (and the sources file) from NVIDIA's published tables.

Reads profiles/nvidia_dle_inference_latency.csv from the shared trace folder
($ESG_PREFECT_TRACES, or ../shared/traces beside the checkout), or the path
given. The derivation and the GPU-share model are described in
esg_prefect/workload/gpu_profiles.py.

Run:  python scripts/make_gpu_profiles.py [path/to/nvidia_dle_inference_latency.csv]
"""

from __future__ import annotations

import sys
from pathlib import Path

from esg_prefect.model.profile_source import PROFILE_DIR
from esg_prefect.workload.gpu_profiles import COLD_STARTS, build
from esg_prefect.workload.traces import shared_traces_dir


def main() -> None:
    if len(sys.argv) > 1:
        source = Path(sys.argv[1])
    else:
        base = shared_traces_dir()
        if base is None:
            sys.exit("no shared trace folder found: pass the path of nvidia_dle_inference_latency.csv")
        source = base / "profiles" / "nvidia_dle_inference_latency.csv"
    n = build(source)
    names = ", ".join(name for name, _ in COLD_STARTS)
    print(f"wrote {n} rows to each of {names} and nvidia_gpu_sources.csv in {PROFILE_DIR}")


if __name__ == "__main__":
    main()
