// The audit's human and JSON reports. See audit_report.h.
#include "engine/audit_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

namespace lockstep::engine {

namespace {

std::string first_divergence_string(const AuditSide& s) {
  if (!s.first) return "none";
  const Divergence& d = *s.first;
  std::ostringstream os;
  os << "request " << d.request << ", token " << d.index << " (position " << d.position << ", id "
     << d.token << "): rollout " << audit_float_text(d.rollout_logp) << " ("
     << audit_bits_text(d.rollout_logp) << ") vs training " << audit_float_text(d.train_logp)
     << " (" << audit_bits_text(d.train_logp) << ")";
  return os.str();
}

std::string pad(const std::string& s, size_t w) {
  return s.size() >= w ? s : std::string(w - s.size(), ' ') + s;
}

// One number through a printf format ("%.1f").
std::string printf_text(const char* fmt, double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), fmt, v);
  return std::string(buf);
}

std::string with_commas(int64_t v) {
  std::string s = std::to_string(v), out;
  const size_t n = s.size();
  for (size_t i = 0; i < n; ++i) {
    out += s[i];
    if (s[i] != '-' && (n - 1 - i) % 3 == 0 && i + 1 < n) out += ',';
  }
  return out;
}

}  // namespace

std::string format_audit_report(const AuditReport& r) {
  std::ostringstream os;
  const AuditConfig& c = r.config;
  os << "lockstep audit: rollout vs training log-probs, compared bit for bit\n";
  os << "  model     " << r.model << "\n";
  if (!r.devices.empty()) os << "  devices   " << r.devices << "\n";
  os << "  contract  " << r.contract << "\n";
  os << "  workload  " << c.workload_string() << "\n";
  os << "  rollout   " << c.rollout_string() << "\n";
  os << "  training  " << c.training_string() << "\n\n";
  const size_t label_w = 24;
  size_t col_w = 14;
  for (const AuditSide& s : r.sides) col_w = std::max(col_w, s.backend.size() + 2);
  os << std::string(label_w, ' ');
  for (const AuditSide& s : r.sides) os << pad(s.backend, col_w);
  os << "\n";
  auto row = [&](const std::string& label, auto&& cell) {
    os << label << std::string(label_w > label.size() ? label_w - label.size() : 1, ' ');
    for (const AuditSide& s : r.sides) os << pad(cell(s), col_w);
    os << "\n";
  };
  row("rollout backend",
      [](const AuditSide& s) { return s.rollout_backend + "@" + s.rollout_device; });
  row("training backend",
      [](const AuditSide& s) { return s.train_backend + "@" + s.train_device; });
  row("tokens compared", [](const AuditSide& s) { return with_commas(s.tokens_compared); });
  row("logp mismatches", [](const AuditSide& s) { return with_commas(s.mismatches); });
  row("entropy mismatches", [](const AuditSide& s) { return with_commas(s.entropy_mismatches); });
  row("max |Δlogp|", [](const AuditSide& s) {
    return printf_text(s.max_abs_diff == 0 ? "0" : "%.3g", s.max_abs_diff);
  });
  row("sequences", [](const AuditSide& s) { return with_commas(s.sequences); });
  row("rollout steps", [](const AuditSide& s) { return with_commas(s.rollout_stats.steps); });
  row("preemptions", [](const AuditSide& s) { return with_commas(s.rollout_stats.preemptions); });
  row("prefix forks", [](const AuditSide& s) { return with_commas(s.rollout_stats.forks); });
  row("micro-batches", [](const AuditSide& s) { return with_commas(s.micro_batches); });
  row("rollout tokens",
      [](const AuditSide& s) { return with_commas(s.rollout_stats.tokens_computed); });
  row("training tokens", [](const AuditSide& s) { return with_commas(s.train_tokens); });
  row("rollout time (s)",
      [](const AuditSide& s) { return printf_text("%.1f", s.rollout_seconds); });
  row("training time (s)", [](const AuditSide& s) { return printf_text("%.1f", s.train_seconds); });
  row("rollout tok/s (gen.)", [](const AuditSide& s) {
    return printf_text(
        "%.0f", s.rollout_seconds > 0 ? double(s.generated_tokens) / s.rollout_seconds : 0.0);
  });
  row("training tok/s", [](const AuditSide& s) {
    return printf_text("%.0f",
                       s.train_seconds > 0 ? double(s.train_tokens) / s.train_seconds : 0.0);
  });
  os << "\n";
  for (const AuditSide& s : r.sides) {
    os << "first divergence (" << s.backend << "): " << first_divergence_string(s) << "\n";
    if (s.localization)
      os << "localization (" << s.backend << "): " << s.localization->summary << "\n";
  }
  if (r.sides.empty()) return os.str();
  const AuditSide& m = r.sides[0];
  os << "\n";
  if (r.passed())
    os << "PASS: " << with_commas(m.tokens_compared) << " of " << with_commas(m.tokens_compared)
       << " log-probs (and entropies) agree bit for bit (" << m.backend << ")\n";
  else
    os << "FAIL: " << with_commas(m.mismatches) << " of " << with_commas(m.tokens_compared)
       << " log-probs differ, " << with_commas(m.entropy_mismatches) << " entropies differ ("
       << m.backend << ")\n";
  return os.str();
}

