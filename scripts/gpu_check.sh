#!/usr/bin/env bash
# The GPU check, in ONE device call. Build here first (the GPU machine has no Debian -dev
# packages), then carry the build:
#   here:    bash scripts/gpu_check.sh --build          (configures + builds ./build-gpu, sm_90a)
#   device:  run(command="bash scripts/gpu_check.sh [parts]", carry=["build-gpu-pack"])
# (build-gpu itself is too big to carry: --build packs the stripped runnables and the CLI's
# OpenBLAS runtime into build-gpu-pack/gpu.txz, which the device side unpacks into build-gpu/.)
# Parts (default: tests bench): tests = every GPU test (build-gpu/test_*: each exits non-zero on
# any mismatch) and the MMA probe (quick mode); test_dist_nccl runs one rank per visible GPU, so
# on a 1-GPU machine only its 1-rank cases run (its summary line says the multi-rank ones did not:
# run it on nvidia-h200-x2 or larger for those); bench = the GEMM, small-M GEMM, attention and
# log-prob benchmarks, each beside its peer (cuBLAS, PyTorch SDPA, PyTorch log_softmax, the torch
# sampler for the sampling choice stage), and the NCCL transport's all-gather beside NCCL's
# all-reduce (bench_dist_nccl, over every visible GPU); bwdbench = the backward's benchmarks beside theirs
# (cuBLAS, SDPA, torch / Liger / cut-cross-entropy: carry .whl too); share = group-shared prompts
# in training (bench_train_shared, then `lockstep grpo --device cuda --share-prompts`); grpo = the
# GRPO loop at the Qwen3-0.6B shape beside --baseline (step time by phase); sanitize =
# compute-sanitizer memcheck and racecheck over every test in
# --quick mode; audit = scripts/gpu_audit.sh (the engine on the GPU); after bench / audit,
# scripts/perf_bars.py reports the open issues' performance bars. Logs go under $OUT (./out by
# hand): summary.txt and logs.tar.gz (re-packed after every step, so a run cut off at its time
# limit still returns what it did). GPU_CHECK_TESTS=NAME[,NAME...] limits the tests and
# sanitize parts to those test binaries (e.g. GPU_CHECK_TESTS=test_baseline_cuda; the MMA probe
# runs only if probe_mma is named), GPU_CHECK_BENCH=NAME[,NAME...] the bench part to those
# benchmarks (bench_gemm_cuda, bench_gemm_small_m, bench_attention, bench_elementwise,
# bench_logprob, bench_dist_nccl; bwdbench:
# bench_gemm_bwd, bench_attention_bwd, bench_logprob_bwd, bench_train; share: bench_train_shared,
# grpo_share_cuda).
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--build" ]; then
  set -e
  # NOTE: no -march=native: the binaries run on the GPU host's CPU.
  if ! cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DLOCKSTEP_CUDA=ON -DLOCKSTEP_TESTS=OFF \
    -DLOCKSTEP_BENCH=OFF -DLOCKSTEP_NATIVE=OFF >build-gpu.configure.log 2>&1; then
    grep -E -A4 'CMake Error' build-gpu.configure.log | head -20
    echo "[gpu_check] configure failed (build-gpu.configure.log); on a fresh machine the Debian"
    echo "[gpu_check] packages come first: bash scripts/setup.sh (installs them, then builds ./build)"
    exit 1
  fi
  if ! cmake --build build-gpu -j"$(nproc)" >build-gpu.log 2>&1; then
    grep -E -A3 'error' build-gpu.log | head -40
    echo "[gpu_check] build failed (build-gpu.log)"
    exit 1
  fi
  # The CLI links OpenBLAS (the CPU baseline backend); the GPU machine has none: carry it.
  mkdir -p build-gpu/rt
  ldd build-gpu/lockstep | awk '/openblas|gfortran|quadmath/ {print $3}' | xargs -r -I{} cp -L {} build-gpu/rt/
  stage=$(mktemp -d)
  cp build-gpu/test_* build-gpu/bench_* build-gpu/probe_* build-gpu/lockstep "$stage"/
  strip "$stage"/* 2>/dev/null || true
  cp -r build-gpu/rt "$stage"/
  # The commit the binaries were built from (the device's copy of .git may be older).
  echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!docs' 2>/dev/null || echo '+uncommitted')" \
    >"$stage/BUILT_FROM"
  mkdir -p build-gpu-pack
  tar -C "$stage" -cJf build-gpu-pack/gpu.txz .  # xz: half the size of gzip (the carry limit is 64 MiB with the tree)
  rm -rf "$stage"
  echo "[gpu_check] built: $(cd build-gpu && ls test_* bench_* probe_* lockstep 2>/dev/null | tr '\n' ' ')"
  echo "[gpu_check] packed build-gpu-pack/gpu.txz ($(du -h build-gpu-pack/gpu.txz | cut -f1)): carry build-gpu-pack"
  exit 0
fi

OUT=${OUT:-$PWD/out}
# A second gpu_check in the same device call keeps the first one's logs: logs.tar.gz -> logs.N.tar.gz
# (each run packs its own logs and removes the folder at its end).
if [ -f "$OUT/logs.tar.gz" ]; then
  n=1
  while [ -f "$OUT/logs.$n.tar.gz" ]; do n=$((n + 1)); done
  mv "$OUT/logs.tar.gz" "$OUT/logs.$n.tar.gz"
fi
mkdir -p "$OUT/logs"
log() { echo "[gpu_check] $*" | tee -a "$OUT/summary.txt"; }
log "date $(date -u +%FT%TZ)"
log "gpu $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null)"
# Unpack the carried build unless this (warm) machine already unpacked this very pack: a warm
# machine keeps build-gpu/ from the previous call, which may be an older build. (A build-gpu/
# with a CMakeCache.txt is a real build directory, the one --build made: never replaced.)
if [ -f build-gpu-pack/gpu.txz ] && [ ! -f build-gpu/CMakeCache.txt ]; then
  sum=$(md5sum build-gpu-pack/gpu.txz | cut -d' ' -f1)
  if [ "$(cat build-gpu/.pack_md5 2>/dev/null)" != "$sum" ]; then
    # (Python's tarfile reads xz where the machine's tar has no xz program.)
    rm -rf build-gpu && mkdir -p build-gpu &&
      { tar -C build-gpu -xf build-gpu-pack/gpu.txz 2>/dev/null ||
        python3 -c "import tarfile, sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" \
          build-gpu-pack/gpu.txz build-gpu; } &&
      echo "$sum" >build-gpu/.pack_md5
  fi
fi
[ -f build-gpu/BUILT_FROM ] && log "binaries built from $(cat build-gpu/BUILT_FROM)"
[ -x build-gpu/test_smoke ] || { log "no build-gpu/: run 'bash scripts/gpu_check.sh --build' here and carry build-gpu-pack"; exit 1; }

export LD_LIBRARY_PATH="$PWD/build-gpu/rt${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# The NCCL programs (build-gpu/*_nccl) load the GPU machine's libnccl.so.2 (it is too big to
# carry): the system's if the loader finds one, else the one of the nvidia-nccl pip package that
# PyTorch uses. NVLink multicast stays off (the transport sets it too; KINDS.md says why).
export NCCL_NVLS_ENABLE=0
if [ -x build-gpu/test_dist_nccl ]; then
  if ldd build-gpu/test_dist_nccl | grep -q 'libnccl.so.2 => not found'; then
    nccl_dir=$(python3 -c '
import glob, os
import nvidia
for p in nvidia.__path__:
    for f in sorted(glob.glob(os.path.join(p, "**", "libnccl.so.2"), recursive=True)):
        print(os.path.dirname(f))
        raise SystemExit
' 2>/dev/null)
    [ -n "$nccl_dir" ] && export LD_LIBRARY_PATH="$nccl_dir:$LD_LIBRARY_PATH"
  fi
  log "nccl $(ldd build-gpu/test_dist_nccl | awk '/libnccl/ {print $3}')"
fi
parts="${*:-tests bench}"
has() { [[ " $parts " == *" $1 "* ]]; }
pass=0
fail=0
pack() { (cd "$OUT" && tar czf logs.tar.gz logs); }
# The test binaries this call runs (all, or those GPU_CHECK_TESTS names).
selected() {
  local name
  name=$(basename "$1")
  [ -x "$1" ] && listed "$name" "${GPU_CHECK_TESTS:-}"
}
listed() {  # listed NAME LIST: LIST empty (everything) or naming NAME
  [ -z "$2" ] || [[ ",$2," == *",$1,"* ]]
}
[ -n "${GPU_CHECK_TESTS:-}" ] && log "tests limited to: $GPU_CHECK_TESTS"
[ -n "${GPU_CHECK_BENCH:-}" ] && log "benchmarks limited to: $GPU_CHECK_BENCH"
if has tests; then
for t in build-gpu/test_*; do
  selected "$t" || continue
  name=$(basename "$t")
  start=$(date +%s)
  if "$t" >"$OUT/logs/$name.log" 2>&1; then
    pass=$((pass + 1))
    log "PASS $name ($(($(date +%s) - start)) s): $(grep -E 'mismatch|passed' "$OUT/logs/$name.log" | tail -1)"
  else
    rc=$?
    fail=$((fail + 1))
    log "FAIL $name (exit $rc): $(tail -3 "$OUT/logs/$name.log" | tr '\n' ' ')"
  fi
  pack
done

# The MMA probe: mma.sync + wgmma vs the CPU model on fresh random data (new seed each run) and
# edge cases.
seed=$(date +%s)
if ! listed probe_mma "${GPU_CHECK_TESTS:-}"; then
  :
elif bash scripts/probe_mma.sh "$OUT/logs/probe" --seed "$seed" --quick >"$OUT/logs/probe_mma.out" 2>&1 &&
  ! grep -qE 'differ from the model|probe failed' "$OUT/logs/probe_mma.out"; then
  pass=$((pass + 1))
  log "PASS probe_mma (seed $seed): $(awk '$4 ~ /^[0-9]+$/ && $5 ~ /^[0-9]+$/ {o += $4; m += $5; i[$1] = 1}
    END {print o " outputs of " length(i) " instructions, " m " mismatches vs the CPU model"}' "$OUT/logs/probe_mma.out")"
else
  fail=$((fail + 1))
  log "FAIL probe_mma: $(tail -3 "$OUT/logs/probe_mma.out" | tr '\n' ' ')"
fi
fi

# Each lockstep benchmark beside its peer, measured in the same call (tables in logs/bench_*.md).
L="$OUT/logs"
bench() {  # bench NAME cmd...
  local name=$1
  shift
  listed "$name" "${GPU_CHECK_BENCH:-}" || return 0
  if "$@" >"$L/$name.md" 2>&1; then
    log "BENCH $name: logs/$name.md"
  else
    fail=$((fail + 1))
    log "FAIL bench $name (exit $?): $(tail -3 "$L/$name.md" | tr '\n' ' ')"
  fi
  pack
}

if has bench; then
  bench bench_gemm_cuda build-gpu/bench_gemm_cuda
  # --sweep: every compiled small-M tile on every shape too (sweep.csv; ~10 s): new tiles are
  # measured by the same call that checks their bits.
  bench bench_gemm_small_m build-gpu/bench_gemm_small_m --sweep --out "$L"
  bench bench_attention bash -c "PYTHONUNBUFFERED=1 python3 bench/cuda/attention_sdpa.py --out '$L/sdpa.csv' &&
    build-gpu/bench_attention --sdpa '$L/sdpa.csv'"
  bench bench_elementwise build-gpu/bench_elementwise
  [ -x build-gpu/bench_dist_nccl ] && bench bench_dist_nccl build-gpu/bench_dist_nccl
  bench bench_logprob bash -c "build-gpu/bench_logprob --json '$L/lp.json' &&
    PYTHONUNBUFFERED=1 python3 bench/cuda/logprob_torch.py --ours '$L/lp.json' &&
    PYTHONUNBUFFERED=1 python3 bench/cuda/sampling_torch.py --ours '$L/lp.json'"
fi

# The backward's benchmarks (issue 11), each beside its peers in the same call: the GEMM dX / dW
# vs cuBLAS, attention forward + backward vs SDPA (cuDNN, flash), the log-prob head forward +
# backward vs torch naive, Liger and cut-cross-entropy. The Python peers not in the GPU image
# travel as wheels: carry .whl (README "GPU"), installed here into /tmp/site.
if has bwdbench; then
  if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl >"$OUT/logs/pip.log" 2>&1 && export PYTHONPATH=/tmp/site
  fi
  bench bench_gemm_bwd build-gpu/bench_gemm_bwd
  bench bench_attention_bwd bash -c "PYTHONUNBUFFERED=1 python3 bench/cuda/attention_bwd_sdpa.py --out '$L/sdpa_bwd.csv' &&
    build-gpu/bench_attention_bwd --sdpa '$L/sdpa_bwd.csv'"
  # --self-check-only first: every dh plan of the kernel gives the same bits (exits non-zero if not).
  bench bench_logprob_bwd bash -c "build-gpu/bench_logprob_bwd --self-check-only &&
    build-gpu/bench_logprob_bwd --json '$L/lpb.json' &&
    PYTHONUNBUFFERED=1 python3 bench/cuda/logprob_bwd_peers.py --ours '$L/lpb.json'"
  bench bench_train bash -c "build-gpu/bench_train --json '$L/train.json' &&
    PYTHONUNBUFFERED=1 python3 bench/cuda/train_torch.py --ours '$L/train.json'"
fi

# Group-shared prompts in training (issue 12 item 9, docs/contract.md §B.11): one training step
# of a 2,048-token prompt with 8 completions of 256 tokens on the Qwen3-0.6B shape, shared vs
# unshared (time, memory, completion log-probs bitwise equal), then the GRPO loop in the shared form
# on the GPU (exits non-zero on any rollout-vs-trainer mismatch).
if has share; then
  bench bench_train_shared build-gpu/bench_train_shared
  bench grpo_share_cuda build-gpu/lockstep grpo --device cuda --share-prompts --steps 5
fi

# The GRPO loop on the GPU at the Qwen3-0.6B shape (issue 12 item 8): lockstep beside --baseline
# (cuBLAS + the baseline kernels for rollout and training forward), one after the other, each
# step's time split by phase (scripts/grpo_split.py over the two --metrics files).
if has grpo; then
  G06="grpo --device cuda --model-shape qwen3-0.6b --steps 20 --sft-steps 10 --sft-lr 1e-3 --lr 2e-5"
  bench grpo_06b build-gpu/lockstep $G06 --metrics "$L/grpo_06b.jsonl"
  bench grpo_06b_baseline build-gpu/lockstep $G06 --baseline --metrics "$L/grpo_06b_baseline.jsonl"
  bench grpo_06b_split python3 scripts/grpo_split.py "lockstep=$L/grpo_06b.jsonl" \
    "baseline=$L/grpo_06b_baseline.jsonl"
fi

if has sanitize; then
  # NOTE: racecheck reports shared-memory races inside cuBLAS's own split-K GEMM kernels (names
  # nvjet*: the baseline's peer, run by test_baseline_cuda; H200, 2026-11-30). Excluding them
  # (--kernel-name-exclude kns=nvjet) made compute-sanitizer 2025.3.1 fail ("failed to handle a
  # hardware exception"), so every kernel is checked, and a racecheck run with reports counts as
  # clean only when the test itself passed and every reported access lies in an nvjet* kernel
  # (the log line names them); any report in a lockstep kernel fails.
  for tool in memcheck racecheck; do
    for t in build-gpu/test_*; do
      selected "$t" || continue
      name=$(basename "$t")
      case "$name" in
        *_nccl)
          # NOTE: its only kernels are NCCL's (and the GEMM's, sanitized by test_gemm_parity); NCCL
          # under compute-sanitizer has not been tried here.
          log "SKIP $tool $name (NCCL's kernels and threads: not sanitized)"
          continue
          ;;
      esac
      tlog="$OUT/logs/$name.$tool.log"
      if compute-sanitizer --tool "$tool" --error-exitcode 99 "$t" --quick >"$tlog" 2>&1; then
        pass=$((pass + 1))
        log "PASS $tool $name: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$tlog" | tail -1)"
      elif [ "$tool" = racecheck ] && grep -qE '^[0-9]+ passed, 0 failed' "$tlog" &&
        ! grep -q 'Internal Sanitizer Error' "$tlog" && grep -q 'access at nvjet' "$tlog" &&
        [ "$(grep -oE 'access at [^ ]+' "$tlog" | grep -vc 'access at nvjet')" = 0 ]; then
        pass=$((pass + 1))
        cublas=$(grep -oE 'access at [^ ]+' "$tlog" | sed 's/access at //; s/+0x.*//' | sort -u | tr '\n' ' ')
        log "PASS $tool $name: 0 hazards in lockstep kernels; reports only inside cuBLAS: ${cublas}($(grep -E 'RACECHECK SUMMARY' "$tlog" | tail -1 | sed 's/=* *//'))"
      else
        fail=$((fail + 1))
        log "FAIL $tool $name: $(grep -E 'SUMMARY|Error|error' "$tlog" | head -3 | tr '\n' ' ')"
      fi
      pack
    done
  done
fi

if has audit; then
  if GPU_AUDIT_LOGS="$OUT/logs" bash scripts/gpu_audit.sh >"$OUT/logs/audit.txt" 2>&1; then
    pass=$((pass + 1))
    log "PASS audit: $(grep -E '^=== .*exit|PASS|FAIL' "$OUT/logs/audit.txt" | tr '\n' ';' | head -c 900)"
  else
    fail=$((fail + 1))
    log "FAIL audit (exit $?): $(grep -E '^=== .*exit|PASS|FAIL' "$OUT/logs/audit.txt" | tr '\n' ';' | head -c 900)"
  fi
  pack
fi

# The open issues' performance bars, read off this run's benchmark and audit logs (a report:
# speed never fails the check).
if has bench || has bwdbench || has audit; then
  python3 scripts/perf_bars.py "$OUT/logs" 2>&1 | sed 's/^/[gpu_check] bar: /' | tee -a "$OUT/summary.txt"
fi

pack && rm -rf "$OUT/logs"
log "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
