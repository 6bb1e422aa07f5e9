#!/usr/bin/env bash
# Planted bugs: do the CUDA kernel tests catch real kernel bugs? (issue 38, item 5)
#
#   scripts/planted_bugs.sh [--only N] [--keep] [--head]
#
# Copies the working tree as git sees it (tracked files as they are now, so uncommitted test
# changes count, plus untracked files that are not ignored) into a scratch folder, builds the
# emulated CUDA device there three times (Release, ASan + UBSan, ThreadSanitizer), then plants ten
# realistic kernel bugs ONE AT A TIME, each as one literal edit of one file of the copy, and runs six
# detectors against each:
#   seed 0 / seed 1 / seed 2   moetrain_cuda_tests --seed N   (every kernel vs its CPU twin, SIMT shim
#                                                              in index order / shuffled schedules)
#   asan                       the same tests built with ASan + UBSan, --seed 1
#   tsan                       the same tests, the .cu sources under ThreadSanitizer (each CUDA
#                              thread a TSan fiber: a race between threads of a block is reported)
#   parity                     tool_device_parity --preset test-moe --steps 20 --precision fp32
#                              (the whole model on the emulated GPU vs the CPU)
# A detector "catches" a bug when it exits non-zero, dies on a signal or times out (a hang is a
# finding too). Every detector must pass on the unmodified copy first, or nothing below means
# anything. Prints a table and writes docs/planted_bugs.md (a full run only; --only N writes the
# table to the scratch folder instead).
#
#   --only N   plant only bug N (1-10), for debugging one row
#   --keep     keep the scratch folder (a later run reuses its builds: incremental)
#   --head     copy the last commit instead of the working tree (when uncommitted work elsewhere
#              in the tree does not build)
#
# Cost on 2 cores: a fresh scratch configures and builds both trees (about 1.5 min when ccache
# holds a checkout's objects, much longer on a cold cache); then 5-15 s per bug (the edited file
# is rebuilt in both trees, every .cu for a bug in reduce.cuh, plus about 5 s of detectors).
#
# Scratch: ${TMPDIR:-/tmp}/moetrain-planted (the copy in src/, its builds in src/build-emu,
# src/build-emu-asan and src/build-emu-tsan: the same layout relative to the source as in a checkout, so ccache, keyed on
# paths relative to the source folder, reuses the checkout's objects). The repository's own
# sources are never modified; the only file written in it is docs/planted_bugs.md.
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
scratch="${TMPDIR:-/tmp}/moetrain-planted"
only=""
keep=0
from_head=0
while [ $# -gt 0 ]; do
  case "$1" in
    --only) only="${2:?--only needs a bug number}"; shift 2 ;;
    --keep) keep=1; shift ;;
    --head) from_head=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done
jobs="$(nproc)"
detector_timeout=300  # seconds per detector run; a clean run takes 0.3-3 s
started_s=$(date +%s)
command_line="scripts/planted_bugs.sh${only:+ --only $only}$([ "$keep" = 1 ] && echo " --keep" || true)$([ "$from_head" = 1 ] && echo " --head" || true)"

# ---------------------------------------------------------------------------------------------
# The bugs. Each: a title, the file (relative to the tree), the exact text to find (it must occur
# exactly once) and its replacement, and why it is a realistic mistake.
titles=(); files=(); olds=(); news=(); whys=()
bug() { titles+=("$1"); files+=("$2"); olds+=("$3"); news+=("$4"); whys+=("$5"); }

bug "deleted __syncthreads (attention forward, before staging the next K/V tile)" \
  src/kernels/cuda/attention.cu \
  $'    __syncthreads();  // the previous tile is consumed (and qw written)\n' \
  '' \
  "the write-after-read barrier of a tiled loop: a warp that finished tile i overwrites the shared K/V rows while other warps still read them (only shapes with more than one 32-row tile have a tile i+1)"

bug "off-by-one bound (rmsnorm dw reduce: j > dim)" \
  src/kernels/cuda/rmsnorm.cu \
  $'  if (j >= dim) return;\n  float acc = dw[j];' \
  $'  if (j > dim) return;\n  float acc = dw[j];' \
  "the kernel's own bound (not MOE_GRID_STRIDE): thread j == dim reads and writes dw[dim], one past the gradient"

