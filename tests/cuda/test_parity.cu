// The GPU parity program: every case of the op-case table (tests/ops/op_cases.cc: GEMM public entry
// and TP partial + combine, RMSNorm (+residual), RoPE, SiLU-and-mul, embedding (+ vocab-parallel),
// attention in every mode, kv_cache_write, linear log-prob (+ partial / combine), sampling) on the
// CUDA backend, compared bit for bit with the CPU reference (memcmp of whole output buffers,
// padding included: both sides start poisoned with 0xA5); outside --quick also every invariance
// relation of each case on the GPU. Then the scenario checks that are not table cases
// (test_parity/elementwise_checks.cu, test_parity/attention_checks.cu: argument errors, device
// metadata and ids, negative control, every bf16 gate, cross-mode GPU invariance, ...).
// No CUDA device: exits 2 with a message. --quick: the quick cases and small scenario sizes
// (compute-sanitizer). --seed N (or N): replay. --filter S: only the table cases whose name holds S
// and the scenario sections whose name does ("scenario attention"). Ends with "N passed, M failed
// (test_parity)" and the counts per op; exits 1 on any failure.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cuda/gpu_harness.h"
#include "lockstep/cuda/attention.h"
#include "lockstep/cuda/backward.h"
#include "lockstep/cuda/elementwise.h"
#include "lockstep/cuda/gemm.h"
#include "lockstep/cuda/logprob.h"
#include "lockstep/cuda/runtime.h"
#include "ops/op_case.h"

void run_elementwise_checks();  // test_parity/elementwise_checks.cu
void run_attention_checks();    // test_parity/attention_checks.cu

namespace lockstep::cases {
namespace {

using gpu_test::report;

class CudaMem final : public Mem {
 public:
  ~CudaMem() override { release_all(); }
  Device device() const override { return Device::kCUDA; }

