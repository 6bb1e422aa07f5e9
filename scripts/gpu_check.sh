#!/usr/bin/env bash
# The whole GPU check in one unattended command for a machine with an NVIDIA GPU (< 8 minutes).
# Writes every result to one folder ($OUT when the device tool runs it, else gpu_results/):
#   env.txt            what the machine has (GPU, driver, nvcc, torch, cmake, mpirun)
#   ops.txt            every CUDA op against the CPU kernel (forward, backward, the += contract)
#   parity_fp32.json   the whole model's loss, logits and gradients CUDA vs CPU, and 20 AdamW steps
#   parity_bf16.json   the same with bf16 GEMM inputs (documented bounds)
#   parity_group.json  the fp32 parity of test-moe-group (group-limited routing)
#   train20.txt        20 steps of `moetrain train` on CPU and on GPU, losses side by side
#   ep2.txt            EP 2 as 2 ranks on one GPU against 1 rank
#   bench_*.json       bench moe-layer --device cuda --precision bf16 at T4096 H1024 for three expert
#                      shapes, each beside the same run's cuBLAS bf16 GEMM and the PyTorch layer
#   train600.txt       the default tiny model, 600 steps on the GPU: tokens/s and held-out loss
#   sanitizer_*.txt    compute-sanitizer memcheck, racecheck and synccheck over the kernel tests
#                      (where the image has compute-sanitizer; last, as they are the slowest)
#   summary.md         the figures above in one page
# The same kernel tests run on every CI build through the SIMT shim (scripts/test.sh
# --emulated-cuda): this script is where they meet the hardware.
# Binaries: from build-gpu/bundle.tar.xz when present (made by scripts/gpu_bundle.sh on a machine
# with the Debian packages), else built here with CUDA (needs OpenMPI, OpenBLAS, nlohmann-json,
# CLI11, GTest and Google Benchmark).
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${OUT:-$root/gpu_results}"
mkdir -p "$out"
work="$(mktemp -d)"
summary="$out/summary.md"
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }
step() { echo "== $*" >&2; }
t_start=$(date +%s)
# A python with torch (the GPU image's python3; /usr/bin/python3 on a Debian development machine).
PY=python3
for p in python3 /usr/bin/python3; do
  if "$p" -c 'import torch' 2>/dev/null; then PY="$p"; break; fi
done

step "environment"
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | head -3
  nvcc --version 2>&1 | tail -1
  cmake --version 2>&1 | head -1
  command -v mpirun || echo "mpirun: not found"
  "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())' 2>&1
  ldd --version 2>&1 | head -1
  nproc
} >"$out/env.txt" 2>&1
note "# moetrain GPU check ($(date -u +%F\ %T) UTC)"
note "- GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"

# cuBLAS (and NCCL) of the machine's PyTorch wheels, for a carried binary.
pylibs="$(python3 - <<'PY' 2>/dev/null
import os, sys, glob
dirs = set()
for p in sys.path:
    for lib in glob.glob(os.path.join(p, "nvidia", "**", "libcublas.so*"), recursive=True) + \
               glob.glob(os.path.join(p, "torch", "lib", "libcublas.so*")):
        dirs.add(os.path.dirname(lib))
print(":".join(sorted(dirs)))
PY
)"
bundle="$root/build-gpu/bundle.tar.xz"
if [ -n "${MOETRAIN_GPU_BIN:-}" ]; then
  # Binaries already built (e.g. the emulated-device build, to try this script without a GPU).
  bin="$MOETRAIN_GPU_BIN"
  corpus="$root/data/kjv.txt"
  note "- binaries: $bin (given by MOETRAIN_GPU_BIN)"
elif [ -f "$bundle" ]; then
  step "binaries from $bundle"
  mkdir -p "$work/bundle"
  tar -C "$work/bundle" -xJf "$bundle"
  bin="$work/bundle/bin"
  export LD_LIBRARY_PATH="$work/bundle/lib${pylibs:+:$pylibs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export OPAL_PREFIX="$work/bundle/usr"
  export PATH="$work/bundle/usr/bin:$PATH"
  corpus="$work/bundle/data/kjv.txt"
  note "- binaries: carried bundle (built with the CUDA backend on the development machine)"
else
  step "building with CUDA"
  build="$root/build-gpu"
  if ! { cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DMOETRAIN_CUDA=ON &&
         cmake --build "$build" -j"$(nproc)" --target moetrain moetrain_cuda_tests tool_device_parity; } \
       >"$out/build.log" 2>&1; then
    note "- build FAILED (see build.log); nothing else ran"
    exit 1
  fi
  bin="$build"
  export LD_LIBRARY_PATH="${pylibs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  corpus="$root/data/kjv.txt"
  note "- binaries: built here"
