// The audit's workload (requests from fixed seeds) and one side's run: rollout, training forward,
// comparison, localization. See audit_workload.h.
#include "engine/audit_workload.h"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "baseline/cpu/backend.h"
#include "core/philox.h"
#include "dist/thread_transport.h"
#include "engine/sha256.h"
#include "lockstep/error.h"

namespace lockstep::engine {

namespace {

constexpr const char* kOp = "audit";

// Portable generator (Philox): the workload is the same on every machine.
struct Gen {
  uint64_t key;
  uint32_t stream;
  uint64_t n = 0;
  uint32_t next() {
    const Philox4 r = philox4x32_10(Philox4{{uint32_t(n), uint32_t(n >> 32), stream, 0x61756474u}},
                                    uint32_t(key), uint32_t(key >> 32));
    ++n;
    return r.v[0];
  }
  uint64_t below(uint64_t m) { return ((uint64_t(next()) << 32) | next()) % m; }
};

std::vector<int64_t> permutation(int64_t n, uint64_t seed) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[size_t(i)] = i;
  if (seed == 0) return order;
  Gen g{seed, 1};
  for (int64_t i = n; i > 1; --i)
    std::swap(order[size_t(i - 1)], order[size_t(g.below(uint64_t(i)))]);
  return order;
}

// Bytes of a float vector, for memcmp.
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// Two training forwards computed the same fp32 bits for every sequence.
bool same_records(const TrainResult& a, const TrainResult& b) {
  if (a.sequences.size() != b.sequences.size()) return false;
  for (size_t i = 0; i < a.sequences.size(); ++i) {
    const TrainTokens &x = a.sequences[i], &y = b.sequences[i];
    if (!same_bits(x.logp, y.logp) || !same_bits(x.lse, y.lse) || !same_bits(x.entropy, y.entropy))
      return false;
  }
  return true;
}

// Two rollouts recorded the same tokens, finish reasons and fp32 bits for every request.
bool same_records(const RolloutResult& a, const RolloutResult& b) {
  if (a.completions.size() != b.completions.size()) return false;
  for (size_t i = 0; i < a.completions.size(); ++i) {
    const Completion &x = a.completions[i], &y = b.completions[i];
    if (x.id != y.id || x.tokens != y.tokens || x.finish != y.finish ||
        !same_bits(x.logp, y.logp) || !same_bits(x.lse, y.lse) || !same_bits(x.entropy, y.entropy))
      return false;
  }
  return true;
}

// Appends the bytes of a value, or of a list after its length, to a digest's input.
template <typename T>
void append_bytes(std::string& out, const T& v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}
template <typename T>
void append_list(std::string& out, const std::vector<T>& v) {
  append_bytes(out, int64_t(v.size()));
  if (!v.empty()) out.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

// How a side's ranks run, for errors: "--rollout-ranks threads".
std::string ranks_flag(const char* side, RankMode mode) {
  return detail::concat("--", side, "-ranks ", rank_mode_name(mode));
}

// What the configuration lines say of a side's rank mode.
const char* rank_mode_text(RankMode mode) {
  switch (mode) {
    case RankMode::kSimulated:
      return "";
    case RankMode::kThreads:
      return " (rank-local models on threads)";
    case RankMode::kLaunch:
      return " (rank-local models, one per process of a launched job)";
  }
  return "";
}

// Runs `job(model, rank)` on tp rank-local models (`side`: "rollout" or "train", for errors):
// - threads: one thread per rank over the thread transport; checks that every rank's result
//   equals rank 0's and returns rank 0's.
// - launch: this process's rank of `comm` (a job of tp processes); checks by sha256 that every
//   rank's result equals rank 0's (a collective) and returns this rank's.
template <typename R>
R on_rank_local_models(const char* side, RankMode mode, int tp, const ModelFactory& make_model,
                       const std::shared_ptr<OpsBackend>& backend, dist::Communicator* comm,
                       const std::function<R(const Model&, int)>& job) {
  const std::string flag = ranks_flag(side, mode);
  LS_CHECK(backend->device() == Device::kCPU, kOp, flag,
           " runs rank-local models over a transport that moves host memory only: it needs a "
           "CPU ",
           side, " backend, got '", backend->name(), "' on ", device_name(backend->device()));
  if (mode == RankMode::kLaunch) {
    LS_CHECK(comm != nullptr, kOp, flag,
             ": this process is not a rank of a job (no communicator; run it under `lockstep "
             "launch --nproc ",
             tp, "`)");
    LS_CHECK(comm->size() == tp, kOp, flag, ": the job has ", comm->size(), " ranks, but --", side,
             "-tp is ", tp, " (one process per TP rank: `lockstep launch --nproc ", tp, "`)");
    const std::unique_ptr<Model> m = make_model(tp, backend, comm);
    R result = job(*m, comm->rank());
    check_same_sha256_on_every_rank(*comm, records_sha256(result),
                                    detail::concat(kOp, ": ", flag, ": the ", side, " records"));
    return result;
  }
  std::vector<R> results(static_cast<size_t>(tp));
  dist::run_ranks(tp, [&](dist::Communicator& c) {
    const std::unique_ptr<Model> m = make_model(tp, backend, &c);
    results[size_t(c.rank())] = job(*m, c.rank());
  });
  for (int r = 1; r < tp; ++r)
    LS_CHECK(same_records(results[0], results[size_t(r)]), kOp, side, " rank ", r,
             " computed other tokens or log-prob bits than rank 0 (rank-local models must agree "
             "on every rank)");
  return std::move(results[0]);
}

}  // namespace

AuditConfig::AuditConfig() {
  rollout.kv.page_size = 16;
  rollout.kv.num_pages = 0;  // auto
  rollout.scheduler.max_running = 128;
  rollout.scheduler.max_batched_tokens = 256;
  rollout.scheduler.prefix_sharing = true;
  rollout.step.kv_splits = 2;
  rollout.step.cascade = true;
  arrival_seed = 3;
  packing.micro_batch_tokens = 1024;
  packing.seed = 7;
}

void AuditConfig::validate() const {
  LS_CHECK(prompts >= 1, kOp, "--prompts must be >= 1, got ", prompts);
  LS_CHECK(group_size >= 1, kOp, "--group must be >= 1, got ", group_size);
  LS_CHECK(prompts * group_size <= (int64_t(1) << 24), kOp,
           "prompts x group = ", prompts * group_size, " requests is too many (max 2^24)");
  LS_CHECK(prompt_len_min >= 1 && prompt_len_min <= prompt_len_max, kOp,
           "prompt lengths must satisfy 1 <= min <= max, got ", prompt_len_min, ":",
           prompt_len_max);
  LS_CHECK(max_new_tokens >= 1, kOp, "--max-new-tokens must be >= 1, got ", max_new_tokens);
  LS_CHECK(arrival_stagger >= 0, kOp, "--arrival-stagger must be >= 0, got ", arrival_stagger);
  if (!mixed_sampling) sampling.validate();
  contract.validate();
  for (auto [name, tp] :
       {std::pair{"--rollout-tp", rollout_tp}, std::pair{"--train-tp", train_tp}}) {
    LS_CHECK(tp == 1 || tp == 2 || tp == 4 || tp == 8, kOp, name, " must be 1, 2, 4 or 8, got ",
             tp);
    LS_CHECK(contract.gemm_segments % tp == 0 && contract.vocab_segments % tp == 0, kOp, name, "=",
             tp, " needs gemm_segments and vocab_segments divisible by it (contract has ",
             contract.gemm_segments, " and ", contract.vocab_segments, "); raise --segments");
  }
  LS_CHECK(rollout_ranks == RankMode::kSimulated || rollout_tp > 1, kOp,
           ranks_flag("rollout", rollout_ranks),
           " needs --rollout-tp > 1 (one rank has nothing to exchange)");
  LS_CHECK(train_ranks == RankMode::kSimulated || train_tp > 1, kOp,
           ranks_flag("train", train_ranks),
           " needs --train-tp > 1 (one rank has nothing to exchange)");
  // One job, one rank per process: both sides launched means one TP degree.
  LS_CHECK(rollout_ranks != RankMode::kLaunch || train_ranks != RankMode::kLaunch ||
               rollout_tp == train_tp,
           kOp,
           "--rollout-ranks launch and --train-ranks launch run both sides on the ranks of one "
           "job: they need --rollout-tp == --train-tp, got ",
           rollout_tp, " and ", train_tp);
  RolloutConfig r = rollout;
  if (r.kv.num_pages == 0) r.kv.num_pages = 1;
  r.validate();
  packing.validate();
}

std::string AuditConfig::rollout_string() const {
  std::ostringstream os;
  os << "tp=" << rollout_tp << rank_mode_text(rollout_ranks) << "; " << rollout.to_string()
     << "; arrival: seed=" << arrival_seed << " stagger=" << arrival_stagger;
  return os.str();
}

std::string AuditConfig::training_string() const {
  std::ostringstream os;
  os << "tp=" << train_tp << rank_mode_text(train_ranks) << "; " << packing.to_string();
  return os.str();
}

std::string AuditConfig::workload_string() const {
  std::ostringstream os;
  os << prompts << " prompts x G=" << group_size << " samples = " << prompts * group_size
     << " sequences; prompts of " << prompt_len_min << ".." << prompt_len_max
     << " random token ids (seed " << seed << "; no tokenizer); <= " << max_new_tokens
     << " new tokens" << (stop_on_eos ? ", stop on EOS" : "") << "; sampling "
     << (mixed_sampling ? "mixed (per-group settings)" : sampling.to_string());
  return os.str();
}

std::string records_sha256(const RolloutResult& r) {
  std::string bytes;
  append_bytes(bytes, int64_t(r.completions.size()));
  for (const Completion& c : r.completions) {
    append_bytes(bytes, c.id);
    append_bytes(bytes, int32_t(c.finish));
    append_list(bytes, c.tokens);
    append_list(bytes, c.logp);
    append_list(bytes, c.lse);
    append_list(bytes, c.entropy);
  }
  return sha256_hex(bytes.data(), bytes.size());
}

std::string records_sha256(const TrainResult& r) {
  std::string bytes;
  append_bytes(bytes, int64_t(r.sequences.size()));
  for (const TrainTokens& t : r.sequences) {
    append_list(bytes, t.logp);
    append_list(bytes, t.lse);
    append_list(bytes, t.entropy);
  }
  return sha256_hex(bytes.data(), bytes.size());
}

SamplingParams mixed_sampling_params(int64_t group, uint64_t seed) {
  SamplingParams p;
  p.seed = seed;
  switch (group % 6) {
    case 0:
      p.temperature = 1.0f;
      break;
    case 1:
      p.temperature = 0.7f, p.top_k = 40;
      break;
    case 2:
      p.temperature = 1.0f, p.top_p = 0.9f;
      break;
    case 3:
      p.temperature = 0.9f, p.min_p = 0.05f;
      break;
    case 4:
      p.temperature = 1.2f, p.top_k = 200, p.top_p = 0.95f, p.min_p = 0.01f;
      break;
    case 5:
      p.temperature = 0.0f;
      break;  // greedy
  }
  return p;
}

std::vector<RolloutRequest> make_audit_requests(const AuditConfig& cfg, const Qwen3Config& mc) {
  cfg.validate();
  const int64_t G = cfg.group_size, n = cfg.prompts * G;
  Gen g{cfg.seed, 0};
  std::vector<RolloutRequest> out;
  out.reserve(size_t(n));
  for (int64_t k = 0; k < cfg.prompts; ++k) {
    std::vector<int32_t> prompt(
        size_t(cfg.prompt_len_min +
               int64_t(g.below(uint64_t(cfg.prompt_len_max - cfg.prompt_len_min + 1)))));
    for (auto& t : prompt) t = int32_t(g.below(uint64_t(mc.vocab_size)));
    SamplingParams sp = cfg.mixed_sampling ? mixed_sampling_params(k, cfg.seed) : cfg.sampling;
    sp.seed = cfg.seed;
    for (int64_t s = 0; s < G; ++s) {
      RolloutRequest r;
      r.id = k * G + s;
      r.prompt = prompt;
      r.sampling = sp;
      r.max_new_tokens = cfg.max_new_tokens;
      r.stop_on_eos = cfg.stop_on_eos;
      r.group = k;
      out.push_back(std::move(r));
    }
  }
  // Arrivals: groups (or, without prefix sharing, single requests) in a permuted order, one
  // group's worth every `arrival_stagger` steps.
  if (cfg.rollout.scheduler.prefix_sharing) {
    const auto order = permutation(cfg.prompts, cfg.arrival_seed);
    for (int64_t rank = 0; rank < cfg.prompts; ++rank)
      for (int64_t s = 0; s < G; ++s)
        out[size_t(order[size_t(rank)] * G + s)].arrival_step = rank * cfg.arrival_stagger;
  } else {
    const auto order = permutation(n, cfg.arrival_seed);
    for (int64_t rank = 0; rank < n; ++rank)
      out[size_t(order[size_t(rank)])].arrival_step = rank / G * cfg.arrival_stagger;
  }
  return out;
}

int64_t audit_auto_kv_pages(const AuditConfig& cfg) {
  const int64_t one = cfg.rollout.kv.pages_for(cfg.prompt_len_max + cfg.max_new_tokens);
  const int64_t all =
      one * std::min(cfg.rollout.scheduler.max_running, cfg.prompts * cfg.group_size);
  return std::max(one, (all + 1) / 2);
}

std::shared_ptr<OpsBackend> shared_baseline_backend() {
  return std::shared_ptr<OpsBackend>(make_baseline_backend());
}

std::string audit_side_label(const OpsBackend& rollout, const OpsBackend& train) {
  const std::string rd = device_name(rollout.device()), td = device_name(train.device());
  if (&rollout == &train || (rollout.name() == train.name() && rd == td))
    return rd == "cpu" ? rollout.name() : rollout.name() + "@" + rd;
  if (rollout.name() == train.name()) return rollout.name() + "@" + rd + "/" + td;
  return rollout.name() + "@" + rd + "/" + train.name() + "@" + td;
}

AuditSide run_audit_side(const AuditConfig& cfg, const ModelFactory& make_model,
                         std::shared_ptr<OpsBackend> backend, const AuditHooks& hooks,
                         dist::Communicator* job) {
  return run_audit_side(cfg, make_model, backend, backend, hooks, job);
}

AuditSide run_audit_side(const AuditConfig& cfg, const ModelFactory& make_model,
                         std::shared_ptr<OpsBackend> rollout_backend,
                         std::shared_ptr<OpsBackend> train_backend, const AuditHooks& hooks,
                         dist::Communicator* job) {
  cfg.validate();
  LS_CHECK(rollout_backend != nullptr && train_backend != nullptr, kOp, "backend is null");
  auto log = [&](const std::string& s) {
    if (hooks.log) hooks.log(s);
  };
  AuditSide side;
  side.backend = audit_side_label(*rollout_backend, *train_backend);
  side.rollout_backend = rollout_backend->name();
  side.train_backend = train_backend->name();
  side.rollout_device = device_name(rollout_backend->device());
  side.train_device = device_name(train_backend->device());
  // The simulated rollout model also replays a mismatch for localization (a rank-local job has
  // the same bits: tests/engine/test_model.cc ModelRanks).
  std::unique_ptr<Model> rollout_model = make_model(cfg.rollout_tp, rollout_backend, nullptr);
  std::unique_ptr<Model> train_model = make_model(cfg.train_tp, train_backend, nullptr);
  const Qwen3Config& mc = rollout_model->config();
  const std::vector<RolloutRequest> requests = make_audit_requests(cfg, mc);

  RolloutConfig rcfg = cfg.rollout;
  if (rcfg.kv.num_pages == 0) rcfg.kv.num_pages = audit_auto_kv_pages(cfg);

  // Rollout.
  RolloutHooks rh;
  rh.progress_every_s = hooks.progress_every_s;
  const auto t_start = std::chrono::steady_clock::now();
  rh.progress = [&](const RolloutProgress& p) {
    char buf[160];
    std::snprintf(
        buf, sizeof(buf),
        "[%s] rollout: step %" PRId64 ", %" PRId64 "/%" PRId64 " sequences done, %" PRId64
        " tokens generated, %.1f s",
        side.backend.c_str(), p.step, p.finished, p.total, p.generated,
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count());
    log(buf);
  };
  const RolloutResult rr =
      cfg.rollout_ranks == RankMode::kSimulated
          ? run_rollout(*rollout_model, requests, rcfg, rh)
          : on_rank_local_models<RolloutResult>(
                "rollout", cfg.rollout_ranks, cfg.rollout_tp, make_model, rollout_backend, job,
                [&](const Model& m, int rank) {
                  return run_rollout(m, requests, rcfg, rank == 0 ? rh : RolloutHooks{});
                });
  side.rollout_sha256 = records_sha256(rr);
  side.rollout_seconds = rr.seconds;
  side.generated_tokens = rr.generated_tokens;
  side.rollout_stats = rr.stats;
  side.cascade_rows = rr.cascade_rows;

  // Training forward over the same sequences.
  const std::vector<TrainSequence> train_seqs = train_sequences(rr);
  TrainHooks th;
  auto last = std::chrono::steady_clock::now();
  th.progress = [&](int64_t done, int64_t total) {
    const auto now = std::chrono::steady_clock::now();
    if (done < total && std::chrono::duration<double>(now - last).count() < hooks.progress_every_s)
      return;
    last = now;
    log("[" + side.backend + "] training: " + std::to_string(done) + "/" + std::to_string(total) +
        " sequences");
  };
  const TrainResult tr = cfg.train_ranks == RankMode::kSimulated
                             ? run_training_forward(*train_model, train_seqs, cfg.packing, th)
                             : on_rank_local_models<TrainResult>(
                                   "train", cfg.train_ranks, cfg.train_tp, make_model,
                                   train_backend, job, [&](const Model& m, int rank) {
                                     return run_training_forward(m, train_seqs, cfg.packing,
                                                                 rank == 0 ? th : TrainHooks{});
                                   });
  side.train_sha256 = records_sha256(tr);
  side.train_seconds = tr.seconds;
  side.train_tokens = tr.tokens_forwarded;
  side.micro_batches = tr.micro_batches;

  // Bitwise comparison (memcmp of the fp32 patterns).
  static_cast<LogprobComparison&>(side) = compare_logprobs(rr, tr);
  if (cfg.localize && side.first) {
    log("[" + side.backend + "] localizing: replaying request " +
        std::to_string(side.first->request) + " token " + std::to_string(side.first->index) +
        " on both sides with activation traces");
    side.localization =
        localize_divergence(*rollout_model, *train_model, requests, rcfg, train_seqs, cfg.packing,
                            *side.first, side.first_sequence);
  } else if (cfg.localize) {
    Localization l;
    l.summary = "nothing to localize: no mismatch";
    side.localization = l;
  }
  return side;
}

}  // namespace lockstep::engine
