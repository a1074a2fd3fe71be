// CUDA GEMM backward (docs/contract.md §B.3), forward y = x·wᵀ, x [T, K], w [N, K]; the same bits
// as the cpu functions of the same name (src/cpu/backward/gemm.cc), as layouts of the one GEMM
// family (src/cuda/gemm/, docs/cuda-gemm.md "Backward"):
//   dx = dy·w: the "nn" layout — w [N, K] read in place as the MN-major operand (the wgmma B
//        transpose bit), the forward contract with N as the reduced axis (segments, tree, one
//        rounding); the TP partial likewise. When the nn layout cannot run (operands TMA cannot
//        read) or for T <= 64 (the small-M kernels): w transposed once into a stream-ordered
//        wᵀ [K, N], then cuda::gemm_bf16_nt(dy, wᵀ) — the same bits.
//   dw += dyᵀ·x: the host lists the canonical token slots (B.1: sequences by step index, then
//        16-position blocks; -1 = a row past the sequence's end). Per chunk of consecutive blocks
//        the "tn" layout's accumulate mode runs each dw element's chain over the chunk's blocks,
//        in order, from dw's current value, on token-major (MN-major) operands: dy and x read in
//        place when the chunk is one run of consecutive rows (one sequence's blocks; the rows past
//        its end are TMA zero fill), else the chunk's rows gathered into token-major copies
//        (zeros for -1). Chunk after chunk, the chain continues through the stored fp32 value
//        (the chain's state is that value): one chain over all blocks.
// No atomics; every output is one fixed chain owned by one thread.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "contract/checks.h"
#include "cuda/gemm/internal.h"
#include "lockstep/cuda/backward.h"
#include "lockstep/cuda/gemm.h"
#include "lockstep/error.h"

