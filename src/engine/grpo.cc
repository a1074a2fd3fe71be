// The GRPO loop (docs/training.md).
#include "engine/grpo.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <sstream>

#include "baseline/cpu/backend.h"
#include "core/thread_pool.h"
#include "dist/thread_transport.h"
#include "engine/backend.h"
#include "engine/file_io.h"
#include "engine/model.h"
#include "engine/safetensors.h"
#include "engine/sha256.h"
#include "engine/train.h"
#include "lockstep/error.h"

namespace lockstep::engine {
namespace {

constexpr const char* kOp = "grpo";

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::map<std::string, TensorView> views_of(const Weights& w) {
  std::map<std::string, TensorView> v;
  for (const auto& [name, t] : w) v[name] = t.view();
  return v;
}

// engine::AdamW as a GrpoOptimizer: its bf16 weights kept from one step to the next.
class CpuOptimizer final : public GrpoOptimizer {
 public:
  explicit CpuOptimizer(AdamW adam) : adam_(std::move(adam)), bf16_(adam_.bf16_weights()) {}
  StepStats step(const Weights& grads) override {
    const StepStats st = adam_.step(grads);
    bf16_ = adam_.bf16_weights();
    return st;
  }
  const Weights& bf16_weights() const override { return bf16_; }
  Weights bf16_weights_host() const override { return bf16_; }
  Weights state() const override { return adam_.state(); }

