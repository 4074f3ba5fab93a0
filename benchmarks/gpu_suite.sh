#!/usr/bin/env bash
# The GPU benchmark suite: one H100/H200, at most ~25 minutes (docs/engine.md,
# "Running on a GPU").
#
#   bash benchmarks/gpu_suite.sh [OUTDIR] [--smoke] [--steps a,b,...]
#
# OUTDIR defaults to $OUT (the device machine's output folder), else
# runs/gpu_suite_<date>. Every step runs under its own `timeout`, logs to
# OUTDIR/<step>.log, writes its JSON records to OUTDIR/<step>.jsonl and its
# outcome to OUTDIR/<step>.status; a failed or timed-out step does not stop the
# others. The last step writes OUTDIR/gpu.md and OUTDIR/docs_results/ (gpu.md and
# <benchmark>_gpu.jsonl) and, for a run on a GPU, copies them into docs/results/.
#
# Steps: env tests w1 throughput throughput_cnn ditto_cost privacy privacy_1000
# ditto_fmnist report (default: all). Environment:
#   GPU_SUITE_SMOKE=1       same as --smoke: every step shrunk to seconds (CPU check)
#   GPU_SUITE_BUDGET=S      total seconds for the steps before the report
#                           (default 1380; a step gets min(its limit, what is left);
#                           the report step has 60 more)
#   GPU_SUITE_WHEELS=DIR    wheels to install missing modules from (default .whl)
#   GPU_SUITE_WRITE_DOCS=0|1  copy the report into docs/results/ (default: only
#                           when jax's backend was gpu and not --smoke)
#   FEDJAX_PFL_DATA_DIR     the data folder, laid out as docs/datasets.md describes;
#                           required when w1 or ditto_fmnist is wanted (the suite
#                           stops with a message when it is unset); each of those
#                           two steps is skipped with a message when its files are
#                           not there
#   PYTHON                  interpreter (default: python, else python3)
set -u

CALLER_DIR=$PWD
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO" || exit 2
SUITE_COMMAND="bash benchmarks/gpu_suite.sh $*"
SMOKE=${GPU_SUITE_SMOKE:-0}
STEPS=all
LOG=""
while [ $# -gt 0 ]; do
  case $1 in
    --smoke) SMOKE=1 ;;
    --steps) STEPS=${2:?--steps needs a comma-separated list}; shift ;;
    --steps=*) STEPS=${1#--steps=} ;;
    -h|--help) sed -n '2,/^set -u/p' "$0" | grep '^#'; exit 0 ;;
    -*) echo "unknown option: $1" >&2; exit 2 ;;
    *) LOG=$1 ;;
  esac
  shift
done
LOG=${LOG:-${OUT:-$REPO/runs/gpu_suite_$(date +%Y%m%d_%H%M%S)}}
mkdir -p "$LOG" || exit 2
LOG=$(cd "$LOG" && pwd)
ALL="env tests w1 throughput throughput_cnn ditto_cost privacy privacy_1000 ditto_fmnist report"
[ "$STEPS" = all ] && STEPS=${ALL// /,}
for s in ${STEPS//,/ }; do
  case " $ALL " in *" $s "*) ;; *) echo "unknown step: $s (steps: $ALL)" >&2; exit 2 ;; esac
done

PY=${PYTHON:-$(command -v python >/dev/null && echo python || echo python3)}
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"  # works without an install
export PYTHONUNBUFFERED=1
export GPU_SUITE_COMMAND="$SUITE_COMMAND"
WHEELS=${GPU_SUITE_WHEELS:-$REPO/.whl}
if [ "$SMOKE" = 1 ]; then BUDGET=${GPU_SUITE_BUDGET:-900}; else BUDGET=${GPU_SUITE_BUDGET:-1380}; fi

wanted() { case ",$STEPS," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }

