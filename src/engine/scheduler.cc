// Continuous-batching scheduler: running sequences first (oldest first, one prefill chunk or one
// decode each while the token budget lasts), then admissions from the waiting queue; preemption of
// the newest running sequence when KV pages run out. See scheduler.h.
#include "engine/scheduler.h"

#include <algorithm>
#include <sstream>

#include "lockstep/error.h"

namespace lockstep::engine {

void SchedulerConfig::validate() const {
  LS_CHECK(max_running >= 1, "SchedulerConfig", "max_running must be >= 1, got ", max_running);
  LS_CHECK(max_batched_tokens >= 1, "SchedulerConfig", "max_batched_tokens must be >= 1, got ",
           max_batched_tokens);
}

std::string SchedulerConfig::to_string() const {
  std::ostringstream os;
  os << "scheduler: max_running=" << max_running << " max_batched_tokens=" << max_batched_tokens
     << " prefix_sharing=" << (prefix_sharing ? "on" : "off");
  return os.str();
}

int64_t StepPlan::num_samples() const {
  int64_t n = 0;
  for (const ScheduledSeq& s : seqs)
    if (s.sample) n += 1 + int64_t(s.forks.size());
  return n;
}

bool StepPlan::decode_only() const {
  return !seqs.empty() && std::all_of(seqs.begin(), seqs.end(), [](const ScheduledSeq& s) {
    return s.count == 1 && s.sample;
  });
}

std::string SchedulerStats::to_string() const {
  std::ostringstream os;
  os << "steps=" << steps << " tokens_computed=" << tokens_computed
     << " prefill_tokens=" << prefill_tokens << " preemptions=" << preemptions
     << " kv_drops=" << kv_drops << " forks=" << forks << " page_copies=" << page_copies
     << " max_step_tokens=" << max_step_tokens << " max_step_seqs=" << max_step_seqs
     << " min_free_pages=" << min_free_pages;
  return os.str();
}

Scheduler::Scheduler(const SchedulerConfig& cfg, const KvCacheConfig& kv_cfg,
                     std::vector<SeqSpec> specs)
    : cfg_((cfg.validate(), cfg)), kv_(kv_cfg) {
  seqs_.reserve(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    SeqSpec& sp = specs[i];
    LS_CHECK(sp.id >= 0, "scheduler", "request ", sp.id, ": id must be >= 0");
    LS_CHECK(by_id_.emplace(sp.id, int64_t(i)).second, "scheduler", "request id ", sp.id,
             " appears twice");
    LS_CHECK(!sp.prompt.empty(), "scheduler", "request ", sp.id, ": empty prompt");
    LS_CHECK(sp.max_new_tokens >= 1, "scheduler", "request ", sp.id,
             ": max_new_tokens must be >= 1, got ", sp.max_new_tokens);
    LS_CHECK(sp.arrival_step >= 0, "scheduler", "request ", sp.id,
             ": arrival_step must be >= 0, got ", sp.arrival_step);
    // The last sampled token is never fed back, so the longest KV is prompt + max_new - 1.
    const int64_t longest = int64_t(sp.prompt.size()) + sp.max_new_tokens - 1;
    LS_CHECK(kv_cfg.pages_for(longest) <= kv_cfg.num_pages, "scheduler", "request ", sp.id,
             ": a sequence of ", sp.prompt.size(), " prompt + ", sp.max_new_tokens,
             " new tokens needs ", kv_cfg.pages_for(longest), " KV pages of ", kv_cfg.page_size,
             " keys but the pool has only ", kv_cfg.num_pages, " (raise the page count)");
    Seq s;
    s.tokens = sp.prompt;
    s.spec = std::move(sp);
    seqs_.push_back(std::move(s));
  }
  // Groups: the first member in spec order leads; the group arrives with its earliest member.
  std::unordered_map<int64_t, int64_t> leader_of;
  if (cfg_.prefix_sharing) {
    for (int64_t i = 0; i < int64_t(seqs_.size()); ++i) {
      Seq& s = seqs_[size_t(i)];
      if (s.spec.group < 0) continue;
      auto [it, inserted] = leader_of.emplace(s.spec.group, i);
      if (inserted) continue;
      Seq& lead = seqs_[size_t(it->second)];
      LS_CHECK(s.spec.prompt == lead.spec.prompt, "scheduler", "request ", s.spec.id,
               ": prefix-sharing group ", s.spec.group, " holds different prompts (request ",
               lead.spec.id, ")");
      lead.members.push_back(i);
      lead.spec.arrival_step = std::min(lead.spec.arrival_step, s.spec.arrival_step);
      s.state = State::kAwaitLeader;
    }
  }
  for (int64_t i = 0; i < int64_t(seqs_.size()); ++i)
    if (seqs_[size_t(i)].state == State::kPending) pending_.push_back(i);
  std::stable_sort(pending_.begin(), pending_.end(), [&](int64_t a, int64_t b) {
    return seqs_[size_t(a)].spec.arrival_step < seqs_[size_t(b)].spec.arrival_step;
  });
  stats_.min_free_pages = kv_cfg.num_pages;
}

int64_t Scheduler::index(int64_t id) const {
  auto it = by_id_.find(id);
  LS_CHECK(it != by_id_.end(), "scheduler", "unknown request ", id);
  return it->second;
}

const SeqSpec& Scheduler::spec(int64_t seq) const { return seqs_[size_t(index(seq))].spec; }
const std::vector<int32_t>& Scheduler::tokens(int64_t seq) const {
  return seqs_[size_t(index(seq))].tokens;
}
int64_t Scheduler::num_generated(int64_t seq) const {
  const Seq& s = seqs_[size_t(index(seq))];
  return int64_t(s.tokens.size() - s.spec.prompt.size());
}
FinishReason Scheduler::finish_reason(int64_t seq) const {
  return seqs_[size_t(index(seq))].finish;
}

bool Scheduler::drop_waiting_kv(int64_t keep) {
  for (auto it = waiting_.rbegin(); it != waiting_.rend(); ++it) {
    Seq& s = seqs_[size_t(*it)];
    if (*it == keep || !s.holds_kv) continue;
    kv_.free(s.spec.id);
    s.holds_kv = false;
    s.computed = 0;
    ++stats_.kv_drops;
    return true;
  }
  return false;
}

void Scheduler::preempt_last_running(StepPlan* plan) {
  const int64_t idx = running_.back();
  running_.pop_back();
  Seq& s = seqs_[size_t(idx)];
  kv_.free(s.spec.id);
  s.holds_kv = false;
  s.computed = 0;  // recomputed from position 0 (prompt and generated tokens) when readmitted
  s.state = State::kWaiting;
  waiting_.push_front(idx);
  plan->preempted.push_back(s.spec.id);
  ++stats_.preemptions;
}

void Scheduler::push_scheduled(int64_t idx, int64_t n, StepPlan* plan) {
  Seq& s = seqs_[size_t(idx)];
  ScheduledSeq ss;
  ss.seq = s.spec.id;
  ss.start = s.computed;
  ss.count = n;
  ss.sample = s.computed + n == int64_t(s.tokens.size());
  if (ss.sample && !s.forked)
    for (int64_t m : s.members) ss.forks.push_back(seqs_[size_t(m)].spec.id);
  plan->num_tokens += n;
  plan->seqs.push_back(std::move(ss));
}

StepPlan Scheduler::schedule() {
  LS_CHECK(!done(), "scheduler", "schedule() called after every request finished");
  LS_CHECK(!in_step_, "scheduler", "schedule() called twice without complete()");
  // Nothing to do until the next arrival: skip the idle steps.
  if (running_.empty() && waiting_.empty() && pending_pos_ < pending_.size())
    step_ = std::max(step_, seqs_[size_t(pending_[pending_pos_])].spec.arrival_step);
  while (pending_pos_ < pending_.size() &&
         seqs_[size_t(pending_[pending_pos_])].spec.arrival_step <= step_) {
    const int64_t idx = pending_[pending_pos_++];
    seqs_[size_t(idx)].state = State::kWaiting;
    waiting_.push_back(idx);
  }

  StepPlan plan;
  plan.step = step_;
  int64_t budget = cfg_.max_batched_tokens;

  // 1. Running sequences, oldest first. A sequence that cannot get pages takes them from the
  //    waiting forks' shared KV, then from the newest running sequences (maybe itself).
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    const int64_t idx = running_[i];
    Seq& s = seqs_[size_t(idx)];
    const int64_t n = std::min(remaining(s), budget);
    bool ok = true;
    while (!kv_.grow(s.spec.id, s.computed + n, &plan.copies)) {
      if (drop_waiting_kv()) continue;
      const bool self = running_.back() == idx;
      preempt_last_running(&plan);
      if (self) {
        ok = false;
        break;
      }
    }
    if (!ok) break;  // it was the newest: nothing after it is running any more
    push_scheduled(idx, n, &plan);
    budget -= n;
  }

