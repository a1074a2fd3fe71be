// `lockstep bench-engine`: the audit's workload (same flags as `lockstep audit`) run by the
// invariant and the baseline backend of one device, timed. EOS is off, so every sequence generates
// exactly --max-new-tokens and the scheduler makes the same steps for both backends (the schedule
// depends on lengths only); the training forward packs sequences of the same lengths the same
// way. Each backend first runs a small warm-up (kernel loading, allocator pools, cuBLAS handles).
// The weights are uploaded once per device and shared by both backends.
// Defaults: the workload of a long-prompt GRPO rollout (32 prompts x 8 samples, prompts of 128-1024
// tokens, 256 new tokens, 128 running sequences) and both deployment contracts in one call — the
// audit's (segments 4, rollout TP 2 vs training TP 1, 64-key chunks) and one GPU's (segments 1, TP
// 1 on both sides, 1024-key chunks); a contract or TP flag runs that one configuration only.
// Every engine step's wall time is set beside its memory floor: the bytes the step must read (the
// weights once, and each sequence's K and V) at the copy bandwidth the device reaches in the same
// run. With --profile-ops each backend is wrapped in a ProfiledBackend (engine/profiled_backend.h)
// and every side reports, per op, its calls, device time and host time, for the whole rollout, its
// decode steps and the training forward, and the wall time that device work does not cover.
#include "tools/bench_engine_cmd.h"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "engine/audit.h"
#include "engine/profiled_backend.h"
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
  // Engine steps against their memory floor (MemoryFloor): decode steps (every sequence one
  // token) and all steps, seconds summed.
  int64_t decode_steps = 0;
  double decode_s = 0, decode_floor_s = 0, step_floor_s = 0;
  std::vector<engine::RolloutStepTime> step_times;
  // --profile-ops: the whole rollout, its decode steps, the training forward.
  bool profiled = false;
  engine::OpProfile rollout_ops, decode_ops, train_ops;
};

// One section of an op profile: the rows, then the wall time against the ops' device time.
struct OpSection {
  const char* name;  // "rollout", "decode steps only", "training forward"
  const char* key;   // its JSON key: "rollout", "decode", "train"
  const engine::OpProfile* ops;
  double wall_s;
  int64_t steps;
  const char* step;        // what `steps` counts: "step", "decode step", "micro-batch"
  const char* steps_name;  // the same in the plural
};

std::vector<OpSection> op_sections(const BenchResult& r) {
  return {{"rollout", "rollout", &r.rollout_ops, r.rollout_s, r.steps, "step", "steps"},
          {"decode steps only", "decode", &r.decode_ops, r.decode_s, r.decode_steps, "decode step",
           "decode steps"},
          {"training forward", "train", &r.train_ops, r.train_s, r.micro_batches, "micro-batch",
           "micro-batches"}};
}

nlohmann::ordered_json op_section_json(const OpSection& s) {
  nlohmann::ordered_json j;
  j["wall_seconds"] = s.wall_s;
  j["device_seconds"] = s.ops->total.device_s;
  j["uncovered_seconds"] = s.wall_s - s.ops->total.device_s;
  j["steps"] = s.steps;
  j["ops"] = nlohmann::ordered_json::array();
  for (const engine::OpTimes& t : s.ops->rows)
    j["ops"].push_back(
        {{"label", t.label}, {"calls", t.calls}, {"device_s", t.device_s}, {"host_s", t.host_s}});
  j["gaps"] = nlohmann::ordered_json::array();
  for (const engine::OpGap& g : s.ops->gaps)
    j["gaps"].push_back({{"from", g.from},
                         {"to", g.to},
                         {"count", g.count},
                         {"device_idle_s", g.device_s},
                         {"host_s", g.host_s}});
  return j;
}

