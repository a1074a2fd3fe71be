// `lockstep bench-engine`: the audit's workload (same flags as `lockstep audit`) run by the
// invariant and the baseline backend of one device, timed. EOS is off, so every sequence generates
// exactly --max-new-tokens and the scheduler makes the same steps for both backends (the schedule
// depends on lengths only); the training forward packs sequences of the same lengths the same
// way. Each backend first runs a small warm-up (kernel loading, allocator pools, cuBLAS handles).
// The weights are uploaded once per device and shared by both backends.
#include "tools/bench_engine_cmd.h"

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "engine/audit.h"
#include "engine/rollout.h"
#include "engine/trainer.h"
#include "lockstep/error.h"
#include "tools/engine_options.h"
#include "tools/engine_setup.h"

namespace lockstep::tools {

namespace {

struct BenchResult {
  std::string backend;
  int64_t generated = 0, rollout_tokens = 0, steps = 0, preemptions = 0;
  double rollout_s = 0;
  int64_t train_tokens = 0, micro_batches = 0;
  double train_s = 0;
  int64_t compared = 0, mismatches = 0;
};

std::vector<engine::TrainSequence> train_seqs_of(const engine::RolloutResult& rr) {
  std::vector<engine::TrainSequence> out;
  for (const engine::Completion& c : rr.completions) {
    engine::TrainSequence s;
    s.id = c.id;
    s.prompt = c.prompt;
    s.completion = c.tokens;
    s.temperature = c.sampling.logprob_temperature();
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace

namespace {

int run_bench_engine(EngineCommandLine& o) {
  resolve_engine_options(o);
  if (o.threads > 0) set_num_threads(o.threads);
  auto log = [&](const std::string& s) {
    if (!o.quiet) std::fprintf(stderr, "%s\n", s.c_str());
  };
  engine::AuditConfig cfg = o.cfg;
  cfg.stop_on_eos = false;  // same lengths -> same schedule for every backend
  struct Side {
    std::string name;
    std::shared_ptr<engine::OpsBackend> rollout, train;
  };
  std::vector<Side> sides;
  for (bool baseline : {false, true}) {
    Side s;
    s.rollout = make_device_backend(o.rollout_device, baseline);
    s.train = o.train_device == o.rollout_device ? s.rollout
                                                 : make_device_backend(o.train_device, baseline);
    if (!s.rollout || !s.train) {
      log("bench-engine: no baseline backend in this build; timing the invariant one only");
      continue;
    }
    if ((baseline && o.no_baseline) || (!baseline && o.baseline_only)) continue;
    s.name = engine::audit_side_label(*s.rollout, *s.train);
    sides.push_back(std::move(s));
  }
  ModelSource source(o.model, log);
  if (cfg.rollout.kv.num_pages == 0) cfg.rollout.kv.num_pages = engine::audit_auto_kv_pages(cfg);
  const engine::ModelFactory factory = source.factory(cfg.contract);
  const std::vector<engine::RolloutRequest> requests =
      engine::make_audit_requests(cfg, source.config());
  const std::string devices = "rollout " + device_description(o.rollout_device) + "; training " +
                              device_description(o.train_device);
  log("bench-engine: " + cfg.workload_string() + " (EOS off)");
  log("bench-engine: " + devices);

  std::vector<BenchResult> results;
  for (const Side& s : sides) {
    auto rollout_model = factory(cfg.rollout_tp, s.rollout);
    auto train_model = factory(cfg.train_tp, s.train);
    // Warm-up: two requests, a few tokens, and their training forward.
    {
      std::vector<engine::RolloutRequest> w(
          requests.begin(), requests.begin() + std::min<size_t>(2, requests.size()));
      for (auto& r : w) {
        r.max_new_tokens = std::min<int64_t>(r.max_new_tokens, 4);
        r.arrival_step = 0;
      }
      const engine::RolloutResult wr = engine::run_rollout(*rollout_model, w, cfg.rollout);
      engine::run_training_forward(*train_model, train_seqs_of(wr), cfg.packing);
    }
    log("bench-engine [" + s.name + "]: rollout of " + std::to_string(requests.size()) +
        " sequences");
    BenchResult b;
    b.backend = s.name;
    const engine::RolloutResult rr = engine::run_rollout(*rollout_model, requests, cfg.rollout);
    b.generated = rr.generated_tokens;
    b.rollout_tokens = rr.stats.tokens_computed;
    b.steps = rr.stats.steps;
    b.preemptions = rr.stats.preemptions;
    b.rollout_s = rr.seconds;
    log("bench-engine [" + s.name + "]: training forward");
    const auto seqs = train_seqs_of(rr);
    const engine::TrainResult tr = engine::run_training_forward(*train_model, seqs, cfg.packing);
    b.train_tokens = tr.tokens_forwarded;
    b.micro_batches = tr.micro_batches;
    b.train_s = tr.seconds;
    for (size_t i = 0; i < rr.completions.size(); ++i)
      for (size_t j = 0; j < rr.completions[i].logp.size(); ++j) {
        ++b.compared;
        b.mismatches += std::memcmp(&rr.completions[i].logp[j], &tr.sequences[i].logp[j], 4) != 0;
      }
    results.push_back(b);
  }

  bool same_schedule = true;
  for (const BenchResult& r : results)
    same_schedule = same_schedule && r.steps == results[0].steps &&
                    r.rollout_tokens == results[0].rollout_tokens &&
                    r.train_tokens == results[0].train_tokens;
  auto rate = [](int64_t n, double s) { return s > 0 ? double(n) / s : 0.0; };
  if (o.json) {
    nlohmann::ordered_json j;
    j["model"] = source.description();
    j["devices"] = devices;
    j["contract"] = cfg.contract.to_string();
    j["workload"] = cfg.workload_string();
    j["rollout"] = cfg.rollout_string();
    j["training"] = cfg.training_string();
    j["same_schedule"] = same_schedule;
    for (const BenchResult& r : results)
      j["backends"][r.backend] = {
          {"rollout_seconds", r.rollout_s},
          {"generated_tokens", r.generated},
          {"rollout_tokens_computed", r.rollout_tokens},
          {"rollout_steps", r.steps},
          {"rollout_generated_tok_per_s", rate(r.generated, r.rollout_s)},
          {"rollout_computed_tok_per_s", rate(r.rollout_tokens, r.rollout_s)},
          {"train_seconds", r.train_s},
          {"train_tokens", r.train_tokens},
          {"train_tok_per_s", rate(r.train_tokens, r.train_s)},
          {"logp_compared", r.compared},
          {"logp_mismatches", r.mismatches}};
    std::printf("%s\n", j.dump().c_str());
    flush_stdout();
    return kExitOk;
  }
  std::printf("lockstep bench-engine: rollout and training-forward throughput\n");
  std::printf("  model     %s\n", source.description().c_str());
  std::printf("  devices   %s\n", devices.c_str());
  std::printf("  contract  %s\n", cfg.contract.to_string().c_str());
  std::printf("  workload  %s; EOS off\n", cfg.workload_string().c_str());
  std::printf("  rollout   %s\n", cfg.rollout_string().c_str());
  std::printf("  training  %s\n", cfg.training_string().c_str());
  std::printf("  schedule  %s\n\n", same_schedule ? "identical for every backend"
                                                  : "DIFFERS between backends (timings not "
                                                    "comparable)");
  std::printf("%-26s %12s %10s %8s %14s %14s %12s %10s %14s %18s\n", "backend", "gen tokens",
              "roll s", "steps", "gen tok/s", "rollout tok/s", "train tok", "train s",
              "train tok/s", "logp mismatches");
  for (const BenchResult& r : results)
    std::printf("%-26s %12" PRId64 " %10.2f %8" PRId64 " %14.1f %14.1f %12" PRId64
                " %10.2f %14.1f %11" PRId64 " / %" PRId64 "\n",
                r.backend.c_str(), r.generated, r.rollout_s, r.steps,
                rate(r.generated, r.rollout_s), rate(r.rollout_tokens, r.rollout_s), r.train_tokens,
                r.train_s, rate(r.train_tokens, r.train_s), r.mismatches, r.compared);
  if (results.size() == 2)
    std::printf(
        "\n%s speed relative to %s (their time / its time): rollout %.2fx, training "
        "forward %.2fx\n",
        results[0].backend.c_str(), results[1].backend.c_str(),
        results[1].rollout_s > 0 ? results[1].rollout_s / results[0].rollout_s : 0.0,
        results[1].train_s > 0 ? results[1].train_s / results[0].train_s : 0.0);
  flush_stdout();
  return kExitOk;
}

}  // namespace

Command add_bench_engine_command(CLI::App& top) {
  auto o = std::make_shared<EngineCommandLine>();
  CLI::App* sub = top.add_subcommand(
      "bench-engine", "rollout and training-forward tokens/s, invariant vs baseline backends");
  sub->footer(
      "Times the rollout (continuous batching, paged KV, sampling) and the packed training "
      "forward\nof the invariant and the baseline backends on one device, same requests and same "
      "schedule\n(EOS is off: every sequence generates --max-new-tokens), in one run. Takes the "
      "flags of\n`lockstep audit`, e.g.\n  lockstep bench-engine --device cuda --model-shape "
      "qwen3-8b --prompts 16 --group 8\nExit status: 0 done, 2 bad usage, bad input or an "
      "error.");
  add_engine_options(*sub, *o);
  return {sub, [o] { return run_bench_engine(*o); }};
}

}  // namespace lockstep::tools
