// Launchers of the CUDA elementwise backward (docs/contract.md §B.4-B.7; kernels:
// elementwise.cuh), the same bits as the lockstep::cpu ops of the same name. Every argument is
// checked on the host before the launch with the CPU op's contract checks (Device::kCUDA); the
// host plans the token reductions from the TokenOrder (RMSNorm's token blocks, the embedding's
// groups of equal ids, both in canonical order), workspace is allocated and freed stream-ordered.
// NOTE: embedding_backward reads the ids back to the host (one stream synchronize) so that they
// are checked exactly as on the CPU, before anything is written, and grouped on the host.
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "contract/checks.h"
#include "cuda/backward/elementwise.cuh"
#include "lockstep/cuda/backward.h"

namespace lockstep::cuda {
namespace {

using detail::check_device_view;

// Stream-ordered device workspace, freed (in stream order) when it goes out of scope.
class Scratch {
 public:
  Scratch(const char* op, cudaStream_t s) : op_(op), s_(s) {}
  ~Scratch() {
    for (void* p : ptrs_) cudaFreeAsync(p, s_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  template <typename T>
  T* alloc(int64_t n) {
    void* p = nullptr;
    const size_t bytes = std::max<size_t>(size_t(n) * sizeof(T), 16);
    const cudaError_t e = cudaMallocAsync(&p, bytes, s_);
    LS_CHECK(e == cudaSuccess, op_, "cudaMallocAsync of ", bytes,
             " bytes of workspace failed: ", cudaGetErrorString(e));
    ptrs_.push_back(p);
    return static_cast<T*>(p);
  }
  // A device copy of a host array.
  template <typename T>
  T* upload(const std::vector<T>& v) {
    T* d = alloc<T>(int64_t(v.size()));
    const cudaError_t e =
        cudaMemcpyAsync(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice, s_);
    LS_CHECK(e == cudaSuccess, op_, "upload of the launch tables failed: ", cudaGetErrorString(e));
    return d;
  }

 private:
  const char* op_;
  cudaStream_t s_;
  std::vector<void*> ptrs_;
};

// Exactly the same view (data, shape and strides): the supported in-place form.
bool same_view(const TensorView& a, const TensorView& b) {
  if (a.data != b.data || a.dtype != b.dtype || a.ndim != b.ndim) return false;
  for (int i = 0; i < a.ndim; ++i)
    if (a.shape[i] != b.shape[i] || (a.shape[i] > 1 && a.stride[i] != b.stride[i])) return false;
  return true;
}

// ---- B.4 RMSNorm ----------------------------------------------------------------------------

// Token blocks per pass of the weight gradient: bounds the block sums to kChunkBlocks·H floats.
constexpr int64_t kChunkBlocks = 1024;
constexpr int kColumnThreads = 256;  // threads per CTA of the per-column kernels

void norm_backward(const char* op, const TensorView& s, const TensorView& weight,
                   const RmsNormConfig& cfg, const TensorView& gy, const TensorView* gres,
                   const TensorView& out, const TokenOrder* order, const TensorView* dweight,
                   void* stream) {
  const int64_t H = contract::check_rmsnorm_backward(op, Device::kCUDA, s, weight, cfg, gy, gres,
                                                     out, order, dweight);
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  detail::NormBwdParams p{};
  p.s = static_cast<const uint16_t*>(s.data);
  p.gy = static_cast<const float*>(gy.data);
  p.gres = gres ? static_cast<const float*>(gres->data) : nullptr;
  p.w = static_cast<const uint16_t*>(weight.data);
  p.out = static_cast<float*>(out.data);
  p.sm = detail::row_map(s);
  p.gm = detail::row_map(gy);
  p.rm = gres ? detail::row_map(*gres) : p.gm;
  p.om = detail::row_map(out);
  p.rows = s.numel() / H;
  p.H = H;
  p.heads = s.ndim == 3 ? s.shape[1] : 1;
  p.eps = cfg.eps;
  if (p.rows == 0) return;
  LS_CHECK(p.rows <= int64_t(0x7fffffff) * detail::kNormBwdWarps, op, "too many rows: ", p.rows);
  const unsigned row_ctas = unsigned((p.rows + detail::kNormBwdWarps - 1) / detail::kNormBwdWarps);
  const unsigned col_ctas = unsigned((H + kColumnThreads - 1) / kColumnThreads);
  LS_CHECK(col_ctas <= 65535u, op, "hidden size too large for the weight gradient: ", H);

  Scratch ws(op, st);
  // The weight gradient first: it reads gy, which out may overwrite.
  if (dweight) {
    std::vector<detail::NormTokenBlock> blocks;  // canonical order (§B.1)
    for (const TokenSeq& q : order->seqs())
      for (int64_t b = 0; b < q.len; b += kTokenBlock)
        blocks.push_back({q.row + b, std::min<int64_t>(kTokenBlock, q.len - b)});
    if (!blocks.empty()) {
      float* rinv = ws.alloc<float>(p.rows);
      detail::rmsnorm_rinv_kernel<<<row_ctas, 32 * detail::kNormBwdWarps, 0, st>>>(p, rinv);
      detail::check_launch(op);
      const detail::NormTokenBlock* dblocks = ws.upload(blocks);
      const int64_t nb = int64_t(blocks.size());
      const int64_t chunk = std::min(nb, kChunkBlocks);
      float* sums = ws.alloc<float>(chunk * H);
      for (int64_t b0 = 0; b0 < nb; b0 += chunk) {
        const int64_t n = std::min(chunk, nb - b0);
        detail::
            rmsnorm_dweight_blocks_kernel<<<dim3(unsigned(n), col_ctas), kColumnThreads, 0, st>>>(
                p, rinv, dblocks + b0, sums);
        detail::check_launch(op);
        detail::rmsnorm_dweight_chain_kernel<<<col_ctas, kColumnThreads, 0, st>>>(
            sums, n, H, static_cast<float*>(dweight->data));
        detail::check_launch(op);
      }
    }
  }
  detail::rmsnorm_backward_kernel<<<row_ctas, 32 * detail::kNormBwdWarps, 0, st>>>(p);
  detail::check_launch(op);
}

// ---- B.7 Embedding --------------------------------------------------------------------------

// The ids of rows [0, rows) of a device i32/i64 view (any stride), on the host.
std::vector<int64_t> read_ids(const char* op, const TensorView& ids, int64_t rows,
                              cudaStream_t st) {
  const int64_t span = (rows - 1) * ids.stride[0] + 1;
  const size_t es = ids.dtype == DType::kI64 ? 8 : 4;
  std::vector<char> raw(size_t(span) * es);
  cudaError_t e = cudaMemcpyAsync(raw.data(), ids.data, raw.size(), cudaMemcpyDeviceToHost, st);
  if (e == cudaSuccess) e = cudaStreamSynchronize(st);
  LS_CHECK(e == cudaSuccess, op, "reading argument 'ids' back failed: ", cudaGetErrorString(e));
  std::vector<int64_t> v(static_cast<size_t>(rows));
  for (int64_t t = 0; t < rows; ++t) {
    const char* q = raw.data() + size_t(t * ids.stride[0]) * es;
    v[size_t(t)] = es == 8 ? *reinterpret_cast<const int64_t*>(q)
                           : int64_t(*reinterpret_cast<const int32_t*>(q));
  }
  return v;
}

}  // namespace

void rmsnorm_backward(const TensorView& s, const TensorView& weight, const RmsNormConfig& cfg,
                      const TensorView& gy, const TensorView& dx, const TokenOrder* order,
                      const TensorView* dweight, void* stream) {
  norm_backward("cuda::rmsnorm_backward", s, weight, cfg, gy, nullptr, dx, order, dweight, stream);
}

void rmsnorm_residual_backward(const TensorView& s, const TensorView& weight,
                               const RmsNormConfig& cfg, const TensorView& gy,
                               const TensorView& gres, const TensorView& ds,
                               const TokenOrder* order, const TensorView* dweight, void* stream) {
  norm_backward("cuda::rmsnorm_residual_backward", s, weight, cfg, gy, &gres, ds, order, dweight,
                stream);
}

// ---- B.5 RoPE -------------------------------------------------------------------------------

// contract::check_rope_backward takes a host RopeTable; here cos / sin are device views, checked
// as cuda::rope checks them, and everything else as check_rope_backward does.
void rope_backward(const TensorView& gy, const TensorView& positions, const TensorView& cos,
                   const TensorView& sin, const TensorView& dx, void* stream) {
  const char* op = "cuda::rope_backward";
  check_device_view(op, "gy", gy, DType::kF32, {-1, -1, -1});
  const int64_t T = gy.shape[0], heads = gy.shape[1], D = gy.shape[2];
  LS_CHECK(D >= 2 && D % 2 == 0, op, "argument 'gy': head_dim (dim 2) must be even and >= 2, got ",
           D);
  const int64_t half = D / 2;
  check_device_view(op, "cos", cos, DType::kF32, {-1, half});
  const int64_t P = cos.shape[0];
  LS_CHECK(P >= 1, op, "argument 'cos': expected at least one table row, got ", cos.shape_string());
  check_device_view(op, "sin", sin, DType::kF32, {P, half});
  check_tensor_dtypes(op, "positions", positions, {DType::kI32, DType::kI64}, {T}, Device::kCUDA);
  check_device_view(op, "dx", dx, DType::kF32, {T, heads, D});
  LS_CHECK(same_view(dx, gy) || !contract::overlaps(dx, gy), op,
           "argument 'dx' overlaps 'gy' without being the same view (in place: pass gy as dx)");
  LS_CHECK(!contract::overlaps(dx, cos) && !contract::overlaps(dx, sin) &&
               !contract::overlaps(dx, positions),
           op, "argument 'dx' must not overlap cos, sin or positions");
  const int64_t rows = T * heads;
  if (rows == 0) return;
  detail::RopeBwdParams p{};
  p.gy = static_cast<const float*>(gy.data);
  p.dx = static_cast<float*>(dx.data);
  p.gm = detail::row_map(gy);
  p.dm = detail::row_map(dx);
  p.tab = detail::rope_table_ref(positions, cos, sin);
  p.rows = rows;
  p.heads = heads;
  p.half = half;
  constexpr int kThreads = 256;
  detail::rope_backward_kernel<<<detail::grid_for(rows * half, kThreads), kThreads, 0,
                                 static_cast<cudaStream_t>(stream)>>>(p);
  detail::check_launch(op);
}

// ---- B.6 SiLU-and-mul -----------------------------------------------------------------------

void silu_mul_backward(const TensorView& gate_up, const TensorView& ga, const TensorView& dgu,
                       void* stream) {
  const char* op = "cuda::silu_mul_backward";
  const int64_t I = contract::check_silu_mul_backward(op, Device::kCUDA, gate_up, ga, dgu);
  const int64_t T = gate_up.shape[0];
  if (T == 0) return;
  detail::SiluBwdParams p{};
  p.gu = static_cast<const uint16_t*>(gate_up.data);
  p.ga = static_cast<const float*>(ga.data);
  p.dgu = static_cast<float*>(dgu.data);
  p.lgu = gate_up.stride[0];
  p.lga = ga.stride[0];
  p.ld = dgu.stride[0];
  p.T = T;
  p.I = I;
  constexpr int kThreads = 256;
  detail::silu_mul_backward_kernel<<<detail::grid_for(T * I, kThreads), kThreads, 0,
                                     static_cast<cudaStream_t>(stream)>>>(p);
  detail::check_launch(op);
}

// ---- B.7 Embedding --------------------------------------------------------------------------

void embedding_backward(const TensorView& ids, const TensorView& gh, const TokenOrder& order,
                        const TensorView& dtable, void* stream) {
  const char* op = "cuda::embedding_backward";
  const int64_t V = contract::check_embedding_backward(op, Device::kCUDA, ids, gh, order, dtable);
  const int64_t H = dtable.shape[1];
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  int64_t covered = 0;
  for (const TokenSeq& q : order.seqs()) covered += q.len;
  if (covered == 0) return;

  // The covered rows' ids, checked as on the CPU (padding rows' ids are never looked at).
  const std::vector<int64_t> id = read_ids(op, ids, order.rows(), st);
  struct Token {
    int64_t id, row;
  };
  std::vector<Token> tokens;  // canonical order (§B.1: sequences ascending, positions ascending)
  tokens.reserve(size_t(covered));
  for (const TokenSeq& q : order.seqs())
    for (int64_t t = q.row; t < q.row + q.len; ++t) {
      const int64_t v = id[size_t(t)];
      LS_CHECK(v >= 0 && v < V, op, "argument 'ids' element ", t, " = ", v,
               " is outside the vocabulary [0, ", V, ")");
      tokens.push_back({v, t});
    }
  // Group by id; stable, so each group keeps the canonical order.
  std::stable_sort(tokens.begin(), tokens.end(),
                   [](const Token& a, const Token& b) { return a.id < b.id; });
  std::vector<int64_t> rows, run_id, run_begin;
  rows.reserve(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (i == 0 || tokens[i].id != tokens[i - 1].id) {
      run_id.push_back(tokens[i].id);
      run_begin.push_back(int64_t(i));
    }
    rows.push_back(tokens[i].row);
  }
  run_begin.push_back(int64_t(tokens.size()));
  const int64_t runs = int64_t(run_id.size());
  LS_CHECK(runs <= int64_t(0x7fffffff), op, "too many distinct ids: ", runs);

  Scratch ws(op, st);
  detail::EmbedBwdParams p{};
  p.gh = static_cast<const float*>(gh.data);
  p.dtable = static_cast<float*>(dtable.data);
  p.rows = ws.upload(rows);
  p.run_id = ws.upload(run_id);
  p.run_begin = ws.upload(run_begin);
  p.lg = gh.stride[0];
  p.lt = dtable.stride[0];
  p.H = H;
  const int threads = int(std::min<int64_t>(kColumnThreads, (H + 31) / 32 * 32));
  const int64_t col_ctas = (H + threads - 1) / threads;
  LS_CHECK(col_ctas <= 65535, op, "hidden size too large: ", H);
  detail::embedding_backward_kernel<<<dim3(unsigned(runs), unsigned(col_ctas)), threads, 0, st>>>(
      p);
  detail::check_launch(op);
}

}  // namespace lockstep::cuda
