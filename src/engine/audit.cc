// `lockstep audit`: workload generation, the two pipelines, the bitwise comparison, divergence
// localization by activation traces, and the reports. See audit.h.
#include "engine/audit.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/philox.h"
#include "lockstep/error.h"

// The baseline backend is another engineer's file; the audit uses it once it is in the tree.
#if __has_include("baseline/cpu/backend.h")
#include "baseline/cpu/backend.h"
#define LOCKSTEP_HAVE_BASELINE 1
#endif

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

std::string hex_bits(float f) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%08x", f32_bits(f));
  return buf;
}

std::string fmt_float(double v) {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  return buf;
}

double abs_diff(float a, float b) {
  if (is_nan_f32(a) || is_nan_f32(b)) return INFINITY;
  return std::fabs(double(a) - double(b));
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
  // Segments cover TP up to 4 on both sides. kv_chunk 64 (the smallest legal chunk) so that the
  // audit's short sequences span several KV chunks and split-KV / cascade really split.
  contract.gemm_segments = 4;
  contract.vocab_segments = 4;
  contract.kv_chunk = 64;
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
  RolloutConfig r = rollout;
  if (r.kv.num_pages == 0) r.kv.num_pages = 1;
  r.validate();
  packing.validate();
}

std::string AuditConfig::rollout_string() const {
  std::ostringstream os;
  os << "tp=" << rollout_tp << "; " << rollout.to_string() << "; arrival: seed=" << arrival_seed
     << " stagger=" << arrival_stagger;
  return os.str();
}

