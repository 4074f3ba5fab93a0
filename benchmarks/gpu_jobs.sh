#!/usr/bin/env bash
# Long benchmark runs on a lent GPU machine: a list of commands, P at a time,
# under one deadline (docs/engine.md, "Running on a GPU").
#
#   bash benchmarks/gpu_jobs.sh JOBFILE [OUTDIR]
#
# JOBFILE holds one command per line, run from the repository root in the order
# given (blank lines and lines starting with # are skipped). In a command, {out}
# becomes OUTDIR/recs/<n>.jsonl (its --out) and {hist} the folder
# OUTDIR/hist/<n>/ (for benchmarks that write their evaluations as they come,
# e.g. ditto_fmnist --history-dir), <n> the job's line number in the file.
# A job that has not ended at the deadline is killed; its records are then only
# what it wrote before (a trajectory in {hist}). At the end OUTDIR/results.tar.gz
# holds recs/, hist/ and logs/ (one log per job) and OUTDIR/jobs.tsv the outcome
# of each job (line, status, seconds, command).
#
# OUTDIR defaults to $OUT (the device machine's output folder). Environment:
#   GPU_JOBS_PARALLEL=P       jobs at a time (default 4; they share the GPU, each
#                             taking memory as it needs it)
#   GPU_JOBS_DEADLINE=S       seconds from the start after which running jobs are
#                             killed (default 500)
#   GPU_JOBS_MIN_LEFT=S       no job starts with fewer seconds than this left
#                             (default 30)
#   GPU_JOBS_WHEELS=DIR       wheels installed first (pip --no-index --no-deps
#                             --target), for modules the machine lacks (default .whl)
#   GPU_JOBS_DETERMINISTIC=1  adds --xla_gpu_deterministic_ops=true to XLA_FLAGS
#                             (GPU runs of one seed are otherwise not repeatable;
#                             docs/engine.md's determinism table)
#   FEDJAX_PFL_GIT_SHA        the commit of the copied tree, written into the
#                             records (the copy's .git, if any, may be stale)
#   PYTHON                    interpreter (default: python3)
set -u

JOBS=${1:?usage: gpu_jobs.sh JOBFILE [OUTDIR]}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
[ -f "$JOBS" ] || { echo "gpu_jobs: JOBFILE $JOBS is not a file" >&2; exit 2; }
JOBS=$(cd "$(dirname "$JOBS")" && pwd)/$(basename "$JOBS")
DIR=${2:-${OUT:?gpu_jobs: give OUTDIR or set OUT}}
P=${GPU_JOBS_PARALLEL:-4}
DEADLINE=${GPU_JOBS_DEADLINE:-500}
MIN_LEFT=${GPU_JOBS_MIN_LEFT:-30}
case $P$DEADLINE$MIN_LEFT in *[!0-9]*|"")
  echo "gpu_jobs: GPU_JOBS_PARALLEL, GPU_JOBS_DEADLINE and GPU_JOBS_MIN_LEFT must be whole numbers" >&2; exit 2 ;;
esac
[ "$P" -ge 1 ] || { echo "gpu_jobs: GPU_JOBS_PARALLEL must be at least 1" >&2; exit 2; }
PY=${PYTHON:-python3}
WORK=$(mktemp -d)
mkdir -p "$WORK/recs" "$WORK/hist" "$WORK/logs" "$DIR" || exit 2
cd "$REPO" || exit 2
START=$(date +%s)

WHEELS=${GPU_JOBS_WHEELS:-$REPO/.whl}
if compgen -G "$WHEELS/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/gpu_jobs_site "$WHEELS"/*.whl || exit 2
  export PYTHONPATH=/tmp/gpu_jobs_site
fi
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # P processes share the GPU's memory
if [ "${GPU_JOBS_DETERMINISTIC:-0}" = 1 ]; then
  export XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }--xla_gpu_deterministic_ops=true"
  echo "gpu_jobs: XLA_FLAGS=$XLA_FLAGS"
fi
"$PY" -c "import jax, fedjax_pfl; print('gpu_jobs: jax', jax.__version__, jax.devices())" \
  || exit 2

declare -A PIDS=() T0=() CMD=()
STATUS=()
finish() {  # line rc
  local n=$1 rc=$2 secs=$(($(date +%s) - ${T0[$1]})) st
  case $rc in 0) st=done ;; 124|137) st=killed_at_deadline ;; *) st="failed_rc$rc" ;; esac
  STATUS+=("$(printf '%s\t%s\t%s\t%s' "$n" "$st" "$secs" "${CMD[$n]}")")
  echo "gpu_jobs: [$n] $st after ${secs}s"
  unset "PIDS[$n]"
}
reap() {  # wait for one job to end (bash >= 5.1)
  local pid="" rc n
  wait -n -p pid "${PIDS[@]}"; rc=$?
  for n in "${!PIDS[@]}"; do
    [ "${PIDS[$n]}" = "$pid" ] && finish "$n" "$rc"
  done
}

n=0
while IFS= read -r line || [ -n "$line" ]; do
  n=$((n + 1))
  case $line in ''|'#'*) continue ;; esac
  while [ "${#PIDS[@]}" -ge "$P" ]; do reap; done
  left=$((DEADLINE - ($(date +%s) - START)))
  if [ "$left" -lt "$MIN_LEFT" ]; then
    STATUS+=("$(printf '%s\tnot_started\t0\t%s' "$n" "$line")"); continue
  fi
  cmd=${line//\{out\}/$WORK/recs/$n.jsonl}
  cmd=${cmd//\{hist\}/$WORK/hist/$n}
  CMD[$n]=$line
  T0[$n]=$(date +%s)
  echo "gpu_jobs: [$n] start (${left}s left): $line"
  # stdin from /dev/null: the loop reads the job file from its own stdin
  timeout --kill-after=10 "$left" bash -c "$cmd" </dev/null >"$WORK/logs/$n.log" 2>&1 &
  PIDS[$n]=$!
done < "$JOBS"
while [ "${#PIDS[@]}" -gt 0 ]; do reap; done

printf '%s\n' "${STATUS[@]}" | sort -n > "$DIR/jobs.tsv"
cp "$DIR/jobs.tsv" "$WORK/logs/"
tar -czf "$DIR/results.tar.gz" -C "$WORK" recs hist logs
echo "gpu_jobs: $(($(date +%s) - START))s in all"
cat "$DIR/jobs.tsv"
