#!/usr/bin/env python3
"""Instruments a copy of src/cuda/sampling.cuh with per-phase SM clocks of row 0's choice CTA
(timing only, never landed): python3 phases.py SRC_TREE. Thread 0 of block 0 stamps clock64() at
each phase mark and prints the deltas at write_choice (the kernel's every exit). Phases: P0 start,
P1 after the argmax, P2 after the bound (tile maxima's level 0 / top-p's counts and bracket),
P3 after the pass over the row, P4 after the list's window, P5 after the boundary keys, P6 the
choice written; P7 the exact path's start (when a bound's list failed)."""
import sys

path = sys.argv[1] + "/src/cuda/sampling.cuh"
s = open(path).read()


def once(old, new):
    global s
    assert s.count(old) == 1, old
    s = s.replace(old, new)


once("namespace lockstep::cuda::detail {\n",
     "namespace lockstep::cuda::detail {\n__device__ long long g_ph[8];\n"
     "__device__ __forceinline__ void ph(int i) {\n"
     "  if (blockIdx.x == 0 && threadIdx.x == 0) g_ph[i] = clock64();\n}\n")
once("""  if (threadIdx.x != 0) return;
  const bool ok = id >= 0;""", """  if (threadIdx.x != 0) return;
  if (blockIdx.x == 0) {
    ph(6);
    printf("PHASES V=%lld k=%lld p=%g minp=%g tau=%g argmax %lld bound %lld pass %lld window %lld keys %lld choice %lld exact_at %lld\\n",
           (long long)p.V, (long long)p.info[t].top_k, p.info[t].top_p, p.info[t].min_p,
           p.info[t].temperature, g_ph[1] - g_ph[0], g_ph[2] - g_ph[1], g_ph[3] - g_ph[2], g_ph[4] - g_ph[3],
           g_ph[5] - g_ph[4], g_ph[6] - g_ph[5], g_ph[7] ? g_ph[7] - g_ph[0] : 0ll);
    for (int i = 0; i < 8; ++i) g_ph[i] = 0;
  }
  const bool ok = id >= 0;""")
once("""  const SampleRow info = p.info[t];
  const float* y = p.y + r * p.ldy;
  const float lse = p.lse[t];
  if (!isfinite(lse)) {""", """  ph(0);
  const SampleRow info = p.info[t];
  const float* y = p.y + r * p.ldy;
  const float lse = p.lse[t];
  if (!isfinite(lse)) {""")
once("  const uint64_t u = sample_row_uniform(", "  ph(1);\n  const uint64_t u = sample_row_uniform(")
# top-k bound
once("""    const int b_k = first_reaching(h0, kBuckets, k, false, sm);
    if (b_k < kTail) {""", """    const int b_k = first_reaching(h0, kBuckets, k, false, sm);
    ph(2);
    if (b_k < kTail) {""")
once("""      mass_pass(true, none, true, bin_cut(b_k + 1, lse));
      __syncthreads();
      const int n = int(sm.list_n);""", """      mass_pass(true, none, true, bin_cut(b_k + 1, lse));
      __syncthreads();
      ph(3);
      const int n = int(sm.list_n);""")
once("""      if (list.covers(k, false)) {
        const Found f""", """      ph(4);
      if (list.covers(k, false)) {
        const Found f""")
once("""        write_choice(p, t, y, lse, choose_with_list(last, n));
        return;""", """        ph(5);
        write_choice(p, t, y, lse, choose_with_list(last, n));
        return;""")
# top-p bound
once("""    const uint64_t below_c = h0.count(br.x - 1);
""", """    const uint64_t below_c = h0.count(br.x - 1);
    ph(2);
""")
once("""      acc = warp_sum(acc);
      if ((tid & 31) == 0) sm.seg_mass[tid >> 5] = acc;
      const uint64_t Q = block_all(q_all, sum_u64, sm);""", """      ph(3);
      acc = warp_sum(acc);
      if ((tid & 31) == 0) sm.seg_mass[tid >> 5] = acc;
      const uint64_t Q = block_all(q_all, sum_u64, sm);""")
once("""      const uint64_t thr = thr_of(Q);
      if (list.covers(thr, true)) {
        write_choice(p, t, y, lse, choose_with_list(list_locate(sm, n, list.w, thr, true).key, n));""",
     """      const uint64_t thr = thr_of(Q);
      ph(4);
      if (list.covers(thr, true)) {
        const uint64_t last = list_locate(sm, n, list.w, thr, true).key;
        ph(5);
        write_choice(p, t, y, lse, choose_with_list(last, n));""")
once("""  __syncthreads();  // every thread is past the bounds' reads of h0 and the list
""", """  __syncthreads();  // every thread is past the bounds' reads of h0 and the list
  ph(7);
""")
open(path, "w").write(s)
print("instrumented", path)
