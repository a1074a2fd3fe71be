// The rollout engine loop: schedule a step, copy shared pages that are about to be written, run
// Model::forward_step over the step's tokens, sample the rows that end a sequence's pending tokens
// (a group leader's last prompt row is sampled once per member), record, complete. See rollout.h.
#include "engine/rollout.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <unordered_map>
#include <unordered_set>

#include "lockstep/error.h"

namespace lockstep::engine {

void RolloutConfig::validate() const {
  kv.validate();
  scheduler.validate();
  LS_CHECK(step.kv_splits >= 1, "RolloutConfig", "kv_splits must be >= 1, got ", step.kv_splits);
  LS_CHECK(!step.cascade || scheduler.prefix_sharing, "RolloutConfig",
           "cascade attention needs prefix sharing");
}

std::string RolloutConfig::to_string() const {
  return kv.to_string() + "; " + scheduler.to_string() + "; " + step.to_string();
}

int64_t model_context(const Model& model) {
  return model.options().max_positions > 0 ? model.options().max_positions
                                           : model.config().max_position_embeddings;
}

namespace {

constexpr const char* kOp = "rollout";

void validate_requests(const Model& model, const std::vector<RolloutRequest>& requests) {
  const int64_t V = model.config().vocab_size, ctx = model_context(model);
  std::unordered_set<int64_t> ids;
  for (const RolloutRequest& r : requests) {
    LS_CHECK(r.id >= 0, kOp, "request ", r.id, ": id must be >= 0");
    LS_CHECK(ids.insert(r.id).second, kOp, "request id ", r.id, " appears twice");
    LS_CHECK(!r.prompt.empty(), kOp, "request ", r.id, ": empty prompt");
    for (size_t i = 0; i < r.prompt.size(); ++i)
      LS_CHECK(r.prompt[i] >= 0 && r.prompt[i] < V, kOp, "request ", r.id, ": prompt token ", i,
               " = ", r.prompt[i], " is outside the vocab [0, ", V, ")");
    LS_CHECK(r.max_new_tokens >= 1, kOp, "request ", r.id, ": max_new_tokens must be >= 1, got ",
             r.max_new_tokens);
    LS_CHECK(int64_t(r.prompt.size()) + r.max_new_tokens <= ctx, kOp, "request ", r.id,
             ": prompt of ", r.prompt.size(), " tokens + ", r.max_new_tokens,
             " new tokens exceeds the model's context of ", ctx, " positions");
    try {
      r.sampling.validate();
    } catch (const Error& e) {
      throw Error(detail::concat(kOp, ": request ", r.id, ": ", e.what()));
    }
  }
}

// Cascade attention's SharedPrefix for one step: sequences of one group (2+ in the batch) whose
// block tables start with the same pages share those pages; shared_len covers whole pages below
// every member's first new position, so no new token writes there.
struct StepPrefix {
  Tensor block_table, shared_len, seq_group;
  bool any = false;
};

StepPrefix build_prefix(const Scheduler& sched, const StepPlan& plan,
                        const std::vector<int64_t>& group_of_seq, int64_t P) {
  std::map<int64_t, std::vector<size_t>> groups;  // group -> plan rows
  for (size_t i = 0; i < plan.seqs.size(); ++i)
    if (group_of_seq[i] >= 0) groups[group_of_seq[i]].push_back(i);
  StepPrefix out;
  const int64_t S = int64_t(plan.seqs.size());
  out.seq_group = Tensor(DType::kI32, {S});
  std::fill_n(out.seq_group.ptr<int32_t>(), S, -1);
  std::vector<std::vector<int32_t>> rows;
  std::vector<int32_t> lens;
  for (const auto& [g, members] : groups) {
    if (members.size() < 2) continue;
    const auto& first = sched.kv().block_table(plan.seqs[members[0]].seq);
    int64_t k = int64_t(first.size());
    for (size_t m : members) {
      const auto& t = sched.kv().block_table(plan.seqs[m].seq);
      k = std::min(k, plan.seqs[m].start / P);
      int64_t j = 0;
      while (j < k && j < int64_t(t.size()) && t[size_t(j)] == first[size_t(j)]) ++j;
      k = j;
    }
    if (k == 0) continue;
    for (size_t m : members) out.seq_group.ptr<int32_t>()[m] = int32_t(rows.size());
    rows.emplace_back(first.begin(), first.begin() + k);
    lens.push_back(int32_t(k * P));
  }
  if (rows.empty()) return out;
  out.any = true;
  size_t mps = 0;
  for (const auto& r : rows) mps = std::max(mps, r.size());
  const int64_t GR = int64_t(rows.size());
  out.block_table = Tensor(DType::kI32, {GR, int64_t(mps)});
  out.shared_len = Tensor(DType::kI32, {GR});
  for (int64_t g = 0; g < GR; ++g) {
    int32_t* row = out.block_table.ptr<int32_t>() + g * int64_t(mps);
    std::fill_n(row, mps, -1);
    std::copy(rows[size_t(g)].begin(), rows[size_t(g)].end(), row);
    out.shared_len.ptr<int32_t>()[g] = lens[size_t(g)];
  }
  return out;
}

}  // namespace

RolloutResult run_rollout(const Model& model, const std::vector<RolloutRequest>& requests,
                          const RolloutConfig& cfg, const RolloutHooks& hooks) {
  cfg.validate();
  validate_requests(model, requests);
  const Qwen3Config& mc = model.config();
  const int64_t H = mc.hidden_size, P = cfg.kv.page_size;
  const int64_t kv_chunk = model.options().contract.kv_chunk;
  const auto t0 = std::chrono::steady_clock::now();

  std::vector<SeqSpec> specs;
  std::unordered_map<int64_t, size_t> req_index;
  for (size_t i = 0; i < requests.size(); ++i) {
    const RolloutRequest& r = requests[i];
    SeqSpec s;
    s.id = r.id;
    s.prompt = r.prompt;
    s.max_new_tokens = r.max_new_tokens;
    if (r.stop_on_eos)
      for (int64_t e : mc.eos_token_ids) s.stop_ids.push_back(int32_t(e));
    s.arrival_step = r.arrival_step;
    s.group = r.group;
    specs.push_back(std::move(s));
    req_index[r.id] = i;
  }
  Scheduler sched(cfg.scheduler, cfg.kv, std::move(specs));
  const OpsBackend& ops = model.ops();
  const KvCacheStorage storage(ops, mc.num_hidden_layers, model.cache_kv_heads(), mc.head_dim,
                               cfg.kv);

  RolloutResult res;
  res.completions.resize(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    Completion& c = res.completions[i];
    c.id = requests[i].id;
    c.prompt = requests[i].prompt;
    c.sampling = requests[i].sampling;
    const size_t cap = size_t(requests[i].max_new_tokens);
    c.tokens.reserve(cap);
    c.logp.reserve(cap);
    c.lse.reserve(cap);
    c.entropy.reserve(cap);
  }

  int64_t finished = 0;
  auto last_progress = t0;
  bool stop = false;
  while (!sched.done() && !stop) {
    const auto t_step = std::chrono::steady_clock::now();
    StepPlan plan = sched.schedule();
    storage.copy_pages(plan.copies);

    // Inputs of the step: rows in plan order, one block-table row per scheduled sequence.
    const int64_t N = plan.num_tokens, S = int64_t(plan.seqs.size());
    RolloutStepInfo info;
    info.plan = &plan;
    size_t mp = 1;
    for (const ScheduledSeq& ss : plan.seqs)
      mp = std::max(mp, sched.kv().block_table(ss.seq).size());
    Tensor tokens(DType::kI32, {N}), seq(DType::kI32, {N}), pos(DType::kI32, {N});
    Tensor block_table(DType::kI32, {S, int64_t(mp)}), seq_lens(DType::kI32, {S});
    std::vector<int64_t> group_of_seq(size_t(S), -1);
    int64_t row = 0;
    for (int64_t s = 0; s < S; ++s) {
      const ScheduledSeq& ss = plan.seqs[size_t(s)];
      info.row_begin.push_back(row);
      const auto& toks = sched.tokens(ss.seq);
      for (int64_t j = 0; j < ss.count; ++j, ++row) {
        tokens.ptr<int32_t>()[row] = toks[size_t(ss.start + j)];
        seq.ptr<int32_t>()[row] = int32_t(s);
        pos.ptr<int32_t>()[row] = int32_t(ss.start + j);
      }
      const auto& table = sched.kv().block_table(ss.seq);
      int32_t* bt = block_table.ptr<int32_t>() + s * int64_t(mp);
      std::fill_n(bt, mp, -1);
      std::copy(table.begin(), table.end(), bt);
      seq_lens.ptr<int32_t>()[s] = int32_t(ss.start + ss.count);
      group_of_seq[size_t(s)] = requests[req_index.at(ss.seq)].group;
    }

    KvCacheView view;
    view.k = storage.k_views();
    view.v = storage.v_views();
    view.block_table = block_table.view();
    view.seq_lens = seq_lens.view();
    StepOptions step = cfg.step;
    StepPrefix prefix;
    if (step.cascade) {
      prefix = build_prefix(sched, plan, group_of_seq, P);
      if (prefix.any) {
        view.prefix = SharedPrefix{prefix.block_table.view(), prefix.shared_len.view(),
                                   prefix.seq_group.view()};
        for (int64_t s = 0; s < S; ++s) {
          const int32_t g = prefix.seq_group.ptr<int32_t>()[s];
          if (g >= 0 && prefix.shared_len.ptr<int32_t>()[g] >= kv_chunk)
            res.cascade_rows += plan.seqs[size_t(s)].count;
        }
      } else {
        step.cascade = false;  // no shared pages in this step (same bits either way)
      }
    }
    if (hooks.before_step && !hooks.before_step(info)) stop = true;

    // Hidden states stay on the backend's device; the host gets the sampled ids and values
    // (one wait per step, inside Model::sample).
    Tensor hidden = ops.empty(DType::kBF16, {N, H});
    model.forward_step(tokens.view(), seq.view(), pos.view(), view, step, hidden.view());

    // Sample rows: a sequence's last row, once for itself and once per forked group member.
    const int64_t R = plan.num_samples();
    std::vector<int32_t> sampled;
    if (R > 0) {
      Tensor rid(DType::kI64, {R}), spos(DType::kI32, {R});
      std::vector<int64_t> src_row;  // row of `hidden` each sample row reads
      std::vector<SamplingParams> params;
      std::vector<size_t> dest;  // completion index of each sample row
      for (int64_t s = 0; s < S; ++s) {
        const ScheduledSeq& ss = plan.seqs[size_t(s)];
        if (!ss.sample) continue;
        auto add = [&](int64_t id) {
          const int64_t r = int64_t(src_row.size());
          src_row.push_back(info.row_begin[size_t(s)] + ss.count - 1);
          rid.ptr<int64_t>()[r] = id;
          spos.ptr<int32_t>()[r] = int32_t(ss.start + ss.count);
          const size_t idx = req_index.at(id);
          params.push_back(requests[idx].sampling);
          dest.push_back(idx);
        };
        add(ss.seq);
        for (int64_t m : ss.forks) add(m);
      }
      // Gather the rows on the device: one copy per run of consecutive rows (a pure decode step
      // samples every row in order and needs no copy at all).
      Tensor h;
      TensorView hv = hidden.view();
      bool identity = R == N;
      for (int64_t r = 0; identity && r < R; ++r) identity = src_row[size_t(r)] == r;
      if (!identity) {
        h = ops.empty(DType::kBF16, {R, H});
        hv = h.view();
        for (int64_t r0 = 0; r0 < R;) {
          int64_t r1 = r0 + 1;
          while (r1 < R && src_row[size_t(r1)] == src_row[size_t(r1 - 1)] + 1) ++r1;
          ops.copy(hv.rows(r0, r1),
                   hidden.view().rows(src_row[size_t(r0)], src_row[size_t(r0)] + (r1 - r0)));
          r0 = r1;
        }
      }
      Tensor ids(DType::kI32, {R}), logp(DType::kF32, {R}), lse(DType::kF32, {R}),
          ent(DType::kF32, {R});
      model.sample(hv, params, rid.view(), spos.view(), ids.view(), logp.view(), lse.view(),
                   ent.view());
      sampled.assign(ids.ptr<int32_t>(), ids.ptr<int32_t>() + R);
      for (int64_t i = 0; i < R; ++i) {
        Completion& c = res.completions[dest[size_t(i)]];
        c.tokens.push_back(ids.ptr<int32_t>()[i]);
        c.logp.push_back(logp.ptr<float>()[i]);
        c.lse.push_back(lse.ptr<float>()[i]);
        c.entropy.push_back(ent.ptr<float>()[i]);
      }
      res.generated_tokens += R;
    }
    sched.complete(plan, sampled);
    {
      RolloutStepTime st{N, S, 0, plan.decode_only(), 0.0};
      for (const ScheduledSeq& ss : plan.seqs) st.keys += ss.start + ss.count;
      st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_step).count();
      res.step_times.push_back(st);
    }

    finished = 0;
    if (hooks.progress) {
      const auto now = std::chrono::steady_clock::now();
      if (sched.done() ||
          std::chrono::duration<double>(now - last_progress).count() >= hooks.progress_every_s) {
        last_progress = now;
        for (const RolloutRequest& q : requests)
          finished += sched.finish_reason(q.id) != FinishReason::kNone;
        hooks.progress(
            RolloutProgress{plan.step, finished, int64_t(requests.size()), res.generated_tokens});
      }
    }
  }
  for (size_t i = 0; i < requests.size(); ++i)
    res.completions[i].finish = sched.finish_reason(requests[i].id);
  res.stats = sched.stats();
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

}  // namespace lockstep::engine