bug "shuffle over the wrong width (warp_sum with width 16)" \
  src/kernels/cuda/reduce.cuh \
  'v += __shfl_xor_sync(kFullMask, v, o);' \
  'v += __shfl_xor_sync(kFullMask, v, o, 16);' \
  "a half-warp width pasted into the full-warp butterfly: the xor 16 step stays inside each half, so each half sums alone"

bug "wrong lda (bf16 GEMM: the caller's lda for the dense bf16 copy)" \
  src/kernels/cuda/gemm.cu \
  'a16, a_cols, b16, b_cols, CUDA_R_16BF' \
  'a16, lda, b16, b_cols, CUDA_R_16BF' \
  "the bf16 copy of A is dense (row stride a_cols) but the caller's padded stride is passed; lda >= a_cols, so cuBLAS accepts it and reads the wrong elements"

bug "transposed GEMM operand (ops not swapped with the operands)" \
  src/kernels/cuda/gemm.cu \
  $'cublasGemmEx(blas(), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,\n                                trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,' \
  $'cublasGemmEx(blas(), trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,\n                                trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,' \
  "row-major C = A·B is column-major C^T = B^T·A^T: the operands were swapped but their transpose flags were not (NN and TT products are unaffected)"

bug "missing atomic (count_kernel histogram: plain += from every thread)" \
  src/kernels/cuda/permute.cu \
  'atomicAdd(shared ? &hist[e] : &count[e], 1);' \
  '(shared ? hist[e] : count[e]) += 1;' \
  "256 threads increment the same shared-memory counters; on a GPU the read-modify-writes race and counts are lost. The fibers never pre-empt each other, so every += runs whole and the counts come out right: only the ThreadSanitizer build, where the threads of a block are TSan fibers synchronised by barriers alone, sees the race (on a GPU, compute-sanitizer racecheck in scripts/gpu_check.sh)"

bug "read of a stream's result before its sync (router_aux_stats)" \
  src/kernels/cuda/router_ops.cu \
  $'  MOE_CUDA_CHECK(cudaStreamSynchronize(stream()));\n' \
  '' \
  "the device-to-host cudaMemcpyAsync of the aux statistics is queued but the host returns (and reads) before the stream has run it"

bug "dynamic shared memory too small (count_kernel: E bytes, not E ints)" \
  src/kernels/cuda/permute.cu \
  '? sizeof(int) * E : 0;' \
  '? E : 0;' \
  "the launch's dynamic shared memory is sized in elements instead of bytes: the histogram runs past it"

bug "block size not a power of two (rmsnorm forward on row_threads(dim))" \
  src/kernels/cuda/rmsnorm.cu \
  'MOE_LAUNCH(rmsnorm_forward_kernel, row_blocks(n_rows), kThreads,' \
  'MOE_LAUNCH(rmsnorm_forward_kernel, row_blocks(n_rows), row_threads(dim),' \
  "\"launch only the threads a row needs\" with the permute kernels' helper: a warp multiple, but block_sum's tree needs a power of two (dim 96 -> 96 threads drops sh[2])"

bug "wrong CUB bit range (place_pairs SortPairs end_bit - 1)" \
  src/kernels/cuda/permute.cu \
  'vals_out, n, 0, end_bit, stream()));' \
  'vals_out, n, 0, end_bit - 1, stream()));' \
  "the radix sort sees one key bit too few, so experts whose ids differ only in the top bit are interleaved"

