// `lockstep grpo` (tools/grpo_cmd.h).
#include "tools/grpo_cmd.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>

#include "core/thread_pool.h"
#include "dist/process_transport.h"
#include "engine/default_model.h"
#include "engine/grpo.h"
#include "engine/safetensors.h"
#include "engine/sha256.h"
#include "lockstep/error.h"
#include "tools/engine_setup.h"
#include "tools/plot_svg.h"

#ifdef LOCKSTEP_WITH_CUDA
#include "engine/cuda/grpo_device.h"
#include "lockstep/cuda/runtime.h"
#endif

namespace lockstep::tools {
namespace {

struct GrpoFlags {
  ModelFlags model;
  engine::GrpoConfig cfg;
  std::string lr_text;
  bool json = false;
  std::string metrics, out, plot, plot_with;
  std::string device = "cpu";
  int threads = 0;
};

// The device's backends and AdamW; a clear error (before any model work) when the device is not
// built in or absent, never a CPU run in its place.
engine::GrpoDevice grpo_device(const std::string& device) {
  if (device == "cpu") return engine::cpu_grpo_device();
  LS_CHECK(device == "cuda", "device", "unknown device '", device, "' (expected cpu or cuda)");
#ifdef LOCKSTEP_WITH_CUDA
  LS_CHECK(cuda::available(), "device",
           "--device cuda: no usable CUDA device on this machine (the build has CUDA support)");
  return engine::cuda_grpo_device();
#else
  throw Error(
      "device: --device cuda: this lockstep binary was built without CUDA (configure with "
      "-DLOCKSTEP_CUDA=ON where nvcc is installed); only --device cpu is available");
#endif
}

// `log`: say so on stderr when random weights are generated.
engine::Weights load_weights(const ModelFlags& m, engine::Qwen3Config& cfg, std::string& desc,
                             bool log) {
  if (m.dir.empty()) {
    // The built-in model's weights, or random weights of a named shape (--weight-seed).
    cfg = engine::qwen3_shape_config(m.shape);
    const uint64_t seed = m.weight_seed == 0 ? engine::kDefaultModelSeed : m.weight_seed;
    desc = m.shape == "default" && m.weight_seed == 0
               ? "built-in default model"
               : "random " + m.shape + " weights (seed " + std::to_string(seed) + ")";
    if (log && m.shape != "default") std::fprintf(stderr, "[grpo] generating %s\n", desc.c_str());
    return engine::random_qwen3_weights(cfg, seed);
  }
  engine::LoadOptions lo;
  lo.strict = m.strict;
  const engine::Checkpoint ck = engine::Checkpoint::load(m.dir, lo);
  cfg = ck.config();
  desc = m.dir;
  engine::Weights w;
  for (const engine::WeightSpec& s : engine::qwen3_weight_specs(cfg))
    w.emplace_back(s.name, ck.get_converted(s.name, DType::kBF16, s.shape));
  return w;
}

std::string json_line(const engine::GrpoStepMetrics& s) {
  char buf[2048];
  std::snprintf(
      buf, sizeof buf,
      "{\"step\": %lld, \"reward_mean\": %.9g, \"reward_std\": %.9g, \"sequences\": "
      "%lld, \"generated_tokens\": %lld, \"logp_compared\": %lld, \"logp_mismatches\": "
      "%lld, \"max_abs_dlogp\": %.9g, \"head_mismatches\": %lld, \"ratio_min\": %.17g, "
      "\"ratio_max\": %.17g, "
      "\"clip_fraction\": %.9g, \"kl\": %.9g, \"entropy_mean\": %.9g, \"loss\": %.9g, "
      "\"grad_norm\": %.9g, \"lr\": %.9g, \"rollout_s\": %.4f, \"train_s\": %.4f, "
      "\"step_s\": %.4f, \"reward_s\": %.4f, \"forward_s\": %.4f, \"backward_s\": %.4f, "
      "\"optimizer_s\": %.4f, \"weight_sync_s\": %.4f, \"hash_s\": %.4f, "
      "\"train_tokens_per_s\": %.1f, "
      "\"rollout_weight_version\": %lld, \"max_staleness\": %lld, \"weights_sha256\": "
      "\"%s\"}",
      (long long)s.step, s.reward_mean, s.reward_std, (long long)s.sequences,
      (long long)s.generated_tokens, (long long)s.logp_compared, (long long)s.logp_mismatches,
      s.max_abs_dlogp, (long long)s.head_mismatches, s.ratio_min, s.ratio_max, s.clip_fraction,
      s.kl, s.entropy_mean, s.loss, s.grad_norm, s.lr, s.rollout_s, s.train_s, s.step_s, s.reward_s,
      s.forward_s, s.backward_s, s.optimizer_s, s.weight_sync_s, s.hash_s, s.train_tokens_per_s,
      (long long)s.rollout_weight_version, (long long)s.max_staleness, s.weights_sha256.c_str());
  return buf;
}

// step, reward_mean and logp_mismatches of a --metrics / --json JSONL file (another run, e.g.
// --baseline's), for --plot-with.
void read_metrics(const std::string& path, PlotSeries& reward, PlotSeries& mism) {
  std::ifstream in(path);
  LS_CHECK(in.good(), "lockstep grpo", "cannot read --plot-with ", path);
  std::string line;
  int64_t n = 0;
  auto field = [&](const std::string& l, const char* key, double& v) {
    const size_t at = l.find(std::string("\"") + key + "\": ");
    if (at == std::string::npos) return false;
    v = std::strtod(l.c_str() + at + std::strlen(key) + 4, nullptr);
    return true;
  };
  while (std::getline(in, line)) {
    double step, r, m;
    if (!field(line, "step", step)) continue;  // warm-up lines
    LS_CHECK(field(line, "reward_mean", r) && field(line, "logp_mismatches", m), "lockstep grpo",
             "--plot-with ", path, ": a step line without reward_mean / logp_mismatches");
    reward.x.push_back(step);
    reward.y.push_back(r);
    mism.x.push_back(step);
    mism.y.push_back(m);
    ++n;
  }
  LS_CHECK(n > 0, "lockstep grpo", "--plot-with ", path, " holds no step");
}

// The run on every process alike (`job`: this process's rank of a launched training job, or
// nullptr); only rank 0 (or a process without a job) prints and writes files.
int run_grpo_on(GrpoFlags& f, dist::Communicator* job) {
  const bool speaks = job == nullptr || job->rank() == 0;
  // The device first: a missing one fails before any model work.
  engine::GrpoDevice dev = grpo_device(f.device);
  dev.train_job = job;
  f.cfg.device = dev.device;
  engine::Qwen3Config mcfg;
  std::string desc;
  const engine::Weights init = load_weights(f.model, mcfg, desc, speaks);
  engine::GrpoConfig& cfg = f.cfg;
  // The KV pool: every sequence of a step at once (prompt + completion), 16-token pages.
  cfg.rollout.kv.page_size = 16;
  cfg.rollout.kv.num_pages = cfg.prompts * cfg.group * 4 + 64;
  cfg.rollout.scheduler.max_running = std::min<int64_t>(128, cfg.prompts * cfg.group);
  cfg.rollout.scheduler.max_batched_tokens = 512;
  cfg.rollout.scheduler.prefix_sharing = true;
  cfg.validate();
  if (is_png_path(f.plot)) check_png_plot_tool("lockstep grpo --plot");  // before the run
  std::FILE* metrics = nullptr;
  if (!speaks) {  // the other ranks of a launched job: their output is rank 0's
    f.json = false;
    f.metrics.clear();
    f.plot.clear();
    f.out.clear();
  }
  if (!f.metrics.empty()) {
    metrics = std::fopen(f.metrics.c_str(), "w");
    LS_CHECK(metrics, "lockstep grpo", "cannot write --metrics ", f.metrics);
  }
  if (speaks && !f.json) {
    std::printf("lockstep grpo: on-policy RL, rollout vs trainer log-probs compared bit for bit\n");
    std::printf("  model     %s: %s\n", desc.c_str(), mcfg.to_string().c_str());
    std::printf("  device    %s\n", device_description(f.device).c_str());
    std::printf("  sha256    %s (the weights' digest of every step)\n",
                engine::sha256_impl_name(engine::sha256_impl()));
    std::printf("  %s\n\n", cfg.to_string().c_str());
    flush_stdout();
  }
  int64_t mismatches = 0;
  engine::GrpoHooks hooks;
  hooks.on_sft_step = [&](const engine::SftStepMetrics& s) {
    if (!speaks) return;
    if (f.json) {
      std::printf(
          "{\"sft_step\": %lld, \"loss\": %.9g, \"token_accuracy\": %.9g, \"grad_norm\": "
          "%.9g}\n",
          (long long)s.step, s.loss, s.token_accuracy, s.grad_norm);
    } else if (s.step % 10 == 0 || s.step + 1 == cfg.sft_steps) {
      std::printf("  warm-up %4lld  loss %.4f  token accuracy %.3f  grad norm %.3f  %.2f s\n",
                  (long long)s.step, s.loss, s.token_accuracy, s.grad_norm, s.step_s);
    }
    flush_stdout();
  };
  hooks.progress = [speaks](const std::string& s) {
    if (speaks) std::fprintf(stderr, "[grpo] %s\n", s.c_str());
  };
  bool header = false;
  PlotSeries reward{cfg.baseline ? "baseline" : "lockstep", {}, {}};
  PlotSeries mism = reward;
  hooks.on_step = [&](const engine::GrpoStepMetrics& s) {
    mismatches += s.logp_mismatches + s.head_mismatches;
    reward.x.push_back(double(s.step));
    reward.y.push_back(s.reward_mean);
    mism.x.push_back(double(s.step));
    mism.y.push_back(double(s.logp_mismatches + s.head_mismatches));
    if (!speaks) return;
    if (!f.json && !header) {
      header = true;
      // The step's time split (seconds): rollout, training forward, backward, optimizer, weight
      // sync, the weights' hash (reward scoring is in step s, and in --json).
      std::printf("\n%5s %8s %7s %10s %10s %20s %8s %9s %8s %9s %8s %7s %7s %7s %7s %7s %7s\n",
                  "step", "reward", "std", "compared", "mismatch", "ratio min/max", "kl",
                  "clipfrac", "gnorm", "tok/s", "step s", "roll", "fwd", "bwd", "opt", "sync",
                  "hash");
    }
    const std::string j = json_line(s);
    if (metrics) {
      std::fprintf(metrics, "%s\n", j.c_str());
      std::fflush(metrics);
    }
    if (f.json) {
      std::printf("%s\n", j.c_str());
    } else {
      char rr[64];
      std::snprintf(rr, sizeof rr, "%.6f/%.6f", s.ratio_min, s.ratio_max);
      std::printf(
          "%5lld %8.4f %7.4f %10lld %10lld %20s %8.2g %9.3f %8.3f %9.0f %8.2f %7.2f %7.2f %7.2f "
          "%7.2f %7.2f %7.2f\n",
          (long long)s.step, s.reward_mean, s.reward_std, (long long)s.logp_compared,
          (long long)s.logp_mismatches, rr, s.kl, s.clip_fraction, s.grad_norm,
          s.train_tokens_per_s, s.step_s, s.rollout_s, s.forward_s, s.backward_s, s.optimizer_s,
          s.weight_sync_s, s.hash_s);
    }
    flush_stdout();
  };
  const engine::Weights final = engine::run_grpo(cfg, mcfg, init, dev, hooks);
  if (metrics) std::fclose(metrics);
  if (!f.plot.empty()) {
    std::vector<PlotPanel> panels = {{"reward (mean over the step's samples)", {reward}},
                                     {"rollout vs trainer log-prob mismatches", {mism}}};
    if (!f.plot_with.empty()) {
      PlotSeries r2{f.plot_with, {}, {}}, m2 = r2;
      read_metrics(f.plot_with, r2, m2);
      panels[0].series.push_back(r2);
      panels[1].series.push_back(m2);
    }
    const std::string title = "lockstep grpo: " + cfg.task + ", " + desc;
    if (is_png_path(f.plot))
      write_png_plot(f.plot, title, panels);
    else
      write_svg_plot(f.plot, title, panels);
    if (!f.json) std::printf("\nwrote %s\n", f.plot.c_str());
  }
  if (!f.out.empty()) {
    engine::write_model_files(f.out, engine::serialize_qwen3_model(mcfg, final));
    if (!f.json) std::printf("\nwrote %s (config.json + model.safetensors)\n", f.out.c_str());
  }
  if (speaks && !f.json) {
    std::printf("\n%s: %lld log-prob mismatches between rollout and trainer over %lld steps%s\n",
                cfg.baseline      ? "BASELINE"
                : mismatches == 0 ? "PASS"
                                  : "FAIL",
                (long long)mismatches, (long long)cfg.steps,
                cfg.baseline ? " (ordinary kernels: what TIS / MIS corrections exist for)" : "");
  }
  flush_stdout();
  // Every rank ran the same steps; rank 0 has written the output. A rank that failed to (or failed
  // at all) fails this barrier on every rank, so every rank's exit status says so.
  if (job) job->barrier();
  return mismatches == 0 || cfg.baseline ? kExitOk : kExitCheckFailed;
}

int run_grpo_cmd(GrpoFlags& f) {
  if (f.cfg.train_ranks != engine::RankMode::kLaunch) {
    if (f.threads > 0) set_num_threads(f.threads);
    return run_grpo_on(f, nullptr);
  }
  const dist::ProcessGroupSpec spec =
      launched_job_spec("--train-ranks launch", "--train-tp", f.cfg.train_tp);
  return run_as_launched_rank(spec, f.threads,
                              [&](dist::Communicator* job) { return run_grpo_on(f, job); });
}

}  // namespace

Command add_grpo_command(CLI::App& top) {
  auto f = std::make_shared<GrpoFlags>();
  f->cfg.contract = default_contract();
  // Defaults: a supervised warm-up, then GRPO at a smaller learning rate (docs/training.md: the
  // measured default run and why these values).
  f->cfg.optim.lr = 3e-4;
  f->cfg.sft_steps = 20;
  f->cfg.steps = 30;
  f->cfg.optim.max_grad_norm = 1.0;
  CLI::App* sub = top.add_subcommand(
      "grpo",
      "GRPO on a model with a verifiable task; every step's rollout log-probs compared with the "
      "trainer's bit for bit");
  add_model_options(*sub, f->model);
  add_contract_options(*sub, f->cfg.contract);
  add_threads_option(*sub, f->threads);
  sub->add_option("--device", f->device,
                  "where rollout, training and the optimizer run (cuda: the invariant CUDA "
                  "kernels, the CPU's bits)")
      ->check(CLI::IsMember({"cpu", "cuda"}).description(""))
      ->type_name("cpu|cuda")
      ->capture_default_str();
  sub->add_option("--task", f->cfg.task, "built-in task: copy, reverse, sort, add")
      ->capture_default_str();
  sub->add_option("--digits", f->cfg.digits, "the task's operand length")
      ->transform(int_in(1, 32))
      ->capture_default_str();
  sub->add_option("--reward-command", f->cfg.reward_command,
                  "score with this command instead (JSONL samples on stdin, one reward per line)");
  sub->add_option("--reward-timeout", f->cfg.reward_timeout_s, "seconds")->capture_default_str();
  sub->add_option("--steps", f->cfg.steps, "GRPO steps")
      ->transform(int_in(0, 1000000))
      ->capture_default_str();
  sub->add_option("--sft-steps", f->cfg.sft_steps,
                  "supervised warm-up steps on the task's answers before GRPO (same optimizer)")
      ->transform(int_in(0, 1000000))
      ->capture_default_str();
  sub->add_option("--sft-lr", f->cfg.sft_lr, "the warm-up's learning rate")->capture_default_str();
  sub->add_option("--sft-prompts", f->cfg.sft_prompts, "prompts per warm-up step")
      ->transform(int_in(1, 65536))
      ->capture_default_str();
  sub->add_option("--prompts", f->cfg.prompts, "prompts per step")
      ->transform(int_in(1, 4096))
      ->capture_default_str();
  sub->add_option("--group", f->cfg.group, "samples per prompt (G)")
      ->transform(int_in(1, 256))
      ->capture_default_str();
  sub->add_option("--temperature", f->cfg.temperature, "sampling temperature")
      ->transform(float_in(0.0f, 100.0f, true))
      ->capture_default_str();
  sub->add_option("--seed", f->cfg.seed, "prompts and sampling")->transform(uint64_any());
  sub->add_option("--rollout-tp", f->cfg.rollout_tp, "rollout tensor parallelism (simulated)")
      ->transform(int_one_of({1, 2, 4, 8}))
      ->capture_default_str();
  sub->add_option("--train-tp", f->cfg.train_tp, "training tensor parallelism (simulated)")
      ->transform(int_one_of({1, 2, 4, 8}))
      ->capture_default_str();
  add_ranks(*sub, "--train-ranks", f->cfg.train_ranks,
            "how the training side's TP ranks run: simulated (one model combines them), threads "
            "(one rank-local model, backward and gradient blocks per thread, parts exchanged by "
            "all_gather) or launch (this process is one rank: run it under `lockstep launch "
            "--nproc N`, N = --train-tp; rollout and AdamW run on every process alike, rank 0 "
            "scores, prints and writes); the same bits; invariant CPU only",
            "Options");
  sub->add_option("--micro-batch-tokens", f->cfg.micro_batch_tokens, "tokens per micro-batch")
      ->transform(int_in(1, int64_t(1) << 24))
      ->capture_default_str();
  sub->add_option("--mini-batches", f->cfg.mini_batches, "optimizer steps per rollout batch")
      ->transform(int_in(1, 4096))
      ->capture_default_str();
  sub->add_option("--lr", f->cfg.optim.lr, "AdamW learning rate")->capture_default_str();
  sub->add_option("--max-grad-norm", f->cfg.optim.max_grad_norm, "global-norm clipping (0: off)")
      ->capture_default_str();
  sub->add_option("--checkpoint-dir", f->cfg.checkpoint_dir,
                  "write checkpoints here (step-<N>/: config.json, model.safetensors, "
                  "optimizer.safetensors, trainer.txt; 'latest' names the newest)");
  sub->add_option("--checkpoint-every", f->cfg.checkpoint_every,
                  "GRPO steps between checkpoints (0: only after the last step)")
      ->transform(int_in(0, 1000000))
      ->capture_default_str();
  sub->add_option("--resume", f->cfg.resume,
                  "continue from a checkpoint (a step-<N> directory or a --checkpoint-dir): the "
                  "remaining steps give the bits of an uninterrupted run");
  sub->add_flag("--baseline", f->cfg.baseline,
                "ordinary (non-invariant) kernels for rollout and training forward (cuda: cuBLAS "
                "and the baseline kernels; the backward stays invariant: the baselines have none)");
  sub->add_flag("--share-prompts", f->cfg.share_prompts,
                "train each GRPO group's prompt once (its completions attend to it; log-probs "
                "unchanged, gradients the shared form of docs/contract.md §B.11)");
  sub->add_flag_callback(
      "--head-forward", [f] { f->cfg.head_from_rollout = false; },
      "run the log-prob head's forward on the first mini-batch too (by default it is skipped "
      "there: the rollout's lse is the trainer's, and the backward recomputes and checks it)");
  sub->add_flag("--json", f->json, "one JSON object per step (JSONL) on stdout");
  sub->add_option("--metrics", f->metrics, "also write the JSONL metrics to this file");
  sub->add_option("--plot", f->plot,
                  "draw reward and mismatches per step into this file: .svg, or .png (rasterized "
                  "by rsvg-convert; atomic write)");
  sub->add_option("--plot-with", f->plot_with,
                  "add another run's --metrics JSONL to the plot (e.g. a --baseline run's)");
  sub->add_option("--out", f->out, "write the final weights here (config.json + safetensors)");
  return {sub, [f] {
            LS_CHECK(f->model.dir.empty() || f->model.shape == "default", "lockstep grpo",
                     "--model and --model-shape exclude each other");
            return run_grpo_cmd(*f);
          }};
}

}  // namespace lockstep::tools