fi
export OPENBLAS_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ldd "$bin/moetrain" >"$out/ldd.txt" 2>&1

step "CUDA ops vs CPU"
timeout 120 "$bin/moetrain_cuda_tests" >"$out/ops.txt" 2>&1
rc=$?
note "- ops vs CPU: rc=$rc, $(grep -c PASS "$out/ops.txt") passed, $(grep -c FAIL "$out/ops.txt") failed (ops.txt)"

step "model parity"
for p in fp32 bf16; do
  timeout 120 "$bin/tool_device_parity" --preset test-moe --steps 20 --precision "$p" \
    --out "$out/parity_$p.json" >"$out/parity_$p.log" 2>&1
  rc=$?
  worst=$(python3 -c "import json;d=json.load(open('$out/parity_$p.json'));print(d['grad_worst_rel_err'], d['grad_worst_tensor'], d['steps_worst_rel_diff'])" 2>/dev/null)
  note "- model gradients CUDA vs CPU ($p): rc=$rc, worst gradient rel. error / tensor / worst step-loss rel. diff: ${worst:-n/a}"
done
# Group-limited routing (DeepSeek-V3 n_group / topk_group): the .cu router with its group mask.
timeout 120 "$bin/tool_device_parity" --preset test-moe-group --steps 20 --precision fp32 \
  --out "$out/parity_group.json" >"$out/parity_group.log" 2>&1
rc=$?
worst=$(python3 -c "import json;d=json.load(open('$out/parity_group.json'));print(d['grad_worst_rel_err'], d['grad_worst_tensor'], d['steps_worst_rel_diff'])" 2>/dev/null)
note "- model gradients CUDA vs CPU (test-moe-group fp32): rc=$rc, worst gradient rel. error / tensor / worst step-loss rel. diff: ${worst:-n/a}"
# DeepSeek-V3's architecture: multi-head latent attention (kernels/cuda/mla.cu), MTP, noaux routing.
timeout 120 "$bin/tool_device_parity" --preset test-v3 --steps 20 --precision fp32 \
  --out "$out/parity_v3.json" >"$out/parity_v3.log" 2>&1
rc=$?
worst=$(python3 -c "import json;d=json.load(open('$out/parity_v3.json'));print(d['grad_worst_rel_err'], d['grad_worst_tensor'], d['steps_worst_rel_diff'])" 2>/dev/null)
note "- model gradients CUDA vs CPU (test-v3 fp32, MLA + MTP): rc=$rc, worst gradient rel. error / tensor / worst step-loss rel. diff: ${worst:-n/a}"

step "20 training steps, CPU vs GPU"
for d in cpu cuda; do
  timeout 120 "$bin/moetrain" train --device "$d" --steps 20 --eval-every 0 --data "$corpus" \
    --out "$work/train20_$d" >"$out/train20_$d.log" 2>&1
  echo "rc=$? device=$d" >>"$out/train20.txt"
done
python3 - "$work" >>"$out/train20.txt" 2>&1 <<'PY'
import json, sys
w = sys.argv[1]
def losses(d):
    try:
        return [json.loads(l)["loss"] for l in open(f"{w}/train20_{d}/metrics.jsonl") if '"loss"' in l]
    except OSError:
        return []
c, g = losses("cpu"), losses("cuda")
for i, (a, b) in enumerate(zip(c, g)):
    print(f"step {i+1:3d}  cpu {a:.6f}  cuda {b:.6f}  rel {abs(a-b)/abs(a):.2e}")
if c and g:
    print("worst rel diff", max(abs(a - b) / abs(a) for a, b in zip(c, g)))
PY
note "- 20 steps CPU vs GPU: $(tail -1 "$out/train20.txt")"

step "EP 2 on one GPU vs 1 rank"
# Two ranks on the one GPU: device buffers staged through the host over MPI (NCCL refuses two
# ranks on one GPU). The same global batch on one rank, and EP 2 on the CPU, beside it.
ep_common=(train --steps 10 --batch 4 --seq-len 64 --eval-every 0 --data "$corpus")
timeout 150 mpirun --oversubscribe -np 2 "$bin/moetrain" "${ep_common[@]}" --device cuda --ep 2 \
  --out "$work/ep2_cuda" >"$out/ep2.txt" 2>&1