std::string AuditConfig::training_string() const {
  std::ostringstream os;
  os << "tp=" << train_tp << "; " << packing.to_string();
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

std::shared_ptr<OpsBackend> baseline_backend_or_null() {
#ifdef LOCKSTEP_HAVE_BASELINE
  return std::shared_ptr<OpsBackend>(make_baseline_backend());
#else
  return nullptr;
#endif
}

namespace {

// One traced activation row: the op boundary and the row's raw elements.
struct TracedRow {
  std::string op;
  int layer = -1;
  DType dtype = DType::kF32;
  std::vector<uint8_t> bytes;
  int64_t elements = 0;
};

void capture_row(const std::string& op, int layer, const TensorView& t, int64_t row,
                 std::vector<TracedRow>* out) {
  if (t.ndim < 1 || row >= t.shape[0]) return;
  TracedRow r;
  r.op = op;
  r.layer = layer;
  r.dtype = t.dtype;
  const int64_t es = dtype_size(t.dtype);
  r.elements = 1;
  for (int d = 1; d < t.ndim; ++d) r.elements *= t.shape[d];
  r.bytes.resize(size_t(r.elements * es));
  // Walk the row's elements in row-major order through the strides.
  std::vector<int64_t> idx(size_t(std::max(t.ndim - 1, 0)), 0);
  const char* base = static_cast<const char*>(t.data) + row * t.stride[0] * es;
  for (int64_t e = 0; e < r.elements; ++e) {
    int64_t off = 0;
    for (int d = 1; d < t.ndim; ++d) off += idx[size_t(d - 1)] * t.stride[d];
    std::memcpy(r.bytes.data() + e * es, base + off * es, size_t(es));
    for (int d = t.ndim - 1; d >= 1; --d) {
      if (++idx[size_t(d - 1)] < t.shape[d]) break;
      idx[size_t(d - 1)] = 0;
    }
  }
  out->push_back(std::move(r));
}

float element_f32(const TracedRow& r, int64_t i) {
  switch (r.dtype) {
    case DType::kF32: {
      float f;
      std::memcpy(&f, r.bytes.data() + i * 4, 4);
      return f;
    }
    case DType::kBF16: {
      bf16 h;
      std::memcpy(&h, r.bytes.data() + i * 2, 2);
      return bf16_to_f32(h);
    }
    case DType::kI32: {
      int32_t v;
      std::memcpy(&v, r.bytes.data() + i * 4, 4);
      return float(v);
    }
    default:
      return 0.0f;
  }
}

OpComparison compare_rows(const TracedRow& a, const TracedRow& b) {
  OpComparison c;
  c.op = a.op;
  c.layer = a.layer;
  c.elements = a.elements;
  if (a.dtype != b.dtype || a.elements != b.elements) {
    c.mismatches = a.elements;
    c.first = 0;
    c.max_abs_diff = INFINITY;
    return c;
  }
  const int64_t es = dtype_size(a.dtype);
  for (int64_t i = 0; i < a.elements; ++i) {
    if (std::memcmp(a.bytes.data() + i * es, b.bytes.data() + i * es, size_t(es)) == 0) continue;
    const float x = element_f32(a, i), y = element_f32(b, i);
    if (c.first < 0) {
      c.first = i;
      c.rollout_value = x;
      c.train_value = y;
    }
    ++c.mismatches;
    c.max_abs_diff = std::max(c.max_abs_diff, abs_diff(x, y));
  }
  return c;
}

std::string op_name(const OpComparison& c) {
  return c.layer >= 0 ? c.op + " (layer " + std::to_string(c.layer) + ")" : c.op;
}

// Replays the divergent token on both sides with traces and compares every op boundary.
Localization localize(const AuditConfig& cfg, Model& rollout_model, Model& train_model,
                      const std::vector<RolloutRequest>& requests, const RolloutConfig& rcfg,
                      const std::vector<TrainSequence>& train_seqs, const Divergence& d,
                      int64_t request_index) {
  Localization loc;
  const RolloutRequest& req = requests[size_t(request_index)];
  const int64_t Lp = int64_t(req.prompt.size());
  const int64_t sample_pos = Lp + d.index;  // the token's position; its row is sample_pos - 1

  // Rollout replay: the same run up to the step that samples the token; capture that row.
  std::vector<TracedRow> rollout_rows;
  int64_t armed_row = -1;
  rollout_model.set_trace([&](const std::string& op, int layer, const TensorView& t) {
    if (armed_row >= 0) capture_row(op, layer, t, armed_row, &rollout_rows);
  });
  RolloutHooks rh;
  rh.before_step = [&](const RolloutStepInfo& info) {
    armed_row = -1;
    for (size_t i = 0; i < info.plan->seqs.size(); ++i) {
      const ScheduledSeq& ss = info.plan->seqs[i];
      if (!ss.sample || ss.start + ss.count != sample_pos) continue;
      bool mine = ss.seq == req.id;
      for (int64_t m : ss.forks) mine = mine || m == req.id;
      if (mine) armed_row = info.row_begin[i] + ss.count - 1;
    }
    return armed_row < 0;  // stop after the armed step
  };
  RolloutResult rr;
  try {
    rr = run_rollout(rollout_model, requests, rcfg, rh);
  } catch (...) {
    rollout_model.set_trace(nullptr);
    throw;
  }
  rollout_model.set_trace(nullptr);

  // Training replay: the micro-batch holding the sequence, row = its first row + position.
  std::vector<TracedRow> train_rows;
  int64_t train_row = -1;
  train_model.set_trace([&](const std::string& op, int layer, const TensorView& t) {
    if (train_row >= 0) capture_row(op, layer, t, train_row, &train_rows);
  });
  TrainHooks th;
  th.before_batch = [&](const std::vector<size_t>& mb, const std::vector<int64_t>& first_row) {
    train_row = -1;
    for (size_t j = 0; j < mb.size(); ++j)
      if (int64_t(mb[j]) == request_index) train_row = first_row[j] + sample_pos - 1;
    return train_row >= 0;
  };
  TrainResult tr;
  try {
    tr = run_training_forward(train_model, train_seqs, cfg.packing, th);
  } catch (...) {
    train_model.set_trace(nullptr);
    throw;
  }
  train_model.set_trace(nullptr);

  loc.replayed = !rollout_rows.empty() && !train_rows.empty();
  if (!loc.replayed) {
    loc.summary = "replay captured no activations (the model's trace reported nothing)";
    return loc;
  }
  // Match op boundaries by (op, layer, occurrence).
  std::map<std::pair<std::string, int>, std::vector<const TracedRow*>> train_by_key;
  for (const TracedRow& r : train_rows) train_by_key[{r.op, r.layer}].push_back(&r);
  std::map<std::pair<std::string, int>, size_t> seen;
  for (const TracedRow& r : rollout_rows) {
    auto key = std::make_pair(r.op, r.layer);
    const size_t occ = seen[key]++;
    auto it = train_by_key.find(key);
    if (it == train_by_key.end() || occ >= it->second.size()) continue;
    loc.ops.push_back(compare_rows(r, *it->second[occ]));
  }
  // The head: the recorded log-prob of the replayed token on both sides.
  OpComparison head;
  head.op = "logp";
  head.elements = 1;
  const Completion& rc = rr.completions[size_t(request_index)];
  const float rl = int64_t(rc.logp.size()) > d.index ? rc.logp[size_t(d.index)] : d.rollout_logp;
  const TrainTokens& tt = tr.sequences[size_t(request_index)];
  const float tl = int64_t(tt.logp.size()) > d.index ? tt.logp[size_t(d.index)] : d.train_logp;
  if (f32_bits(rl) != f32_bits(tl)) {
    head.mismatches = 1;
    head.first = 0;
    head.rollout_value = rl;
    head.train_value = tl;
    head.max_abs_diff = abs_diff(rl, tl);
  }
  loc.ops.push_back(head);
  for (size_t i = 0; i < loc.ops.size(); ++i)
    if (loc.ops[i].mismatches > 0) {
      loc.first_divergent = int(i);
      break;
    }
  std::ostringstream os;
  if (loc.first_divergent < 0) {
    os << "all " << loc.ops.size() << " op boundaries agree on replay (the divergence did not "
       << "reproduce)";
  } else {
    const size_t k = size_t(loc.first_divergent);
    const OpComparison& c = loc.ops[k];
    os << "first divergent op: " << op_name(c) << ": " << c.mismatches << " of " << c.elements
       << " elements differ, first at " << c.first << ": rollout " << fmt_float(c.rollout_value)
       << " vs training " << fmt_float(c.train_value) << " (max |Δ| " << fmt_float(c.max_abs_diff)
       << ")";
    if (k > 0)
      os << "; the " << k << " op boundaries before it agree (" << op_name(loc.ops[0])
         << (k > 1 ? " .. " + op_name(loc.ops[k - 1]) : std::string()) << ")";
    if (c.op == "logp")
      os << "; every traced activation agrees: the difference is in the log-prob head";
    else
      os << "; "
         << std::count_if(loc.ops.begin() + std::ptrdiff_t(k), loc.ops.end(),
                          [](const OpComparison& o) { return o.mismatches > 0; })
         << " of the " << loc.ops.size() - k << " op boundaries from there on differ";
  }
  loc.summary = os.str();
  return loc;
}

}  // namespace

std::string audit_side_label(const OpsBackend& rollout, const OpsBackend& train) {
  const std::string rd = device_name(rollout.device()), td = device_name(train.device());
  if (&rollout == &train || (rollout.name() == train.name() && rd == td))
    return rd == "cpu" ? rollout.name() : rollout.name() + "@" + rd;
  if (rollout.name() == train.name()) return rollout.name() + "@" + rd + "/" + td;
  return rollout.name() + "@" + rd + "/" + train.name() + "@" + td;
}

AuditSide run_audit_side(const AuditConfig& cfg, const ModelFactory& make_model,
                         std::shared_ptr<OpsBackend> backend, const AuditHooks& hooks) {
  return run_audit_side(cfg, make_model, backend, backend, hooks);
}

AuditSide run_audit_side(const AuditConfig& cfg, const ModelFactory& make_model,
                         std::shared_ptr<OpsBackend> rollout_backend,
                         std::shared_ptr<OpsBackend> train_backend, const AuditHooks& hooks) {
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
  std::unique_ptr<Model> rollout_model = make_model(cfg.rollout_tp, rollout_backend);
  std::unique_ptr<Model> train_model = make_model(cfg.train_tp, train_backend);
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
  RolloutResult rr = run_rollout(*rollout_model, requests, rcfg, rh);
  side.rollout_seconds = rr.seconds;
  side.generated_tokens = rr.generated_tokens;
  side.rollout_stats = rr.stats;
  side.cascade_rows = rr.cascade_rows;

  // Training forward over the same sequences.
  std::vector<TrainSequence> train_seqs;
  for (const Completion& c : rr.completions) {
    TrainSequence s;
    s.id = c.id;
    s.prompt = c.prompt;
    s.completion = c.tokens;
    s.temperature = c.sampling.logprob_temperature();
    train_seqs.push_back(std::move(s));
  }
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
  TrainResult tr = run_training_forward(*train_model, train_seqs, cfg.packing, th);
  side.train_seconds = tr.seconds;
  side.train_tokens = tr.tokens_forwarded;
  side.micro_batches = tr.micro_batches;

  // Bitwise comparison (memcmp of the fp32 patterns).
  int64_t first_index = -1;
  for (size_t i = 0; i < rr.completions.size(); ++i) {
    const Completion& c = rr.completions[i];
    const TrainTokens& t = tr.sequences[i];
    ++side.sequences;
    for (size_t j = 0; j < c.tokens.size(); ++j) {
      ++side.tokens_compared;
      if (std::memcmp(&c.entropy[j], &t.entropy[j], 4) != 0) ++side.entropy_mismatches;
      if (std::memcmp(&c.logp[j], &t.logp[j], 4) == 0) continue;
      ++side.mismatches;
      side.max_abs_diff = std::max(side.max_abs_diff, abs_diff(c.logp[j], t.logp[j]));
      if (!side.first) {
        Divergence d;
        d.request = c.id;
        d.index = int64_t(j);
        d.position = int64_t(c.prompt.size() + j);
        d.token = c.tokens[j];
        d.rollout_logp = c.logp[j];
        d.train_logp = t.logp[j];
        side.first = d;
        first_index = int64_t(i);
      }
    }
  }
  if (cfg.localize && side.first) {
    log("[" + side.backend + "] localizing: replaying request " +
        std::to_string(side.first->request) + " token " + std::to_string(side.first->index) +
        " on both sides with activation traces");
    side.localization = localize(cfg, *rollout_model, *train_model, requests, rcfg, train_seqs,
                                 *side.first, first_index);
  } else if (cfg.localize) {
    Localization l;
    l.summary = "nothing to localize: no mismatch";
    side.localization = l;
  }
  return side;
}

// ----- reports -----

namespace {

std::string first_divergence_string(const AuditSide& s) {
  if (!s.first) return "none";
  const Divergence& d = *s.first;
  std::ostringstream os;
  os << "request " << d.request << ", token " << d.index << " (position " << d.position << ", id "
     << d.token << "): rollout " << fmt_float(d.rollout_logp) << " (" << hex_bits(d.rollout_logp)
     << ") vs training " << fmt_float(d.train_logp) << " (" << hex_bits(d.train_logp) << ")";
  return os.str();
}

std::string pad(const std::string& s, size_t w) {
  return s.size() >= w ? s : std::string(w - s.size(), ' ') + s;
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
    char buf[32];
    std::snprintf(buf, sizeof(buf), s.max_abs_diff == 0 ? "0" : "%.3g", s.max_abs_diff);
    return std::string(buf);
  });
  row("sequences", [](const AuditSide& s) { return with_commas(s.sequences); });
  row("rollout steps", [](const AuditSide& s) { return with_commas(s.rollout_stats.steps); });
  row("preemptions", [](const AuditSide& s) { return with_commas(s.rollout_stats.preemptions); });
  row("prefix forks", [](const AuditSide& s) { return with_commas(s.rollout_stats.forks); });
  row("micro-batches", [](const AuditSide& s) { return with_commas(s.micro_batches); });
  row("rollout tokens",
      [](const AuditSide& s) { return with_commas(s.rollout_stats.tokens_computed); });
  row("training tokens", [](const AuditSide& s) { return with_commas(s.train_tokens); });
  row("rollout time (s)", [](const AuditSide& s) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.1f", s.rollout_seconds);
    return std::string(buf);
  });
  row("training time (s)", [](const AuditSide& s) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.1f", s.train_seconds);
    return std::string(buf);
  });
  row("rollout tok/s (gen.)", [](const AuditSide& s) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.0f",
                  s.rollout_seconds > 0 ? double(s.generated_tokens) / s.rollout_seconds : 0.0);
    return std::string(buf);
  });
  row("training tok/s", [](const AuditSide& s) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.0f",
                  s.train_seconds > 0 ? double(s.train_tokens) / s.train_seconds : 0.0);
    return std::string(buf);
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
  if (s.first) {
    const Divergence& d = *s.first;
    j["first_divergence"] = {{"request", d.request},
                             {"index", d.index},
                             {"position", d.position},
                             {"token", d.token},
                             {"rollout_logp", d.rollout_logp},
                             {"train_logp", d.train_logp},
                             {"rollout_bits", hex_bits(d.rollout_logp)},
                             {"train_bits", hex_bits(d.train_logp)}};
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
                   {"micro_batch_tokens", c.packing.micro_batch_tokens},
                   {"packing_seed", c.packing.seed},
                   {"description", c.training_string()}};
  for (size_t i = 1; i < r.sides.size(); ++i) j[r.sides[i].backend] = side_json(r.sides[i]);
  return j.dump();
}

