// `lockstep plan` (tools/plan_cmd.h). The GEMM planner is host code (src/cuda/gemm/plan.h), so the
// plan prints on a CPU-only build too; only the attention and log-prob launch descriptions need
// the CUDA library.
#include "tools/plan_cmd.h"

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cuda/gemm/plan.h"
#include "engine/config.h"
#include "lockstep/contract.h"
#include "tools/engine_setup.h"
#ifdef LOCKSTEP_WITH_CUDA
#include "lockstep/cuda/attention.h"
#include "lockstep/cuda/logprob.h"
#endif

namespace lockstep::tools {
namespace {

struct PlanFlags {
  ModelFlags model;
  ContractConfig contract = default_contract();
  int tp = 1;
  std::vector<int64_t> rows = {1, 16, 64, 1024, 4096, 16384};
};

// One layer GEMM as a rank launches it: column-parallel ones split N, row-parallel ones K (each
// rank a K-subtree of S/tp segments, an fp32 partial).
void print_gemm(const engine::GemmShape& g, const PlanFlags& f) {
  const GemmConfig gcfg = GemmConfig::for_layer(
      f.contract, g.row_parallel ? LayerRole::kRowParallel : LayerRole::kColumnParallel);
  const GemmKLayout kl = gemm_k_layout(gcfg, g.k);
  const int tp = g.row_parallel ? f.tp : 1;
  const int64_t n = g.row_parallel ? g.n : g.n / f.tp;
  const GemmKRange kr = gemm_tp_k_range(gcfg, g.k, tp, 0);
  std::printf("  %-8s N=%lld K=%lld S=%d (K padded to %lld, segments of %lld)%s\n", g.name,
              (long long)n, (long long)(kr.end - kr.begin), gcfg.segments / tp,
              (long long)kl.padded, (long long)kl.segment_len,
              tp > 1 ? ": a rank's fp32 partial, then the tree combine" : "");
  for (const int64_t m : f.rows) {
    cuda::GemmProblem p;
    p.M = m;
    p.N = n;
    p.K = kr.end - kr.begin;
    p.segments = gcfg.segments / tp;
    p.segment_len = kl.segment_len;
    p.partial = tp > 1;
    std::printf("    M=%-6lld %s\n", (long long)m, cuda::plan_gemm(p).to_string().c_str());
  }
}

int run_plan(const PlanFlags& f) {
  const engine::Qwen3Config cfg = model_config_of(f.model);
  const ContractConfig& c = f.contract;
  c.validate();
  LS_CHECK(c.gemm_segments % f.tp == 0, "lockstep plan", "--tp ", f.tp,
           " needs gemm_segments to be a multiple of it (row-parallel ranks own whole K "
           "segments), got gemm_segments=",
           c.gemm_segments);
  LS_CHECK(cfg.num_attention_heads % f.tp == 0, "lockstep plan", "--tp ", f.tp,
           " must divide the query heads (", cfg.num_attention_heads, ")");
  std::printf(
      "lockstep plan: the kernels of one forward (a function of the model, the contract "
      "and TP; never of the batch)\n");
  std::printf("  model     %s\n", cfg.to_string().c_str());
  std::printf("  contract  %s\n", c.to_string().c_str());
  std::printf("  tp        %d (per-rank shapes below)\n\n", f.tp);

  std::printf(
      "GEMM (cuda::gemm_bf16_nt, the same in every layer; the plan is a speed choice: every"
      " plan gives the same bits)\n");
  for (const engine::GemmShape& g : engine::qwen3_gemm_shapes(cfg)) print_gemm(g, f);

  const AttentionConfig acfg = AttentionConfig::from_contract(c);
  std::printf("\n%s, head_dim %lld, %lld query / %lld kv heads per rank\n",
              acfg.to_string().c_str(), (long long)cfg.head_dim,
              (long long)(cfg.num_attention_heads / f.tp),
              (long long)std::max<int64_t>(1, cfg.num_key_value_heads / f.tp));
  const LogprobVocabLayout lay = logprob_vocab_layout(c, cfg.vocab_size);
  std::printf(
      "logprob: V=%lld padded to %lld: %d segments of %lld tiles of %lld (tiles fold left "
      "to right in a segment, segments in a tree)\n",
      (long long)lay.vocab_size, (long long)lay.padded, lay.segments,
      (long long)lay.tiles_per_segment, (long long)lay.tile);
#ifdef LOCKSTEP_WITH_CUDA
  std::printf("\nCUDA launches\n  attention: %s\n  log-prob: %s\n",
              cuda::attention_launch_plan(acfg, cfg.num_attention_heads / f.tp,
                                          std::max<int64_t>(1, cfg.num_key_value_heads / f.tp),
                                          cfg.head_dim)
                  .c_str(),
              cuda::logprob_launch_plan(c, cfg.hidden_size, cfg.vocab_size).c_str());
#else
  std::printf(
      "\n(this binary has no CUDA backend: the attention and log-prob launch plans print "
      "in a CUDA build)\n");
#endif
  flush_stdout();
  return kExitOk;
}

}  // namespace

Command add_plan_command(CLI::App& top) {
  auto f = std::make_shared<PlanFlags>();
  CLI::App* sub = top.add_subcommand(
      "plan", "prints the kernel plan (GEMM per layer, attention, log-prob) a forward would run");
  add_model_options(*sub, f->model);
  add_contract_options(*sub, f->contract);
  sub->add_option("--tp", f->tp, "tensor-parallel degree (per-rank shapes)")
      ->transform(int_one_of({1, 2, 4, 8}))
      ->type_name("N")
      ->capture_default_str();
  sub->add_option("--rows", f->rows, "row counts M to plan the GEMMs for")
      ->transform(int_in(1, int64_t(1) << 30))
      ->type_name("M ...");
  return {sub, [f] {
            LS_CHECK(f->model.dir.empty() || f->model.shape == "default", "lockstep plan",
                     "--model and --model-shape exclude each other");
            return run_plan(*f);
          }};
}

}  // namespace lockstep::tools