void print_op_section(const std::string& title, const OpSection& s) {
  const double dev = s.ops->total.device_s;
  auto per = [&](double v) { return s.steps > 0 ? v / double(s.steps) : 0.0; };
  std::printf("\n%s %s (%s: %" PRId64 ")\n", title.c_str(), s.name, s.steps_name, s.steps);
  std::printf("  %-36s %10s %12s %10s %9s %12s\n", "op", "calls", "device ms", "ms/step",
              "% device", "host ms");
  for (const engine::OpTimes& t : s.ops->rows)
    std::printf("  %-36s %10" PRId64 " %12.3f %10.4f %8.1f%% %12.3f\n", t.label.c_str(), t.calls,
                1e3 * t.device_s, 1e3 * per(t.device_s), dev > 0 ? 100.0 * t.device_s / dev : 0.0,
                1e3 * t.host_s);
  std::printf("  %-36s %10" PRId64 " %12.3f %10.4f %8.1f%% %12.3f\n", "total", s.ops->total.calls,
              1e3 * dev, 1e3 * per(dev), dev > 0 ? 100.0 : 0.0, 1e3 * s.ops->total.host_s);
  std::printf("  wall %.3f ms (%.4f ms per %s), op device time %.3f ms\n", 1e3 * s.wall_s,
              1e3 * per(s.wall_s), s.step, 1e3 * dev);
  std::printf(
      "  not covered by device work (host work, launches, waits): %.3f ms (%.1f%% of "
      "wall)\n",
      1e3 * (s.wall_s - dev), s.wall_s > 0 ? 100.0 * (s.wall_s - dev) / s.wall_s : 0.0);
  // Where the device waited: the transitions between consecutive ops with the most idle.
  constexpr size_t kGapRows = 8;
  if (s.ops->gaps.empty() || s.ops->gaps.front().device_s <= 0) return;
  std::printf(
      "  device idle between consecutive ops (after-mark to before-mark), largest %zu of %zu "
      "transitions; host ms = host time between the two calls:\n",
      std::min(kGapRows, s.ops->gaps.size()), s.ops->gaps.size());
  std::printf("    %-58s %10s %10s %10s %10s\n", "from -> to", "count", "idle ms", "ms/step",
              "host ms");
  for (size_t i = 0; i < s.ops->gaps.size() && i < kGapRows; ++i) {
    const engine::OpGap& g = s.ops->gaps[i];
    const std::string t = g.from + " -> " + g.to;
    std::printf("    %-58s %10" PRId64 " %10.3f %10.4f %10.3f\n", t.c_str(), g.count,
                1e3 * g.device_s, 1e3 * per(g.device_s), 1e3 * g.host_s);
  }
}

// The least time an engine step can take on its device: the bytes it must read — every weight
// once (bf16; the embedding table only where it is also the lm_head: a lookup reads a few rows),
// and K and V of every key of every scheduled sequence (bf16, each layer) — at the device's copy
// bandwidth, measured here (a copy reads and writes: 2 x bytes / time, best of 5).
struct MemoryFloor {
  double weight_bytes = 0, kv_bytes_per_key = 0, bytes_per_s = 0;
  double seconds(const engine::RolloutStepTime& st) const {
    return (weight_bytes + kv_bytes_per_key * double(st.keys)) / bytes_per_s;
  }
};

double copy_bandwidth(const engine::OpsBackend& ops) {
  const int64_t n = ops.device() == Device::kCPU ? int64_t(1) << 27 : int64_t(1) << 30;  // bytes
  const Tensor a = ops.empty(DType::kF32, {n / 4}), b = ops.empty(DType::kF32, {n / 4});
  ops.fill_zero(a.view());
  double best = 1e30;
  for (int i = 0; i < 6; ++i) {
    ops.synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    ops.copy(b.view(), a.view());
    ops.synchronize();
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (i > 0) best = std::min(best, t);  // the first is the warm-up
  }
  return 2.0 * double(n) / best;
}