// ----- command line -----

namespace {

const char* const kAuditUsage =
    "usage: lockstep audit [flags]\n"
    "\n"
    "Generates completions like an RL rollout engine, recomputes their log-probs like a training\n"
    "engine, and compares every generated token's fp32 log-prob (and entropy) bit for bit.\n"
    "Exit status: 0 all agree, 1 some differ, 2 bad usage or error.\n"
    "\n"
    "model and workload\n"
    "  --model DIR               Qwen3 checkpoint dir (config.json + safetensors); default: the\n"
    "                            built-in model, created in ./models/default on first use\n"
    "  --model-shape S           default | qwen3-0.6b | qwen3-8b: random bf16 weights of that\n"
    "                            shape, generated in memory (excludes --model)      [default]\n"
    "  --weight-seed S           seed of the random weights (0 = the built-in model's)  [0]\n"
    "  --prompts N               prompts (random token ids; there is no tokenizer)     [64]\n"
    "  --group G                 samples per prompt (a GRPO group)                      [8]\n"
    "  --prompt-len MIN:MAX      prompt lengths (or one number)                      [8:80]\n"
    "  --max-new-tokens N        tokens generated per sample (fewer on EOS)            [96]\n"
    "  --seed S                  prompts, sampling seed, default orders                 [1]\n"
    "  --sampling mixed|uniform  per-group settings from a fixed table, or the flags below\n"
    "                            for every request                                  [mixed]\n"
    "  --temperature T --top-k K --top-p P --min-p M   uniform sampling settings (imply\n"
    "                            --sampling uniform; temperature 0 = greedy)\n"
    "  --no-eos                  do not stop on the model's EOS tokens\n"
    "rollout side\n"
    "  --rollout-tp N            tensor-parallel degree (1, 2, 4, 8)                    [2]\n"
    "  --page-size P             KV page size (keys)                                   [16]\n"
    "  --kv-pages N              KV pool size; 0 = half of what --max-batch full-length\n"
    "                            sequences need (long runs preempt and recompute)       [0]\n"
    "  --chunk-budget N          tokens per engine step (chunked prefill budget)      [256]\n"
    "  --max-batch N             running sequences                                    [128]\n"
    "  --kv-splits N             split-KV count for attention                           [2]\n"
    "  --prefix-sharing on|off   prefill each prompt once and fork its KV to the group [on]\n"
    "  --cascade on|off          prefix-shared (cascade) attention (needs sharing)     [on]\n"
    "  --arrival-seed S          permutation of the arrival order (0 = in order)        [3]\n"
    "  --arrival-stagger K       engine steps between groups' arrivals                  [1]\n"
    "training side\n"
    "  --train-tp N              tensor-parallel degree (1, 2, 4, 8)                    [1]\n"
    "  --micro-batch-tokens N    tokens per packed micro-batch                       [1024]\n"
    "  --packing-seed S          packing order (0 = rollout order)                      [7]\n"
    "contract (both sides)\n"
    "  --segments N              GEMM K segments and vocab segments (>= both TP degrees) [4]\n"
    "  --kv-chunk N              attention KV chunk (multiple of 64)                   [64]\n"
    "  --vocab-tile N            log-prob vocab tile (multiple of 8)                  [256]\n"
    "devices\n"
    "  --device cpu|cuda         where both sides run (weights, activations, KV pages)  [cpu]\n"
    "  --rollout-device cpu|cuda where the rollout runs (cross-device audit)        [--device]\n"
    "  --train-device cpu|cuda   where the training forward runs                    [--device]\n"
    "run\n"
    "  --baseline                run the pipeline with the baseline (ordinary, non-invariant)\n"
    "                            kernels only (on --device)\n"
    "  --no-baseline             do not add the baseline column to the default report\n"
    "  --localize                replay the first mismatching token on both sides and name\n"
    "                            the first op whose activations differ\n"
    "  --threads N               CPU threads (bits never depend on it)    [all cores]\n"
    "  --json                    print one JSON object instead of the report\n"
    "  --quiet                   no progress lines on stderr\n";

int64_t parse_int(const std::string& flag, const std::string& v, int64_t lo, int64_t hi) {
  errno = 0;
  char* end = nullptr;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno == ERANGE || x < lo || x > hi)
    throw Error(flag + " expects an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                "], got '" + v + "'");
  return x;
}