# The data folder: only $FEDJAX_PFL_DATA_DIR, laid out as docs/datasets.md describes.
DATA=${FEDJAX_PFL_DATA_DIR:-}
if wanted w1 || wanted ditto_fmnist; then
  if [ -z "$DATA" ]; then
    {
      echo "gpu_suite: FEDJAX_PFL_DATA_DIR is not set. Steps w1 and ditto_fmnist read"
      echo "  fashion_mnist/ (and w1 pfllib_fmnist_dir01/) from it: point it at a data"
      echo "  folder laid out as docs/datasets.md describes, e.g."
      echo "    FEDJAX_PFL_DATA_DIR=/path/to/data bash benchmarks/gpu_suite.sh ..."
      echo "  or leave both steps out with --steps (steps: $ALL)."
    } >&2
    exit 2
  fi
  case $DATA in /*) ;; *) DATA=$CALLER_DIR/$DATA ;; esac
  if [ ! -d "$DATA" ]; then
    echo "gpu_suite: FEDJAX_PFL_DATA_DIR=$DATA is not a directory" >&2
    exit 2
  fi
  DATA=$(cd "$DATA" && pwd)
  export FEDJAX_PFL_DATA_DIR="$DATA"
fi

START=$(date +%s)
SUMMARY=()
echo "gpu_suite: $SUITE_COMMAND"
echo "gpu_suite: output $LOG; steps $STEPS; smoke=$SMOKE; budget ${BUDGET}s; data ${DATA:-none}"

record() {  # name status rc seconds limit command
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$@" > "$LOG/$1.status"
  SUMMARY+=("$(printf '%-15s %-18s %6ss (limit %ss)' "$1" "$2" "$4" "$5")")
}

skip() {  # name reason
  echo "=== [$1] skipped: $2"
  record "$1" "skipped: $2" - 0 0 -
}

run_step() {  # name limit cmd...
  local name=$1 limit=$2; shift 2
  wanted "$name" || return 0
  local left=$((BUDGET - ($(date +%s) - START)))
  if [ "$name" != report ] && [ "$left" -lt 20 ]; then
    skip "$name" "budget (${BUDGET}s) spent"; return 0
  fi
  [ "$name" != report ] && [ "$left" -lt "$limit" ] && limit=$left
  local cmd
  cmd=$(printf '%q ' "$@")
  cmd=${cmd% }
  cmd=${cmd//"$LOG"/OUT}
  cmd=${cmd//"$REPO/"/}
  echo "=== [$name] limit ${limit}s: $cmd"
  rm -f "$LOG/$name.jsonl"
  local t0=$(date +%s)
  timeout --kill-after=30 "$limit" "$@" 2>&1 | tee "$LOG/$name.log"
  local rc=${PIPESTATUS[0]} secs=$(($(date +%s) - t0)) status
  case $rc in
    0) status=passed ;;
    124|137) status=timeout ;;
    *) status="failed (rc $rc)" ;;
  esac
  echo "=== [$name] $status in ${secs}s"
  record "$name" "$status" "$rc" "$secs" "$limit" "$cmd"
}

have_data() {  # relative paths under the data dir
  [ -n "$DATA" ] || return 1
  local f
  for f in "$@"; do [ -e "$DATA/$f" ] || return 1; done
}

B=benchmarks
if [ "$SMOKE" = 1 ]; then
  ENV_ARGS=()
  TESTS=(tests/core/test_engine.py -x -q -p no:cacheprovider -k "jit_equals_no_jit or sharded_equals_unsharded")
  W1=(--rounds 1 --clients 2)
  TP=(--models logreg --clients 6 --steps 2 --batch 4 --per-client 8 --repeats 1
      --strategies vmap map:2 --scan-rounds 2)
  TP_CNN=(--models cnn --clients 2 --batch 4 --per-client 8 --repeats 1
          --strategies vmap --scan-rounds 0)
  DC=(--clients 6 --cohort-size 3 --rounds 1 --eval-every 1 --repeats 1)
  PRIV=(--models tiny_mlp --clients 2 --batch 4 --repeats 1
        --variants plain ghost ghost_nonoise vmap vmap_chunk2)
  PRIV_1000=(--models tiny_mlp --clients 3 --batch 4 --repeats 1
             --variants plain ghost ghost_nonoise vmap_chunk2)
  FMNIST=(--rounds 1 --eval-every 1 --num-clients 20)
else
  ENV_ARGS=(--expect-gpu)
  TESTS=(tests/core -x -q -p no:cacheprovider -k "not multiprocess")
  # pytest-xdist, where the image has it: 4 workers (the tests use 4 fake CPU devices)
  "$PY" -c "import xdist" 2>/dev/null && TESTS+=(-n 4)
  W1=(--rounds 3)
  # map:1 (one client at a time) is the CPU default, not a GPU candidate
  TP=(--models logreg mlp --clients 1000 10000 --strategies vmap map:10 map:100 map:1000
      --repeats 3 --scan-rounds 4)
  # the CNN (3.27M parameters) at 1,000 clients only: 10,000 stacked updates are 130 GB
  TP_CNN=(--models cnn --clients 1000 --cnn-steps 1 --strategies vmap map:10 map:100
          --repeats 3 --scan-rounds 4)
  DC=()  # the CPU record's setting: 100 clients, cohort 10, 100 rounds, logreg
  PRIV=(--models mlp fedavg_cnn --clients 100)
  # no plain nested vmap at 1,000 clients: 64,000 per-example CNN gradients are 149 GB
  PRIV_1000=(--models mlp fedavg_cnn --clients 1000
             --variants plain ghost ghost_nonoise vmap_chunk16)
  FMNIST=(--rounds 100 --eval-every 50)
fi
LAMS=(--lams 0 0.05 0.1 0.2 0.5 1 2 5)  # 8 values, as the CPU record

run_step env 90 "$PY" $B/gpu_suite.py env "$LOG" --wheels "$WHEELS" ${ENV_ARGS[@]+"${ENV_ARGS[@]}"}

run_step tests 300 "$PY" -m pytest "${TESTS[@]}"

if wanted w1; then
  if [ ! -f $B/w1_pytorch.py ]; then
    skip w1 "benchmarks/w1_pytorch.py is not in this tree"
  elif ! have_data fashion_mnist pfllib_fmnist_dir01/split.json.gz; then
    skip w1 "no fashion_mnist/ and pfllib_fmnist_dir01/ under FEDJAX_PFL_DATA_DIR"
  else
    run_step w1 360 "$PY" $B/w1_pytorch.py "${W1[@]}" --impl fedjax torch \
      --out "$LOG/w1.jsonl"
  fi
fi

run_step throughput 300 "$PY" $B/throughput.py "${TP[@]}" --out "$LOG/throughput.jsonl"
run_step throughput_cnn 180 "$PY" $B/throughput.py "${TP_CNN[@]}" \
  --out "$LOG/throughput_cnn.jsonl"
run_step ditto_cost 180 "$PY" $B/ditto_cost.py "${LAMS[@]}" ${DC[@]+"${DC[@]}"} \
  --out "$LOG/ditto_cost.jsonl"
run_step privacy 120 "$PY" $B/privacy.py "${PRIV[@]}" --out "$LOG/privacy.jsonl"
run_step privacy_1000 150 "$PY" $B/privacy.py "${PRIV_1000[@]}" \
  --out "$LOG/privacy_1000.jsonl"

if wanted ditto_fmnist; then
  if ! have_data fashion_mnist; then
    skip ditto_fmnist "no fashion_mnist/ under FEDJAX_PFL_DATA_DIR"
  else
    run_step ditto_fmnist 300 "$PY" $B/ditto_fmnist.py "${FMNIST[@]}" \
      --out "$LOG/ditto_fmnist.jsonl"
  fi
fi

if wanted report; then
  DOCS=()
  if [ "${GPU_SUITE_WRITE_DOCS:-}" = 1 ] || { [ -z "${GPU_SUITE_WRITE_DOCS:-}" ] &&
      [ "$SMOKE" != 1 ] && grep -q '"backend": "gpu"' "$LOG/env.json" 2>/dev/null; }; then
    DOCS=(--docs "$REPO/docs/results")
  fi
  run_step report 60 "$PY" $B/gpu_suite.py report "$LOG" ${DOCS[@]+"${DOCS[@]}"}
fi

echo
echo "gpu_suite: $(( $(date +%s) - START ))s in all; output in $LOG"
for line in ${SUMMARY[@]+"${SUMMARY[@]}"}; do echo "  $line"; done
FAILED=0
for line in ${SUMMARY[@]+"${SUMMARY[@]}"}; do
  case $line in *" passed "*|*" skipped"*) ;; *) FAILED=$((FAILED + 1)) ;; esac
done
echo "gpu_suite: $FAILED step(s) failed or timed out"
[ "$FAILED" -eq 0 ]