rc=$?
timeout 150 "$bin/moetrain" "${ep_common[@]}" --batch 8 --device cuda --out "$work/ep1_cuda" >>"$out/ep2.txt" 2>&1
timeout 150 mpirun --oversubscribe -np 2 "$bin/moetrain" "${ep_common[@]}" --device cpu --ep 2 \
  --out "$work/ep2_cpu" >>"$out/ep2.txt" 2>&1
python3 - "$work" >>"$out/ep2.txt" 2>&1 <<'PY'
import json, sys
w = sys.argv[1]
def losses(d):
    try:
        return [json.loads(l)["loss"] for l in open(f"{w}/{d}/metrics.jsonl") if '"loss"' in l]
    except OSError:
        return []
a, b, c = losses("ep2_cuda"), losses("ep1_cuda"), losses("ep2_cpu")
worst = lambda x, y: max((abs(p - q) / abs(p) for p, q in zip(x, y)), default=float("nan"))
print(f"EP2 cuda vs 1 rank cuda: worst rel diff {worst(a, b):.2e}; EP2 cuda vs EP2 cpu: {worst(a, c):.2e} ({len(a)} steps)")
PY
note "- EP2 (2 ranks on one GPU, MPI staged): rc=$rc $(tail -1 "$out/ep2.txt") (ep2.txt)"

step "bench moe-layer bf16 vs cuBLAS and PyTorch"
note ""
note "| shape | moetrain ms | % of cuBLAS bf16 | PyTorch ms | moetrain / PyTorch speed |"
note "|---|---|---|---|---|"
for shape in "64 6 704" "128 8 256" "8 2 3584"; do
  set -- $shape
  tag="E$1_k$2_F$3"
  timeout 120 "$bin/moetrain" bench moe-layer --device cuda --precision bf16 --tokens 4096 \
    --hidden 1024 --experts "$1" --topk "$2" --ffn "$3" --iters 10 --warmup 3 --json \
    >"$out/bench_$tag.json" 2>"$out/bench_$tag.log"
  timeout 120 "$PY" "$root/scripts/torch_moe_layer.py" --tokens 4096 --hidden 1024 --experts "$1" \
    --topk "$2" --ffn "$3" --device cuda --dtype bf16 >"$out/torch_$tag.json" 2>"$out/torch_$tag.log"
  python3 - "$out/bench_$tag.json" "$out/torch_$tag.json" "$tag" >>"$summary" 2>/dev/null <<'PY' || note "| $tag | failed (see bench_$tag.log, torch_$tag.log) | | | |"
import json, sys
m = json.load(open(sys.argv[1])); t = json.load(open(sys.argv[2]))
row = m["rows"][0]
print(f"| {sys.argv[3]} | {row['total_ms']:.2f} | {100*row['frac_of_blas_layer']:.1f}% (experts {100*row['frac_of_blas_expert']:.1f}%) "
      f"| {t['total_ms']:.2f} ({t['experts_path']}) | {t['total_ms']/row['total_ms']:.2f}x |")
PY
done
note ""

step "tiny model, ${GPU_CHECK_TRAIN_STEPS:-600} steps on the GPU"
timeout 300 "$bin/moetrain" train --device cuda --steps "${GPU_CHECK_TRAIN_STEPS:-600}" \
  --data "$corpus" --out "$work/train600" >"$out/train600.txt" 2>&1
rc=$?
note "- ${GPU_CHECK_TRAIN_STEPS:-600} steps on GPU: rc=$rc; $(grep -E 'tok/s|tokens/s' "$out/train600.txt" | tail -1)"
note "  $(grep -iE 'held-out|val' "$out/train600.txt" | tail -1)"
step "compute-sanitizer over the kernel tests"
sanitizer="$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)"
if [ -n "$sanitizer" ]; then
  for tool in memcheck racecheck synccheck; do
    timeout "${GPU_CHECK_SANITIZER_S:-120}" "$sanitizer" --tool "$tool" "$bin/moetrain_cuda_tests" \
      >"$out/sanitizer_$tool.txt" 2>&1
    rc=$?
    note "- compute-sanitizer $tool: rc=$rc; $(grep -m1 'ERROR SUMMARY' "$out/sanitizer_$tool.txt" || echo 'no summary (timed out?)')"
  done
else
  note "- compute-sanitizer: not in this image (skipped)"
fi
note "- wall: $(( $(date +%s) - t_start )) s"
rm -rf "$work"
