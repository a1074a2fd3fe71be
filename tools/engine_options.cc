// The flags of `lockstep audit` and `lockstep bench-engine`. See engine_options.h.
#include "tools/engine_options.h"

#include <charconv>

#include "lockstep/error.h"

namespace lockstep::tools {

namespace {

constexpr int64_t kBig = int64_t(1) << 30;

template <class T>
CLI::Option* add_int(CLI::App& app, const std::string& name, T& target, int64_t lo, int64_t hi,
                     const std::string& description, const std::string& group) {
  return app.add_option(name, target, description)
      ->transform(int_in(lo, hi))
      ->type_name("N")
      ->capture_default_str()
      ->group(group);
}

CLI::Option* add_seed(CLI::App& app, const std::string& name, uint64_t& target,
                      const std::string& description, const std::string& group) {
  return app.add_option(name, target, description)
      ->transform(uint64_any())
      ->type_name("S")
      ->capture_default_str()
      ->group(group);
}

CLI::Option* add_device(CLI::App& app, const std::string& name,
                        std::function<void(const std::string&)> set, const std::string& description,
                        const std::string& group) {
  return app.add_option_function<std::string>(name, std::move(set), description)
      ->check(CLI::IsMember({"cpu", "cuda"}).description(""))
      ->type_name("cpu|cuda")
      ->group(group);
}

// "N" or "MIN:MAX", each in [1, 2^30], MIN <= MAX.
bool parse_prompt_len(const std::string& v, int64_t& lo, int64_t& hi) {
  auto one = [](const std::string& s, int64_t& out) {
    const auto r = std::from_chars(s.data(), s.data() + s.size(), out, 10);
    return !s.empty() && r.ec == std::errc() && r.ptr == s.data() + s.size() && out >= 1 &&
           out <= kBig;
  };
  const size_t colon = v.find(':');
  if (colon == std::string::npos) {
    if (!one(v, lo)) return false;
    hi = lo;
    return true;
  }
  return one(v.substr(0, colon), lo) && one(v.substr(colon + 1), hi) && lo <= hi;
}

}  // namespace

void add_engine_options(CLI::App& app, EngineCommandLine& o) {
  engine::AuditConfig& c = o.cfg;
  c.contract = default_contract();
  add_model_options(app, o.model);

  const std::string w = "workload";
  add_int(app, "--prompts", c.prompts, 1, 1 << 20,
          "prompts (random token ids; there is no tokenizer)", w);
  add_int(app, "--group", c.group_size, 1, 1 << 16, "samples per prompt (a GRPO group)", w);
  app.add_option_function<std::string>(
         "--prompt-len",
         [&c](const std::string& v) { parse_prompt_len(v, c.prompt_len_min, c.prompt_len_max); },
         "prompt lengths (or one number)")
      ->transform(CLI::Validator(
          [](std::string& v) -> std::string {
            int64_t lo = 0, hi = 0;
            if (parse_prompt_len(v, lo, hi)) return {};
            return "expects N or MIN:MAX with 1 <= MIN <= MAX <= 2^30, got '" + v + "'";
          },
          ""))
      ->type_name("MIN:MAX")
      ->default_str(std::to_string(c.prompt_len_min) + ":" + std::to_string(c.prompt_len_max))
      ->group(w);
  add_int(app, "--max-new-tokens", c.max_new_tokens, 1, kBig,
          "tokens generated per sample (fewer on EOS)", w);
  add_seed(app, "--seed", c.seed, "prompts, sampling seed, default orders", w);
  app.add_option_function<std::string>(
         "--sampling", [&c](const std::string& v) { c.mixed_sampling = v == "mixed"; },
         "per-group settings from a fixed table (mixed), or --temperature/--top-k/--top-p/"
         "--min-p for every request (uniform; those flags imply it)")
      ->check(CLI::IsMember({"mixed", "uniform"}).description(""))
      ->type_name("mixed|uniform")
      ->default_str("mixed")
      ->group(w);
  auto uniform = [&c](auto& field) {
    return [&c, &field](auto v) {
      field = v;
      c.mixed_sampling = false;
    };
  };
  app.add_option_function<float>("--temperature", uniform(c.sampling.temperature),
                                 "uniform sampling temperature (finite, >= 0; 0 = greedy)")
      ->transform(float_in(0, 1e6))
      ->type_name("T")
      ->group(w);
  app.add_option_function<int64_t>("--top-k", uniform(c.sampling.top_k), "uniform top-k (0 = off)")
      ->transform(int_in(0, kBig))
      ->type_name("K")
      ->group(w);
  app.add_option_function<float>("--top-p", uniform(c.sampling.top_p), "uniform top-p, in (0, 1]")
      ->transform(float_in(0, 1, true))
      ->type_name("P")
      ->group(w);
  app.add_option_function<float>("--min-p", uniform(c.sampling.min_p), "uniform min-p, in [0, 1]")
      ->transform(float_in(0, 1))
      ->type_name("M")
      ->group(w);
  app.add_flag_callback(
         "--no-eos", [&c] { c.stop_on_eos = false; }, "do not stop on the model's EOS tokens")
      ->group(w);

  const std::string r = "rollout side";
  app.add_option("--rollout-tp", c.rollout_tp, "tensor-parallel degree")
      ->transform(int_one_of({1, 2, 4, 8}))
      ->type_name("N")
      ->capture_default_str()
      ->group(r);
  add_ranks(app, "--rollout-ranks", c.rollout_ranks,
            "how the rollout's TP ranks run: simulated (one model runs every rank's shards), "
            "threads (one rank-local model per rank on its own thread, exchanging partials over "
            "the thread transport: multi-GPU TP's code path, on the CPU) or launch (this process "
            "is one rank: run it under `lockstep launch --nproc N`, N = --rollout-tp; one "
            "rank-local model per process over shared memory; the other side runs on every "
            "process alike, rank 0 prints); the same bits in every mode; audit only",
            r);
  add_int(app, "--page-size", c.rollout.kv.page_size, 1, 1 << 20, "KV page size (keys)", r);
  add_int(app, "--kv-pages", c.rollout.kv.num_pages, 0, kBig,
          "KV pool size; 0 = half of what --max-batch full-length sequences need (long runs "
          "preempt and recompute)",
          r);
  add_int(app, "--chunk-budget", c.rollout.scheduler.max_batched_tokens, 1, kBig,
          "tokens per engine step (chunked prefill budget)", r);
  add_int(app, "--max-batch", c.rollout.scheduler.max_running, 1, kBig, "running sequences", r);
  add_int(app, "--kv-splits", c.rollout.step.kv_splits, 1, 1024, "split-KV count for attention", r);
  add_on_off(app, "--prefix-sharing", c.rollout.scheduler.prefix_sharing,
             "prefill each prompt once and fork its KV to the group")
      ->group(r);
  app.add_option_function<std::string>(
         "--cascade",
         [&o](const std::string& v) {
           o.cfg.rollout.step.cascade = v == "on";
           o.cascade_set = true;
         },
         "prefix-shared (cascade) attention (needs sharing; follows --prefix-sharing unless set)")
      ->check(CLI::IsMember({"on", "off"}).description(""))
      ->type_name("on|off")
      ->default_str(c.rollout.step.cascade ? "on" : "off")
      ->group(r);
  add_seed(app, "--arrival-seed", c.arrival_seed, "permutation of the arrival order (0 = in order)",
           r);
  add_int(app, "--arrival-stagger", c.arrival_stagger, 0, kBig,
          "engine steps between groups' arrivals", r);

  const std::string t = "training side";
  add_ranks(app, "--train-ranks", c.train_ranks,
            "how the training forward's TP ranks run: simulated, threads or launch (as "
            "--rollout-ranks, N = --train-tp; audit only)",
            t);
  app.add_option("--train-tp", c.train_tp, "tensor-parallel degree")
      ->transform(int_one_of({1, 2, 4, 8}))
      ->type_name("N")
      ->capture_default_str()
      ->group(t);
  add_int(app, "--micro-batch-tokens", c.packing.micro_batch_tokens, 1, kBig,
          "tokens per packed micro-batch", t);
  add_seed(app, "--packing-seed", c.packing.seed, "packing order (0 = rollout order)", t);

  add_contract_options(app, c.contract);

  // NOTE: CLI11 runs option callbacks in the order they are defined here, so --rollout-device and
  // --train-device override --device whatever their order on the command line.
  const std::string d = "devices";
  add_device(
      app, "--device", [&o](const std::string& v) { o.rollout_device = o.train_device = v; },
      "where both sides run (weights, activations, KV pages) [cpu]", d);
  add_device(
      app, "--rollout-device", [&o](const std::string& v) { o.rollout_device = v; },
      "where the rollout runs (cross-device audit) [--device]", d);
  add_device(
      app, "--train-device", [&o](const std::string& v) { o.train_device = v; },
      "where the training forward runs [--device]", d);

  const std::string run = "run";
  app.add_flag("--baseline", o.baseline_only,
               "run the pipeline with the baseline (ordinary, non-invariant) kernels only")
      ->group(run);
  app.add_flag("--no-baseline", o.no_baseline,
               "do not add the baseline column to the default report")
      ->group(run);
  app.add_flag("--localize", c.localize,
               "replay the first mismatching token on both sides and name the first op whose "
               "activations differ")
      ->group(run);
  add_threads_option(app, o.threads);
  app.add_flag("--json", o.json, "print one JSON object instead of the report")->group(run);
  app.add_flag("--quiet", o.quiet, "no progress lines on stderr")->group(run);
}

void resolve_engine_options(EngineCommandLine& o) {
  engine::AuditConfig& c = o.cfg;
  if (o.baseline_only && o.no_baseline)
    throw Error("--baseline and --no-baseline exclude each other");
  if (!o.model.dir.empty() && o.model.shape != "default")
    throw Error("--model and --model-shape exclude each other");
  // Without sharing there is no shared prefix to cascade over: cascade follows unless set.
  if (!c.rollout.scheduler.prefix_sharing && !o.cascade_set) c.rollout.step.cascade = false;
  if (c.rollout.step.cascade && !c.rollout.scheduler.prefix_sharing)
    throw Error("--cascade on needs --prefix-sharing on");
  c.validate();
}

EngineCommandLine parse_engine_args(const std::vector<std::string>& args) {
  EngineCommandLine o;
  CLI::App app{"", "lockstep-engine-options"};
  add_engine_options(app, o);
  std::vector<std::string> rev(args.rbegin(), args.rend());  // CLI11 takes them reversed
  app.parse(rev);
  resolve_engine_options(o);
  return o;
}

}  // namespace lockstep::tools