MemoryFloor memory_floor(const engine::Qwen3Config& mc, const engine::OpsBackend& ops) {
  MemoryFloor f;
  for (const engine::WeightSpec& w : engine::qwen3_weight_specs(mc)) {
    if (w.name == "model.embed_tokens.weight" && !mc.tie_word_embeddings) continue;
    double n = 1;
    for (int64_t e : w.shape) n *= double(e);
    f.weight_bytes += 2.0 * n;
  }
  f.kv_bytes_per_key =
      2.0 * 2.0 * double(mc.num_hidden_layers * mc.num_key_value_heads * mc.head_dim);
  f.bytes_per_s = copy_bandwidth(ops);
  return f;
}

}  // namespace

namespace {

// One configuration of the call: a name and its settings (contract, TP degrees).
struct BenchConfig {
  std::string name;
  engine::AuditConfig cfg;
};

// The configurations to time: the flags' own if a contract or TP flag was given, else the audit's
// contract and one GPU's.
std::vector<BenchConfig> bench_configs(const EngineCommandLine& o, const CLI::App& app) {
  LS_CHECK(o.cfg.rollout_ranks == engine::RankMode::kSimulated &&
               o.cfg.train_ranks == engine::RankMode::kSimulated,
           "bench-engine",
           "--rollout-ranks / --train-ranks threads|launch are audit flags: bench-engine times "
           "the engine on one device (simulated TP)");
  for (const char* f : {"--segments", "--gemm-segments", "--vocab-segments", "--kv-chunk",
                        "--vocab-tile", "--rollout-tp", "--train-tp"})
    if (app.count(f) > 0) return {{"flags", o.cfg}};
  BenchConfig one{"one-gpu", o.cfg};
  one.cfg.rollout_tp = one.cfg.train_tp = 1;
  one.cfg.contract.gemm_segments = one.cfg.contract.vocab_segments = 1;
  one.cfg.contract.kv_chunk = 1024;
  one.cfg.validate();
  return {{"audit", o.cfg}, std::move(one)};
}

int run_bench_engine(EngineCommandLine& o, const CLI::App& app) {
  resolve_engine_options(o);
  if (o.threads > 0) set_num_threads(o.threads);
  auto log = [&](const std::string& s) {
    if (!o.quiet) std::fprintf(stderr, "%s\n", s.c_str());
  };
  struct Side {
    std::string name;
    std::shared_ptr<engine::OpsBackend> rollout, train;
    // --profile-ops: the two sides' backends wrapped (the models run on these), else null.
    std::shared_ptr<engine::ProfiledBackend> rollout_prof, train_prof;
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
    if (o.profile_ops) {
      s.rollout_prof = std::make_shared<engine::ProfiledBackend>(s.rollout);
      s.train_prof = std::make_shared<engine::ProfiledBackend>(s.train);
    }
    sides.push_back(std::move(s));
  }
  ModelSource source(o.model, log);
  const std::string devices = "rollout " + device_description(o.rollout_device) + "; training " +
                              device_description(o.train_device);
  log("bench-engine: " + devices);
  const MemoryFloor floor = memory_floor(source.config(), *sides.front().rollout);
  {
    char buf[200];
    std::snprintf(buf, sizeof(buf),
                  "bench-engine: memory floor from %.1f MiB of weights, %.0f KiB of K+V per key, "
                  "copy bandwidth %.0f GB/s (measured now)",
                  floor.weight_bytes / double(1 << 20), floor.kv_bytes_per_key / 1024.0,
                  floor.bytes_per_s / 1e9);
    log(buf);
  }
  auto rate = [](int64_t n, double s) { return s > 0 ? double(n) / s : 0.0; };
  auto ms = [](double s, int64_t n) { return n > 0 ? 1e3 * s / double(n) : 0.0; };
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> csv(nullptr, std::fclose);
  if (!o.steps_csv.empty()) {
    csv.reset(std::fopen(o.steps_csv.c_str(), "w"));
    if (!csv) throw Error("bench-engine: cannot write --steps-csv '" + o.steps_csv + "'");
    std::fprintf(csv.get(), "config,backend,step,tokens,seqs,keys,decode,seconds,floor_seconds\n");
  }

  bool first_block = true;
  for (const BenchConfig& bc : bench_configs(o, app)) {
    engine::AuditConfig cfg = bc.cfg;
    cfg.stop_on_eos = false;  // same lengths -> same schedule for every backend
    if (cfg.rollout.kv.num_pages == 0) cfg.rollout.kv.num_pages = engine::audit_auto_kv_pages(cfg);
    source.release();  // the previous configuration's models
    const engine::ModelFactory factory = source.factory(cfg.contract);
    const std::vector<engine::RolloutRequest> requests =
        engine::make_audit_requests(cfg, source.config());
    log("bench-engine [" + bc.name + "]: " + cfg.workload_string() + " (EOS off); " +
        cfg.contract.to_string() + ", rollout TP " + std::to_string(cfg.rollout_tp) +
        ", training TP " + std::to_string(cfg.train_tp));

    std::vector<BenchResult> results;
    for (const Side& s : sides) {
      auto rollout_model =
          factory(cfg.rollout_tp, s.rollout_prof ? s.rollout_prof : s.rollout, nullptr);
      auto train_model = factory(cfg.train_tp, s.train_prof ? s.train_prof : s.train, nullptr);
      // Warm-up: two requests, a few tokens, and their training forward.
      {
        std::vector<engine::RolloutRequest> w(
            requests.begin(), requests.begin() + std::min<size_t>(2, requests.size()));
        for (auto& r : w) {
          r.max_new_tokens = std::min<int64_t>(r.max_new_tokens, 4);
          r.arrival_step = 0;
        }
        const engine::RolloutResult wr = engine::run_rollout(*rollout_model, w, cfg.rollout);
        engine::run_training_forward(*train_model, engine::train_sequences(wr), cfg.packing);
      }
      log("bench-engine [" + bc.name + ", " + s.name + "]: rollout of " +
          std::to_string(requests.size()) + " sequences");
      BenchResult b;
      b.backend = s.name;
      engine::RolloutHooks hooks;
      if (s.rollout_prof) {
        // NOTE: a step's copy-on-write page copies run before this hook, so they count with the
        // step before; everything else of a step (its forward and sampling) counts with it.
        s.rollout_prof->reset();
        hooks.before_step = [&s](const engine::RolloutStepInfo& info) {
          s.rollout_prof->set_decode(info.plan->decode_only());
          return true;
        };
      }
      const engine::RolloutResult rr =
          engine::run_rollout(*rollout_model, requests, cfg.rollout, hooks);
      if (s.rollout_prof) {
        b.profiled = true;
        b.rollout_ops = s.rollout_prof->report();
        b.decode_ops = s.rollout_prof->decode_report();
      }
      b.generated = rr.generated_tokens;
      b.rollout_tokens = rr.stats.tokens_computed;
      b.steps = rr.stats.steps;
      b.preemptions = rr.stats.preemptions;
      b.rollout_s = rr.seconds;
      b.step_times = rr.step_times;
      for (const engine::RolloutStepTime& st : rr.step_times) {
        b.step_floor_s += floor.seconds(st);
        if (!st.decode) continue;
        ++b.decode_steps;
        b.decode_s += st.seconds;
        b.decode_floor_s += floor.seconds(st);
      }
      log("bench-engine [" + bc.name + ", " + s.name + "]: training forward");
      const auto seqs = engine::train_sequences(rr);
      if (s.train_prof) s.train_prof->reset();
      const engine::TrainResult tr = engine::run_training_forward(*train_model, seqs, cfg.packing);
      if (s.train_prof) b.train_ops = s.train_prof->report();
      b.train_tokens = tr.tokens_forwarded;
      b.micro_batches = tr.micro_batches;
      b.train_s = tr.seconds;
      for (size_t i = 0; i < rr.completions.size(); ++i)
        for (size_t j = 0; j < rr.completions[i].logp.size(); ++j) {
          ++b.compared;
          b.mismatches += std::memcmp(&rr.completions[i].logp[j], &tr.sequences[i].logp[j], 4) != 0;
        }
      if (csv)
        for (size_t k = 0; k < rr.step_times.size(); ++k) {
          const engine::RolloutStepTime& st = rr.step_times[k];
          std::fprintf(csv.get(), "%s,%s,%zu,%" PRId64 ",%" PRId64 ",%" PRId64 ",%d,%.9f,%.9f\n",
                       bc.name.c_str(), s.name.c_str(), k, st.tokens, st.seqs, st.keys,
                       int(st.decode), st.seconds, floor.seconds(st));
        }
      results.push_back(std::move(b));
    }

    bool same_schedule = true;
    for (const BenchResult& r : results)
      same_schedule = same_schedule && r.steps == results[0].steps &&
                      r.rollout_tokens == results[0].rollout_tokens &&
                      r.train_tokens == results[0].train_tokens;
    if (o.json) {  // one JSON object per configuration (JSONL)
      nlohmann::ordered_json j;
      j["config"] = bc.name;
      j["model"] = source.description();
      j["devices"] = devices;
      j["contract"] = cfg.contract.to_string();
      j["workload"] = cfg.workload_string();
      j["rollout"] = cfg.rollout_string();
      j["training"] = cfg.training_string();
      j["same_schedule"] = same_schedule;
      j["copy_bandwidth_bytes_per_s"] = floor.bytes_per_s;
      for (const BenchResult& r : results) {
        j["backends"][r.backend] = {
            {"rollout_seconds", r.rollout_s},
            {"generated_tokens", r.generated},
            {"rollout_tokens_computed", r.rollout_tokens},
            {"rollout_steps", r.steps},
            {"rollout_generated_tok_per_s", rate(r.generated, r.rollout_s)},
            {"rollout_computed_tok_per_s", rate(r.rollout_tokens, r.rollout_s)},
            {"decode_steps", r.decode_steps},
            {"decode_step_ms", ms(r.decode_s, r.decode_steps)},
            {"decode_step_floor_ms", ms(r.decode_floor_s, r.decode_steps)},
            {"rollout_floor_seconds", r.step_floor_s},
            {"train_seconds", r.train_s},
            {"train_tokens", r.train_tokens},
            {"train_tok_per_s", rate(r.train_tokens, r.train_s)},
            {"logp_compared", r.compared},
            {"logp_mismatches", r.mismatches}};
        if (r.profiled)
          for (const OpSection& sec : op_sections(r))
            j["backends"][r.backend]["op_profile"][sec.key] = op_section_json(sec);
      }
      std::printf("%s\n", j.dump().c_str());
      flush_stdout();
      continue;
    }
    if (first_block)
      std::printf("lockstep bench-engine: rollout and training-forward throughput\n");
    first_block = false;
    std::printf("\nconfiguration %s\n", bc.name.c_str());
    std::printf("  model     %s\n", source.description().c_str());
    std::printf("  devices   %s\n", devices.c_str());
    std::printf("  contract  %s\n", cfg.contract.to_string().c_str());
    std::printf("  workload  %s; EOS off\n", cfg.workload_string().c_str());
    std::printf("  rollout   %s\n", cfg.rollout_string().c_str());
    std::printf("  training  %s\n", cfg.training_string().c_str());
    std::printf(
        "  floor     %.1f MiB of weights + %.0f KiB per key at %.0f GB/s (device copy, "
        "measured in this run)\n",
        floor.weight_bytes / double(1 << 20), floor.kv_bytes_per_key / 1024.0,
        floor.bytes_per_s / 1e9);
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
                  rate(r.generated, r.rollout_s), rate(r.rollout_tokens, r.rollout_s),
                  r.train_tokens, r.train_s, rate(r.train_tokens, r.train_s), r.mismatches,
                  r.compared);
    std::printf("\n%-26s %12s %14s %14s %10s %22s\n", "backend", "decode steps", "ms per step",
                "floor ms", "x floor", "rollout s / floor s");
    for (const BenchResult& r : results)
      std::printf(
          "%-26s %12" PRId64 " %14.3f %14.3f %10.2f %15.2f / %.2f\n", r.backend.c_str(),
          r.decode_steps, ms(r.decode_s, r.decode_steps), ms(r.decode_floor_s, r.decode_steps),
          r.decode_floor_s > 0 ? r.decode_s / r.decode_floor_s : 0.0, r.rollout_s, r.step_floor_s);
    if (results.size() == 2)
      std::printf(
          "\n[%s] %s speed relative to %s (their time / its time): rollout %.2fx, training "
          "forward %.2fx\n",
          bc.name.c_str(), results[0].backend.c_str(), results[1].backend.c_str(),
          results[1].rollout_s > 0 ? results[1].rollout_s / results[0].rollout_s : 0.0,
          results[1].train_s > 0 ? results[1].train_s / results[0].train_s : 0.0);
    for (const BenchResult& r : results) {
      if (!r.profiled) continue;
      std::printf(
          "\nop profile [%s, %s] (--profile-ops): each op's device time is the time between "
          "timing marks\njust before and after its call (CUDA events on the backend's stream; on "
          "the CPU, the host clock);\nthe two marks per op perturb the run slightly\n",
          bc.name.c_str(), r.backend.c_str());
      for (const OpSection& sec : op_sections(r))
        print_op_section("[" + bc.name + ", " + r.backend + "]", sec);
    }
    flush_stdout();
  }
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
      "schedule\n(EOS is off: every sequence generates --max-new-tokens), in one run. Default "
      "workload: 32\nprompts x 8 samples, prompts of 128-1024 tokens, 256 new tokens, 128 running; "
      "default\nconfigurations: 'audit' (the flags' contract: segments 4, rollout TP 2, training "
      "TP "
      "1,\n64-key chunks) and 'one-gpu' (segments 1, TP 1 and 1, 1024-key chunks). Any contract "
      "or TP\nflag times that one configuration only. Each engine step is set beside its memory "
      "floor\n(weights once + every sequence's K and V, at the device's copy bandwidth measured in "
      "the\nsame run). --profile-ops adds, per backend, each op kind's calls, device time (timing "
      "marks\naround every call: CUDA events, which perturb the run slightly) and host time, for "
      "the\nrollout, its decode steps and the training forward, and the wall time device work "
      "does not\ncover. Takes the flags of `lockstep audit`, e.g.\n  lockstep bench-engine "
      "--device "
      "cuda --model-shape qwen3-8b\nExit status: 0 done, 2 bad usage, bad input or an error.");
  // The realistic default workload (see the top of this file), set before the flags capture
  // their defaults.
  o->cfg.prompts = 32;
  o->cfg.group_size = 8;
  o->cfg.prompt_len_min = 128;
  o->cfg.prompt_len_max = 1024;
  o->cfg.max_new_tokens = 256;
  o->cfg.rollout.scheduler.max_running = 128;
  add_engine_options(*sub, *o);
  sub->add_option("--steps-csv", o->steps_csv,
                  "write every engine step's wall time and memory floor to FILE (CSV)")
      ->type_name("FILE")
      ->group("run");
  sub->add_flag("--profile-ops", o->profile_ops,
                "time every op call (device and host time per op kind; two timing marks per op "
                "perturb the run slightly) and print a table per backend")
      ->group("run");
  return {sub, [o, sub] { return run_bench_engine(*o, *sub); }};
}

}  // namespace lockstep::tools
