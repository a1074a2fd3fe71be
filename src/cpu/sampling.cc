// Sampling on the CPU, the executable form of docs/contract.md §S: one token row at a time
// (a [V] row is the largest buffer), logits by the GEMM contract, the LogP state of the row by the
// LogP op's own tile/fold/tree code, filters top-k → top-p (exact integer masses) → min-p, then
// the id whose mass interval (ascending ids) holds the row's Philox target. Each row is computed by
// one task.
#include "lockstep/ops/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "contract/checks.h"
#include "core/math.h"
#include "core/sample_choice.h"
#include "core/thread_pool.h"
#include "cpu/logprob_internal.h"
#include "lockstep/ops/logprob.h"

namespace lockstep {

namespace {
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int64_t kRowBlock = 8;      // rows per GEMM call (any value: same bits)
constexpr int64_t kFirstSort = 1024;  // top-p: sorted prefix tried before sorting more

// Canonical order of a row: larger y first, then lower index. A strict total order on ids whose
// y is not NaN (a row with NaN never gets here: its lse is NaN).
struct CanonicalBefore {
  const float* y;
  bool operator()(int64_t a, int64_t b) const { return y[a] > y[b] || (y[a] == y[b] && a < b); }
};

// argmax y, lowest index among ties (strict > in ascending order).
int64_t argmax_lowest(const float* y, int64_t V) {
  int64_t best = 0;
  for (int64_t v = 1; v < V; ++v)
    if (y[v] > y[best]) best = v;
  return best;
}

inline float prob(float y, float lse) { return ls_expf(y - lse); }

// y's 32-bit fixed-point mass floor(p · 2^32) (§S.5), p = exp(y − lse).
inline uint64_t mass_q32(float y, float lse) { return sample_mass_q32(y - lse); }

// Candidates after the filters into *kept (ascending ids). Returns false (kept untouched) when no
// filter is active: every id is a candidate. `order` is scratch.
bool filter_row(const float* y, int64_t V, float lse, const SamplingParams& p,
                std::vector<int64_t>* order, std::vector<int64_t>* kept) {
  const bool top_k = p.top_k > 0 && p.top_k < V;
  const bool top_p = p.top_p < 1.0f;
  const bool min_p = p.min_p > 0.0f;
  if (!top_k && !top_p && !min_p) return false;
  kept->clear();
  if (top_k || top_p) {
    order->resize(size_t(V));
    for (int64_t v = 0; v < V; ++v) (*order)[size_t(v)] = v;
    const CanonicalBefore before{y};
    int64_t n = top_k ? p.top_k : V;  // candidates so far: the first n of the canonical order
    int64_t sorted = 0;               // the first `sorted` entries of *order are in final place
    // NOTE: partial_sort with a strict total order puts exactly the canonical first m entries in
    // place, so sorting only as far as needed gives the same set as a full sort.
    auto sort_first = [&](int64_t m) {
      m = std::min(m, n);
      if (m <= sorted) return;
      std::partial_sort(order->begin() + sorted, order->begin() + m, order->end(), before);
      sorted = m;
    };
    if (top_k) sort_first(n);
    if (top_p) {
      // NOTE: masses are integers, so the sums are exact in any order (a GPU scan gives the same
      // bits); the threshold is one IEEE double multiply, rounded up to an integer.
      uint64_t total = 0;
      for (int64_t i = 0; i < n; ++i) total += mass_q32(y[(*order)[size_t(i)]], lse);
      const uint64_t thr = uint64_t(std::ceil(double(p.top_p) * double(total)));
      uint64_t cum = 0;
      int64_t keep = 0;
      for (int64_t want = kFirstSort;; want *= 16) {
        sort_first(want);
        while (keep < sorted && (cum < thr || keep == 0))
          cum += mass_q32(y[(*order)[size_t(keep++)]], lse);
        if (cum >= thr || sorted == n) break;
      }
      n = keep;
    }
    kept->assign(order->begin(), order->begin() + n);
    std::sort(kept->begin(), kept->end());
  } else {
    kept->resize(size_t(V));
    for (int64_t v = 0; v < V; ++v) (*kept)[size_t(v)] = v;
  }
  if (min_p) {
    const float thr = p.min_p * prob(y[argmax_lowest(y, V)], lse);
    auto drop = [&](int64_t v) { return !(prob(y[v], lse) >= thr); };
    kept->erase(std::remove_if(kept->begin(), kept->end(), drop), kept->end());
  }
  return true;
}

// The choice (§S.7) over the candidates (all ids when `all`): q_v = floor(p_v · 2^32), Q = Σ q,
// target = floor(U · Q / 2^64); the first id (ascending) whose inclusive mass prefix exceeds the
// target. Entries with q = 0 (y = −inf among them) are never chosen.
int64_t mass_choice(const float* y, int64_t V, bool all, const std::vector<int64_t>& kept,
                    float lse, uint64_t u) {
  const int64_t n = all ? V : int64_t(kept.size());
  auto id = [&](int64_t i) { return all ? i : kept[size_t(i)]; };
  uint64_t total = 0;
  for (int64_t i = 0; i < n; ++i) total += mass_q32(y[id(i)], lse);
  // NOTE: Q > 0: the argmax is a candidate of every row, and its p is about 1/V or more, V < 2^21.
  LS_CHECK(total > 0, "sample", "internal: the candidates' mass is 0");
  const uint64_t target = sample_target(u, total);
  uint64_t cum = 0;
  for (int64_t i = 0; i < n; ++i) {
    cum += mass_q32(y[id(i)], lse);
    if (cum > target) return id(i);
  }
  LS_CHECK(false, "sample", "internal: the target ", target, " is not below the mass ", total);
  return -1;
}

}  // namespace

std::vector<int64_t> sampling_candidates(const float* y, int64_t V, float lse,
                                         const SamplingParams& params) {
  params.validate();
  LS_CHECK(params.temperature > 0.0f, "sampling_candidates",
           "filters apply to temperature > 0 rows, got temperature 0 (greedy)");
  LS_CHECK(V >= 1 && V < kSampleMaxVocab, "sampling_candidates", "V must be in [1, 2^21), got ", V);
  LS_CHECK(std::isfinite(lse), "sampling_candidates", "lse must be finite, got ", lse);
  std::vector<int64_t> order, kept;
  if (!filter_row(y, V, lse, params, &order, &kept)) {
    kept.resize(size_t(V));
    for (int64_t v = 0; v < V; ++v) kept[size_t(v)] = v;
  }
  return kept;
}

namespace cpu {

using logprob_detail::f32_at;
using logprob_detail::read_index;

namespace {

// One sampled row: the id and linear_logprob's values for it.
struct SampledRow {
  int64_t id = 0;
  float logp = 0.0f, lse = 0.0f, entropy = 0.0f;
};

// [T] results, written to the outputs only once every row has been sampled (a row that cannot be
// sampled throws before any output is written).
struct SampledRows {
  std::vector<SampledRow> rows;
  explicit SampledRows(int64_t T) : rows(size_t(T)) {}
  void write(const TensorView& token_ids, const TensorView& logp, const TensorView& lse,
             const TensorView& entropy) const {
    for (size_t t = 0; t < rows.size(); ++t) {
      const SampledRow& r = rows[t];
      if (token_ids.dtype == DType::kI32) {
        static_cast<int32_t*>(token_ids.data)[int64_t(t) * token_ids.stride[0]] = int32_t(r.id);
      } else {
        static_cast<int64_t*>(token_ids.data)[int64_t(t) * token_ids.stride[0]] = r.id;
      }
      f32_at(logp, int64_t(t)) = r.logp;
      f32_at(lse, int64_t(t)) = r.lse;
      f32_at(entropy, int64_t(t)) = r.entropy;
    }
  }
};

// Row t from its logits y [lay.padded] (z in [0, V), anything after; tempered and padded here).
SampledRow sample_row(const char* op, int64_t t, float* y, int64_t V, const LogprobVocabLayout& lay,
                      const SamplingParams& p, uint64_t request_id, uint32_t position,
                      std::vector<LogprobState>* scratch, std::vector<int64_t>* order,
                      std::vector<int64_t>* kept) {
  const float temperature = p.logprob_temperature();
  for (int64_t v = 0; v < V; ++v) y[v] = y[v] / temperature;
  for (int64_t v = V; v < lay.padded; ++v) y[v] = kNegInf;
  const LogprobState st = logprob_detail::row_state(y, lay, scratch);
  SampledRow r;
  logprob_finish(st, &r.lse, &r.entropy);
  LS_CHECK(std::isfinite(r.lse), op, "row ", t, ": logsumexp is ", r.lse,
           " (NaN or +inf logits, or every logit -inf): nothing to sample");
  if (p.temperature == 0.0f) {
    r.id = argmax_lowest(y, V);  // y = z / 1 = z
  } else {
    const bool filtered = filter_row(y, V, r.lse, p, order, kept);
    r.id = mass_choice(y, V, !filtered, *kept, r.lse,
                       sample_row_uniform(p.seed, request_id, position));
  }
  r.logp = canonical_f32(y[r.id] - r.lse);
  return r;
}

}  // namespace

void sample(const TensorView& h, const TensorView& w, std::span<const SamplingParams> params,
            const TensorView& request_ids, const TensorView& positions, const ContractConfig& cfg,
            const TensorView& token_ids, const TensorView& logp, const TensorView& lse,
            const TensorView& entropy) {
  const char* op = "sample";
  contract::check_sample(op, Device::kCPU, h, w, params, request_ids, positions, cfg, token_ids,
                         logp, lse, entropy);
  const int64_t T = h.size(0), V = w.size(0);
  if (T == 0) return;
  const LogprobVocabLayout lay = logprob_vocab_layout(cfg, V);

  // Blocks of kRowBlock rows: one GEMM over the whole vocab per block ([kRowBlock, V_pad] fp32,
  // bounded whatever T is), then each row alone. Nested parallel_for calls run serially when the
  // blocks already fill the pool, and spread one block's GEMM and rows over it otherwise.
  SampledRows out(T);
  const int64_t n_blocks = (T + kRowBlock - 1) / kRowBlock;
  parallel_for(n_blocks, 1, [&](int64_t b0, int64_t b1) {
    std::vector<float> buf(static_cast<size_t>(kRowBlock * lay.padded));  // [rows, V_pad]
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t r0 = b * kRowBlock, rows = std::min(kRowBlock, T - r0);
      logprob_detail::tile_logits(h.rows(r0, r0 + rows), w, cfg, buf.data(), lay.padded);
      parallel_for(rows, 1, [&](int64_t i0, int64_t i1) {
        std::vector<LogprobState> scratch;
        std::vector<int64_t> order, kept;
        for (int64_t i = i0; i < i1; ++i) {
          const int64_t t = r0 + i;
          out.rows[size_t(t)] =
              sample_row(op, t, buf.data() + i * lay.padded, V, lay, params[size_t(t)],
                         uint64_t(read_index(request_ids, t)), uint32_t(read_index(positions, t)),
                         &scratch, &order, &kept);
        }
      });
    }
  });
  out.write(token_ids, logp, lse, entropy);
}

void lm_head_logits(const TensorView& h, const TensorView& w, const ContractConfig& cfg,
                    const TensorView& z) {
  contract::check_lm_head_logits("lm_head_logits", Device::kCPU, h, w, cfg, z);
  if (h.size(0) == 0 || w.size(0) == 0) return;
  logprob_detail::tile_logits(h, w, cfg, static_cast<float*>(z.data), z.stride[0]);
}

void sample_logits(const TensorView& z, std::span<const SamplingParams> params,
                   const TensorView& request_ids, const TensorView& positions,
                   const ContractConfig& cfg, const TensorView& token_ids, const TensorView& logp,
                   const TensorView& lse, const TensorView& entropy) {
  const char* op = "sample_logits";
  contract::check_sample_logits(op, Device::kCPU, z, params, request_ids, positions, cfg, token_ids,
                                logp, lse, entropy);
  const int64_t T = z.size(0), V = z.size(1);
  if (T == 0) return;
  const LogprobVocabLayout lay = logprob_vocab_layout(cfg, V);
  SampledRows out(T);
  parallel_for(T, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> y(static_cast<size_t>(lay.padded));
    std::vector<LogprobState> scratch;
    std::vector<int64_t> order, kept;
    for (int64_t t = t0; t < t1; ++t) {
      const float* row = z.ptr<const float>() + t * z.stride[0];
      std::copy(row, row + V, y.begin());
      out.rows[size_t(t)] = sample_row(op, t, y.data(), V, lay, params[size_t(t)],
                                       uint64_t(read_index(request_ids, t)),
                                       uint32_t(read_index(positions, t)), &scratch, &order, &kept);
    }
  });
  out.write(token_ids, logp, lse, entropy);
}

}  // namespace cpu
}  // namespace lockstep