  // 2. Admissions in queue order while there are slots, budget and pages. Admission never
  //    preempts a running sequence; with nothing scheduled, waiting forks' KV is dropped. No
  //    admissions in a step that preempted (as vLLM): pages are short.
  while (plan.preempted.empty() && budget > 0 && int64_t(running_.size()) < cfg_.max_running &&
         !waiting_.empty()) {
    const int64_t idx = waiting_.front();
    Seq& s = seqs_[size_t(idx)];
    const int64_t n = std::min(remaining(s), budget);
    const bool had_kv = s.holds_kv;
    if (!had_kv) kv_.add(s.spec.id);
    bool ok = kv_.grow(s.spec.id, s.computed + n, &plan.copies);
    // Only waiting sequences hold pages: free the others' shared KV.
    while (!ok && plan.seqs.empty() && drop_waiting_kv(idx))
      ok = kv_.grow(s.spec.id, s.computed + n, &plan.copies);
    if (!ok) {
      if (!had_kv) kv_.free(s.spec.id);
      LS_CHECK(!plan.seqs.empty(), "scheduler", "internal: request ", s.spec.id,
               " does not fit an empty KV pool");
      break;
    }
    s.holds_kv = true;
    s.state = State::kRunning;
    waiting_.pop_front();
    running_.push_back(idx);
    push_scheduled(idx, n, &plan);
    budget -= n;
  }
  LS_CHECK(!plan.seqs.empty(), "scheduler", "internal: step ", step_, " scheduled nothing");