 private:
  AdamW adam_;
  Weights bf16_;
};

// One training sequence: the prompt and the completion, and where the completion's log-probs sit.
struct TrainSeq {
  std::vector<int32_t> tokens;  // prompt + completion
  int64_t prompt_len = 0;
  const Completion* c = nullptr;
  double advantage = 0;
  int64_t weight_version = 0;  // of the weights that generated it (Sample::weight_version)
  // Filled by the forward of its micro-batch: per completion token.
  std::vector<float> logp, entropy;
};

// The trainer's forward of a micro-batch [s0, s1) of `seqs`: saved activations, per-token
// targets and the log-prob head's outputs. With shared prompts (pack set) the micro-batch holds
// whole groups and the head's rows, targets, lse and entropy are the pack's head rows.
struct MicroBatch {
  int64_t s0 = 0, s1 = 0;
  mutable std::vector<int64_t> targets;  // viewed (non-const TensorView data) by the ops
  std::vector<int32_t> cu;
  SavedForward saved;
  Tensor lse, ent;
  std::optional<SharedPack> pack;
  // Per sequence s0 .. s1-1: its first row of the head's outputs (its first completion token).
  std::vector<int64_t> head0;
};

uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Every setting but the device (GrpoConfig::to_string adds it).
std::string settings_string(const GrpoConfig& c) {
  std::ostringstream os;
  os << "task " << c.task << " (digits " << c.digits << ")"
     << (c.reward_command.empty() ? "" : ", reward command: " + c.reward_command) << "; " << c.steps
     << " steps x " << c.prompts << " prompts x G=" << c.group << " (after " << c.sft_steps
     << " supervised warm-up steps of " << c.sft_prompts << " prompts)"
     << "; temperature " << c.temperature << ", seed " << c.seed
     << "\n  rollout tp=" << c.rollout_tp << "; training tp=" << c.train_tp
     << ", micro_batch_tokens=" << c.micro_batch_tokens << ", mini_batches=" << c.mini_batches
     << "\n  " << c.contract.to_string() << "\n  " << c.optim.to_string() << "\n  "
     << c.loss.to_string() << "\n  " << c.rollout.to_string()
     << (c.baseline ? "\n  kernels: BASELINE (ordinary, non-invariant)" : "")
     << (c.share_prompts ? "\n  training: group-shared prompts (docs/contract.md §B.11)" : "")
     << (c.head_from_rollout ? ""
                             : "\n  training: the log-prob head's forward on every mini-batch");
  return os.str();
}

// The settings a resumed run must share with the checkpoint (everything that changes bits; not
// the device: every device gives the same bits).
std::string resume_key(const GrpoConfig& c) {
  GrpoConfig k = c;
  k.steps = 0;  // a resumed run may go further
  k.checkpoint_dir.clear();
  k.checkpoint_every = 0;
  k.resume.clear();
  return settings_string(k);
}

void save_checkpoint(const GrpoConfig& cfg, const Qwen3Config& mcfg, const GrpoOptimizer& adam,
                     const Weights& weights, int64_t steps_done) {
  namespace fs = std::filesystem;
  const std::string name = "step-" + std::to_string(steps_done);
  const fs::path root(cfg.checkpoint_dir), tmp = root / ("." + name + ".tmp"), dst = root / name;
  std::error_code ec;
  fs::create_directories(root, ec);
  LS_CHECK(!ec, kOp, "cannot create the checkpoint directory ", root.string(), ": ", ec.message());
  fs::remove_all(tmp, ec);
  fs::create_directory(tmp, ec);
  LS_CHECK(!ec, kOp, "cannot create ", tmp.string(), ": ", ec.message());
  const ModelFileBytes files = serialize_qwen3_model(mcfg, weights);
  write_file_atomic((tmp / "config.json").string(), files.config_json.data(),
                    files.config_json.size());
  write_file_atomic((tmp / "model.safetensors").string(), files.safetensors.data(),
                    files.safetensors.size());
  const Weights st = adam.state();
  std::vector<NamedTensor> named;
  for (const auto& [n, t] : st) named.push_back({n, t.view()});
  write_safetensors((tmp / "optimizer.safetensors").string(), named);
  const std::string info = "steps_done " + std::to_string(steps_done) + "\nweights_sha256 " +
                           weights_sha256(weights) + "\nsettings\n" + resume_key(cfg) + "\n";
  write_file_atomic((tmp / "trainer.txt").string(), info.data(), info.size());
  fs::remove_all(dst, ec);
  fs::rename(tmp, dst, ec);
  LS_CHECK(!ec, kOp, "cannot rename ", tmp.string(), " to ", dst.string(), ": ", ec.message());
  const std::string latest = name + "\n";
  write_file_atomic((root / "latest").string(), latest.data(), latest.size());
}

struct Resumed {
  int64_t steps_done = 0;
  Weights state;
};

Resumed load_checkpoint(const GrpoConfig& cfg, const Qwen3Config& mcfg, const std::string& where) {
  namespace fs = std::filesystem;
  fs::path dir(where);
  if (fs::exists(dir / "latest")) {
    std::string l = read_small_file((dir / "latest").string(), 4096, "checkpoint latest");
    while (!l.empty() && (l.back() == '\n' || l.back() == ' ')) l.pop_back();
    LS_CHECK(l.rfind("step-", 0) == 0 && l.find('/') == std::string::npos, kOp, "checkpoint ",
             where, ": 'latest' holds '", l, "', not a step-<N> name");
    dir /= l;
  }
  const std::string info =
      read_small_file((dir / "trainer.txt").string(), 1 << 20, "checkpoint trainer.txt");
  Resumed r;
  LS_CHECK(std::sscanf(info.c_str(), "steps_done %lld", (long long*)&r.steps_done) == 1 &&
               r.steps_done >= 0,
           kOp, "checkpoint ", dir.string(), ": trainer.txt does not start with 'steps_done N'");
  const size_t at = info.find("\nsettings\n");
  LS_CHECK(at != std::string::npos, kOp, "checkpoint ", dir.string(),
           ": trainer.txt lacks its settings");
  const std::string saved = info.substr(at + 10);
  LS_CHECK(saved == resume_key(cfg) + "\n", kOp, "checkpoint ", dir.string(),
           " was written with other settings:\n", saved, "this run:\n", resume_key(cfg));
  // The file keeps names, not their order: rebuild AdamW::state()'s order (the weights' order).
  const SafetensorsFile f = SafetensorsFile::open((dir / "optimizer.safetensors").string());
  auto take = [&](const std::string& name) {
    LS_CHECK(f.find(name) != nullptr, kOp, "checkpoint ", dir.string(),
             ": optimizer.safetensors lacks '", name, "'");
    const TensorView v = f.view(name);
    Tensor t(v.dtype, std::vector<int64_t>(v.shape, v.shape + v.ndim));
    std::memcpy(t.data(), v.data, size_t(t.nbytes()));
    r.state.emplace_back(name, std::move(t));
  };
  for (const char* part : {"master/", "m/", "v/"})
    for (const WeightSpec& w : qwen3_weight_specs(mcfg)) take(part + w.name);
  take("step");
  LS_CHECK(f.tensors().size() == r.state.size(), kOp, "checkpoint ", dir.string(),
           ": optimizer.safetensors holds ", f.tensors().size(), " tensors, expected ",
           r.state.size());
  return r;
}

}  // namespace

void GrpoConfig::validate() const {
  LS_CHECK(steps >= 0 && steps <= 1000000, kOp, "steps must be in [0, 1e6], got ", steps);
  LS_CHECK(sft_steps >= 0 && sft_steps <= 1000000 && sft_prompts >= 1 && sft_prompts <= 65536, kOp,
           "sft_steps must be in [0, 1e6] and sft_prompts in [1, 65536]");
  LS_CHECK(prompts >= 1 && group >= 1 && prompts * group <= 65536, kOp, "prompts (", prompts,
           ") and group (", group, ") must be >= 1 with prompts·group <= 65536");
  LS_CHECK(std::isfinite(temperature) && temperature > 0.0f, kOp,
           "temperature must be finite and > 0 (the policy's distribution), got ", temperature);
  LS_CHECK(micro_batch_tokens >= 1, kOp, "micro_batch_tokens must be >= 1");
  LS_CHECK(mini_batches >= 1 && mini_batches <= prompts * group, kOp,
           "mini_batches must be in [1, prompts·group], got ", mini_batches);
  LS_CHECK(rollout_tp >= 1 && train_tp >= 1, kOp, "tp degrees must be >= 1");
  LS_CHECK(reward_timeout_s > 0, kOp, "reward timeout must be > 0");
  LS_CHECK(std::isfinite(sft_lr) && sft_lr > 0, kOp, "sft_lr must be finite and > 0");
  LS_CHECK(checkpoint_every >= 0, kOp, "checkpoint_every must be >= 0");
  if (share_prompts) {
    LS_CHECK(!baseline, kOp,
             "share_prompts needs the invariant kernels (the baseline backend has no shared-prompt "
             "attention)");
    LS_CHECK(mini_batches <= prompts, kOp,
             "share_prompts cuts mini-batches at group boundaries: mini_batches (", mini_batches,
             ") must be <= prompts (", prompts, ")");
  }
  if (train_ranks != RankMode::kSimulated)
    LS_CHECK(train_tp > 1 && !baseline && device == Device::kCPU, kOp, "train ranks ",
             train_ranks == RankMode::kThreads ? "on threads" : "of a launched job",
             " need train_tp > 1 (one rank has nothing to exchange), the invariant kernels and the "
             "CPU (the vocab-parallel head backward exists there only); got train_tp ",
             train_tp, baseline ? ", baseline kernels" : "", ", device ", device_name(device));
  contract.validate();
  optim.validate();
  loss.validate();
  rollout.validate();
}

std::string GrpoConfig::to_string() const {
  return settings_string(*this) + "\n  device " + device_name(device) +
         (train_ranks == RankMode::kThreads  ? "; training ranks: threads (rank-local)"
          : train_ranks == RankMode::kLaunch ? "; training ranks: launch (rank-local, one per "
                                               "process)"
                                             : "");
}

GrpoDevice cpu_grpo_device() {
  GrpoDevice d;
  d.device = Device::kCPU;
  d.backend = [](bool baseline) {
    return std::shared_ptr<OpsBackend>(baseline ? make_baseline_backend()
                                                : make_invariant_backend());
  };
  d.adamw = [](const Weights& w, const AdamWConfig& c) -> std::unique_ptr<GrpoOptimizer> {
    return std::make_unique<CpuOptimizer>(AdamW(w, c));
  };
  d.adamw_from_state = [](const Weights& st,
                          const AdamWConfig& c) -> std::unique_ptr<GrpoOptimizer> {
    return std::make_unique<CpuOptimizer>(AdamW::from_state(st, c));
  };
  return d;
}

std::string weights_sha256(const Weights& w) {
  // Pieces of at most 16 MiB (a tensor's bytes cut at multiples of 16 MiB; an empty tensor is one
  // empty piece), hashed in parallel: a 0.6B model's 1.2 GB took ~8 s in one portable sha256 on
  // one core.
  constexpr size_t kPiece = size_t(16) << 20;
  struct Piece {
    const uint8_t* p;
    size_t n;
  };
  std::vector<Piece> pieces;
  for (const auto& [name, t] : w) {
    const auto* p = static_cast<const uint8_t*>(t.data());
    const size_t n = t.nbytes();
    size_t off = 0;
    do {
      pieces.push_back({p + off, std::min(kPiece, n - off)});
      off += kPiece;
    } while (off < n);
  }
  // NOTE: the threads take pieces one at a time, not as parallel_for's contiguous ranges: a
  // model's pieces run from a few bytes to 16 MiB, and one range would get all of the embedding's
  // (0.6B: its 19 pieces of 328, a quarter of the bytes, in the first of 16 ranges). Each digest
  // depends on its piece alone, so the order of taking changes nothing.
  std::vector<std::string> hex(pieces.size());
  std::atomic<size_t> next{0};
  parallel_for(num_threads(), 1, [&](int64_t, int64_t) {
    for (size_t i; (i = next.fetch_add(1)) < pieces.size();)
      hex[i] = sha256_hex(pieces[i].p, pieces[i].n);
  });
  std::string all;
  for (const std::string& h : hex) all += h;
  return sha256_hex(all.data(), all.size());
}

Weights run_grpo(const GrpoConfig& cfg, const Qwen3Config& mcfg, const Weights& init,
                 const GrpoHooks& hooks) {
  LS_CHECK(cfg.device == Device::kCPU, kOp, "device ", device_name(cfg.device),
           ": run_grpo needs that device's GrpoDevice (engine/cuda/grpo_device.h for cuda)");
  return run_grpo(cfg, mcfg, init, cpu_grpo_device(), hooks);
}

Weights run_grpo(const GrpoConfig& cfg, const Qwen3Config& mcfg, const Weights& init,
                 const GrpoDevice& dev, const GrpoHooks& hooks) {
  cfg.validate();
  LS_CHECK(dev.device == cfg.device, kOp, "the config's device is ", device_name(cfg.device),
           ", the GrpoDevice's ", device_name(dev.device));
  LS_CHECK(dev.backend && dev.adamw && dev.adamw_from_state, kOp,
           "the GrpoDevice lacks its backends or its optimizer");
  // A launched training side: this process is rank job->rank() of train_tp processes.
  dist::Communicator* const job = dev.train_job;
  if (cfg.train_ranks == RankMode::kLaunch)
    LS_CHECK(job != nullptr && job->size() == cfg.train_tp, kOp,
             "train ranks of a launched job need the GrpoDevice's train_job, a job of train_tp = ",
             cfg.train_tp, " ranks; got ",
             job ? detail::concat("one of ", job->size(), " ranks") : std::string("none"));
  else
    LS_CHECK(job == nullptr, kOp,
             "the GrpoDevice has a train_job but the training ranks are not launched (train_ranks ",
             rank_mode_name(cfg.train_ranks), ")");
  const bool writes = job == nullptr || job->rank() == 0;  // checkpoints
  // The invariant backend runs the warm-up and every backward (the baselines have none); the
  // rollout and the training forward run on the baseline backend with cfg.baseline.
  const std::shared_ptr<OpsBackend> ops = dev.backend(false);
  const std::shared_ptr<OpsBackend> fwd_ops = cfg.baseline ? dev.backend(true) : ops;
  LS_CHECK(ops && fwd_ops && ops->device() == cfg.device && fwd_ops->device() == cfg.device, kOp,
           "the GrpoDevice's backends are not on ", device_name(cfg.device));
  std::unique_ptr<Task> task = make_builtin_task(cfg.task, cfg.digits, mcfg.vocab_size);
  if (!cfg.reward_command.empty())
    task = make_command_task(std::move(task), cfg.reward_command, cfg.reward_timeout_s);
  AdamWConfig sft_cfg = cfg.optim;
  sft_cfg.lr = cfg.sft_lr;
  std::unique_ptr<GrpoOptimizer> sft_adam = dev.adamw(init, sft_cfg);
  // The policy's bf16 weights on the host (the sha256, the checkpoints, the result); the models
  // are built over the optimizer's weights.
  Weights host = sft_adam->bf16_weights_host();
  LS_CHECK(weights_sha256(host) == weights_sha256(init), kOp,
           "the initial weights must be bf16 (their fp32 masters round back to other bits)");
  ModelOptions ropt, topt;
  ropt.contract = topt.contract = cfg.contract;
  ropt.tp = cfg.rollout_tp;
  topt.tp = cfg.train_tp;
  auto say = [&](const std::string& s) {
    if (hooks.progress) hooks.progress(s);
  };
  // Time splits: `into` gets the seconds since the last lap, after the device has finished.
  Clock::time_point mark = Clock::now();
  auto lap = [&](double& into) {
    fwd_ops->synchronize();
    ops->synchronize();
    const Clock::time_point now = Clock::now();
    into += std::chrono::duration<double>(now - mark).count();
    mark = now;
  };

  // ---- supervised warm-up
  for (int64_t step = 0; cfg.resume.empty() && step < cfg.sft_steps; ++step) {
    const auto t_step = Clock::now();
    std::mt19937_64 g(cfg.seed * 0xD1B54A32D192ED03ull + uint64_t(step));
    std::vector<int32_t> tokens, cu = {0};
    std::vector<int64_t> targets, seq_index;
    const std::vector<int64_t> eos = mcfg.eos_token_ids;
    for (int64_t p = 0; p < cfg.sft_prompts; ++p) {
      const TaskPrompt tp = task->make_prompt(g);
      std::vector<int32_t> seq = tp.prompt;
      seq.insert(seq.end(), tp.answer.begin(), tp.answer.end());
      if (!eos.empty()) seq.push_back(int32_t(eos[0]));
      for (size_t i = 0; i < seq.size(); ++i) {
        tokens.push_back(seq[i]);
        const bool target = i + 1 >= tp.prompt.size() && i + 1 < seq.size();
        targets.push_back(target ? seq[i + 1] : -1);
      }
      cu.push_back(int32_t(tokens.size()));
      seq_index.push_back(p);
    }
    const int64_t T = int64_t(tokens.size());
    StepStats st;
    int64_t n = 0, right = 0;
    double nll = 0;
    {
      Model model(mcfg, views_of(sft_adam->bf16_weights()), topt, ops);
      const Backprop bp(mcfg, views_of(sft_adam->bf16_weights()), topt, *ops);
      const SavedForward f =
          bp.forward(model, TensorView::contiguous(tokens.data(), DType::kI32, {T}),
                     TensorView::contiguous(cu.data(), DType::kI32, {int64_t(cu.size())}));
      Tensor logp(DType::kF32, {T}), lse(DType::kF32, {T}), ent(DType::kF32, {T});
      const TensorView tg = TensorView::contiguous(targets.data(), DType::kI64, {T});
      model.logprob(f.hidden.view(), tg, 1.0f, logp.view(), lse.view(), ent.view());
      for (int64_t t = 0; t < T; ++t) {
        if (targets[size_t(t)] < 0) continue;
        ++n;
        nll -= double(logp.ptr<float>()[t]);
        right += logp.ptr<float>()[t] > -0.6931472f;
      }
      std::vector<float> g_lp(size_t(T), 0.0f);
      for (int64_t t = 0; t < T; ++t)
        if (targets[size_t(t)] >= 0) g_lp[size_t(t)] = float(-1.0 / double(n));
      Gradients grads(mcfg, *ops);
      bp.backward(f, tg, LogprobParams{}, lse.view(), ent.view(),
                  TensorView::contiguous(g_lp.data(), DType::kF32, {T}), nullptr, seq_index, grads);
      grads.finish();
      st = sft_adam->step(grads.all());
      ops->synchronize();  // the step has read grads before they are freed
    }
    SftStepMetrics sm;
    sm.step = step;
    sm.loss = nll / double(n);
    sm.token_accuracy = double(right) / double(n);
    sm.grad_norm = st.grad_norm;
    sm.step_s = seconds_since(t_step);
    if (hooks.on_sft_step) hooks.on_sft_step(sm);
  }

  // GRPO starts a fresh optimizer from the warm-up's bf16 weights (or the checkpoint's state).
  host = sft_adam->bf16_weights_host();
  sft_adam.reset();
  int64_t first_step = 0;
  std::unique_ptr<GrpoOptimizer> adam;
  if (cfg.resume.empty()) {
    adam = dev.adamw(host, cfg.optim);
  } else {
    Resumed r = load_checkpoint(cfg, mcfg, cfg.resume);
    first_step = r.steps_done;
    adam = dev.adamw_from_state(r.state, cfg.optim);
    host = adam->bf16_weights_host();
  }
  // Optimizer steps applied to the policy: the warm-up's, then one per mini-batch (a resumed run
  // has the same settings as its checkpoint, so the count is a function of steps done).
  int64_t weight_version = cfg.sft_steps + first_step * cfg.mini_batches;
  for (int64_t step = first_step; step < cfg.steps; ++step) {
    const auto t_step = Clock::now();
    mark = t_step;
    GrpoStepMetrics met;
    met.step = step;
    // ---- rollout: the optimizer's weights to the rollout model, on the device (no host copy)
    auto rollout_model =
        std::make_unique<Model>(mcfg, views_of(adam->bf16_weights()), ropt, fwd_ops);
    lap(met.weight_sync_s);
    std::mt19937_64 g(cfg.seed * 0x9E3779B97F4A7C15ull + uint64_t(step));
    std::vector<RolloutRequest> reqs;
    std::vector<TaskPrompt> prompts;
    for (int64_t p = 0; p < cfg.prompts; ++p) {
      prompts.push_back(task->make_prompt(g));
      for (int64_t j = 0; j < cfg.group; ++j) {
        RolloutRequest r;
        r.id = p * cfg.group + j;
        r.prompt = prompts.back().prompt;
        r.sampling.seed = cfg.seed * 1000003ull + uint64_t(step);
        r.sampling.temperature = cfg.temperature;
        r.max_new_tokens = task->max_new_tokens();
        r.group = p;
        reqs.push_back(std::move(r));
      }
    }
    say("step " + std::to_string(step) + ": rollout of " + std::to_string(reqs.size()) +
        " sequences");
    const RolloutResult roll = run_rollout(*rollout_model, reqs, cfg.rollout);
    rollout_model.reset();
    lap(met.rollout_s);
    met.generated_tokens = roll.generated_tokens;

    // ---- rewards and advantages
    std::vector<Sample> samples;
    std::vector<int64_t> groups;
    for (const Completion& c : roll.completions) {
      const int64_t p = c.id / cfg.group;
      samples.push_back({c.id, c.prompt, c.tokens, prompts[size_t(p)].answer, weight_version});
      groups.push_back(p);
    }
    met.rollout_weight_version = weight_version;
    // A launched job scores on rank 0 alone (a reward command runs once) and broadcasts the
    // rewards' bytes.
    std::vector<double> rewards =
        job && job->rank() != 0 ? std::vector<double>(samples.size()) : task->score(samples);
    LS_CHECK(rewards.size() == samples.size(), kOp, "the task returned ", rewards.size(),
             " rewards for ", samples.size(), " samples");
    if (job)
      job->broadcast(TensorView::contiguous(rewards.data(), DType::kU8,
                                            {int64_t(rewards.size() * sizeof(double))}),
                     0);
    double rs = 0, rq = 0;
    for (double r : rewards) rs += r;
    met.reward_mean = rs / double(rewards.size());
    for (double r : rewards) rq += (r - met.reward_mean) * (r - met.reward_mean);
    met.reward_std = std::sqrt(rq / double(rewards.size()));
    const std::vector<double> adv = group_advantages(rewards, groups, cfg.loss);

    std::vector<TrainSeq> seqs(roll.completions.size());
    for (size_t i = 0; i < seqs.size(); ++i) {
      const Completion& c = roll.completions[i];
      LS_CHECK(!c.tokens.empty(), kOp, "request ", c.id, " generated no token");
      TrainSeq& s = seqs[i];
      s.tokens = c.prompt;
      s.tokens.insert(s.tokens.end(), c.tokens.begin(), c.tokens.end());
      s.prompt_len = int64_t(c.prompt.size());
      s.c = &c;
      s.advantage = adv[i];
      s.weight_version = samples[i].weight_version;
    }
    met.sequences = int64_t(seqs.size());
    // The step's GRPO groups (shared prompts): request p·G + j is sample j of prompt p.
    std::vector<PromptGroup> prompt_groups;
    if (cfg.share_prompts) {
      for (size_t i = 0; i < seqs.size(); ++i) {
        const Completion& c = *seqs[i].c;
        LS_CHECK(c.id == int64_t(i), kOp, "completion ", i, " is request ", c.id,
                 ": shared prompts need the rollout's request order");
        if (i % size_t(cfg.group) == 0) prompt_groups.push_back({c.prompt, {}});
        prompt_groups.back().completions.push_back(c.tokens);
      }
    }
    lap(met.reward_s);

    // ---- training: mini-batches (consecutive runs of the step's order), each one optimizer step
    const auto t_train = Clock::now();
    int64_t train_tokens = 0;
    const int64_t n = int64_t(seqs.size());
    for (int64_t mb = 0; mb < cfg.mini_batches; ++mb) {
      // Mini-batch mb: sequences [m0, m1); with shared prompts whole groups (of G sequences each).
      const int64_t unit = cfg.share_prompts ? cfg.group : 1, nu = n / unit;
      const int64_t m0 = nu * mb / cfg.mini_batches * unit;
      const int64_t m1 = nu * (mb + 1) / cfg.mini_batches * unit;
      for (int64_t s = m0; s < m1; ++s) {
        const int64_t lag = weight_version - seqs[size_t(s)].weight_version;
        // The first mini-batch trains on the rollout's own weights (the ratios are exactly 1
        // there); a sample from newer weights than the trainer's is impossible.
        LS_CHECK(lag >= 0 && (mb > 0 || lag == 0), kOp, "step ", step, " mini-batch ", mb,
                 ": the trainer's weights (version ", weight_version, ") vs sample ",
                 seqs[size_t(s)].c->id, "'s (version ", seqs[size_t(s)].weight_version, ")");
        met.max_staleness = std::max(met.max_staleness, lag);
      }
      // The mini-batch's forwards, loss and backward into gradients: on the simulated-TP model
      // (comm null), or as rank comm->rank() of a rank-local job (threads: one thread per rank,
      // each with its own copies of seqs / met / train_tokens, rank 0's are kept; launch: this
      // process's rank of the job).
      // `tick` times phases (rank 0 only in a job).
      auto train_minibatch = [&](dist::Communicator* comm, std::vector<TrainSeq>& seqs,
                                 GrpoStepMetrics& met, int64_t& train_tokens) {
        const bool timing = !comm || comm->rank() == 0;
        auto tick = [&](double& into) {
          if (timing) lap(into);
        };
        // The head from the rollout (GrpoConfig::head_from_rollout): on the first mini-batch (the
        // rollout's own weights) with the invariant kernels, the trainer does not run the head's
        // forward — the rollout's lse / entropy / logp are its bits (the contract) — and the
        // backward recomputes them from the logits it computes anyway (§B.8 "the forward from the
        // backward"); they are compared with the rollout's afterwards, and a mismatch (a broken
        // contract: never expected) redoes the mini-batch with the head's forward.
        const bool rollout_head_allowed =
            cfg.head_from_rollout && mb == 0 && !cfg.baseline && !cfg.share_prompts && !comm;
        const GrpoStepMetrics met_in = met;
        const int64_t tokens_in = train_tokens;
        int64_t head_mismatches = 0;  // of the attempts so far (kept when a redo resets met)
        for (int attempt = 0;; ++attempt) {
          const bool from_rollout = rollout_head_allowed && attempt == 0;
          met = met_in;
          met.head_mismatches += head_mismatches;
          train_tokens = tokens_in;
          int64_t rollout_head_mismatches = 0;
          // One trainer log-prob vs the rollout's, bit for bit, into the step's counts; true if
          // equal.
          auto compare_logp = [&](float trainer, float rollout) {
            ++met.logp_compared;
            if (f32_bits(trainer) == f32_bits(rollout)) return true;
            ++met.logp_mismatches;
            met.max_abs_dlogp =
                std::max(met.max_abs_dlogp, std::fabs(double(trainer) - double(rollout)));
            return false;
          };
          std::unique_ptr<Gradients> grads;
          // The training model over the optimizer's weights, and its backward's own copies of them
          // (on the device: device to device). Rank-local: each rank's shards only.
          Model train_model(mcfg, views_of(adam->bf16_weights()), topt, fwd_ops, comm);
          const std::unique_ptr<Backprop> bp_own =
              comm ? std::make_unique<Backprop>(mcfg, views_of(adam->bf16_weights()), topt, *ops,
                                                *comm)
                   : std::make_unique<Backprop>(mcfg, views_of(adam->bf16_weights()), topt, *ops);
          const Backprop& bp = *bp_own;
          tick(met.weight_sync_s);
          // Forwards of the micro-batches (consecutive runs of at most micro_batch_tokens tokens).
          std::vector<MicroBatch> mbs;
          for (int64_t s = m0; cfg.share_prompts && s < m1;) {
            // Whole groups while their tokens (each prompt once) fit in micro_batch_tokens.
            MicroBatch u;
            u.s0 = s;
            std::vector<size_t> members;
            int64_t fill = 0;
            while (s < m1) {
              const size_t k = size_t(s / cfg.group);
              int64_t len = int64_t(prompt_groups[k].prompt.size());
              for (const auto& c : prompt_groups[k].completions) len += int64_t(c.size());
              if (!members.empty() && fill + len > cfg.micro_batch_tokens) break;
              members.push_back(k);
              fill += len;
              s += cfg.group;
            }
            u.s1 = s;
            u.pack = pack_prompt_groups(prompt_groups, members);
            SharedPack& pk = *u.pack;
            const int64_t T = int64_t(pk.tokens.size()), Th = int64_t(pk.targets.size());
            train_tokens += T;
            u.saved = bp.forward_shared(
                train_model, TensorView::contiguous(pk.tokens.data(), DType::kI32, {T}),
                TensorView::contiguous(pk.cu.data(), DType::kI32, {int64_t(pk.cu.size())}),
                TensorView::contiguous(pk.prompt_of.data(), DType::kI32,
                                       {int64_t(pk.prompt_of.size())}));
            u.targets = pk.targets;
            Tensor logp(DType::kF32, {Th});
            u.lse = Tensor(DType::kF32, {Th});
            u.ent = Tensor(DType::kF32, {Th});
            const Tensor hh = bp.head_hidden(u.saved, pk.head);
            train_model.logprob(hh.view(),
                                TensorView::contiguous(u.targets.data(), DType::kI64, {Th}),
                                cfg.temperature, logp.view(), u.lse.view(), u.ent.view());
            for (int64_t k = u.s0; k < u.s1; ++k) {
              TrainSeq& q = seqs[size_t(k)];
              const int64_t base =
                  pk.head_row0[size_t((k - u.s0) / cfg.group)][size_t((k - u.s0) % cfg.group)];
              const int64_t nc = int64_t(q.c->tokens.size());
              u.head0.push_back(base);
              q.logp.assign(logp.ptr<float>() + base, logp.ptr<float>() + base + nc);
              q.entropy.assign(u.ent.ptr<float>() + base, u.ent.ptr<float>() + base + nc);
            }
            mbs.push_back(std::move(u));
          }
          for (int64_t s = m0; !cfg.share_prompts && s < m1;) {
            MicroBatch u;
            u.s0 = s;
            std::vector<int32_t> tokens;
            u.cu = {0};
            while (s < m1 && (s == u.s0 || int64_t(tokens.size() + seqs[size_t(s)].tokens.size()) <=
                                               cfg.micro_batch_tokens)) {
              const TrainSeq& q = seqs[size_t(s)];
              for (size_t i = 0; i < q.tokens.size(); ++i) {
                tokens.push_back(q.tokens[i]);
                // Position i predicts token i+1; only the completion's tokens are targets.
                const bool target = int64_t(i) + 1 >= q.prompt_len && i + 1 < q.tokens.size();
                u.targets.push_back(target ? q.tokens[i + 1] : -1);
              }
              u.cu.push_back(int32_t(tokens.size()));
              ++s;
            }
            u.s1 = s;
            const int64_t T = int64_t(tokens.size());
            train_tokens += T;
            u.saved = bp.forward(
                train_model, TensorView::contiguous(tokens.data(), DType::kI32, {T}),
                TensorView::contiguous(u.cu.data(), DType::kI32, {int64_t(u.cu.size())}));
            Tensor logp(DType::kF32, {T});
            u.lse = Tensor(DType::kF32, {T});
            u.ent = Tensor(DType::kF32, {T});
            if (from_rollout) {
              // Rows without a target: lse a large finite value and entropy 0 (their G is +0 with
              // any finite p: the bits of the true lse; a finite lse keeps p ⊗ (μ ⊖ y) finite).
              std::fill_n(u.lse.ptr<float>(), T, 1e30f);
              std::fill_n(u.ent.ptr<float>(), T, 0.0f);
              std::fill_n(logp.ptr<float>(), T, 0.0f);
              for (int64_t k = u.s0; k < u.s1; ++k) {
                const Completion& c = *seqs[size_t(k)].c;
                const int64_t base = u.cu[size_t(k - u.s0)] + seqs[size_t(k)].prompt_len - 1;
                LS_CHECK(c.lse.size() == c.tokens.size() && c.entropy.size() == c.tokens.size() &&
                             c.logp.size() == c.tokens.size(),
                         kOp, "request ", c.id, ": the rollout recorded ", c.lse.size(),
                         " lse and ", c.entropy.size(), " entropies for ", c.tokens.size(),
                         " tokens");
                std::copy(c.lse.begin(), c.lse.end(), u.lse.ptr<float>() + base);
                std::copy(c.entropy.begin(), c.entropy.end(), u.ent.ptr<float>() + base);
                std::copy(c.logp.begin(), c.logp.end(), logp.ptr<float>() + base);
              }
            } else {
              train_model.logprob(u.saved.hidden.view(),
                                  TensorView::contiguous(u.targets.data(), DType::kI64, {T}),
                                  cfg.temperature, logp.view(), u.lse.view(), u.ent.view());
            }
            for (int64_t k = u.s0; k < u.s1; ++k) {
              TrainSeq& q = seqs[size_t(k)];
              const int64_t base = u.cu[size_t(k - u.s0)] + q.prompt_len - 1;
              const int64_t nc = int64_t(q.c->tokens.size());
              u.head0.push_back(base);
              q.logp.assign(logp.ptr<float>() + base, logp.ptr<float>() + base + nc);
              q.entropy.assign(u.ent.ptr<float>() + base, u.ent.ptr<float>() + base + nc);
            }
            mbs.push_back(std::move(u));
          }
          // Compare with the rollout's recorded values (first mini-batch of the step: same weights;
          // from the rollout: after the backward, with the values it recomputed).
          if (mb == 0 && !from_rollout) {
            for (int64_t k = m0; k < m1; ++k) {
              const TrainSeq& q = seqs[size_t(k)];
              for (size_t j = 0; j < q.logp.size(); ++j) compare_logp(q.logp[j], q.c->logp[j]);
            }
          }
          tick(met.forward_s);
          // The loss over the mini-batch, then the backward micro-batch by micro-batch.
          std::vector<SeqLoss> sl;
          for (int64_t k = m0; k < m1; ++k) {
            const TrainSeq& q = seqs[size_t(k)];
            SeqLoss x;
            x.advantage = q.advantage;
            x.old_logp = q.c->logp;
            x.logp = q.logp;
            x.entropy = q.entropy;
            sl.push_back(std::move(x));
          }
          const LossResult lr = policy_loss(sl, cfg.loss);
          if (mb == 0) {
            met.ratio_min = lr.ratio_min;
            met.ratio_max = lr.ratio_max;
            met.clip_fraction = lr.clip_fraction;
            met.kl = lr.kl;
            met.entropy_mean = lr.entropy_mean;
            met.loss = lr.loss;
          }
          grads = comm ? std::make_unique<Gradients>(mcfg, topt, *comm)
                       : std::make_unique<Gradients>(mcfg, *ops);
          for (const MicroBatch& u : mbs) {
            const int64_t T = int64_t(u.targets.size());
            std::vector<float> g_lp(size_t(T), 0.0f), g_ent(size_t(T), 0.0f);
            std::vector<int64_t> idx;
            for (int64_t k = u.s0; k < u.s1; ++k) {
              const int64_t base = u.head0[size_t(k - u.s0)];
              const auto& gl = lr.g_logp[size_t(k - m0)];
              const auto& ge = lr.g_entropy[size_t(k - m0)];
              for (size_t j = 0; j < gl.size(); ++j) {
                g_lp[size_t(base) + j] = gl[j];
                g_ent[size_t(base) + j] = ge[j];
              }
              idx.push_back(k);
            }
            const TensorView ge_v = TensorView::contiguous(g_ent.data(), DType::kF32, {T});
            LogprobParams params;
            params.temperature = cfg.temperature;
            const TensorView tg = TensorView::contiguous(u.targets.data(), DType::kI64, {T});
            const TensorView gl_v = TensorView::contiguous(g_lp.data(), DType::kF32, {T});
            if (u.pack) {
              bp.backward_shared(u.saved, u.pack->head, tg, params, u.lse.view(), u.ent.view(),
                                 gl_v, &ge_v, u.pack->step_indices, *grads);
            } else if (from_rollout) {
              Tensor lp_r(DType::kF32, {T}), lse_r(DType::kF32, {T}), ent_r(DType::kF32, {T});
              const HeadOutputs ho{lp_r.view(), lse_r.view(), ent_r.view()};
              bp.backward(u.saved, tg, params, u.lse.view(), u.ent.view(), gl_v, &ge_v, idx, *grads,
                          &ho);
              // The trainer's head (recomputed by the backward) vs the rollout's, bit for bit.
              for (int64_t k = u.s0; k < u.s1; ++k) {
                const Completion& c = *seqs[size_t(k)].c;
                const size_t base = size_t(u.head0[size_t(k - u.s0)]);
                for (size_t j = 0; j < c.logp.size(); ++j) {
                  const float lp = lp_r.ptr<float>()[base + j];
                  if (!compare_logp(lp, c.logp[j]) ||
                      f32_bits(lse_r.ptr<float>()[base + j]) != f32_bits(c.lse[j]) ||
                      f32_bits(ent_r.ptr<float>()[base + j]) != f32_bits(c.entropy[j]))
                    ++rollout_head_mismatches;
                }
              }
            } else {
              bp.backward(u.saved, tg, params, u.lse.view(), u.ent.view(), gl_v, &ge_v, idx,
                          *grads);
            }
          }
          if (rollout_head_mismatches > 0) {
            // The gradients were taken at the rollout's lse, which is not the trainer's: redo.
            std::fprintf(stderr,
                         "[grpo] step %lld: %lld of the rollout's head values differ from the "
                         "trainer's (the contract is broken somewhere); the mini-batch is redone "
                         "with the trainer's own head\n",
                         (long long)step, (long long)rollout_head_mismatches);
            head_mismatches += rollout_head_mismatches;
            continue;
          }
          grads->finish();
          return grads;
        }
      };
      Weights gathered;  // rank-local: the gradients of every rank's blocks
      std::unique_ptr<Gradients> grads;
      if (cfg.train_ranks == RankMode::kSimulated) {
        grads = train_minibatch(nullptr, seqs, met, train_tokens);
      } else if (cfg.train_ranks == RankMode::kLaunch) {
        gathered = train_minibatch(job, seqs, met, train_tokens)->gather();
      } else {
        std::vector<TrainSeq> seqs0;
        GrpoStepMetrics met0;
        int64_t tokens0 = 0;
        dist::run_ranks(cfg.train_tp, [&](dist::Communicator& comm) {
          std::vector<TrainSeq> my_seqs = seqs;
          GrpoStepMetrics my_met = met;
          int64_t my_tokens = train_tokens;
          const std::unique_ptr<Gradients> g = train_minibatch(&comm, my_seqs, my_met, my_tokens);
          Weights w = g->gather();
          if (comm.rank() != 0) return;
          seqs0 = std::move(my_seqs);
          met0 = my_met;
          tokens0 = my_tokens;
          gathered = std::move(w);
        });
        seqs = std::move(seqs0);
        met = met0;
        train_tokens = tokens0;
      }
      lap(met.backward_s);
      const StepStats st = adam->step(grads ? grads->all() : gathered);
      met.grad_norm = st.grad_norm;
      met.lr = st.lr;
      lap(met.optimizer_s);
      grads.reset();
      ++weight_version;
      lap(met.weight_sync_s);
    }
    met.train_s = seconds_since(t_train);
    met.train_tokens_per_s = met.train_s > 0 ? double(train_tokens) / met.train_s : 0;
    // The step's weights on the host (the sha256, checkpoints, the result): one copy per step.
    host = adam->bf16_weights_host();
    met.weights_sha256 = weights_sha256(host);
    if (job)
      check_same_sha256_on_every_rank(*job, met.weights_sha256,
                                      "grpo step " + std::to_string(step) + ": the weights");
    lap(met.hash_s);
    met.step_s = seconds_since(t_step);
    if (writes && !cfg.checkpoint_dir.empty() &&
        ((cfg.checkpoint_every > 0 && (step + 1) % cfg.checkpoint_every == 0) ||
         step + 1 == cfg.steps))
      save_checkpoint(cfg, mcfg, *adam, host, step + 1);
    if (hooks.on_step) hooks.on_step(met);
  }
  return host;
}

}  // namespace lockstep::engine
