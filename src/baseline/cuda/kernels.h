// Launchers of the CUDA *baseline* kernels (src/cuda/baseline_*.cu): ordinary fast kernels as
// inference stacks run them (cuBLAS GEMMs whose algorithm depends on M, plain one-pass reductions,
// flash-decoding with a split-KV count chosen from the batch size). Not batch-invariant, not the
// contract: the performance peer of the invariant kernels (docs/baseline.md, "GPU").
//
// Plain C++ header (no CUDA types): `stream` is an opaque cudaStream_t (nullptr = the legacy
// default stream). Arguments are raw device pointers with element strides; the caller
// (src/engine/cuda/baseline_backend.cc) has checked shapes, dtypes and host metadata. Device
// metadata is trusted, but the kernels never read outside the tensors they are given: an invalid
// id / position / page / slot gives a zero or NaN result, never an out-of-bounds access.
// Every launcher checks the launch (and cuBLAS status) and throws lockstep::Error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace lockstep::cuda::baseline {

// ---------------------------------------------------------------------------------------------
// Runtime pieces (baseline_runtime.cu).

// One backend's cuBLAS handle (on the legacy default stream) and workspace, and the device's SM
// count (the flash-decoding split heuristic uses it, as real engines do).
class Context {
 public:
  Context();
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
  void* cublas() const { return handle_; }  // cublasHandle_t
  int num_sms() const { return num_sms_; }
  std::string summary() const;  // "baseline cuda: 132 SMs, cuBLAS 13.0.0, workspace 32 MiB"

 private:
  void* handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  int num_sms_ = 1;
};

// Stream-ordered scratch memory (cudaMallocAsync / cudaFreeAsync on `stream`).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(size_t bytes, void* stream);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), stream_(o.stream_) { o.p_ = nullptr; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return p_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  void* p_ = nullptr;
  void* stream_ = nullptr;
};

// Host -> device / device -> host copies and a fill, on `stream` (host memory: see cudaMemcpyAsync;
// pageable sources are staged before the call returns).
void upload(void* dst, const void* src, size_t bytes, void* stream);
void download(void* dst, const void* src, size_t bytes, void* stream);
void fill_bytes(void* dst, int value, size_t bytes, void* stream);
void stream_synchronize(void* stream, const char* op);

// ---------------------------------------------------------------------------------------------
// Argument shapes.

// A 1-D index array on the device: i32 or i64 elements `stride` elements apart.
struct Index {
  const void* p = nullptr;
  int64_t stride = 1;
  bool i64 = false;
};

// Rows of a 2-D [R, C] or 3-D [T, inner, C] view (last dim contiguous), flattened: row r starts at
// p + (r / inner)·s0 + (r % inner)·s1 elements.
struct Rows {
  void* p = nullptr;
  int64_t s0 = 0, s1 = 0, inner = 1;
};

// A [rows, heads, D] view (last dim contiguous): element (r, h, d) at p + r·s0 + h·s1 + d.
template <typename T>
struct Heads {
  T* p = nullptr;
  int64_t s0 = 0, s1 = 0;
};

// A KV cache [NP, P, Hkv, D] (last dim contiguous), strides in elements.
struct Cache {
  const void* p = nullptr;
  int64_t s0 = 0, s1 = 0, s2 = 0;
};

// The per-row f32 outputs of the log-prob ops, each `s_*` elements apart.
struct RowOutputs {
  float* logp;
  int64_t s_logp;
  float* lse;
  int64_t s_lse;
  float* entropy;
  int64_t s_entropy;
};

// ---------------------------------------------------------------------------------------------
// GEMM and sums (baseline_gemm.cu).

// y[M, N] = x[M, K] · w[N, K]ᵀ by cublasGemmEx: bf16 inputs, fp32 compute (CUBLAS_COMPUTE_32F,
// CUBLAS_GEMM_DEFAULT: cuBLAS picks the algorithm, split-K included, from M, N, K), y bf16 or f32.
// Leading dimensions in elements (>= K, >= K, >= N). K = 0 writes zeros.
void gemm(const Context& ctx, const void* x, int64_t ldx, const void* w, int64_t ldw, void* y,
          int64_t ldy, bool y_f32, int64_t M, int64_t N, int64_t K, void* stream);

