// The audit's workload and its two pipelines: the generated requests (random-token prompts x GRPO
// groups, per-group sampling, a permuted arrival order, all from fixed seeds, the same on every
// machine), the rollout that samples them (rollout.h, one configuration) and the training forward
// that recomputes their log-probs (trainer.h, another), then the comparison (audit_compare.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/audit_compare.h"
#include "engine/backend.h"
#include "engine/model.h"
#include "engine/ranks.h"
#include "engine/rollout.h"
#include "engine/trainer.h"
#include "lockstep/contract.h"

namespace lockstep::engine {

// The contract the audit (and every `lockstep` subcommand) starts from. Segments cover TP up to 4
// on both sides; kv_chunk 64 (the smallest legal chunk) so that the audit's short sequences span
// several KV chunks and split-KV / cascade really split.
inline ContractConfig audit_default_contract() {
  ContractConfig c;
  c.gemm_segments = 4;
  c.vocab_segments = 4;
  c.kv_chunk = 64;
  return c;
}

// Everything an audit run depends on. Defaults are the `lockstep audit` defaults.
struct AuditConfig {
  // Workload: `prompts` prompts of random token ids (there is no tokenizer) x `group_size` samples.
  int64_t prompts = 64;
  int64_t group_size = 8;
  int64_t prompt_len_min = 8, prompt_len_max = 80;
  int64_t max_new_tokens = 96;
  uint64_t seed = 1;           // prompts, sampling seed, default arrival and packing orders
  bool mixed_sampling = true;  // per-group settings from a fixed table (mixed_sampling_params) ...
  SamplingParams sampling;     // ... or these for every request (seed is taken from `seed`)
  bool stop_on_eos = true;

  // Rollout side.
  int rollout_tp = 2;
  // How the rollout's TP ranks run (engine/ranks.h): simulated (one model holds and runs every
  // rank's shards); threads (one rank-local model per rank on its own thread, exchanging its
  // parts over the thread transport, dist::run_ranks); launch (this process is one rank of a job
  // of rollout_tp processes: one rank-local model over the job's communicator, run_audit_side's
  // `job`). threads and launch are the code path of multi-GPU TP, on host memory (CPU backends).
  // Every rank's records are checked equal to rank 0's (launch: by their sha256); rank 0's are
  // compared.
  RankMode rollout_ranks = RankMode::kSimulated;
  RolloutConfig rollout;        // kv.num_pages 0 = enough for max_running full sequences
  uint64_t arrival_seed = 0;    // permutation of the arrival order; 0 = in order
  int64_t arrival_stagger = 1;  // steps between consecutive groups' arrivals (0: all at once)

  // Training side.
  int train_tp = 1;
  RankMode train_ranks = RankMode::kSimulated;  // as rollout_ranks, for the training forward
  PackingConfig packing;

  // The deployment's contract (both sides). gemm/vocab segments must be >= both TP degrees.
  ContractConfig contract = audit_default_contract();

  bool localize = false;  // replay the first mismatching token with activation traces

  AuditConfig();  // sets the audit's defaults for the nested configs
  void validate() const;
  // Lines "rollout: ...", "training: ...", "workload: ..." for reports.
  std::string rollout_string() const;
  std::string training_string() const;
  std::string workload_string() const;
};

// The audit's requests: ids prompt * group_size + g, group = prompt, arrival by the arrival order.
std::vector<RolloutRequest> make_audit_requests(const AuditConfig& cfg, const Qwen3Config& model);

// KV pages for rollout.kv.num_pages == 0: half of what max_running full-length sequences need (so
// long runs preempt), at least what the longest sequence needs alone.
int64_t audit_auto_kv_pages(const AuditConfig& cfg);

// The sampling settings of prompt group k under mixed sampling (a fixed cycle).
SamplingParams mixed_sampling_params(int64_t group, uint64_t seed);

// One column of the report: the whole pipeline with one backend (or, cross-device, the rollout on
// one backend and the training forward on another), and its comparison (the base).
struct AuditSide : LogprobComparison {
  std::string backend;  // column label: "invariant", "invariant@cuda", "invariant@cuda/cpu", ...
  std::string rollout_backend, train_backend;  // OpsBackend::name() of each side
  std::string rollout_device, train_device;    // "cpu" | "cuda"
  double rollout_seconds = 0, train_seconds = 0;
  int64_t generated_tokens = 0;  // rollout: sampled tokens
  int64_t train_tokens = 0;      // training forward: packed tokens
  SchedulerStats rollout_stats;
  int64_t cascade_rows = 0;  // RolloutResult::cascade_rows
  int64_t micro_batches = 0;
  // Digests of what each side computed (records_sha256): equal whatever the TP layout and rank
  // mode, so runs can be compared by them.
  std::string rollout_sha256, train_sha256;
  std::optional<Localization> localization;
};

// sha256 (64 hex digits) of a rollout's records: per completion in order its id, finish reason,
// tokens and the fp32 bits of its log-probs, logsumexps and entropies (little-endian, each list
// after its length). Timings and statistics are not included.
std::string records_sha256(const RolloutResult& r);
// The same of a training forward's per-sequence log-probs, logsumexps and entropies.
std::string records_sha256(const TrainResult& r);

// Makes the model for one side: (tp, backend, comm) -> Model with the audit's contract; comm
// nullptr: simulated TP, else a rank-local model of that communicator's job.
using ModelFactory = std::function<std::unique_ptr<Model>(
    int tp, std::shared_ptr<OpsBackend> backend, dist::Communicator* comm)>;

struct AuditHooks {
  std::function<void(const std::string&)> log;  // progress lines (no newline)
  double progress_every_s = 5.0;
};

// Runs rollout and training with `backend` (both sides), compares, localizes if asked.
// `job`: this process's rank of a launched job, required when a side's ranks are kLaunch (its
// size must be that side's TP degree) and unused otherwise. Every rank of the job runs this call
// with the same arguments: the launched side as its rank, everything else (the other side, the
// comparison, the localization) identically on every rank, so every rank returns the same side.
AuditSide run_audit_side(const AuditConfig& cfg, const ModelFactory& make_model,
                         std::shared_ptr<OpsBackend> backend, const AuditHooks& hooks = {},
                         dist::Communicator* job = nullptr);
// Cross-device (or cross-backend) form: the rollout runs on `rollout_backend`, the training
// forward on `train_backend` (e.g. rollout on the GPU, training on the CPU).
AuditSide run_audit_side(const AuditConfig& cfg, const ModelFactory& make_model,
                         std::shared_ptr<OpsBackend> rollout_backend,
                         std::shared_ptr<OpsBackend> train_backend, const AuditHooks& hooks = {},
                         dist::Communicator* job = nullptr);
// The column label of a side (see AuditSide::backend).
std::string audit_side_label(const OpsBackend& rollout, const OpsBackend& train);

// The CPU baseline backend (ordinary, non-invariant kernels), shared.
std::shared_ptr<OpsBackend> shared_baseline_backend();

}  // namespace lockstep::engine