 protected:
  void* alloc_raw(size_t bytes) override {
    void* p = nullptr;
    CK(cudaMalloc(&p, bytes));
    CK(cudaMemset(p, 0xA5, bytes));
    return p;
  }
  void free_raw(void* p) override { cudaFree(p); }
  void put(void* d, const void* s, size_t n) override {
    CK(cudaMemcpy(d, s, n, cudaMemcpyHostToDevice));
  }
  void get(void* d, const void* s, size_t n) override {
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(d, s, n, cudaMemcpyDeviceToHost));
  }
};

// The CUDA entry points (lockstep::cuda::*), each followed by a synchronize that throws on a
// pending CUDA error, so an asynchronous fault is charged to the op that caused it.
class CudaOps final : public Ops {
 public:
  std::string name() const override { return "cuda"; }
  void gemm(const TensorView& x, const TensorView& w, const TensorView* bias, const GemmConfig& cfg,
            const TensorView& y) override {
    cuda::gemm_bf16_nt(x, w, bias, cfg, y);
    cuda::synchronize();
  }
  void gemm_partial(const TensorView& x, const TensorView& w, int64_t k_total, int tp, int rank,
                    const GemmConfig& cfg, const TensorView& y) override {
    cuda::gemm_bf16_nt_partial(x, w, k_total, tp, rank, cfg, y);
    cuda::synchronize();
  }
  void gemm_combine(const std::vector<TensorView>& partials, const TensorView* bias,
                    const TensorView& y) override {
    cuda::gemm_tree_combine(partials, bias, y);
    cuda::synchronize();
  }
  void rmsnorm(const TensorView& x, const TensorView& w, const RmsNormConfig& cfg,
               const TensorView& y) override {
    cuda::rmsnorm(x, w, cfg, y);
    cuda::synchronize();
  }
  void rmsnorm_residual(const TensorView& x, const TensorView& res, const TensorView& w,
                        const RmsNormConfig& cfg, const TensorView& res_out,
                        const TensorView& y) override {
    cuda::rmsnorm_residual(x, res, w, cfg, res_out, y);
    cuda::synchronize();
  }
  // The table's cos / sin go to the device once per call (the CUDA op takes device views).
  void rope(const TensorView& x, const TensorView& pos, const RopeTable& table,
            const TensorView& y) override {
    const TensorView hc = table.cos_view(), hs = table.sin_view();
    Tensor dc = cuda::empty(DType::kF32, {hc.shape[0], hc.shape[1]});
    Tensor ds = cuda::empty(DType::kF32, {hs.shape[0], hs.shape[1]});
    cuda::copy(dc.view(), hc);
    cuda::copy(ds.view(), hs);
    cuda::rope(x, pos, dc.view(), ds.view(), y);
    cuda::synchronize();
  }
  void silu_mul(const TensorView& g, const TensorView& u, const TensorView& out) override {
    cuda::silu_mul(g, u, out);
    cuda::synchronize();
  }
  void embedding(const TensorView& ids, const TensorView& table, const TensorView& out) override {
    cuda::embedding(ids, table, out);
    cuda::synchronize();
  }
  void embedding_vocab_parallel(const TensorView& ids, const TensorView& table,
                                const VocabShard& shard, int64_t vocab,
                                const TensorView& out) override {
    cuda::embedding_vocab_parallel(ids, table, shard, vocab, out);
    cuda::synchronize();
  }
  void embedding_combine(const std::vector<TensorView>& partials, const TensorView& out) override {
    cuda::embedding_combine(partials, out);
    cuda::synchronize();
  }
  void attention_prefill_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                                const TensorView& cu, const AttentionConfig& cfg,
                                const TensorView& out, const TensorView& lse) override {
    cuda::attention_prefill_varlen(q, k, v, cu, cfg, out, lse);
    cuda::synchronize();
  }
  void attention_paged(const TensorView& q, const TensorView& q_seq, const TensorView& q_pos,
                       const PagedKv& kv, const AttentionConfig& cfg, const TensorView& out,
                       const TensorView& lse) override {
    cuda::attention_paged(q, q_seq, q_pos, kv, cfg, out, lse);
    cuda::synchronize();
  }
  void attention_paged_split_kv(const TensorView& q, const TensorView& q_seq,
                                const TensorView& q_pos, const PagedKv& kv,
                                const AttentionConfig& cfg, int splits, const TensorView& out,
                                const TensorView& lse) override {
    cuda::attention_paged_split_kv(q, q_seq, q_pos, kv, cfg, splits, out, lse);
    cuda::synchronize();
  }
  void attention_paged_cascade(const TensorView& q, const TensorView& q_seq,
                               const TensorView& q_pos, const PagedKv& kv,
                               const SharedPrefix& prefix, const AttentionConfig& cfg,
                               const TensorView& out, const TensorView& lse) override {
    cuda::attention_paged_cascade(q, q_seq, q_pos, kv, prefix, cfg, out, lse);
    cuda::synchronize();
  }
  void attention_paged_chunk_states(const TensorView& q, const TensorView& q_seq,
                                    const TensorView& q_pos, const PagedKv& kv,
                                    const AttentionConfig& cfg, int64_t chunk_begin,
                                    const AttentionChunkStates& states) override {
    cuda::attention_paged_chunk_states(q, q_seq, q_pos, kv, cfg, chunk_begin, states);
    cuda::synchronize();
  }
  void attention_merge_chunk_states(const AttentionChunkStates& states, const TensorView& q_pos,
                                    const AttentionConfig& cfg, const TensorView& out,
                                    const TensorView& lse) override {
    cuda::attention_merge_chunk_states(states, q_pos, cfg, out, lse);
    cuda::synchronize();
  }
  void kv_cache_write(const TensorView& k, const TensorView& v, const TensorView& slots,
                      const TensorView& k_cache, const TensorView& v_cache) override {
    cuda::kv_cache_write(k, v, slots, k_cache, v_cache);
    cuda::synchronize();
  }
  void linear_logprob(const TensorView& h, const TensorView& w, const TensorView& targets,
                      const LogprobParams& p, const ContractConfig& cfg, const TensorView& logp,
                      const TensorView& lse, const TensorView& entropy) override {
    cuda::linear_logprob(h, w, targets, p, cfg, logp, lse, entropy);
    cuda::synchronize();
  }
  void linear_logprob_partial(const TensorView& h, const TensorView& w_shard,
                              const TensorView& targets, const LogprobParams& p,
                              const ContractConfig& cfg, const LogprobShard& shard,
                              const TensorView& state) override {
    cuda::linear_logprob_partial(h, w_shard, targets, p, cfg, shard, state);
    cuda::synchronize();
  }
  void linear_logprob_combine(const TensorView& states, const TensorView& targets,
                              const LogprobParams& p, const ContractConfig& cfg, int64_t vocab,
                              const TensorView& logp, const TensorView& lse,
                              const TensorView& entropy) override {
    cuda::linear_logprob_combine(states, targets, p, cfg, vocab, logp, lse, entropy);
    cuda::synchronize();
  }
  void sample(const TensorView& h, const TensorView& w, std::span<const SamplingParams> params,
              const TensorView& request_ids, const TensorView& positions, const ContractConfig& cfg,
              const TensorView& token_ids, const TensorView& logp, const TensorView& lse,
              const TensorView& entropy) override {
    cuda::sample(h, w, params, request_ids, positions, cfg, token_ids, logp, lse, entropy);
    cuda::synchronize();
  }
  void gemm_dx(const TensorView& dy, const TensorView& w, const GemmConfig& cfg,
               const TensorView& dx) override {
    cuda::gemm_bf16_dx(dy, w, cfg, dx);
    cuda::synchronize();
  }
  void gemm_dx_partial(const TensorView& dy_shard, const TensorView& w_shard, int64_t n_total,
                       int tp, int rank, const GemmConfig& cfg,
                       const TensorView& dx_partial) override {
    cuda::gemm_bf16_dx_partial(dy_shard, w_shard, n_total, tp, rank, cfg, dx_partial);
    cuda::synchronize();
  }
  void gemm_dw(const TensorView& dy, const TensorView& x, const TokenOrder& order,
               const TensorView& dw) override {
    cuda::gemm_bf16_dw(dy, x, order, dw);
    cuda::synchronize();
  }
  void rmsnorm_backward(const TensorView& s, const TensorView& w, const RmsNormConfig& cfg,
                        const TensorView& gy, const TensorView& dx, const TokenOrder* order,
                        const TensorView* dweight) override {
    cuda::rmsnorm_backward(s, w, cfg, gy, dx, order, dweight);
    cuda::synchronize();
  }
  void rmsnorm_residual_backward(const TensorView& s, const TensorView& w, const RmsNormConfig& cfg,
                                 const TensorView& gy, const TensorView& gres, const TensorView& ds,
                                 const TokenOrder* order, const TensorView* dweight) override {
    cuda::rmsnorm_residual_backward(s, w, cfg, gy, gres, ds, order, dweight);
    cuda::synchronize();
  }
  void rope_backward(const TensorView& gy, const TensorView& pos, const RopeTable& table,
                     const TensorView& dx) override {
    const TensorView hc = table.cos_view(), hs = table.sin_view();
    Tensor dc = cuda::empty(DType::kF32, {hc.shape[0], hc.shape[1]});
    Tensor ds = cuda::empty(DType::kF32, {hs.shape[0], hs.shape[1]});
    cuda::copy(dc.view(), hc);
    cuda::copy(ds.view(), hs);
    cuda::rope_backward(gy, pos, dc.view(), ds.view(), dx);
    cuda::synchronize();
  }
  void silu_mul_backward(const TensorView& gate_up, const TensorView& ga,
                         const TensorView& dgu) override {
    cuda::silu_mul_backward(gate_up, ga, dgu);
    cuda::synchronize();
  }
  void embedding_backward(const TensorView& ids, const TensorView& gh, const TokenOrder& order,
                          const TensorView& dtable) override {
    cuda::embedding_backward(ids, gh, order, dtable);
    cuda::synchronize();
  }
  void linear_logprob_backward(const TensorView& h, const TensorView& w, const TensorView& targets,
                               const LogprobParams& p, const ContractConfig& cfg,
                               const TensorView& lse, const TensorView& entropy,
                               const TensorView& g_lp, const TensorView* g_ent,
                               const TensorView& dh, const TokenOrder& order,
                               const TensorView& dw) override {
    cuda::linear_logprob_backward(h, w, targets, p, cfg, lse, entropy, g_lp, g_ent, dh, order, dw);
    cuda::synchronize();
  }
  // The library's entry: the one pass where it applies (rows in place, vocab_tile a multiple of
  // 16), else the definition (forward, then backward); the calls that took the one pass counted.
  void linear_logprob_backward_recompute(const TensorView& h, const TensorView& w,
                                         const TensorView& targets, const LogprobParams& p,
                                         const ContractConfig& cfg, const TensorView& lse,
                                         const TensorView& entropy, const TensorView& g_lp,
                                         const TensorView* g_ent, const TensorView& dh,
                                         const TokenOrder& order, const TensorView& dw,
                                         const TensorView& logp_out, const TensorView& lse_out,
                                         const TensorView& entropy_out) override {
    one_passes +=
        cuda::linear_logprob_backward_recompute(h, w, targets, p, cfg, lse, entropy, g_lp, g_ent,
                                                dh, order, dw, logp_out, lse_out, entropy_out)
            ? 1
            : 0;
    cuda::synchronize();
  }
  int64_t one_passes = 0;  // calls that ran the one pass (the summary says how many)
  // cu: the host view of the case (Mem::host); validated here as on the CPU.
  void attention_backward_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                                 const TensorView& out, const TensorView& lse,
                                 const TensorView& dout, const TensorView& cu,
                                 const AttentionConfig& cfg, const TensorView& dq,
                                 const TensorView& dk, const TensorView& dv) override {
    const PackedSeqs seqs = PackedSeqs::validate("attention_backward_varlen", cu, q.shape[0]);
    cuda::attention_backward_varlen(q, k, v, out, lse, dout, seqs, cfg, dq, dk, dv);
    cuda::synchronize();
  }
  // cu, prompt_of: the case's host views; validated here as on the CPU.
  void attention_prefill_shared(const TensorView& q, const TensorView& k, const TensorView& v,
                                const TensorView& cu, const TensorView& prompt_of,
                                const AttentionConfig& cfg, const TensorView& out,
                                const TensorView& lse) override {
    const SharedPromptSeqs segs =
        SharedPromptSeqs::validate("attention_prefill_shared", cu, prompt_of, q.shape[0]);
    cuda::attention_prefill_shared(q, k, v, segs, cfg, out, lse);
    cuda::synchronize();
  }
  void attention_backward_shared(const TensorView& q, const TensorView& k, const TensorView& v,
                                 const TensorView& out, const TensorView& lse,
                                 const TensorView& dout, const TensorView& cu,
                                 const TensorView& prompt_of, const AttentionConfig& cfg,
                                 const TensorView& dq, const TensorView& dk,
                                 const TensorView& dv) override {
    const SharedPromptSeqs segs =
        SharedPromptSeqs::validate("attention_backward_shared", cu, prompt_of, q.shape[0]);
    cuda::attention_backward_shared(q, k, v, out, lse, dout, segs, cfg, dq, dk, dv);
    cuda::synchronize();
  }
};