namespace {

nlohmann::ordered_json side_json(const AuditSide& s) {
  nlohmann::ordered_json j;
  j["backend"] = s.backend;
  j["rollout_backend"] = s.rollout_backend;
  j["train_backend"] = s.train_backend;
  j["rollout_device"] = s.rollout_device;
  j["train_device"] = s.train_device;
  j["tokens_compared"] = s.tokens_compared;
  j["mismatches"] = s.mismatches;
  j["entropy_mismatches"] = s.entropy_mismatches;
  // JSON has no inf: a NaN-involving difference is reported as null with a flag.
  if (std::isfinite(s.max_abs_diff)) {
    j["max_abs_diff"] = s.max_abs_diff;
  } else {
    j["max_abs_diff"] = nullptr;
    j["max_abs_diff_is_nan_or_inf"] = true;
  }
  j["sequences"] = s.sequences;
  j["rollout_sha256"] = s.rollout_sha256;
  j["train_sha256"] = s.train_sha256;
  if (s.first) {
    const Divergence& d = *s.first;
    j["first_divergence"] = {{"request", d.request},
                             {"index", d.index},
                             {"position", d.position},
                             {"token", d.token},
                             {"rollout_logp", d.rollout_logp},
                             {"train_logp", d.train_logp},
                             {"rollout_bits", audit_bits_text(d.rollout_logp)},
                             {"train_bits", audit_bits_text(d.train_logp)}};
  } else {
    j["first_divergence"] = nullptr;
  }
  const SchedulerStats& st = s.rollout_stats;
  j["rollout_stats"] = {{"steps", st.steps},
                        {"tokens_computed", st.tokens_computed},
                        {"prefill_tokens", st.prefill_tokens},
                        {"preemptions", st.preemptions},
                        {"kv_drops", st.kv_drops},
                        {"forks", st.forks},
                        {"page_copies", st.page_copies},
                        {"max_step_tokens", st.max_step_tokens},
                        {"max_step_seqs", st.max_step_seqs},
                        {"min_free_pages", st.min_free_pages},
                        {"cascade_rows", s.cascade_rows}};
  j["micro_batches"] = s.micro_batches;
  j["generated_tokens"] = s.generated_tokens;
  j["train_tokens"] = s.train_tokens;
  j["rollout_seconds"] = s.rollout_seconds;
  j["train_seconds"] = s.train_seconds;
  if (s.localization) {
    const Localization& l = *s.localization;
    nlohmann::ordered_json lj;
    lj["replayed"] = l.replayed;
    lj["summary"] = l.summary;
    if (l.first_divergent >= 0) {
      const OpComparison& c = l.ops[size_t(l.first_divergent)];
      lj["first_divergent_op"] = {{"op", c.op},
                                  {"layer", c.layer},
                                  {"mismatches", c.mismatches},
                                  {"elements", c.elements},
                                  {"first_element", c.first},
                                  {"rollout_value", c.rollout_value},
                                  {"train_value", c.train_value}};
    } else {
      lj["first_divergent_op"] = nullptr;
    }
    lj["ops_compared"] = int64_t(l.ops.size());
    j["localization"] = lj;
  }
  return j;
}

}  // namespace

std::string audit_report_json(const AuditReport& r) {
  nlohmann::ordered_json j;
  if (!r.sides.empty()) j = side_json(r.sides[0]);
  j["passed"] = r.passed();
  j["contract"] = r.contract;
  j["model"] = r.model;
  j["devices"] = r.devices;
  const AuditConfig& c = r.config;
  j["workload"] = {{"prompts", c.prompts},
                   {"group_size", c.group_size},
                   {"prompt_len_min", c.prompt_len_min},
                   {"prompt_len_max", c.prompt_len_max},
                   {"max_new_tokens", c.max_new_tokens},
                   {"seed", c.seed},
                   {"sampling", c.mixed_sampling ? std::string("mixed") : c.sampling.to_string()},
                   {"stop_on_eos", c.stop_on_eos},
                   {"tokenizer", "none: prompts are random token ids"}};
  j["rollout"] = {{"tp", c.rollout_tp},
                  {"ranks", rank_mode_name(c.rollout_ranks)},
                  {"page_size", c.rollout.kv.page_size},
                  {"kv_pages", c.rollout.kv.num_pages},
                  {"max_batch", c.rollout.scheduler.max_running},
                  {"chunk_budget", c.rollout.scheduler.max_batched_tokens},
                  {"prefix_sharing", c.rollout.scheduler.prefix_sharing},
                  {"kv_splits", c.rollout.step.kv_splits},
                  {"cascade", c.rollout.step.cascade},
                  {"arrival_seed", c.arrival_seed},
                  {"arrival_stagger", c.arrival_stagger},
                  {"description", c.rollout_string()}};
  j["training"] = {{"tp", c.train_tp},
                   {"ranks", rank_mode_name(c.train_ranks)},
                   {"micro_batch_tokens", c.packing.micro_batch_tokens},
                   {"packing_seed", c.packing.seed},
                   {"description", c.training_string()}};
  for (size_t i = 1; i < r.sides.size(); ++i) j[r.sides[i].backend] = side_json(r.sides[i]);
  return j.dump();
}

}  // namespace lockstep::engine
