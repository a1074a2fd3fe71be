# Shared steps of the one-call A/B scripts (dev/ab_attention.sh, dev/ab_engine.sh); sourced, from
# the repository root, after OUT is set.

# Unpacks the carried build (gpu_check.sh's first lines: build-gpu/ and its runtime libraries,
# e.g. the CLI's OpenBLAS) and puts the libraries on the loader's path.
ab_setup_runtime() {
  [ -f build-gpu-pack/gpu.txz ] && bash scripts/gpu_check.sh none >/dev/null 2>&1
  export LD_LIBRARY_PATH="$PWD/build-gpu/rt${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}

# Decompresses every NAME.xz of the variant folders given (`xz -9` shrinks a test binary ~3x, so
# several variants fit the carry limit), with Python's lzma: the GPU machine may have no xz.
ab_unxz() {
  local v z
  for v in "$@"; do
    for z in "$v"/*.xz; do
      [ -f "$z" ] || continue
      python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" \
        "$z" "${z%.xz}" && chmod +x "${z%.xz}" && rm -f "$z"
    done
  done
}

# One archive of $OUT's logs instead of many files (the device tool brings back only so many
# files per call).
ab_pack_logs() {
  (cd "$OUT" && shopt -s nullglob && f=(*.txt *.csv *.log) && [ ${#f[@]} -gt 0 ] &&
    tar czf ab_logs.tgz "${f[@]}" && rm -f "${f[@]}")
}

# The start of a one-call A/B script (after `cd` to the repository and OUT set): $OUT made, the
# carried build's runtime (when a pack is carried), the variant folders given unpacked, the GPU
# named.
ab_start() {
  mkdir -p "$OUT"
  ab_setup_runtime
  ab_unxz "$@"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
}

# Filter: bench_gemm_bwd's dW rows, a line each (shape, T, form, plan, ms, "cu" cuBLAS's ms,
# "r" the ratio).
ab_dw_rows() {
  grep "| dW" | awk -F'|' '{printf "%s %s %s %s cu %s r %s\n",$3,$4,$7,$8,$10,$12}'
}