  in_step_ = true;
  ++stats_.steps;
  stats_.tokens_computed += plan.num_tokens;
  for (const ScheduledSeq& ss : plan.seqs) stats_.prefill_tokens += ss.count - (ss.sample ? 1 : 0);
  stats_.page_copies += int64_t(plan.copies.size());
  stats_.max_step_tokens = std::max(stats_.max_step_tokens, plan.num_tokens);
  stats_.max_step_seqs = std::max(stats_.max_step_seqs, int64_t(plan.seqs.size()));
  stats_.min_free_pages = std::min(stats_.min_free_pages, kv_.num_free_pages());
  return plan;
}

bool Scheduler::accept_token(Seq& s, int32_t tok) {
  s.tokens.push_back(tok);
  const SeqSpec& sp = s.spec;
  if (std::find(sp.stop_ids.begin(), sp.stop_ids.end(), tok) != sp.stop_ids.end())
    s.finish = FinishReason::kStop;
  else if (int64_t(s.tokens.size() - sp.prompt.size()) >= sp.max_new_tokens)
    s.finish = FinishReason::kLength;
  return s.finish != FinishReason::kNone;
}

void Scheduler::complete(const StepPlan& plan, std::span<const int32_t> sampled) {
  LS_CHECK(in_step_, "scheduler", "complete() without schedule()");
  LS_CHECK(plan.step == step_, "scheduler", "complete(): plan of step ", plan.step,
           ", expected step ", step_);
  LS_CHECK(int64_t(sampled.size()) == plan.num_samples(), "scheduler",
           "complete(): ", sampled.size(), " sampled tokens for ", plan.num_samples(),
           " sample rows");
  size_t k = 0;
  std::vector<int64_t> finished, new_waiting;
  for (const ScheduledSeq& ss : plan.seqs) {
    const int64_t idx = index(ss.seq);
    Seq& s = seqs_[size_t(idx)];
    LS_CHECK(s.state == State::kRunning && s.computed == ss.start, "scheduler",
             "complete(): plan does not match request ", ss.seq);
    s.computed = ss.start + ss.count;
    if (!ss.sample) continue;
    const bool done_now = accept_token(s, sampled[k++]);
    // Members fork before the leader may finish (and free the prompt's pages).
    for (int64_t mid : ss.forks) {
      const int64_t m = index(mid);
      Seq& c = seqs_[size_t(m)];
      if (accept_token(c, sampled[k++])) {
        c.state = State::kFinished;
        ++num_finished_;
        continue;
      }
      kv_.fork(s.spec.id, c.spec.id);
      c.holds_kv = true;
      c.computed = s.computed;
      c.state = State::kWaiting;
      new_waiting.push_back(m);
      ++stats_.forks;
    }
    if (!ss.forks.empty()) s.forked = true;
    if (done_now) finished.push_back(idx);
  }
  // Forked members go to the front of the queue, in order: they only need decodes.
  for (auto it = new_waiting.rbegin(); it != new_waiting.rend(); ++it) waiting_.push_front(*it);
  for (int64_t idx : finished) {
    Seq& s = seqs_[size_t(idx)];
    kv_.free(s.spec.id);
    s.holds_kv = false;
    s.state = State::kFinished;
    ++num_finished_;
    running_.erase(std::find(running_.begin(), running_.end(), idx));
  }
  ++step_;
  in_step_ = false;
}

}  // namespace lockstep::engine
