#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: build softmax_ext from source, run the
# main job and the whole test suite (CUDA tests included), optionally the
# CUDA tests under compute-sanitizer, and print a short summary last.
#
#   scripts/gpu_check.sh                 build + python -m softmax_ext + tests
#   SANITIZE=1 scripts/gpu_check.sh      + compute-sanitizer memcheck/racecheck (SANITIZE_TIMEOUT s each), beside the tests
#   BENCH=1 scripts/gpu_check.sh         + benchmarks (BENCH_ARGS: their options)
#   HOST=1 scripts/gpu_check.sh          + host cost per call beside torch (bench_host)
#   MODELS=1 scripts/gpu_check.sh        + HF model training steps (MODELS_ARGS; MODELS_TIMEOUT s)
#   SWEEP=1 scripts/gpu_check.sh         + scripts/model_sweep.py: 17 HF architectures run and compared (SWEEP_ARGS)
#   TESTS="tests/test_x.py" ...          which tests (default: all of tests/; TESTS=0: none)
#   DIST=1 scripts/gpu_check.sh          + benchmarks/bench_distributed.py over every GPU (NCCL)
#   KERNELS=1 scripts/gpu_check.sh       + the plan's kernel for every benchmark case ($OUT/kernels.txt)
#   MAIN=0 ...                           skip python -m softmax_ext
#   WHEELS=dir ...                       pip install dir/*.whl first (no network there: expecttest, which
#                                        tests/test_opinfo.py needs, peers for the benchmarks)
# Logs go to $OUT (default /tmp/softmax_ext_out).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/softmax_ext_out}
mkdir -p "$OUT"
# NVLink multicast stays off in every NCCL world started from here
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-16} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
summary=()

gpu=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)
echo "GPU: $gpu"

if [ -n "${WHEELS:-}" ]; then
  python3 -m pip install -q --no-deps "$WHEELS"/*.whl > "$OUT/wheels.log" 2>&1
  summary+=("wheels from $WHEELS: exit $?")
fi
# test_opinfo.py skips as a whole without expecttest (PyTorch's OpInfo database imports it)
if python3 -c "import expecttest" 2> /dev/null; then opinfo="OpInfo tests run"; else opinfo="OpInfo tests SKIPPED (no expecttest: WHEELS=dir)"; fi

t0=$(date +%s)
if python3 -m pip install --no-build-isolation --no-deps -e . > "$OUT/build.log" 2>&1; then
  summary+=("build: ok in $(( $(date +%s) - t0 )) s")
else
  tail -60 "$OUT/build.log"
  echo "build FAILED (log: $OUT/build.log)"
  exit 1
fi

# Registers and spills of every kernel: cuobjdump reports spilled registers
# as a stack frame (STACK), LOCAL stays 0 for them.
so=$(ls softmax_ext/_C*.so | head -1)
if command -v cuobjdump > /dev/null; then
  cuobjdump --dump-resource-usage "$so" > "$OUT/resources.log" 2>&1
  spilled=$(grep -cE "STACK:[1-9]|LOCAL:[1-9]" "$OUT/resources.log")
  summary+=("kernels: $(grep -c 'REG:' "$OUT/resources.log"), with a stack frame or local memory (spills): $spilled, max REG: $(grep -oE 'REG:[0-9]+' "$OUT/resources.log" | cut -d: -f2 | sort -n | tail -1)")
fi

if [ "${MAIN:-1}" = 1 ]; then
  python3 -m softmax_ext 2>&1 | tee "$OUT/main.log"
  summary+=("python -m softmax_ext: exit ${PIPESTATUS[0]}, $(tail -1 "$OUT/main.log")")
fi

if [ "${KERNELS:-0}" = 1 ]; then
  python3 scripts/kernel_names.py > "$OUT/kernels.txt" 2>&1
  summary+=("kernel names: exit $?, $(wc -l < "$OUT/kernels.txt") cases ($OUT/kernels.txt)")
fi

# The sanitizer runs (memcheck and racecheck) go on in the background
# beside the tests: they need the build only.
sanitizer_pids=()
if [ "${SANITIZE:-0}" = 1 ]; then
  for tool in memcheck racecheck; do
    (
      timeout "${SANITIZE_TIMEOUT:-0}" compute-sanitizer --tool "$tool" --error-exitcode 99 --print-limit 20 \
        python3 scripts/cuda_smoke.py > "$OUT/sanitize_$tool.log" 2>&1
      echo "exit $?" > "$OUT/sanitize_$tool.rc"
    ) &
    sanitizer_pids+=($!)
  done
fi

# (tests/conftest.py shares the CPUs among the eight workers)
if [ "${TESTS:-tests}" != 0 ]; then
  python3 -m pytest ${TESTS:-tests} -q -p no:cacheprovider -n 8 2>&1 | tee "$OUT/tests.log" | tail -40
  summary+=("tests: $(tail -1 "$OUT/tests.log"); $opinfo")
fi

if [ "${SANITIZE:-0}" = 1 ]; then
  wait "${sanitizer_pids[@]}"
  for tool in memcheck racecheck; do
    summary+=("compute-sanitizer $tool: $(cat "$OUT/sanitize_$tool.rc"), $(grep -E "(ERROR|RACECHECK) SUMMARY" "$OUT/sanitize_$tool.log" | tail -1)")
  done
fi

if [ "${BENCH:-0}" = 1 ] && [ -f benchmarks/bench_softmax.py ]; then
  python3 -m benchmarks.bench_softmax ${BENCH_ARGS:-} --out "$OUT/bench.csv" 2>&1 | tee "$OUT/bench.log" | tail -120
  summary+=("benchmark: exit ${PIPESTATUS[0]} (table in $OUT/bench.log)")
fi

if [ "${HOST:-0}" = 1 ]; then
  python3 -m benchmarks.bench_host 2>&1 | tee "$OUT/host.log"
  summary+=("host benchmark: exit ${PIPESTATUS[0]} ($OUT/host.log)")
fi

if [ "${DIST:-0}" = 1 ]; then
  python3 benchmarks/bench_distributed.py --device cuda ${DIST_ARGS:-} 2>&1 | tee "$OUT/distributed.log" | tail -40
  summary+=("distributed benchmark: exit ${PIPESTATUS[0]} ($OUT/distributed.log)")
fi

if [ "${SWEEP:-0}" = 1 ]; then
  timeout "${SWEEP_TIMEOUT:-600}" python3 scripts/model_sweep.py ${SWEEP_ARGS:-} --csv "$OUT/sweep.csv" \
    > "$OUT/sweep.log" 2>&1
  summary+=("model sweep: exit $? ($OUT/sweep.log, $OUT/sweep.csv), $(grep -E '^[0-9]+ runs' "$OUT/sweep.log")")
fi

if [ "${MODELS:-0}" = 1 ]; then
  timeout "${MODELS_TIMEOUT:-600}" python3 -m benchmarks.bench_models ${MODELS_ARGS:-} --csv "$OUT/models.csv" \
    > "$OUT/models.log" 2>&1
  summary+=("model benchmark: exit $? ($OUT/models.log, $OUT/models.csv)")
  grep -E "^  [a-z0-9]+ " "$OUT/models.log" | tail -60
fi

echo
echo "== summary ($gpu)"
printf '  %s\n' "${summary[@]}"
