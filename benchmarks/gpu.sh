#!/usr/bin/env bash
# The GPU benchmark run, planned to fit a lent machine's minutes (--budget-s, default 480 s). On one
# CUDA node (1 to 8 GPUs) it runs these parts in this order, each only while the estimate of what is
# left fits the budget, each writing its results as it finishes:
#   1. table:     the article's table: single, dp and ddp at 1, 2, 4, ... all GPUs, fp32
#   2. precision: the same setups in bf16 and fp16 (GradScaler)
#   3. fsdp:      fsdp at every world size, fp32, bf16 and fp16
#   4. parity:    `scalelab bench parity` (engine step vs a hand-written loop)
#   5. mfu:       `scalelab bench mfu`, a GPT-style step (experiments/gpt.py, 12 layers, d_model 1024,
#                 seq 1024, batch 16) in bf16 on the first GPU, over the device's dense bf16 peak
# Each study part is its own `scalelab speedup` (out: gpu/<part>/); gpu/parts.tsv gets a line per
# part as it ends (ran / failed / left out, and its seconds), gpu/torch.txt the torch it ran with.
#
#   benchmarks/gpu.sh                                  # needs CUDA: exits 2 without it
#   benchmarks/gpu.sh --dry-run --gpus 8 --budget-s 480  # the plan and its commands, on any machine
#   benchmarks/gpu.sh --no-tracking                    # a node without mlflow: the study logs no runs
# Paths (--out, --params) are relative to the repository root.
set -euo pipefail

# Estimated seconds, from the one run so far: one H200, world size 1, 2026-12-04
# (benchmarks/h200-2026-12-04/gpu.log, 207 s wall): 9 study cells in 123 s, 13.7 s a cell; the
# report, parity and MFU together took the other ~84 s. Cells at world sizes 2-8 are unmeasured and
# assumed to cost the same (each runs the same number of steps); --cell-s overrides the figure.
CELL_S=14   # one study cell (torchrun start, warm-up, 3 x 5 timed steps)
START_S=10  # one study's start-up and report (estimate)
PARITY_S=30 # bench parity (estimate: part of the 84 s)
MFU_S=50    # bench mfu (estimate: part of the 84 s)

usage() {
    cat <<'USAGE'
usage: benchmarks/gpu.sh [--dry-run] [--gpus N] [--budget-s S] [--cell-s S] [--out DIR] [--params FILE]
                         [--skip-parity] [--no-tracking]
  --dry-run      print the plan and its commands and exit 0; runs nothing and needs no GPU
  --gpus N       GPUs to use (default: every visible one; 8 in a dry run without CUDA)
  --budget-s S   seconds the whole run may take (default 480): parts that do not fit are left out
  --cell-s S     estimated seconds of one study cell (default 14, measured on one H200)
  --out DIR      output folder (default results/bench)
  --params FILE  params whose `speedup` section is the workload (default params.yaml)
  --skip-parity  leave out the parity benchmark
  --no-tracking  the study's params get tracking.enabled: false (no MLflow parent and cell runs)
USAGE
}