constexpr int kMaxParts = 16;
// y[m, n] = ((p0 + p1) + p2) + ... in fp32, rank order, one rounding (bf16) or f32. parts are
// [M, N] (row strides lds), f32 or bf16 (parts_bf16). y may be the same memory as parts[0].
void sum_parts(const void* const* parts, bool parts_bf16, const int64_t* lds, int n, int64_t M,
               int64_t N, void* y, int64_t ldy, bool y_f32, void* stream);

// ---------------------------------------------------------------------------------------------
// Elementwise (baseline_elementwise.cu).

// y = bf16(bf16(s · r) · w), r = rsqrt(Σs²/H + eps) (one warp per row, shuffle reduction), over
// s = x, or, with a residual (residual.p not null), s = bf16(x + residual), written to
// residual_out.
void rmsnorm(Rows x, Rows residual, const void* w, Rows residual_out, Rows y, int64_t rows,
             int64_t H, float eps, void* stream);
// x, y [T, heads, D] as Rows with inner = heads. cos/sin of pos · inv_freq in fp32 on the device
// (inv_freq = 1 / powf(theta, 2i / D)), rotate-half, one rounding. y may be x.
void rope(Rows x, Index positions, Rows y, int64_t T, int64_t heads, int64_t D, float theta,
          void* stream);
// out = bf16(g / (1 + exp(-g)) · u).
void silu_mul(const void* gate, int64_t ldg, const void* up, int64_t ldu, void* out, int64_t ldo,
              int64_t T, int64_t I, void* stream);
// out[t] = table[ids[t] - row_begin] when that is in [0, table_rows), else +0 (also for an invalid
// device id).
void embedding(Index ids, const void* table, int64_t ldt, int64_t row_begin, int64_t table_rows,
               void* out, int64_t ldo, int64_t T, int64_t H, void* stream);

// ---------------------------------------------------------------------------------------------
// Attention (baseline_attention.cu).

// Packed varlen causal prefill: flash-attention style (mma.sync bf16, fp32 online softmax in
// base 2 with exp2f, P rounded to bf16 for the PV product), 64 query rows x 64 keys per step.
struct PrefillArgs {
  Heads<const void> q, k, v;
  const int32_t* cu_seqlens;  // [B + 1] on the device, `cu_s` elements apart
  int64_t cu_s;
  int64_t B, T, Hq, Hkv, D;
  float scale_log2;  // softmax_scale · log2(e)
  Heads<void> out;
  Heads<float> lse;  // p nullptr: not wanted
};
void attention_prefill(const PrefillArgs& a, void* stream);

// Paged attention (decode and chunked prefill), flash-decoding: one CTA per (row, kv head, group
// of up to 4 query heads, split); a row's keys [0, q_pos + 1) are cut into `splits` ranges of
// whole 64-key blocks; with more than one split, per-split (m, l, acc) states go to scratch and a
// second kernel merges them in split order.
struct PagedArgs {
  Heads<const void> q;
  Cache k_cache, v_cache;
  const int32_t* block_table;  // [S, MP] (row stride bt_s0), device
  int64_t bt_s0, S, MP, NP, P;
  const int32_t* q_seq;  // [N], device, qseq_s elements apart
  const int32_t* q_pos;  // [N], qpos_s elements apart
  int64_t qseq_s, qpos_s;
  // Prefix sharing (cascade), or nullptrs.
  const int32_t* prefix_table = nullptr;  // [GR, MPs]
  int64_t pt_s0 = 0, GR = 0, MPs = 0;
  const int32_t* shared_len = nullptr;  // [GR], sl_s elements apart
  const int32_t* seq_group = nullptr;   // [S], sg_s elements apart
  int64_t sl_s = 1, sg_s = 1;
  int64_t N, Hq, Hkv, D;
  float scale_log2;
  int splits;
  Heads<void> out;
  Heads<float> lse;  // p nullptr: not wanted
};
void attention_paged(const PagedArgs& a, void* stream);
constexpr int kPagedBlock = 64;  // keys per step of the paged kernel
constexpr int kPagedMaxSplits = 64;
// The split count real engines pick: about 8 CTAs per SM (several waves, so that one CTA's loads
// overlap another's math), at most one split per 64-key block of the longest context. Fewer
// rows -> more splits: a row's bits depend on it.
int paged_num_splits(int64_t rows, int64_t Hkv, int64_t group, int64_t max_ctx, int num_sms);

