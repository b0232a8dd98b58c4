#!/usr/bin/env bash
# Everything that needs a GPU, in one go (irc installed, CUDA visible):
#   benchmarks/run_on_gpu.sh OUT_DIR
# 1. the compiling tests with real Triton (IRC_TEST_DEVICE=cuda), GPU-only checks included;
# 2. a batch of random graphs, fused and unfused, against the reference on the GPU;
# 3. the benchmark table (fresh caches: cold compiles are cold), then autotuned;
# 4. attention against torch.compile and SDPA (benchmarks/attention.py);
# 5. compile time at 1,000 and 10,000 ops.
set -o pipefail
out=${1:-.}
mkdir -p "$out"
here=$(cd "$(dirname "$0")/.." && pwd)
out=$(cd "$out" && pwd)
export PYTHONUNBUFFERED=1
# Run from outside the checkout, so that `irc` is the installed package.
cd /tmp || exit 1
IRC_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider -c "$here/pyproject.toml" --rootdir "$here" \
  "$here"/tests/test_lowering_ops.py "$here"/tests/test_gpu.py "$here"/tests/test_lowering_regressions.py \
  "$here"/tests/test_online_softmax.py "$here"/tests/test_tf32.py "$here"/tests/test_run_check.py \
  "$here"/tests/test_persistent_gemm.py "$here"/tests/test_split_reduction.py "$here"/tests/test_api.py \
  "$here"/tests/test_half_rounding.py "$here"/tests/test_target.py "$here"/tests/test_runtime.py \
  "$here"/tests/test_attention.py "$here"/tests/test_pytorch_formulas.py "$here"/tests/test_one_pass_variance.py \
  "$here"/tests/test_layout_tiling.py "$here"/tests/test_layout_fusion.py "$here"/tests/test_activation_forms.py \
  "$here"/tests/test_split_k.py "$here"/tests/test_f32_tiling.py "$here"/tests/test_pad_gemm_operands.py \
  "$here"/tests/test_k_major_gemm_operands.py "$here"/tests/test_split_tf32_gemm_operands.py \
  2>&1 | tail -15 | tee "$out/pytest_gpu.log"
python3 -m irc.testing.graphgen --count 2000 --seed 100000 --device cuda --max-seconds 90 2>&1 | tail -5 | tee "$out/graphgen_gpu.log"
python3 "$here"/benchmarks/bench.py --fresh-caches --markdown "$out/bench.md" --json "$out/bench.json" 2>&1 \
  | tee "$out/bench.log"
python3 "$here"/benchmarks/bench.py --autotune --markdown "$out/bench_autotune.md" --json "$out/bench_autotune.json" 2>&1 \
  | tr '\r' '\n' | grep -v '^autotune \[' | tee "$out/bench_autotune.log"
python3 "$here"/benchmarks/attention.py --markdown "$out/attention.md" --json "$out/attention.json" 2>&1 \
  | tee "$out/attention.log"
python3 "$here"/benchmarks/compile_speed.py 2>&1 | tee "$out/compile_speed.log"
python3 "$here"/benchmarks/layouts.py --markdown "$out/layouts.md" --json "$out/layouts.json" 2>&1 | tee "$out/layouts.log"
