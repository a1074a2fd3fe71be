// Launchers of the baseline attention kernels (baseline_attention.cuh): tile/slice choice for the
// prefill kernel, the flash-decoding split heuristic, split-state scratch and the merge.
#include <algorithm>

#include "baseline/cuda/attention.cuh"

namespace lockstep::cuda::baseline {

namespace {

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Every row of the view starts on a 16-byte boundary (whole 8-element groups are one load).
bool vec8(const Heads<const void>& h) { return aligned16(h.p) && h.s0 % 8 == 0 && h.s1 % 8 == 0; }
bool vec8(const Cache& c) {
  return aligned16(c.p) && c.s0 % 8 == 0 && c.s1 % 8 == 0 && c.s2 % 8 == 0;
}

template <int DV>
void launch_prefill(const PrefillArgs& a, bool vec, cudaStream_t stream) {
  const int nst = kernels::prefill_stages(a.D);
  const int ldq = int(a.D) + kernels::kSmemPad, ldv = DV + kernels::kSmemPad;
  const size_t smem = size_t(kernels::kPrefillRows + nst * kernels::kPrefillKeys) * ldq * 2 +
                      size_t(nst) * kernels::kPrefillKeys * ldv * 2;
  // Enough for every head_dim (the largest: 512 with one stage, ~150 KB); set once.
  static const cudaError_t attr = cudaFuncSetAttribute(
      kernels::prefill_kernel<DV>, cudaFuncAttributeMaxDynamicSharedMemorySize, 160 * 1024);
  LS_CHECK(attr == cudaSuccess, "baseline attention_prefill_varlen",
           "cudaFuncSetAttribute failed: ", cudaGetErrorString(attr));
  LS_CHECK(smem <= size_t(160 * 1024), "baseline attention_prefill_varlen", "head_dim ", a.D,
           " needs ", smem, " bytes of shared memory");
  const int64_t tiles = (a.T + kernels::kPrefillRows - 1) / kernels::kPrefillRows;
  LS_CHECK(tiles <= 0x7fffffff && a.Hq <= 65535, "baseline attention_prefill_varlen", "T = ", a.T,
           " / Hq = ", a.Hq, " exceed the grid limits");
  const dim3 grid(unsigned(tiles), unsigned(a.Hq), unsigned((a.D + DV - 1) / DV));
  kernels::prefill_kernel<DV><<<grid, kernels::kPrefillThreads, smem, stream>>>(a, vec, nst);
}

// Dynamic shared memory of the paged kernel for hpc heads of head_dim D (one 64-key block).
size_t paged_smem(int hpc, int D) {
  const size_t BK = kPagedBlock;
  return size_t(hpc) * D * 4 + size_t(hpc) * BK * 4 + BK * 4 + BK * (D + 2) * 2 + BK * D * 2;
}

}  // namespace

void attention_prefill(const PrefillArgs& a, void* stream) {
  const char* op = "baseline attention_prefill_varlen";
  if (a.T == 0) return;
  const bool vec = vec8(a.q) && vec8(a.k) && vec8(a.v);
  if (a.D <= 64) {
    launch_prefill<64>(a, vec, as_stream(stream));
  } else {
    launch_prefill<128>(a, vec, as_stream(stream));
  }
  LS_BASE_LAUNCHED(op);
}

int paged_num_splits(int64_t rows, int64_t Hkv, int64_t group, int64_t max_ctx, int num_sms) {
  const int64_t hgroups = (group + kernels::kPagedHeadsPerCta - 1) / kernels::kPagedHeadsPerCta;
  const int64_t ctas = std::max<int64_t>(1, rows * Hkv * hgroups);
  // Several waves of CTAs per SM: one CTA's loads overlap another's math.
  const int64_t target = 8 * int64_t(std::max(num_sms, 1));
  int64_t splits = (target + ctas - 1) / ctas;
  const int64_t blocks = std::max<int64_t>(1, (max_ctx + kPagedBlock - 1) / kPagedBlock);
  splits = std::min<int64_t>({splits, blocks, int64_t(kPagedMaxSplits)});
  return int(std::max<int64_t>(1, splits));
}

void attention_paged(const PagedArgs& a, void* stream) {
  const char* op = "baseline attention_paged";
  if (a.N == 0) return;
  LS_CHECK(a.splits >= 1, op, "splits must be >= 1, got ", a.splits);
  LS_CHECK(a.D <= kernels::kPagedMaxD && a.D % 2 == 0, op, "head_dim ", a.D, " not supported");
  const int64_t G = a.Hq / a.Hkv;
  const int hpc = int(std::min<int64_t>(G, kernels::kPagedHeadsPerCta));
  const int64_t hgroups = (G + hpc - 1) / hpc;
  LS_CHECK(a.N <= 0x7fffffff && a.Hkv * hgroups <= 65535 && a.splits <= 65535, op, "N = ", a.N,
           " exceeds the grid limits");
  // Enough for every head_dim and head group (set once).
  static const cudaError_t attr =
      cudaFuncSetAttribute(kernels::paged_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           int(paged_smem(kernels::kPagedHeadsPerCta, kernels::kPagedMaxD)));
  LS_CHECK(attr == cudaSuccess, op, "cudaFuncSetAttribute failed: ", cudaGetErrorString(attr));
  const bool vec16 = vec8(a.k_cache) && vec8(a.v_cache);
  const dim3 grid(unsigned(a.N), unsigned(a.Hkv * hgroups), unsigned(a.splits));
  // More than one split: per-split states in scratch, merged by a second kernel.
  kernels::PagedWs ws{};
  DeviceBuffer ws_buf;
  if (a.splits > 1) {
    const size_t states = size_t(a.N) * size_t(a.Hq) * size_t(a.splits);
    ws_buf = DeviceBuffer(states * (2 + size_t(a.D)) * sizeof(float), stream);
    ws.m = ws_buf.as<float>();
    ws.l = ws.m + states;
    ws.acc = ws.l + states;
  }
  kernels::paged_kernel<<<grid, 32 * hpc, paged_smem(hpc, int(a.D)), as_stream(stream)>>>(
      a, hpc, int(hgroups), vec16, ws);
  LS_BASE_LAUNCHED(op);
  if (a.splits == 1) return;
  kernels::merge_kernel<<<unsigned(a.N * a.Hq), 128, 0, as_stream(stream)>>>(a, ws);
  LS_BASE_LAUNCHED(op);
}

}  // namespace lockstep::cuda::baseline
