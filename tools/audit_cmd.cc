// `lockstep audit` command line: flags (parsed by engine::parse_audit_args), model loading (the
// built-in default model or a Hugging Face style Qwen3 directory), the audit (src/engine/audit.h),
// and its report.
#include "tools/audit_cmd.h"

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "engine/audit.h"
#include "engine/backend.h"
#include "engine/default_model.h"
#include "engine/model.h"
#include "engine/safetensors.h"
#include "lockstep/error.h"

namespace lockstep::tools {
namespace {
constexpr const char* kDefaultModelDir = "models/default";
}  // namespace

int run_audit_command(int argc, char** argv) {
  engine::AuditCommandLine o;
  try {
    o = engine::parse_audit_args(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const Error& e) {
    const std::string msg = e.what();
    std::fprintf(stderr, "lockstep %s\n",
                 (msg.rfind("audit: ", 0) == 0 ? msg : "audit: " + msg).c_str());
    return 2;
  }
  if (o.help) {
    std::fputs(engine::audit_usage(), stdout);
    return 0;
  }
  try {
    if (o.threads > 0) set_num_threads(o.threads);
    auto log = [&](const std::string& s) {
      if (!o.quiet) std::fprintf(stderr, "%s\n", s.c_str());
    };

    // The model: a checkpoint directory, or the built-in model (generated on first use).
    std::string dir = o.model_dir, desc;
    if (dir.empty()) {
      dir = kDefaultModelDir;
      if (!std::filesystem::exists(std::filesystem::path(dir) / "model.safetensors"))
        log("creating the built-in default model in ./" + dir);
      engine::ensure_default_model(dir);
      desc = "built-in default model (./" + dir + ")";
    } else {
      desc = dir;
    }
    const engine::Checkpoint ckpt = engine::Checkpoint::open(dir);
    desc += ": " + ckpt.config().to_string();
    engine::AuditConfig& cfg = o.cfg;
    if (cfg.rollout.kv.num_pages == 0) cfg.rollout.kv.num_pages = engine::audit_auto_kv_pages(cfg);

    engine::ModelFactory factory = [&](int tp, std::shared_ptr<engine::OpsBackend> backend) {
      engine::ModelOptions mo;
      mo.contract = cfg.contract;
      mo.tp = tp;
      return std::make_unique<engine::Model>(ckpt.config(), ckpt, mo, std::move(backend));
    };

    std::vector<std::shared_ptr<engine::OpsBackend>> backends;
    std::shared_ptr<engine::OpsBackend> baseline = engine::baseline_backend_or_null();
    if (o.baseline_only) {
      if (!baseline) {
        std::fprintf(stderr,
                     "lockstep audit: --baseline: the baseline backend (ordinary non-invariant "
                     "kernels) is not built yet in this version; no result\n");
        return 2;
      }
      backends.push_back(baseline);
    } else {
      backends.push_back(std::shared_ptr<engine::OpsBackend>(engine::make_invariant_backend()));
      if (baseline && !o.no_baseline) backends.push_back(baseline);
    }

    engine::AuditReport report;
    report.model = desc;
    report.contract = cfg.contract.to_string();
    report.config = cfg;
    engine::AuditHooks hooks;
    hooks.log = log;
    log("lockstep audit: " + cfg.workload_string());
    for (auto& b : backends) report.sides.push_back(engine::run_audit_side(cfg, factory, b, hooks));

    if (o.json)
      std::printf("%s\n", engine::audit_report_json(report).c_str());
    else
      std::fputs(engine::format_audit_report(report).c_str(), stdout);
    return report.passed() ? 0 : 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "lockstep audit: error: %s\n", e.what());
    return 2;
  }
}

}  // namespace lockstep::tools
