// `lockstep audit` command line: flags (tools/engine_options.h), the devices and
// backends (tools/engine_setup.h), the model (a Hugging Face style Qwen3 directory, the built-in
// default model, or random weights of a named shape), the audit (src/engine/audit.h), and its
// report.
#include "tools/audit_cmd.h"

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "dist/process_transport.h"
#include "engine/audit.h"
#include "engine/backend.h"
#include "lockstep/error.h"
#include "tools/engine_options.h"
#include "tools/engine_setup.h"

namespace lockstep::tools {

namespace {

// The audit proper, on every process alike (`job`: this process's rank of a launched job, or
// nullptr). Only rank 0 (or a process without a job) logs and prints the report.
int run_audit_on(EngineCommandLine& o, dist::Communicator* job) {
  const bool speaks = job == nullptr || job->rank() == 0;
  auto log = [&](const std::string& s) {
    if (!o.quiet && speaks) std::fprintf(stderr, "%s\n", s.c_str());
  };

  // Backends first: a missing device fails before any model work.
  struct Pair {
    std::shared_ptr<engine::OpsBackend> rollout, train;
  };
  std::vector<Pair> pairs;
  auto pair_of = [&](bool baseline) {
    Pair p;
    p.rollout = make_device_backend(o.rollout_device, baseline);
    p.train = o.train_device == o.rollout_device ? p.rollout
                                                 : make_device_backend(o.train_device, baseline);
    return p;
  };
  const Pair baseline = pair_of(true);
  const bool have_baseline = baseline.rollout && baseline.train;
  if (o.baseline_only) {
    if (!have_baseline)
      throw Error(
          "--baseline: the baseline backend (ordinary non-invariant kernels) is not built in this "
          "version; no result");
    pairs.push_back(baseline);
  } else {
    pairs.push_back(pair_of(false));
    if (have_baseline && !o.no_baseline) pairs.push_back(baseline);
  }

  ModelSource source(o.model, log);
  engine::AuditConfig& cfg = o.cfg;
  if (cfg.rollout.kv.num_pages == 0) cfg.rollout.kv.num_pages = engine::audit_auto_kv_pages(cfg);
  const engine::ModelFactory factory = source.factory(cfg.contract);

  engine::AuditReport report;
  report.model = source.description();
  report.devices = "rollout " + device_description(o.rollout_device) + "; training " +
                   device_description(o.train_device);
  if (job) report.devices += "; " + std::to_string(job->size()) + " processes (lockstep launch)";
  report.contract = cfg.contract.to_string();
  report.config = cfg;
  engine::AuditHooks hooks;
  hooks.log = log;
  log("lockstep audit: " + cfg.workload_string());
  log("lockstep audit: " + report.devices);
  for (const Pair& p : pairs)
    report.sides.push_back(engine::run_audit_side(cfg, factory, p.rollout, p.train, hooks, job));

  if (speaks) {
    if (o.json)
      std::printf("%s\n", engine::audit_report_json(report).c_str());
    else
      std::fputs(engine::format_audit_report(report).c_str(), stdout);
    flush_stdout();
  }
  // Every rank computed the same report; rank 0 has written it. A rank that failed to (or failed
  // at all) fails this barrier on every rank, so every rank's exit status says so.
  if (job) job->barrier();
  return report.passed() ? kExitOk : kExitCheckFailed;
}

int run_audit(EngineCommandLine& o) {
  resolve_engine_options(o);
  using engine::RankMode;
  const engine::AuditConfig& cfg = o.cfg;
  if (cfg.rollout_ranks != RankMode::kLaunch && cfg.train_ranks != RankMode::kLaunch) {
    if (o.threads > 0) set_num_threads(o.threads);
    return run_audit_on(o, nullptr);
  }
  // A rank of a launched job: the job's WORLD_SIZE is the launched side's TP degree (both sides'
  // when both are launched: resolve_engine_options checked they are equal).
  const bool rollout = cfg.rollout_ranks == RankMode::kLaunch;
  const dist::ProcessGroupSpec spec =
      rollout ? launched_job_spec("--rollout-ranks launch", "--rollout-tp", cfg.rollout_tp)
              : launched_job_spec("--train-ranks launch", "--train-tp", cfg.train_tp);
  return run_as_launched_rank(spec, o.threads,
                              [&](dist::Communicator* job) { return run_audit_on(o, job); });
}

}  // namespace

Command add_audit_command(CLI::App& top) {
  auto o = std::make_shared<EngineCommandLine>();
  CLI::App* sub = top.add_subcommand(
      "audit", "the main job: rollout vs training log-probs, compared bit for bit");
  sub->footer(
      "Generates completions like an RL rollout engine, recomputes their log-probs like a "
      "training engine,\nand compares every generated token's fp32 log-prob (and entropy) bit for "
      "bit.\nExit status: 0 all log-probs agree, 1 some differ, 2 bad usage, bad input or an "
      "error.\n"
      "Rank-local TP across processes (one per rank, as on GPUs; the same bits as simulated):\n"
      "  lockstep launch --nproc 2 -- lockstep audit --rollout-tp 2 --rollout-ranks launch");
  add_engine_options(*sub, *o);
  return {sub, [o] { return run_audit(*o); }};
}

}  // namespace lockstep::tools