n_bugs=${#titles[@]}
if [ -n "$only" ] && ! [[ "$only" =~ ^[0-9]+$ && "$only" -ge 1 && "$only" -le "$n_bugs" ]]; then
  echo "--only: expected a bug number in 1..$n_bugs, got '$only'" >&2
  exit 2
fi

detectors=(seed0 seed1 seed2 asan tsan parity)
detector_names=("seed 0" "seed 1" "seed 2" "ASan" "TSan" "parity")

# ---------------------------------------------------------------------------------------------
# Scratch folder: ours only. A marker file says we made it; anything else at that path is left
# alone (we refuse to run rather than delete or overwrite someone's folder).
marker="$scratch/.moetrain-planted-bugs"
case "$(realpath -m "$scratch")/" in
  "$(realpath "$repo")"/*|/) echo "scratch folder $scratch must lie outside the repository" >&2; exit 2 ;;
esac
if [ -e "$scratch" ] && [ ! -e "$marker" ]; then
  echo "$scratch exists and was not made by this script; set TMPDIR elsewhere or remove it" >&2
  exit 2
fi
mkdir -p "$scratch" && touch "$marker"
src="$scratch/src"
emu="$src/build-emu"
asan="$src/build-emu-asan"
tsan="$src/build-emu-tsan"
logs="$scratch/logs"
orig="$scratch/orig"  # the unplanted copy of the file being edited
mkdir -p "$src" "$logs" "$orig"

planted=""  # the file that holds a planted bug right now (restored on any exit)
restore() {
  if [ -n "$planted" ]; then
    # A plain copy (new mtime): make must rebuild the object the bug went into.
    cp "$orig/current" "$src/$planted"
    planted=""
  fi
}
cleanup() {
  local rc=$?
  restore || true
  if [ "$keep" = 1 ]; then
    echo "scratch kept: $scratch" >&2
  elif [ -e "$marker" ]; then
    rm -rf -- "$scratch"
  fi
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log() { printf '[%4ds] %s\n' $(( $(date +%s) - started_s )) "$*" >&2; }

# ---------------------------------------------------------------------------------------------
# The copy: the working tree as git sees it (tracked files plus untracked ones that are not
# ignored: a new header not yet added is part of what builds; no build folders, no data), or with
# --head the last commit. It is staged first and synced into src/: only files whose bytes differ
# are copied (with a fresh mtime, so make rebuilds exactly what they feed) and files the tree no
# longer has are removed (the CMake globs would still compile them), so a kept scratch stays
# incremental and never keeps a stale object.
# What was copied is recorded now, for the report (others may commit while this runs).
stage="$scratch/stage"
rm -rf -- "$stage" && mkdir -p "$stage"
head="$(git -C "$repo" rev-parse --short HEAD)"
if [ "$from_head" = 1 ]; then
  tree="commit $head"
  log "copying the last commit ($head) of $repo to $src"
  git -C "$repo" archive "$head" | tar -C "$stage" -xf -
else
  tree="commit $head"
  if [ -n "$(git -C "$repo" status --porcelain)" ]; then
    tree+=" plus the working tree's uncommitted changes"
  fi
  log "copying the working tree of $repo to $src"
  git -C "$repo" ls-files -z --cached --others --exclude-standard |
    tar -C "$repo" --null -T - --ignore-failed-read -cf - 2>/dev/null | tar -C "$stage" -xf -
fi
python3 - "$stage" "$src" <<'PY'
import filecmp, os, shutil, sys
stage, src = sys.argv[1:]
def files(root, skip=()):
    out = set()
    for d, dirs, names in os.walk(root):
        if d == root:
            dirs[:] = [x for x in dirs if x not in skip]
        out.update(os.path.relpath(os.path.join(d, n), root) for n in names)
    return out
want = files(stage)
have = files(src, skip={"build-emu", "build-emu-asan", "build-emu-tsan"})
for f in sorted(have - want):
    os.remove(os.path.join(src, f))
for f in sorted(want):
    a, b = os.path.join(stage, f), os.path.join(src, f)
    if f not in have or not filecmp.cmp(a, b, shallow=False):
        os.makedirs(os.path.dirname(b), exist_ok=True)
        shutil.copy(a, b)  # content and mode; the mtime is now
PY
rm -rf -- "$stage"

# The two builds, configured once (as scripts/test.sh --emulated-cuda does).
build() {  # build DIR TARGET... ; the log stays in $logs, the tail is shown on failure
  local dir="$1"; shift
  if ! cmake --build "$dir" -j"$jobs" --target "$@" >"$logs/build-$(basename "$dir").log" 2>&1; then
    grep -E -B2 -A6 "error" "$logs/build-$(basename "$dir").log" | head -60 >&2
    echo "build failed in $dir (log: $logs/build-$(basename "$dir").log)" >&2
    return 1
  fi
}
if [ ! -f "$emu/CMakeCache.txt" ]; then
  log "configuring the emulated Release build"
  cmake -S "$src" -B "$emu" -DMOETRAIN_CUDA=OFF -DMOETRAIN_EMULATE_CUDA=ON \
    -DCMAKE_BUILD_TYPE=Release >"$logs/configure-emu.log" 2>&1 ||
    { tail -30 "$logs/configure-emu.log" >&2; exit 1; }
fi
if [ ! -f "$asan/CMakeCache.txt" ]; then
  log "configuring the ASan + UBSan build"
  cmake -S "$src" -B "$asan" -DMOETRAIN_CUDA=OFF -DMOETRAIN_EMULATE_CUDA=ON \
    -DMOETRAIN_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" \
    "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" >"$logs/configure-asan.log" 2>&1 ||
    { tail -30 "$logs/configure-asan.log" >&2; exit 1; }
fi
if [ ! -f "$tsan/CMakeCache.txt" ]; then
  log "configuring the ThreadSanitizer build"
  cmake -S "$src" -B "$tsan" -DMOETRAIN_CUDA=OFF -DMOETRAIN_EMULATE_CUDA=ON \
    -DMOETRAIN_SIMT_TSAN=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" \
    "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" >"$logs/configure-tsan.log" 2>&1 ||
    { tail -30 "$logs/configure-tsan.log" >&2; exit 1; }
fi
build_all() {
  build "$emu" moetrain_cuda_tests tool_device_parity
  build "$asan" moetrain_cuda_tests
  build "$tsan" moetrain_cuda_tests
}
log "building (ccache reuses the checkout's objects where the flags match)"
build_all

# ---------------------------------------------------------------------------------------------
# Detectors. Each runs under `timeout`; its exit status and output are kept for the reason line.
# stdbuf -oL: the Release tests print one line per case, so a run killed by a signal still shows
# how far it got (not used under ASan, whose runtime must come first in the library list).
run_detector() {  # run_detector NAME LOGFILE ; prints the exit status
  local name="$1" out="$2" rc=0
  case "$name" in
    seed0|seed1|seed2)
      timeout -k 10 "$detector_timeout" stdbuf -oL "$emu/moetrain_cuda_tests" --seed "${name#seed}" \
        >"$out" 2>&1 || rc=$? ;;
    asan)
      timeout -k 10 "$detector_timeout" "$asan/moetrain_cuda_tests" --seed 1 >"$out" 2>&1 || rc=$? ;;
    tsan)
      OPENBLAS_NUM_THREADS=1 TSAN_OPTIONS=halt_on_error=1 timeout -k 10 "$detector_timeout" \
        "$tsan/moetrain_cuda_tests" --seed 1 >"$out" 2>&1 || rc=$? ;;
    parity)
      timeout -k 10 "$detector_timeout" "$emu/tool_device_parity" --preset test-moe --steps 20 \
        --precision fp32 >"$out" 2>&1 || rc=$? ;;
  esac
  echo "$rc"
}

# One line saying why a detector failed, from its output: a timeout; the kernel tests' FAIL lines
# (how many, and the first); a sanitizer report (its kind and the first frame in our source; not
# the two faults simt_refusals.cpp provokes on purpose in child processes); the parity tool's
# verdict or exception; a signal (for a Release test run killed mid-case, which prints nothing
# for that case, the case is named from the clean run's log: the one after the last line printed).
reason() {  # reason LOGFILE RC CLEAN_LOGFILE
  python3 - "$1" "$2" "$3" "$detector_timeout" <<'PY'
import json, re, signal, sys
path, rc, clean, limit = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
text = open(path, errors="replace").read()
lines = [l.rstrip() for l in text.splitlines() if l.strip()]
def squeeze(s, n=300):
    s = re.sub(r"0x[0-9a-f]{8,}", "0x…", s)  # addresses differ run to run
    s = re.sub(r"\s+", " ", s).strip()
    return s if len(s) <= n else s[: n - 3] + "..."
def case_key(l):  # "op  shape" of a kernel-test line ("%-40s %-36s ...")
    return re.sub(r"\s+", " ", l[:77]).strip()
is_case = lambda l: re.search(r"\s(PASS|FAIL)\b", l) is not None
if rc in (124, 137):
    print(f"timed out after {limit} s (a hang)")
    sys.exit()
parts = []
fails = [l for l in lines if re.search(r"\bFAIL\b", l)]
if fails:
    # "op  shape  nmse  bound  FAIL notes" -> "op shape: FAIL (nmse X, bound Y) notes"
    m = re.match(r"(.*?)\s+(\S+)\s+(\S+)\s+FAIL\s*(.*)", fails[0])
    first = f"{m[1]}: FAIL (nmse {m[2]}, bound {m[3]}) {m[4]}" if m else fails[0]
    parts.append((f"{len(fails)} FAIL lines, first " if len(fails) > 1 else "") + first)
# Sanitizer reports, one block per report (ERROR ... SUMMARY), skipping the provoked ones.
blocks, cur = [], None
for l in lines:
    if re.search(r"ERROR: (Address|UndefinedBehavior|Thread)Sanitizer|runtime error:|WARNING: ThreadSanitizer", l):
        cur = [l]
        blocks.append(cur)
    elif cur is not None:
        cur.append(l)
        if l.startswith("SUMMARY:"):
            cur = None
blocks = [b for b in blocks if not any("simt_refusals" in l for l in b)]
if blocks and not fails:
    b = blocks[0]
    kind = re.sub(r"^.*?(ERROR: |runtime error: |WARNING: )", "", b[0])
    kind = re.sub(r" on (unknown )?address.*| \(pc .*| \(pid=\d+\)", "", kind)
    access = next((re.sub(r" at 0x.*", "", l) for l in b[1:3] if re.match(r"(READ|WRITE) of size", l)), "")
    frame = next((re.sub(r"^\s*#\d+ \S+ in ", "", l) for l in b
                  if re.match(r"\s*#\d+ ", l) and " ../" in l and "libsanitizer" not in l), "")
    parts.append(" ".join(x for x in (kind + (";" if access else ""), access, ("in " + frame) if frame else "") if x))
if "{" in text:
    try:
        j = json.loads(text[text.index("{"): text.rindex("}") + 1])
        g = lambda k: "NaN" if j.get(k) is None else f"{j[k]:.6g}"  # NaN is dumped as null
        if j.get("pass") is False:
            parts.append(f"pass=false: loss cpu {g('loss_cpu')} vs cuda {g('loss_cuda')}; worst grad rel err "
                         f"{g('grad_worst_rel_err')} ({j.get('grad_worst_tensor')}), bound {j.get('grad_bound')}; "
                         f"worst step loss diff {g('steps_worst_rel_diff')}")
    except (ValueError, KeyError, TypeError):
        pass
if not parts:
    err = [l for l in lines if re.search(r"what\(\)|tool_device_parity:", l)]
    if err:
        parts.append(err[0])
if rc > 128:
    try:
        sig = signal.Signals(rc - 128).name
    except ValueError:
        sig = f"signal {rc - 128}"
    last = lines[-1] if lines else ""
    if last and is_case(last):
        try:
            ref = [l for l in open(clean, errors="replace").read().splitlines() if is_case(l)]
            keys = [case_key(l) for l in ref]
            nxt = keys[keys.index(case_key(last)) + 1]
            parts.append(f"killed by {sig} in case '{nxt}'")
        except (OSError, ValueError, IndexError):
            parts.append(f"killed by {sig} after case '{case_key(last)}'")
    elif last and not last.lstrip().startswith(("}", "\"")):
        parts.append(f"killed by {sig}: {last}")
    else:
        parts.append(f"killed by {sig}")
if not parts:
    parts.append(f"exit {rc}" + (f": {lines[-1]}" if lines else ""))
print(squeeze("; ".join(p.strip().rstrip(";") for p in parts)))
PY
}

# Runs all detectors; fills result_rc[] and result_why[] (index = detector).
result_rc=(); result_why=()
run_all() {  # run_all TAG
  local tag="$1" i rc
  result_rc=(); result_why=()
  for i in "${!detectors[@]}"; do
    local out="$logs/$tag-${detectors[$i]}.log"
    rc=$(run_detector "${detectors[$i]}" "$out")
    result_rc+=("$rc")
    if [ "$rc" = 0 ]; then
      result_why+=("")
    else
      result_why+=("$(reason "$out" "$rc" "$logs/clean-${detectors[$i]}.log")")
    fi
  done
}

log "clean copy: every detector must pass"
run_all clean
for i in "${!detectors[@]}"; do
  if [ "${result_rc[$i]}" != 0 ]; then
    echo "detector '${detector_names[$i]}' fails on the UNMODIFIED copy (exit ${result_rc[$i]}):" >&2
    echo "  ${result_why[$i]}  (log: $logs/clean-${detectors[$i]}.log)" >&2
    keep=1  # keep the logs
    exit 1
  fi
done
log "clean copy: all ${#detectors[@]} detectors pass"

# ---------------------------------------------------------------------------------------------
# Planting: one literal replacement, which must match exactly once; prints the line of the first
# changed line (1-based, in the unmodified file).
plant() {  # plant FILE OLD NEW
  OLD="$2" NEW="$3" python3 - "$1" <<'PY'
import os, sys
path = sys.argv[1]
old, new = os.environ["OLD"], os.environ["NEW"]
text = open(path).read()
count = text.count(old)
if count != 1:
    sys.exit(f"planted_bugs: the pattern occurs {count} times in {path} (expected exactly once):\n{old}")
at = text.index(old)
common = 0
while common < min(len(old), len(new)) and old[common] == new[common]:
    common += 1
open(path, "w").write(text[:at] + new + text[at + len(old):])
print(text.count("\n", 0, at + common) + 1)
PY
}

# Markdown: a pipe inside a table cell is escaped.
md_cell() { local s="${1//|/\\|}"; printf '%s' "$s"; }

rows_md=""      # the summary table
details_md=""   # one section per bug
caught_total=0
ran_total=0
summary_lines=()

for b in $(seq 1 "$n_bugs"); do
  [ -n "$only" ] && [ "$b" != "$only" ] && continue
  k=$((b - 1))
  file="${files[$k]}"
  bug_start=$(date +%s)
  log "bug $b: ${titles[$k]}"
  cp "$src/$file" "$orig/current"
  planted="$file"
  line=$(plant "$src/$file" "${olds[$k]}" "${news[$k]}")
  build_all
  run_all "bug$b"
  restore
  ran_total=$((ran_total + 1))

  marks=(); caught_by=(); first_why=""
  for i in "${!detectors[@]}"; do
    rc="${result_rc[$i]}"
    if [ "$rc" = 0 ]; then
      marks+=("–")
    elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
      marks+=("timeout"); caught_by+=("${detector_names[$i]}")
    else
      marks+=("caught"); caught_by+=("${detector_names[$i]}")
    fi
    [ -z "$first_why" ] && [ "$rc" != 0 ] && first_why="${detector_names[$i]}: ${result_why[$i]}"
  done
  if [ ${#caught_by[@]} -gt 0 ]; then
    caught_total=$((caught_total + 1)); verdict="caught"
  else
    verdict="NOT caught"
  fi
  secs=$(( $(date +%s) - bug_start ))
  log "bug $b: $verdict (${caught_by[*]:-no detector}) in ${secs}s"
  summary_lines+=("$(printf '%2d  %-10s %-8s %-8s %-8s %-8s %-8s %-8s %s' "$b" "$verdict" "${marks[@]}" "${titles[$k]}")")

  rows_md+="| $b | $(md_cell "${titles[$k]}") | \`$file:$line\` | ${marks[0]} | ${marks[1]} | ${marks[2]} | ${marks[3]} | ${marks[4]} | ${marks[5]} | **$verdict** | $(md_cell "${first_why:-no detector failed}") |"$'\n'
  details_md+=$'\n'"### $b. ${titles[$k]}"$'\n\n'
  details_md+="\`$file:$line\` — ${whys[$k]}."$'\n\n'
  details_md+='```diff'$'\n'
  while IFS= read -r l; do details_md+="- $l"$'\n'; done <<<"${olds[$k]%$'\n'}"
  if [ -n "${news[$k]}" ]; then
    while IFS= read -r l; do details_md+="+ $l"$'\n'; done <<<"${news[$k]%$'\n'}"
  fi
  details_md+='```'$'\n\n'
  for i in "${!detectors[@]}"; do
    if [ "${result_rc[$i]}" = 0 ]; then
      details_md+="- ${detector_names[$i]}: passed (not caught)"$'\n'
    else
      details_md+="- ${detector_names[$i]}: exit ${result_rc[$i]} — $(md_cell "${result_why[$i]}")"$'\n'
    fi
  done
  details_md+="- time: ${secs} s (rebuild + six detectors)"$'\n'
done

# A kept scratch gets the unmodified sources rebuilt, so its binaries match its sources.
if [ "$keep" = 1 ]; then build_all; fi

wall=$(( $(date +%s) - started_s ))
cpu="$(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //')"

echo
echo " #  verdict    seed 0   seed 1   seed 2   ASan     TSan     parity   bug"
printf '%s\n' "${summary_lines[@]}"
echo
echo "$caught_total of $ran_total caught; wall time ${wall} s; CPU: $cpu"

out_md="$repo/docs/planted_bugs.md"
[ -n "$only" ] && out_md="$scratch/planted_bugs.md" && keep=1
{
  echo "# Planted kernel bugs: which test catches each"
  echo
  echo "Generated by \`scripts/planted_bugs.sh\` — do not edit by hand."
  echo
  echo "- **$caught_total of $ran_total caught**"
  echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC'); tree: $tree"
  echo "- command: \`$command_line\` (wall time ${wall} s, $jobs cores)"
  echo "- CPU: $cpu (no GPU: the kernels run on the SIMT shim, src/kernels/simt/)"
  echo
  echo "Each bug is one literal edit of one file in a scratch copy of the tree; the script rebuilds,"
  echo "runs the six detectors (each under \`timeout $detector_timeout\`), and restores the file. All"
  echo "six pass on the unmodified copy first. Detectors:"
  echo
  echo "- **seed 0 / 1 / 2**: \`moetrain_cuda_tests --seed N\` (Release): every CUDA kernel against its"
  echo "  CPU twin; seed 0 runs fibers and blocks in index order, 1 and 2 shuffle them."
  echo "- **ASan**: the same tests built with \`-DMOETRAIN_SANITIZE=ON\` (ASan + UBSan, -O1), \`--seed 1\`."
  echo "- **TSan**: the same tests with the \`.cu\` sources under ThreadSanitizer"
  echo "  (\`-DMOETRAIN_SIMT_TSAN=ON\`): each CUDA thread a TSan fiber, barriers and warp operations"
  echo "  the only synchronisation within a block, so a plain \`+=\` racing between threads is reported."
  echo "- **parity**: \`tool_device_parity --preset test-moe --steps 20 --precision fp32\`: the whole"
  echo "  model (forward, backward, 20 AdamW steps) on the emulated GPU against the CPU."
  echo
  echo "\"caught\" = non-zero exit or killed by a signal; \"timeout\" = still running after"
  echo "$detector_timeout s (a hang, also a finding); \"–\" = passed, i.e. the bug went unnoticed."
  echo
  echo "| # | bug | where | seed 0 | seed 1 | seed 2 | ASan | TSan | parity | verdict | first reason |"
  echo "|---|-----|-------|--------|--------|--------|------|------|--------|---------|--------------|"
  printf '%s' "$rows_md"
  echo
  echo "## The edits and every detector's reason"
  printf '%s' "$details_md"
} >"$out_md"
echo "wrote $out_md"