namespace lockstep::cuda {

namespace {

constexpr const char* kOpDx = "cuda::gemm_bf16_dx";
constexpr const char* kOpDxPartial = "cuda::gemm_bf16_dx_partial";
constexpr const char* kOpDw = "cuda::gemm_bf16_dw";

// Token slots per dW chunk (a multiple of kTokenBlock), and the bound of a chunk's gathered
// operands (16 slots at least).
constexpr int64_t kDwChunkSlots = 8192;
constexpr int64_t kDwChunkBytes = int64_t(1) << 30;

// One cudaMallocAsync'd buffer, freed in stream order when it goes out of scope (also on a throw).
class StreamBuffer {
 public:
  StreamBuffer(const char* op, int64_t bytes, cudaStream_t s) : s_(s) {
    const cudaError_t e = cudaMallocAsync(&p_, size_t(std::max<int64_t>(bytes, 16)), s);
    LS_CHECK(e == cudaSuccess, op, "cudaMallocAsync of ", bytes,
             " bytes of workspace failed: ", cudaGetErrorString(e));
  }
  StreamBuffer(const StreamBuffer&) = delete;
  StreamBuffer& operator=(const StreamBuffer&) = delete;
  ~StreamBuffer() { cudaFreeAsync(p_, s_); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  void* p_ = nullptr;
  cudaStream_t s_;
};

constexpr int kTrTile = 64;  // tokens x columns per tile
constexpr int kTrThreadsX = 32, kTrThreadsY = 8;

// out[c · ldo + t] = src[r(t) · lds + c] for t < T, c < C, with r(t) = slots[t] (or t when slots
// is null); r(t) < 0: +0 (a padding slot). A 64 x 64 tile through shared memory: each thread moves
// pairs of elements, read along c and written along t (both coalesced); vec_in / vec_out: 4-byte
// accesses allowed (even row strides, 4-byte aligned bases), else element by element. Pure data
// movement (bf16 bits copied).
__global__ void __launch_bounds__(kTrThreadsX* kTrThreadsY)
    gather_transpose_bf16_kernel(const uint16_t* __restrict__ src, int64_t lds,
                                 const int32_t* __restrict__ slots, int64_t T, int64_t C,
                                 uint16_t* __restrict__ out, int64_t ldo, int vec_in, int vec_out) {
  __shared__ __align__(4) uint16_t tile[kTrTile][kTrTile + 2];
  const int64_t t0 = int64_t(blockIdx.x) * kTrTile;
  const int64_t c0 = int64_t(blockIdx.y) * kTrTile;
  const int tx = threadIdx.x, ty = threadIdx.y;
#pragma unroll
  for (int i = ty; i < kTrTile; i += kTrThreadsY) {
    const int64_t t = t0 + i, c = c0 + 2 * tx;
    uint32_t v = 0;
    if (t < T && c < C) {
      const int64_t r = slots ? int64_t(slots[t]) : t;
      if (r >= 0) {
        const uint16_t* row = src + r * lds;
        if (vec_in && c + 1 < C) {
          v = *reinterpret_cast<const uint32_t*>(row + c);
        } else {
          v = uint32_t(row[c]);
          if (c + 1 < C) v |= uint32_t(row[c + 1]) << 16;
        }
      }
    }
    *reinterpret_cast<uint32_t*>(&tile[i][2 * tx]) = v;
  }
  __syncthreads();
#pragma unroll
  for (int i = ty; i < kTrTile; i += kTrThreadsY) {
    const int64_t c = c0 + i, t = t0 + 2 * tx;
    if (c >= C || t >= T) continue;
    const uint32_t v0 = tile[2 * tx][i], v1 = tile[2 * tx + 1][i];
    uint16_t* o = out + c * ldo + t;
    if (vec_out && t + 1 < T) {
      *reinterpret_cast<uint32_t*>(o) = v0 | (v1 << 16);
    } else {
      o[0] = uint16_t(v0);
      if (t + 1 < T) o[1] = uint16_t(v1);
    }
  }
}

bool aligned4(const void* p) { return reinterpret_cast<uintptr_t>(p) % 4 == 0; }

void gather_transpose(const char* op, const uint16_t* src, int64_t lds, const int32_t* slots,
                      int64_t T, int64_t C, uint16_t* out, int64_t ldo, cudaStream_t s) {
  if (T == 0 || C == 0) return;
  const int64_t gy = (C + kTrTile - 1) / kTrTile;
  LS_CHECK(gy <= 65535, op, "the transposed operand has ", C, " columns (grid limit)");
  const dim3 grid(unsigned((T + kTrTile - 1) / kTrTile), unsigned(gy));
  const int vec_in = aligned4(src) && lds % 2 == 0 ? 1 : 0;
  const int vec_out = aligned4(out) && ldo % 2 == 0 ? 1 : 0;
  gather_transpose_bf16_kernel<<<grid, dim3(kTrThreadsX, kTrThreadsY), 0, s>>>(
      src, lds, slots, T, C, out, ldo, vec_in, vec_out);
  const cudaError_t e = cudaGetLastError();
  LS_CHECK(e == cudaSuccess, op, "gather-transpose launch failed: ", cudaGetErrorString(e));
}

constexpr int kGatherThreads = 256;
constexpr int kGatherRows = 4;  // rows per block step: 16-byte moves in flight per thread

// out[t · ldo + c] = src[slots[t] · lds + c] for t < T, c < C; slots[t] < 0: +0 (a padding slot).
// Blocks step over groups of kGatherRows rows, threads over a row's 8-column groups (no integer
// division). vec: 16-byte moves (8-element aligned bases and strides; a partial last group is
// copied element by element), else one element per step. Pure data movement (bf16 bits copied).
__global__ void __launch_bounds__(kGatherThreads)
    gather_rows_bf16_kernel(const uint16_t* __restrict__ src, int64_t lds,
                            const int32_t* __restrict__ slots, int64_t T, int64_t C,
                            uint16_t* __restrict__ out, int64_t ldo, int vec) {
  const int64_t groups = vec ? (C + 7) / 8 : C;  // units per row
  for (int64_t t0 = int64_t(blockIdx.x) * kGatherRows; t0 < T;
       t0 += int64_t(gridDim.x) * kGatherRows) {
    int64_t r[kGatherRows];
#pragma unroll
    for (int u = 0; u < kGatherRows; ++u) r[u] = t0 + u < T ? int64_t(slots[t0 + u]) : -1;
    for (int64_t g = threadIdx.x; g < groups; g += kGatherThreads) {
      if (!vec) {
#pragma unroll
        for (int u = 0; u < kGatherRows; ++u)
          if (t0 + u < T) out[(t0 + u) * ldo + g] = r[u] >= 0 ? src[r[u] * lds + g] : uint16_t(0);
        continue;
      }
      const int64_t c = 8 * g;
      uint4 v[kGatherRows];
#pragma unroll
      for (int u = 0; u < kGatherRows; ++u) {
        v[u] = make_uint4(0u, 0u, 0u, 0u);
        if (r[u] < 0) continue;
        if (c + 8 <= C) {
          v[u] = *reinterpret_cast<const uint4*>(src + r[u] * lds + c);
        } else {
          uint16_t tmp[8] = {0, 0, 0, 0, 0, 0, 0, 0};
          for (int64_t i = c; i < C; ++i) tmp[i - c] = src[r[u] * lds + i];
          v[u] = *reinterpret_cast<const uint4*>(tmp);
        }
      }
      // The row stride is a multiple of 8 covering C rounded up to 8: the group fits the row.
#pragma unroll
      for (int u = 0; u < kGatherRows; ++u)
        if (t0 + u < T) *reinterpret_cast<uint4*>(out + (t0 + u) * ldo + c) = v[u];
    }
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Rows are kept 8 elements apart at least (16-byte aligned: TMA-readable).
int64_t ld8(int64_t n) { return std::max<int64_t>(8, (n + 7) / 8 * 8); }

int gather_grid() {
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || sms <= 0)
    sms = 132;
  return sms * 8;
}

// out (rows ldo apart, ldo = ld8(C)) = the rows slots[0, T) of src, zeros for padding slots.
void gather_rows(const char* op, const uint16_t* src, int64_t lds, const int32_t* slots, int64_t T,
                 int64_t C, uint16_t* out, int64_t ldo, cudaStream_t s) {
  if (T == 0 || C == 0) return;
  static const int grid = gather_grid();
  const int vec = aligned16(src) && lds % 8 == 0 && aligned16(out) && ldo % 8 == 0 ? 1 : 0;
  gather_rows_bf16_kernel<<<unsigned(grid), kGatherThreads, 0, s>>>(src, lds, slots, T, C, out, ldo,
                                                                    vec);
  const cudaError_t e = cudaGetLastError();
  LS_CHECK(e == cudaSuccess, op, "row gather launch failed: ", cudaGetErrorString(e));
}

// wᵀ [K, N] of w [N, K] (rows may be strided) in `buf`, rows ld_wt = N rounded up to 8 apart
// (16-byte aligned rows: TMA-readable); the columns past N are never read.
int64_t wt_ld(int64_t N) { return std::max<int64_t>(8, (N + 7) / 8 * 8); }
TensorView transpose_w(const char* op, const TensorView& w, const StreamBuffer& buf,
                       cudaStream_t s) {
  const int64_t N = w.size(0), K = w.size(1), ld = wt_ld(N);
  gather_transpose(op, w.ptr<const uint16_t>(), w.stride[0], nullptr, N, K, buf.as<uint16_t>(), ld,
                   s);
  TensorView wt = TensorView::contiguous(buf.as<void>(), DType::kBF16, {K, N}, Device::kCUDA);
  wt.stride[0] = ld;
  return wt;
}

// The canonical token slots of `order` (B.1): per sequence by step index, per 16-position block,
// the 16 packed rows (-1 past the sequence's end).
std::vector<int32_t> canonical_slots(const TokenOrder& order) {
  std::vector<int32_t> slots;
  for (const TokenSeq& q : order.seqs())
    for (int64_t p = 0; p < q.len; p += kTokenBlock)
      for (int64_t i = 0; i < kTokenBlock; ++i)
        slots.push_back(p + i < q.len ? int32_t(q.row + p + i) : int32_t(-1));
  return slots;
}

// dX reads w in place (the nn layout) when TMA can read the operands and T > 64 (smaller T: the
// forward's small-M kernels on wᵀ).
bool nn_runs(const GemmProblem& q) { return q.tma_ok && q.M > 64; }

// The slots [0, n) as one run of consecutive rows followed only by padding slots (a piece that
// reads dy and x in place): its length in slots (whole blocks: the padding ends a block) and, in
// *valid, its real rows; 0 when slots[0] is padding.
int64_t in_place_piece(const int32_t* slots, int64_t n, int64_t* valid) {
  int64_t v = 0;
  while (v < n && slots[v] >= 0 && slots[v] == slots[0] + v) ++v;
  int64_t len = v;
  while (len < n && slots[len] < 0) ++len;
  *valid = v;
  return v == 0 ? 0 : len;
}

// dW over the canonical slots on the blocked tn layout: the full 16-slot blocks (16 consecutive
// rows) read in place, the partial ones (a sequence's last block) gathered, zero-padded, into a
// small tail buffer; one launch over all blocks in canonical order (its chain = §B.3's).
void dw_blocked(const TensorView& dy, const TensorView& x, const std::vector<int32_t>& slots,
                const TensorView& dw, cudaStream_t s) {
  const int64_t N = dy.size(1), K = x.size(1), nblocks = int64_t(slots.size()) / kTokenBlock;
  std::vector<int32_t> table;  // the block entries (padded), then the tail slots
  std::vector<int32_t> tail_slots;
  table.reserve(size_t((nblocks + 3) / 4 + 1) * 4);
  for (int64_t j = 0; j < nblocks; ++j) {
    const int32_t* b = slots.data() + j * kTokenBlock;
    bool full = true;
    for (int64_t i = 0; i < kTokenBlock && full; ++i) full = b[i] >= 0 && b[i] == b[0] + i;
    if (full) {
      table.push_back(b[0]);
    } else {
      table.push_back(-int32_t(tail_slots.size() / kTokenBlock) - 1);
      tail_slots.insert(tail_slots.end(), b, b + kTokenBlock);
    }
  }
  const int64_t padded = ((nblocks + 3) / 4 + 1) * 4;  // the producer reads one k-tile ahead
  table.resize(size_t(padded), table[0]);
  const int64_t ntail_rows = int64_t(tail_slots.size());
  table.insert(table.end(), tail_slots.begin(), tail_slots.end());
  const StreamBuffer dtable(kOpDw, int64_t(table.size()) * 4, s);
  const cudaError_t e =
      cudaMemcpyAsync(dtable.as<void>(), table.data(), table.size() * 4, cudaMemcpyHostToDevice, s);
  LS_CHECK(e == cudaSuccess, kOpDw,
           "upload of the token-block table failed: ", cudaGetErrorString(e));
  const int64_t ldn = ld8(N), ldk = ld8(K);
  const StreamBuffer dyt(kOpDw, std::max<int64_t>(ntail_rows, 1) * ldn * 2, s);
  const StreamBuffer xt(kOpDw, std::max<int64_t>(ntail_rows, 1) * ldk * 2, s);
  const int32_t* dtail_slots = dtable.as<int32_t>() + padded;
  gather_rows(kOpDw, dy.ptr<const uint16_t>(), dy.stride[0], dtail_slots, ntail_rows, N,
              dyt.as<uint16_t>(), ldn, s);
  gather_rows(kOpDw, x.ptr<const uint16_t>(), x.stride[0], dtail_slots, ntail_rows, K,
              xt.as<uint16_t>(), ldk, s);
  const int64_t rows = dy.size(0);
  detail::gemm_bf16_tn_accumulate_blocked(
      dy.ptr<const uint16_t>(), dy.stride[0], x.ptr<const uint16_t>(), x.stride[0], rows,
      dyt.as<uint16_t>(), ldn, xt.as<uint16_t>(), ldk, ntail_rows, dtable.as<int32_t>(), nblocks, N,
      K, dw.ptr<float>(), dw.stride[0], nullptr, s);
}

}  // namespace

void gemm_bf16_dx(const TensorView& dy, const TensorView& w, const GemmConfig& cfg,
                  const TensorView& dx, void* stream) {
  contract::check_gemm_dx(kOpDx, Device::kCUDA, dy, w, cfg, dx);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int64_t N = w.size(0), K = w.size(1);
  if (dy.size(0) == 0 || K == 0) return;  // dx has no element
  if (nn_runs(detail::gemm_nn_problem(dy, w, cfg))) {
    detail::gemm_bf16_nn(dy, w, cfg, dx, nullptr, stream);
    return;
  }
  const StreamBuffer buf(kOpDx, K * wt_ld(N) * 2, s);
  const TensorView wt = transpose_w(kOpDx, w, buf, s);
  gemm_bf16_nt(dy, wt, nullptr, cfg, dx, stream);
}

void gemm_bf16_dx_partial(const TensorView& dy_shard, const TensorView& w_shard, int64_t n_total,
                          int tp_size, int tp_rank, const GemmConfig& cfg,
                          const TensorView& dx_partial, void* stream) {
  contract::check_gemm_dx_partial(kOpDxPartial, Device::kCUDA, dy_shard, w_shard, n_total, tp_size,
                                  tp_rank, cfg, dx_partial);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int64_t Nr = w_shard.size(0), K = w_shard.size(1);
  if (dy_shard.size(0) == 0 || K == 0) return;  // dx_partial has no element
  if (nn_runs(detail::gemm_nn_partial_problem(dy_shard, w_shard, n_total, tp_size, cfg))) {
    detail::gemm_bf16_nn_partial(dy_shard, w_shard, n_total, tp_size, cfg, dx_partial, nullptr,
                                 stream);
    return;
  }
  const StreamBuffer buf(kOpDxPartial, K * wt_ld(Nr) * 2, s);
  const TensorView wt = transpose_w(kOpDxPartial, w_shard, buf, s);
  gemm_bf16_nt_partial(dy_shard, wt, n_total, tp_size, tp_rank, cfg, dx_partial, stream);
}

namespace {

// gemm_bf16_dw after its checks; blocked: the blocked form may read several runs in place (else
// they are row-gathered, window by window).
void dw_runs(const TensorView& dy, const TensorView& x, const TokenOrder& order,
             const TensorView& dw, bool blocked, void* stream) {
  const int64_t N = dy.size(1), K = x.size(1);
  if (N == 0 || K == 0) return;
  LS_CHECK(order.rows() < (int64_t(1) << 31), kOpDw, "dy: ", order.rows(),
           " rows exceed the token-slot table's int32 range");
  const std::vector<int32_t> slots = canonical_slots(order);
  if (slots.empty()) return;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int64_t total = int64_t(slots.size());
  // Slots per chunk: whole token blocks, the gathered operands within kDwChunkBytes.
  const int64_t by_bytes = kDwChunkBytes / ((N + K) * 2) / kTokenBlock * kTokenBlock;
  const int64_t chunk =
      std::min(total, std::max<int64_t>(kTokenBlock, std::min(kDwChunkSlots, by_bytes)));

  const int64_t ldn = ld8(N), ldk = ld8(K);
  const uint16_t* dyp = dy.ptr<const uint16_t>();
  const uint16_t* xp = x.ptr<const uint16_t>();
  float* const dwp = dw.ptr<float>();
  // Several runs of rows (e.g. sequences whose lengths are not multiples of 16) and operands TMA
  // reads in place: the blocked path, one launch over every block.
  int64_t valid0 = 0;
  const bool one_run = in_place_piece(slots.data(), total, &valid0) == total;
  if (!one_run && blocked &&
      detail::gemm_tn_problem(dyp, dy.stride[0], xp, x.stride[0], N, K, order.rows()).tma_ok) {
    dw_blocked(dy, x, slots, dw, s);
    return;
  }
  // Made when a window needs them: the slot table on the device and the gathered copies.
  std::optional<StreamBuffer> dslots, dyg, xg;
  for (int64_t pos = 0; pos < total;) {
    // A run of consecutive rows that covers a whole window (or the rest) is read in place, in one
    // launch however long (TMA zero fill past its last real row).
    int64_t valid = 0;
    const int64_t piece = in_place_piece(slots.data() + pos, total - pos, &valid);
    if (piece >= std::min(chunk, total - pos)) {
      const int64_t r0 = slots[size_t(pos)];
      const uint16_t* a = dyp + r0 * dy.stride[0];
      const uint16_t* b = xp + r0 * x.stride[0];
      if (detail::gemm_tn_problem(a, dy.stride[0], b, x.stride[0], N, K, valid).tma_ok) {
        detail::gemm_bf16_tn_accumulate(a, dy.stride[0], b, x.stride[0], N, K, valid, dwp,
                                        dw.stride[0], nullptr, stream);
        pos += piece;
        continue;
      }
    }
    // Else a window of at most `chunk` slots gathered token-major: the rest cut into equal
    // windows of whole blocks (no short last launch, which would read and write dw for little).
    const int64_t rest = total - pos, windows = (rest + chunk - 1) / chunk;
    const int64_t tc = std::min(
        rest, ((rest + windows - 1) / windows + kTokenBlock - 1) / kTokenBlock * kTokenBlock);
    if (!dslots) {
      dslots.emplace(kOpDw, total * 4, s);
      const cudaError_t e = cudaMemcpyAsync(dslots->as<void>(), slots.data(), size_t(total) * 4,
                                            cudaMemcpyHostToDevice, s);
      LS_CHECK(e == cudaSuccess, kOpDw,
               "upload of the token-slot table failed: ", cudaGetErrorString(e));
      dyg.emplace(kOpDw, chunk * ldn * 2, s);
      xg.emplace(kOpDw, chunk * ldk * 2, s);
    }
    const int32_t* sl = dslots->as<int32_t>() + pos;
    gather_rows(kOpDw, dyp, dy.stride[0], sl, tc, N, dyg->as<uint16_t>(), ldn, s);
    gather_rows(kOpDw, xp, x.stride[0], sl, tc, K, xg->as<uint16_t>(), ldk, s);
    // The window's blocks are consecutive k-blocks of every dw element's chain, from its value.
    detail::gemm_bf16_tn_accumulate(dyg->as<uint16_t>(), ldn, xg->as<uint16_t>(), ldk, N, K, tc,
                                    dwp, dw.stride[0], nullptr, stream);
    pos += tc;
  }
}

}  // namespace

void gemm_bf16_dw(const TensorView& dy, const TensorView& x, const TokenOrder& order,
                  const TensorView& dw, void* stream) {
  contract::check_gemm_dw(kOpDw, Device::kCUDA, dy, x, order, dw);
  dw_runs(dy, x, order, dw, /*blocked=*/true, stream);
}

namespace detail {
void gemm_bf16_dw_gathered(const TensorView& dy, const TensorView& x, const TokenOrder& order,
                           const TensorView& dw, void* stream) {
  contract::check_gemm_dw(kOpDw, Device::kCUDA, dy, x, order, dw);
  dw_runs(dy, x, order, dw, /*blocked=*/false, stream);
}
}  // namespace detail

}  // namespace lockstep::cuda
