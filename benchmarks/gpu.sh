#!/usr/bin/env bash
# The GPU benchmark run, ready to go: on one CUDA node (1 or 8 GPUs), in under ~10 minutes,
#   - the speedup study: single, dp, ddp and fsdp at 1..all GPUs, in fp32, bf16 and fp16 with
#     GradScaler, over NCCL (`scalelab speedup`, one grid: speedup.precisions);
#   - the parity benchmark (`scalelab bench parity`: engine step vs a hand-written loop);
#   - an MFU figure for a small GPT-style workload (`scalelab bench mfu`: experiments/gpt.py, 12
#     layers, d_model 1024, seq 1024, batch 16, bf16 autocast on the first GPU; achieved FLOP/s over
#     the device's dense bf16 peak from a table by name, about a minute).
# It writes under --out (default results/bench): gpu/speedup/, parity.json,
# mfu.json and their lines in summary.md.
#
#   benchmarks/gpu.sh                     # needs CUDA: exits 2 without it
#   benchmarks/gpu.sh --dry-run --gpus 8  # prints the commands, runs nothing (works on CPU)
#   benchmarks/gpu.sh --no-tracking       # a node without mlflow installed: the study logs no runs
# Paths (--out, --params) are relative to the repository root.
set -euo pipefail

usage() {
    cat <<'USAGE'
usage: benchmarks/gpu.sh [--dry-run] [--gpus N] [--out DIR] [--params FILE] [--skip-parity] [--no-tracking]
  --dry-run      print the commands and exit 0; runs nothing and needs no GPU
  --gpus N       GPUs to use (default: every visible one; 8 in a dry run without CUDA)
  --out DIR      output folder (default results/bench)
  --params FILE  params whose `speedup` section is the workload (default params.yaml)
  --skip-parity  leave out the parity benchmark
  --no-tracking  the study's params get tracking.enabled: false (no MLflow parent and cell runs)
USAGE
}

DRY=0 GPUS="" OUT="results/bench" PARAMS="params.yaml" PARITY=1 TRACKING=True
while [[ $# -gt 0 ]]; do
    case "$1" in
        --dry-run) DRY=1 ;;
        --gpus) [[ $# -ge 2 ]] || { echo "gpu.sh: error: --gpus needs a number" >&2; exit 2; }; GPUS="$2"; shift ;;
        --out) [[ $# -ge 2 ]] || { echo "gpu.sh: error: --out needs a folder" >&2; exit 2; }; OUT="$2"; shift ;;
        --params) [[ $# -ge 2 ]] || { echo "gpu.sh: error: --params needs a file" >&2; exit 2; }; PARAMS="$2"; shift ;;
        --skip-parity) PARITY=0 ;;
        --no-tracking) TRACKING=False ;;
        -h|--help) usage; exit 0 ;;
        *) echo "gpu.sh: error: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
    esac
    shift
done
if [[ -n "$GPUS" && ! "$GPUS" =~ ^[1-9][0-9]*$ ]]; then
    echo "gpu.sh: error: --gpus = '$GPUS' is not a positive whole number" >&2
    exit 2
fi
cd "$(dirname "$0")/.."  # paths are relative to the repository root
[[ -f "$PARAMS" ]] || { echo "gpu.sh: error: --params $PARAMS: no such file" >&2; exit 2; }
PY="${PYTHON:-.venv/bin/python}"
[[ -x "$PY" ]] || PY=python3

if [[ -z "$GPUS" || $DRY -eq 0 ]]; then
    FOUND=$("$PY" -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)")
    if [[ "$FOUND" -eq 0 && $DRY -eq 0 ]]; then
        echo "gpu.sh: error: no CUDA device visible (torch.cuda.is_available() is False): this script runs on a GPU node; use --dry-run to see its commands" >&2
        exit 2
    fi
    if [[ -n "$GPUS" && "$FOUND" -gt 0 && "$GPUS" -gt "$FOUND" ]]; then
        echo "gpu.sh: error: --gpus $GPUS but only $FOUND CUDA device(s) are visible" >&2
        exit 2
    fi
    [[ -n "$GPUS" ]] || GPUS=$(( FOUND > 0 ? FOUND : 8 ))
fi

# world sizes 1, 2, 4, ... and all GPUs
SIZES="1"
for (( n = 2; n < GPUS; n *= 2 )); do SIZES="$SIZES, $n"; done
(( GPUS > 1 )) && SIZES="$SIZES, $GPUS"

run() {
    if [[ $DRY -eq 1 ]]; then
        printf '+'; printf ' %q' "$@"; printf '\n'
    else
        echo "+ $*" >&2
        "$@"
    fi
}

# the speedup section on CUDA at the chosen world sizes, every strategy and precision
WRITE_PARAMS='import sys, yaml
src, dst, sizes, tracking = sys.argv[1:5]
p = yaml.safe_load(open(src))
p["tracking"]["enabled"] = tracking == "True"
p["speedup"].update(device="cuda", precisions=["fp32", "bf16", "fp16"], strategies=["single", "dp", "ddp", "fsdp"],
                    world_sizes=[int(s) for s in sizes.split(",")])
yaml.safe_dump(p, open(dst, "w"), sort_keys=False)'

echo "gpu.sh: $GPUS GPU(s), world sizes $SIZES, out $OUT$([[ $DRY -eq 1 ]] && echo ' (dry run: nothing runs)')"
run mkdir -p "$OUT/gpu"
run "$PY" -c "$WRITE_PARAMS" "$PARAMS" "$OUT/gpu/params.yaml" "${SIZES// /}" "$TRACKING"
run timeout 420 "$PY" -m scalelab.cli speedup --params "$OUT/gpu/params.yaml" --out "$OUT/gpu/speedup"
if [[ $PARITY -eq 1 ]]; then
    run timeout 120 "$PY" -m scalelab.cli bench parity --params "$PARAMS" --out "$OUT"
fi
run timeout 180 "$PY" -m scalelab.cli bench mfu --device cuda --precision bf16 --layers 12 --d-model 1024 \
    --seq 1024 --batch 16 --vocab 32768 --steps 10 --repeats 5 --warmup-steps 3 --out "$OUT"
echo "gpu.sh: done; figures in $OUT (summary.md)"