// ---------------------------------------------------------------------------------------------
// Log-probs and sampling (baseline_logprob.cu).

// Softmax statistics of rows of fp32 logits z[rows, V] (row stride ldz), y = z / temperature:
// M = max, s = Σ exp(y − M), w = Σ exp(y − M)·(y − M) (one block per row, two passes).
// logp = y[target] − lse (+0 when target == ignore_index, NaN when a device target is outside
// [0, V)), lse = M + log s, entropy = log s − w / s. Outputs strided (elements).
struct StatsArgs {
  const float* z;
  int64_t ldz, rows, V;
  float temperature;
  Index targets;  // rows' targets (already offset to the first row)
  int64_t ignore_index;
  RowOutputs out;
};
void logprob_rows(const StatsArgs& a, void* stream);

// A vocab shard's states (m, s, w, y_target) of rows of z[rows, Vs] (shard rows [v0, v0 + Vs)
// of the vocab): y_target = y[target − v0] when the target lies in the shard, else NaN.
// Vs == 0 writes empty states (−inf, 0, 0, NaN).
struct PartialArgs {
  const float* z;
  int64_t ldz, rows, Vs, v0;
  float temperature;
  Index targets;
  int64_t ignore_index;
  float* state;  // [rows, 4] (row stride ld_state)
  int64_t ld_state;
};
void logprob_partial_rows(const PartialArgs& a, void* stream);

// Combines [R, T, 4] states in rank order: M = max m_r, S = Σ s_r·e^(m_r − M),
// W = Σ (w_r + (m_r − M)·s_r)·e^(m_r − M); lse = M + log S, entropy = log S − W / S,
// logp = states[target / rank_len][t][3] − lse.
struct CombineArgs {
  const float* states;
  int64_t st_sR, st_sT, R, T, rank_len, V;
  Index targets;
  int64_t ignore_index;
  RowOutputs out;
};
void logprob_combine(const CombineArgs& a, void* stream);

// One row's sampling settings, as the kernels read them.
struct SampleRow {
  uint64_t seed;
  int64_t top_k;      // 0 or >= V: off
  float temperature;  // 0: greedy
  float top_p;        // 1: off
  float min_p;        // 0: off
  int32_t filtered;   // top-k / top-p / min-p active (temperature > 0)
};
// Samples rows [0, rows) of z[rows, V] (overwritten with y = z / T): stats as logprob_rows,
// greedy argmax (lowest index on ties), or Gumbel-max with the invariant sampler's Philox noise
// (sampling_gumbel) over all ids or, for filtered rows, over the candidates left by top-k, top-p
// and min-p on a (CUB segmented radix) sorted copy of the row. `filtered_rows` lists (on the
// host) the rows with filters. A row with a non-finite lse sets *bad_row (device, atomicMin) and
// writes nothing.
struct SampleArgs {
  float* z;
  int64_t ldz, rows, V;
  const SampleRow* params;  // [rows], device
  Index request_ids, positions;
  void* token_ids;
  int64_t s_ids;
  bool ids_i64;
  RowOutputs out;
  uint32_t* bad_row;    // device: the smallest row index that could not be sampled, or UINT32_MAX
  uint32_t row_offset;  // added to a row index written to *bad_row
};
void sample_rows(const SampleArgs& a, const int32_t* filtered_rows_host, int64_t n_filtered,
                 void* stream);

}  // namespace lockstep::cuda::baseline
