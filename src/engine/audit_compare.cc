// The audit's bitwise comparison and divergence localization. See audit_compare.h.
#include "engine/audit_compare.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <sstream>

namespace lockstep::engine {

namespace {

double abs_diff(float a, float b) {
  if (is_nan_f32(a) || is_nan_f32(b)) return INFINITY;
  return std::fabs(double(a) - double(b));
}

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

}  // namespace

std::string audit_float_text(double v) {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  return buf;
}

std::string audit_bits_text(float f) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%08x", f32_bits(f));
  return buf;
}

LogprobComparison compare_logprobs(const RolloutResult& rr, const TrainResult& tr) {
  LogprobComparison cmp;
  for (size_t i = 0; i < rr.completions.size(); ++i) {
    const Completion& c = rr.completions[i];
    const TrainTokens& t = tr.sequences[i];
    ++cmp.sequences;
    for (size_t j = 0; j < c.tokens.size(); ++j) {
      ++cmp.tokens_compared;
      if (std::memcmp(&c.entropy[j], &t.entropy[j], 4) != 0) ++cmp.entropy_mismatches;
      if (std::memcmp(&c.logp[j], &t.logp[j], 4) == 0) continue;
      ++cmp.mismatches;
      cmp.max_abs_diff = std::max(cmp.max_abs_diff, abs_diff(c.logp[j], t.logp[j]));
      if (!cmp.first) {
        Divergence d;
        d.request = c.id;
        d.index = int64_t(j);
        d.position = int64_t(c.prompt.size() + j);
        d.token = c.tokens[j];
        d.rollout_logp = c.logp[j];
        d.train_logp = t.logp[j];
        cmp.first = d;
        cmp.first_sequence = int64_t(i);
      }
    }
  }
  return cmp;
}

Localization localize_divergence(Model& rollout_model, Model& train_model,
                                 const std::vector<RolloutRequest>& requests,
                                 const RolloutConfig& rcfg,
                                 const std::vector<TrainSequence>& train_seqs,
                                 const PackingConfig& packing, const Divergence& d,
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
    tr = run_training_forward(train_model, train_seqs, packing, th);
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
       << " elements differ, first at " << c.first << ": rollout "
       << audit_float_text(c.rollout_value) << " vs training " << audit_float_text(c.train_value)
       << " (max |Δ| " << audit_float_text(c.max_abs_diff) << ")";
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

}  // namespace lockstep::engine
