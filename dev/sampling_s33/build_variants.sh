#!/usr/bin/env bash
# Builds the sampler's variants for one device call (here, after `scripts/gpu_check.sh --build`):
# each dev/sampling_s33/NNNN-NAME.patch applied to a copy of src/, bench/ and tests/, its
# sampling.cu compiled with build-gpu's flags and swapped into a copy of liblockstep_cuda.a,
# bench_logprob.cu and test_logprob_parity.cu compiled from the same copy, both linked into
# .v33NAME/ (stripped, xz); `main` = this tree unpatched, `phases` = it
# instrumented by phases.py (bench_logprob only); `.v33pass` = pass_costs.cu. All git-ignored; the
# device call: dev/sampling_s33/run_next.sh (it names its carry).
# Other sessions: PREFIX=.v34 bash dev/sampling_s33/build_variants.sh main PATH/NNNN-NAME.patch ...
# builds just those (main, patches, phases, pass) as .v34NAME.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
prefix=${PREFIX:-.v33}
b=$root/build-gpu
[ -f "$b/liblockstep_cuda.a" ] || { echo "build-gpu missing: bash scripts/gpu_check.sh --build first"; exit 1; }
flags=(-O3 -DNDEBUG "--generate-code=arch=compute_90a,code=[compute_90a,sm_90a]" -fmad=false
  --expt-relaxed-constexpr -Xcompiler=-ffp-contract=off -std=c++20)
link() {  # link OUT OBJECT LIB
  (cd "$b" && /usr/bin/c++ -O3 -DNDEBUG -Wl,--as-needed "$2" -o "$1" -L/usr/local/cuda/targets/x86_64-linux/lib \
    -Wl,-rpath,/usr/local/cuda/lib liblockstep_engine_cuda.a liblockstep_op_cases.a "$3" \
    liblockstep_gemm_plan.a liblockstep_baseline_cuda.a /usr/local/cuda/lib/libcudart.so \
    /usr/local/cuda/lib/libcublas.so /usr/local/cuda/lib/libcublasLt.so /usr/local/cuda/lib/libculibos.a \
    liblockstep.a liblockstep_cpu.a liblockstep_contract.a liblockstep_core.a \
    /usr/lib/x86_64-linux-gnu/libopenblas.so -lcudadevrt -lcudart_static -lrt -lpthread -ldl)
}
variant() {  # variant NAME [PATCH]: builds .v33NAME from src/ (+ PATCH, or phases.py for "phases")
  local name=$1 patch=${2:-} tmp
  tmp=$(mktemp -d)
  cp -r src bench tests "$tmp/"
  if [ "$name" = phases ]; then
    python3 dev/sampling_s33/phases.py "$tmp" >/dev/null
  elif [ -n "$patch" ]; then
    (cd "$tmp" && patch -s -p1 <"$root/$patch")
  fi
  (cd "$b" && /usr/local/cuda/bin/nvcc -I"$tmp/src" "${flags[@]}" --options-file \
    CMakeFiles/lockstep_cuda.dir/includes_CUDA.rsp -c "$tmp/src/cuda/sampling.cu" -o "$tmp/sampling.cu.o")
  cp "$b/liblockstep_cuda.a" "$tmp/" && (cd "$tmp" && ar r liblockstep_cuda.a sampling.cu.o)
  # The benchmark and the test from the same tree (a patch may change SampleBlockParams).
  (cd "$b" && /usr/local/cuda/bin/nvcc -I"$tmp/src" -I"$tmp/tests" "${flags[@]}" \
    "-DLOCKSTEP_SOURCE_DIR=\"$root\"" --options-file CMakeFiles/bench_logprob.dir/includes_CUDA.rsp \
    -c "$tmp/bench/cuda/bench_logprob.cu" -o "$tmp/bench_logprob.cu.o")
  [ "$name" = phases ] || (cd "$b" && /usr/local/cuda/bin/nvcc -I"$tmp/src" -I"$tmp/tests" "${flags[@]}" \
    "-DLOCKSTEP_SOURCE_DIR=\"$root\"" --options-file CMakeFiles/test_logprob_parity.dir/includes_CUDA.rsp \
    -c "$tmp/tests/cuda/test_logprob_parity.cu" -o "$tmp/test_logprob_parity.cu.o")
  rm -rf "$prefix$name" && mkdir -p "$prefix$name"
  link "$root/$prefix$name/bench_logprob" "$tmp/bench_logprob.cu.o" "$tmp/liblockstep_cuda.a"
  [ "$name" = phases ] || link "$root/$prefix$name/test_logprob_parity" "$tmp/test_logprob_parity.cu.o" \
    "$tmp/liblockstep_cuda.a"
  strip "$prefix$name"/* && xz -9 -T1 "$prefix$name"/*
  grep -qx "$prefix$name" .git/info/exclude 2>/dev/null || echo "$prefix$name" >>.git/info/exclude
  rm -rf "$tmp"
  echo "built $prefix$name ($(du -sh "$prefix$name" | cut -f1))"
}
build_pass() {
  mkdir -p "${prefix}pass" && /usr/local/cuda/bin/nvcc -std=c++20 -O3 -arch=sm_90a -Isrc -Iinclude \
    dev/sampling_s33/pass_costs.cu -o "${prefix}pass/pass_costs" && strip "${prefix}pass/pass_costs"
  grep -qx "${prefix}pass" .git/info/exclude || echo "${prefix}pass" >>.git/info/exclude
  echo "built ${prefix}pass"
}
if [ $# -gt 0 ]; then
  for a in "$@"; do
    case $a in
      main | phases) variant "$a" ;;
      pass) build_pass ;;
      *) n=${a##*/}; n=${n#*-}; n=${n%.patch}; variant "$n" "$a" ;;
    esac
  done
  exit 0
fi
variant main
for p in dev/sampling_s33/[0-9][0-9][0-9][0-9]-*.patch; do
  n=${p##*/}; n=${n#*-}; n=${n%.patch}
  variant "$n" "$p"
done
variant phases
build_pass
