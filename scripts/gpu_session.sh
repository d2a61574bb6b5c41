#!/usr/bin/env bash
# Everything esg-prefect measures on a GPU, run on the GPU machine itself (see docs/gpu.md).
#
#   bash scripts/gpu_session.sh check     # nvidia-smi, the CUDA tests (pytest -m gpu): ~2 min
#   bash scripts/gpu_session.sh profile   # the example stages over batch x vCPU x GPU share, the
#                                         # Stash breakdown with the co-run table, the validation: ~8 min
#   bash scripts/gpu_session.sh bench PROFILE.csv [ARGS]   # bench/runtime_throughput.py with that profile
#   bash scripts/gpu_session.sh all       # the three in turn (more than one device call allows)
#
# Wheels for what the machine lacks (Prefect, SQLModel) are installed from .whl/ when it is there
# (scripts/gpu_wheels.sh makes it). Results go to $OUT (the device tool's folder), else
# ./gpu-results: logs, and the profile's files as one tarball (the tool brings back at most 8 files).
# ESG_GPU_QUICK=1 profiles one repetition of batches 1 and 2 only (a dry run of the script);
# ESG_GPU_VCPUS, ESG_GPU_SHARES and ESG_GPU_BATCHES narrow the profile (comma-separated lists) when a
# step would run past the device tool's 10 minutes a command.
set -uo pipefail
cd "$(dirname "$0")/.."
STEP="${1:-all}"
OUT="${OUT:-$PWD/gpu-results}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export ESG_PREFECT_STORE_URL="sqlite:///$OUT/../esg-gpu-store.db"
if [ -d .whl ] && ! python3 -c "import prefect, sqlmodel" 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || { echo "installing the wheels of .whl failed"; exit 1; }
    export PYTHONPATH="/tmp/site:$PYTHONPATH"
fi
esg() { python3 -m esg_prefect.cli "$@"; }

check() {
    nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || echo "no nvidia-smi" > "$OUT/nvidia-smi.txt"
    python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), \
torch.cuda.get_device_name() if torch.cuda.is_available() else '')" | tee -a "$OUT/nvidia-smi.txt"
    python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py 2>&1 | tee "$OUT/pytest_gpu.log"
}

profile() {
    local dir; dir="$(mktemp -d)"
    local sizes=(--batches "${ESG_GPU_BATCHES:-1,2,4,8,16,32}")  # --quick has its own (and refuses these)
    [ -n "${ESG_GPU_QUICK:-}" ] && sizes=(--quick)
    esg profile --target examples --vcpus "${ESG_GPU_VCPUS:-2}" --gpu-shares "${ESG_GPU_SHARES:-0.25,0.5,1}" \
        "${sizes[@]}" --breakdown --co-runners 1 --validate --out-dir "$dir" --name gpu --no-store 2>&1 \
        | tee "$OUT/profile.log"
    tar czf "$OUT/gpu_profile.tgz" -C "$dir" .
    echo "profile files: $(cd "$dir" && ls | tr '\n' ' ')" | tee -a "$OUT/profile.log"
}

bench() {
    local prof="${1:?bench needs the profile CSV measured on this machine}"
    shift
    python3 bench/runtime_throughput.py --profile "$prof" "$@" 2>&1 | tee "$OUT/runtime_throughput.log"
}

case "$STEP" in
    check) check ;;
    profile) profile ;;
    bench) shift; bench "$@" ;;
    all)
        check
        profile
        dir="$(mktemp -d)" && tar xzf "$OUT/gpu_profile.tgz" -C "$dir" && bench "$dir/gpu.csv"
        ;;
    *) echo "unknown step $STEP: check, profile, bench PROFILE.csv or all"; exit 2 ;;
esac