bad() { echo "gpu.sh: error: $*" >&2; exit 2; }
DRY=0 GPUS="" OUT="results/bench" PARAMS="params.yaml" PARITY=1 TRACKING=True BUDGET=480
while [[ $# -gt 0 ]]; do
    case "$1" in
        --dry-run) DRY=1 ;;
        --gpus) [[ $# -ge 2 ]] || bad "--gpus needs a number"; GPUS="$2"; shift ;;
        --budget-s) [[ $# -ge 2 ]] || bad "--budget-s needs a number of seconds"; BUDGET="$2"; shift ;;
        --cell-s) [[ $# -ge 2 ]] || bad "--cell-s needs a number of seconds"; CELL_S="$2"; shift ;;
        --out) [[ $# -ge 2 ]] || bad "--out needs a folder"; OUT="$2"; shift ;;
        --params) [[ $# -ge 2 ]] || bad "--params needs a file"; PARAMS="$2"; shift ;;
        --skip-parity) PARITY=0 ;;
        --no-tracking) TRACKING=False ;;
        -h|--help) usage; exit 0 ;;
        *) echo "gpu.sh: error: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
    esac
    shift
done
[[ -z "$GPUS" || "$GPUS" =~ ^[1-9][0-9]*$ ]] || bad "--gpus = '$GPUS' is not a positive whole number"
[[ "$BUDGET" =~ ^[1-9][0-9]*$ ]] || bad "--budget-s = '$BUDGET' is not allowed: give a positive whole number of seconds"
[[ "$CELL_S" =~ ^[1-9][0-9]*$ ]] || bad "--cell-s = '$CELL_S' is not allowed: give a positive whole number of seconds"
cd "$(dirname "$0")/.."  # paths are relative to the repository root
[[ -f "$PARAMS" ]] || bad "--params $PARAMS: no such file"
PY="${PYTHON:-.venv/bin/python}"
[[ -x "$PY" ]] || PY=python3

if [[ -z "$GPUS" || $DRY -eq 0 ]]; then
    FOUND=$("$PY" -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)")
    if [[ "$FOUND" -eq 0 && $DRY -eq 0 ]]; then
        bad "no CUDA device visible (torch.cuda.is_available() is False): this script runs on a GPU node; use --dry-run to see its plan"
    fi
    if [[ -n "$GPUS" && "$FOUND" -gt 0 && "$GPUS" -gt "$FOUND" ]]; then
        bad "--gpus $GPUS but only $FOUND CUDA device(s) are visible"
    fi
    [[ -n "$GPUS" ]] || GPUS=$(( FOUND > 0 ? FOUND : 8 ))
fi

# world sizes 1, 2, 4, ... and all GPUs; NS: how many, NMULTI: how many above 1 (dp's)
SIZES="1" NS=1
for (( n = 2; n < GPUS; n *= 2 )); do SIZES="$SIZES, $n"; NS=$(( NS + 1 )); done
(( GPUS > 1 )) && { SIZES="$SIZES, $GPUS"; NS=$(( NS + 1 )); }
NMULTI=$(( NS - 1 ))

# the parts: name, strategies, precisions, cells (single: one per precision; dp: one per world size
# above 1; ddp and fsdp: one per world size) and estimated seconds
PARTS=(table precision fsdp)
declare -A STRATS=([table]="single,dp,ddp" [precision]="single,dp,ddp" [fsdp]="fsdp")
declare -A PRECS=([table]="fp32" [precision]="bf16,fp16" [fsdp]="fp32,bf16,fp16")
declare -A CELLS=([table]=$(( 1 + NMULTI + NS )) [precision]=$(( 2 * (1 + NMULTI + NS) )) [fsdp]=$(( 3 * NS )))
declare -A EST
for p in "${PARTS[@]}"; do EST[$p]=$(( START_S + CELLS[$p] * CELL_S )); done
EST[parity]=$PARITY_S EST[mfu]=$MFU_S
(( PARITY == 1 )) && PARTS+=(parity)
PARTS+=(mfu)

# the plan: each part in order when its estimate fits what is left of the budget
declare -A PLAN
LEFT=$BUDGET PLANNED=0 OMITTED=""
for p in "${PARTS[@]}"; do
    if (( EST[$p] <= LEFT )); then
        PLAN[$p]=run LEFT=$(( LEFT - EST[$p] )) PLANNED=$(( PLANNED + EST[$p] ))
    else
        PLAN[$p]="left out: needs ~${EST[$p]} s, ~$LEFT s left"; OMITTED="$OMITTED $p"
    fi
done

echo "gpu.sh: $GPUS GPU(s), world sizes $SIZES, budget $BUDGET s, out $OUT$([[ $DRY -eq 1 ]] && echo ' (dry run: nothing runs)')"
echo "plan (estimates: $CELL_S s a study cell, measured on one H200 at world size 1; $START_S s a study's start-up):"
declare -A WHAT=([parity]="engine step vs a hand-written loop" [mfu]="GPT step in bf16 on the first GPU")
for p in "${PARTS[@]}"; do
    what="${WHAT[$p]:-${CELLS[$p]:-0} cells: ${STRATS[$p]:-}}"
    [[ -n "${PRECS[$p]:-}" ]] && what="${what//,/, } x ${PRECS[$p]//,/, }"
    printf '  %-10s ~%4d s  %-8s %s\n' "$p" "${EST[$p]}" "${PLAN[$p]%%:*}" "$what"
    [[ "${PLAN[$p]}" == run ]] || echo "             ${PLAN[$p]}"
done
(( GPUS < 2 )) && echo "  dp: skipped at every world size (nn.DataParallel needs >= 2 GPUs; $GPUS visible)"
echo "  total ~$PLANNED s of $BUDGET; left out:${OMITTED:- nothing}"

run() {
    if [[ $DRY -eq 1 ]]; then
        printf '+'; printf ' %q' "$@"; printf '\n'
    else
        echo "+ $*" >&2
        "$@"
    fi
}

WRITE_PARAMS='import sys, yaml
src, dst, sizes, tracking, strategies, precisions = sys.argv[1:7]
p = yaml.safe_load(open(src))
p["tracking"]["enabled"] = tracking == "True"
p["speedup"].update(device="cuda", strategies=strategies.split(","), precisions=precisions.split(","),
                    world_sizes=[int(s) for s in sizes.split(",")])
yaml.safe_dump(p, open(dst, "w"), sort_keys=False)'
TORCH_INFO='import sys, torch
n = torch.cuda.device_count() if torch.cuda.is_available() else 0
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, python {sys.version.split()[0]}, "
      + ", ".join(torch.cuda.get_device_name(i) for i in range(n)))'

START=$(date +%s)
part() {  # part NAME COMMAND...: runs it within what is left of the budget, and records how it ended
    local name="$1"; shift
    local left=$(( BUDGET - ($(date +%s) - START) ))
    (( DRY == 1 )) && left=$(( BUDGET - ${DONE_EST:-0} ))
    if [[ "${PLAN[$name]}" != run ]]; then
        echo "gpu.sh: $name ${PLAN[$name]}" >&2
        (( DRY == 1 )) || printf '%s\tleft out\t0\n' "$name" >> "$OUT/gpu/parts.tsv"
        return 0
    fi
    if (( DRY == 0 && EST[$name] > left )); then  # the parts before ran longer than estimated
        echo "gpu.sh: $name left out: needs ~${EST[$name]} s, $left s left" >&2
        printf '%s\tleft out\t0\n' "$name" >> "$OUT/gpu/parts.tsv"
        return 0
    fi
    local t0 rc=0; t0=$(date +%s)
    run timeout "$left" "$@" || rc=$?
    DONE_EST=$(( ${DONE_EST:-0} + EST[$name] ))
    (( DRY == 1 )) && return 0
    local status=ran; (( rc == 0 )) || status="failed (exit $rc)"
    printf '%s\t%s\t%d\n' "$name" "$status" $(( $(date +%s) - t0 )) >> "$OUT/gpu/parts.tsv"
}

run mkdir -p "$OUT/gpu"
if (( DRY == 1 )); then run "$PY" -c "$TORCH_INFO"; else "$PY" -c "$TORCH_INFO" | tee "$OUT/gpu/torch.txt"; fi
for p in table precision fsdp; do
    [[ "${PLAN[$p]}" == run ]] && run mkdir -p "$OUT/gpu/$p" \
        && run "$PY" -c "$WRITE_PARAMS" "$PARAMS" "$OUT/gpu/$p/params.yaml" "${SIZES// /}" "$TRACKING" "${STRATS[$p]}" "${PRECS[$p]}"
    part "$p" "$PY" -m scalelab.cli speedup --params "$OUT/gpu/$p/params.yaml" --out "$OUT/gpu/$p"
done
if (( PARITY == 1 )); then
    part parity "$PY" -m scalelab.cli bench parity --params "$PARAMS" --out "$OUT"
fi
part mfu "$PY" -m scalelab.cli bench mfu --device cuda --precision bf16 --layers 12 --d-model 1024 \
    --seq 1024 --batch 16 --vocab 32768 --steps 10 --repeats 5 --warmup-steps 3 --out "$OUT"
echo "gpu.sh: done; figures in $OUT (summary.md), each part's end in $OUT/gpu/parts.tsv"