uint64_t parse_u64(const std::string& flag, const std::string& v) {
  errno = 0;
  char* end = nullptr;
  if (v.empty() || v[0] == '-')
    throw Error(flag + " expects a non-negative integer, got '" + v + "'");
  const unsigned long long x = std::strtoull(v.c_str(), &end, 0);
  if (*end != '\0' || errno == ERANGE)
    throw Error(flag + " expects a non-negative integer, got '" + v + "'");
  return x;
}

float parse_float(const std::string& flag, const std::string& v) {
  errno = 0;
  char* end = nullptr;
  const float x = std::strtof(v.c_str(), &end);
  if (v.empty() || *end != '\0' || errno == ERANGE || !(x == x))
    throw Error(flag + " expects a number, got '" + v + "'");
  return x;
}

bool parse_on_off(const std::string& flag, const std::string& v) {
  if (v == "on" || v == "true" || v == "1") return true;
  if (v == "off" || v == "false" || v == "0") return false;
  throw Error(flag + " expects on or off, got '" + v + "'");
}

}  // namespace

const char* audit_usage() { return kAuditUsage; }

AuditCommandLine parse_audit_args(const std::vector<std::string>& args) {
  AuditCommandLine o;
  const int argc = int(args.size());
  bool cascade_set = false;
  AuditConfig& c = o.cfg;
  for (int i = 0; i < argc; ++i) {
    std::string flag = args[size_t(i)], value;
    bool has_value = false;
    if (size_t eq = flag.find('='); flag.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
      has_value = true;
    }
    auto val = [&]() -> std::string {
      if (has_value) return value;
      if (i + 1 >= argc) throw Error(flag + " needs a value");
      return args[size_t(++i)];
    };
    auto no_value = [&] {
      if (has_value) throw Error(flag + " takes no value");
    };
    const int64_t kBig = int64_t(1) << 30;
    if (flag == "--help" || flag == "-h") {
      o.help = true;
      return o;
    } else if (flag == "--model") {
      o.model_dir = val();
    } else if (flag == "--model-shape") {
      o.model_shape = val();
      if (o.model_shape != "default" && o.model_shape != "qwen3-0.6b" &&
          o.model_shape != "qwen3-8b")
        throw Error("--model-shape expects default, qwen3-0.6b or qwen3-8b, got '" + o.model_shape +
                    "'");
    } else if (flag == "--weight-seed") {
      o.weight_seed = parse_u64(flag, val());
    } else if (flag == "--device" || flag == "--rollout-device" || flag == "--train-device") {
      const std::string v = val();
      if (v != "cpu" && v != "cuda") throw Error(flag + " expects cpu or cuda, got '" + v + "'");
      if (flag != "--train-device") o.rollout_device = v;
      if (flag != "--rollout-device") o.train_device = v;
    } else if (flag == "--prompts") {
      c.prompts = parse_int(flag, val(), 1, 1 << 20);
    } else if (flag == "--group") {
      c.group_size = parse_int(flag, val(), 1, 1 << 16);
    } else if (flag == "--prompt-len") {
      const std::string v = val();
      const size_t colon = v.find(':');
      if (colon == std::string::npos) {
        c.prompt_len_min = c.prompt_len_max = parse_int(flag, v, 1, kBig);
      } else {
        c.prompt_len_min = parse_int(flag, v.substr(0, colon), 1, kBig);
        c.prompt_len_max = parse_int(flag, v.substr(colon + 1), 1, kBig);
        if (c.prompt_len_min > c.prompt_len_max)
          throw Error("--prompt-len MIN:MAX needs MIN <= MAX, got '" + v + "'");
      }
    } else if (flag == "--max-new-tokens") {
      c.max_new_tokens = parse_int(flag, val(), 1, kBig);
    } else if (flag == "--seed") {
      c.seed = parse_u64(flag, val());
    } else if (flag == "--sampling") {
      const std::string v = val();
      if (v != "mixed" && v != "uniform")
        throw Error("--sampling expects mixed or uniform, got '" + v + "'");
      c.mixed_sampling = v == "mixed";
    } else if (flag == "--temperature") {
      c.sampling.temperature = parse_float(flag, val());
      c.mixed_sampling = false;
    } else if (flag == "--top-k") {
      c.sampling.top_k = parse_int(flag, val(), 0, kBig);
      c.mixed_sampling = false;
    } else if (flag == "--top-p") {
      c.sampling.top_p = parse_float(flag, val());
      c.mixed_sampling = false;
    } else if (flag == "--min-p") {
      c.sampling.min_p = parse_float(flag, val());
      c.mixed_sampling = false;
    } else if (flag == "--no-eos") {
      no_value();
      c.stop_on_eos = false;
    } else if (flag == "--rollout-tp") {
      c.rollout_tp = int(parse_int(flag, val(), 1, 8));
    } else if (flag == "--page-size") {
      c.rollout.kv.page_size = parse_int(flag, val(), 1, 1 << 20);
    } else if (flag == "--kv-pages") {
      c.rollout.kv.num_pages = parse_int(flag, val(), 0, kBig);
    } else if (flag == "--chunk-budget") {
      c.rollout.scheduler.max_batched_tokens = parse_int(flag, val(), 1, kBig);
    } else if (flag == "--max-batch") {
      c.rollout.scheduler.max_running = parse_int(flag, val(), 1, kBig);
    } else if (flag == "--kv-splits") {
      c.rollout.step.kv_splits = int(parse_int(flag, val(), 1, 1024));
    } else if (flag == "--prefix-sharing") {
      c.rollout.scheduler.prefix_sharing = parse_on_off(flag, val());
    } else if (flag == "--cascade") {
      c.rollout.step.cascade = parse_on_off(flag, val());
      cascade_set = true;
    } else if (flag == "--arrival-seed") {
      c.arrival_seed = parse_u64(flag, val());
    } else if (flag == "--arrival-stagger") {
      c.arrival_stagger = parse_int(flag, val(), 0, kBig);
    } else if (flag == "--train-tp") {
      c.train_tp = int(parse_int(flag, val(), 1, 8));
    } else if (flag == "--micro-batch-tokens") {
      c.packing.micro_batch_tokens = parse_int(flag, val(), 1, kBig);
    } else if (flag == "--packing-seed") {
      c.packing.seed = parse_u64(flag, val());
    } else if (flag == "--segments") {
      c.contract.gemm_segments = c.contract.vocab_segments = int(parse_int(flag, val(), 1, 8));
    } else if (flag == "--kv-chunk") {
      c.contract.kv_chunk = int(parse_int(flag, val(), 1, 1 << 24));
    } else if (flag == "--vocab-tile") {
      c.contract.vocab_tile = int(parse_int(flag, val(), 1, 1 << 24));
    } else if (flag == "--baseline") {
      no_value();
      o.baseline_only = true;
    } else if (flag == "--no-baseline") {
      no_value();
      o.no_baseline = true;
    } else if (flag == "--localize") {
      no_value();
      c.localize = true;
    } else if (flag == "--threads") {
      o.threads = int(parse_int(flag, val(), 1, 1024));
    } else if (flag == "--json") {
      no_value();
      o.json = true;
    } else if (flag == "--quiet") {
      no_value();
      o.quiet = true;
    } else {
      throw Error("unknown flag '" + flag + "' (see lockstep audit --help)");
    }
  }
  if (o.baseline_only && o.no_baseline)
    throw Error("--baseline and --no-baseline exclude each other");
  if (!o.model_dir.empty() && o.model_shape != "default")
    throw Error("--model and --model-shape exclude each other");
  // Without sharing there is no shared prefix to cascade over: cascade follows unless set.
  if (!c.rollout.scheduler.prefix_sharing && !cascade_set) c.rollout.step.cascade = false;
  if (c.rollout.step.cascade && !c.rollout.scheduler.prefix_sharing)
    throw Error("--cascade on needs --prefix-sharing on");
  c.validate();
  return o;
}

}  // namespace lockstep::engine
