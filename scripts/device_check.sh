#!/usr/bin/env bash
# The GPU checks and timings, as one call on a GPU machine whose python3 holds torch (nothing is installed). Writes
# at most 8 files under $OUT and prints each step's tail.
#   FEDLIB_DATA=<data root> OUT=<folder> bash scripts/device_check.sh [window seconds per table, default 90]
# Steps, each under its own time limit, so that one that hangs leaves the others their time:
#   1. tests/test_cuda.py: the GPU path against the CPU's (float64) and CUDA graphs against eager (bit for bit)
#   2. python -m benchmarks --e2e --device cuda --repeats 1: W1-W6 eager (one timing each, so that the check
#      stays short)
#   3. the same with FEDLIB_CUDA_GRAPHS=1 (only if step 1 passed)
#   4. python -m benchmarks --table: windows of AdaFL's MNIST Table 1 and FedMCSA's Table 2 (whole-table estimates),
#      with CUDA graphs where step 1 passed
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-build/device}
WINDOW=${1:-90}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
step() {
  local name=$1 limit=$2
  shift 2
  echo "== $name: $* ($(date -u +%T) UTC)"
  timeout -s INT -k 20 "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "== $name: rc $rc ($(date -u +%T) UTC)"
  grep -v "it/s\]\|s/it\]\|%|" "$OUT/$name.log" | tail -n 45
  return $rc
}
{
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv
  $py -c "import torch, sys; print(sys.version.split()[0], torch.__version__, torch.cuda.get_device_name())"
  nproc
  date -u
} 2>&1 | tee "$OUT/machine.log"
step tests 170 $py -m pytest -q -s -p no:cacheprovider tests/test_cuda.py -k "${TESTS:-not test_run_on_cuda_equals_cpu}"
graphs=$([ $? -eq 0 ] && echo 1 || echo 0)
[ -z "${SKIP_EAGER:-}" ] && step e2e 170 $py -m benchmarks.bench --e2e --device cuda --repeats 1
if [ "$graphs" = 1 ]; then
  step e2e_graphs 120 env FEDLIB_CUDA_GRAPHS=1 $py -m benchmarks.bench --e2e --device cuda --repeats 1 \
    --only W1,W2,W3,W4,W6
fi
for t in adafl_table1:6 fedmcsa_table2:12; do
  step "table_${t%%:*}" $((WINDOW + 60)) env FEDLIB_CUDA_GRAPHS=$graphs \
    $py -m benchmarks.bench --table "${t%%:*}" --seconds "$WINDOW" --jobs "${t##*:}" --log "/tmp/tbl"
  cp "/tmp/tbl.${t%%:*}.json" "$OUT/" 2>/dev/null
done