// Every table case on the GPU vs the CPU reference: one check per output buffer; outside --quick
// also each relation of the case on the GPU (one check per comparison it makes).
void run_table() {
  const auto table = op_cases();
  auto cpu = cpu_ops();
  CudaOps gpu;
  int skipped = 0;
  for (size_t i = 0; i < table.size(); ++i) {
    OpCase& c = *table[i];
    if ((gpu_test::g_quick && !c.quick()) ||
        c.name().find(gpu_test::g_filter) == std::string::npos) {
      ++skipped;
      continue;
    }
    gpu_test::section("table " + c.op(), [&] {
      c.build(gpu_test::g_seed + i);
      auto cm = cpu_mem();
      const Outputs want = c.run(*cpu, *cm);
      Outputs got;
      {
        CudaMem gm;
        got = c.run(gpu, gm);
      }
      if (got.size() != want.size()) {
        report(false, c.name() + ": " + std::to_string(got.size()) + " outputs, cpu " +
                          std::to_string(want.size()));
        return;
      }
      for (size_t o = 0; o < got.size(); ++o) {
        const Verdict v = compare_outputs(got[o], want[o]);
        report(v.ok, c.name() + " " + got[o].name + " gpu == cpu");
        if (!v.ok) std::printf("  mismatch: %s\n", v.message.c_str());
      }
      if (gpu_test::g_quick) return;
      for (const Relation& r : c.relations()) {
        CudaMem gm;
        r.run(gpu, gm, got, [&](const std::string& what, const Verdict& v) {
          report(v.ok, c.name() + " gpu invariance: " + r.name + ": " + what);
          if (!v.ok) std::printf("  mismatch: %s\n", v.message.c_str());
        });
      }
    });
  }
  std::printf("table: %zu cases, %d skipped (--quick / --filter)\n", table.size(), skipped);
  // The relation "the one pass == forward + backward" of the log-prob backward's cases must have
  // run the one pass (not only its fallback) somewhere.
  if (!gpu_test::g_quick && gpu_test::g_filter.empty())
    report(gpu.one_passes > 0,
           "the one-pass log-prob backward ran (" + std::to_string(gpu.one_passes) + " calls)");
}

}  // namespace
}  // namespace lockstep::cases

int main(int argc, char** argv) {
  namespace gt = lockstep::gpu_test;
  if (!gt::start("test_parity", argc, argv)) return 2;
  const auto t0 = std::chrono::steady_clock::now();
  lockstep::cases::run_table();
  // --filter names table cases ("gemm/M17", "attention_paged") or a scenario section ("scenario").
  for (auto [name, fn] : {std::pair{"scenario elementwise", &run_elementwise_checks},
                          std::pair{"scenario attention", &run_attention_checks}})
    if (std::string(name).find(gt::g_filter) != std::string::npos) gt::section(name, fn);
  std::printf("test_parity: %.1f s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return gt::finish("test_parity");
}
