// Continuous-batching scheduler (vLLM style) over a paged KV cache: requests arrive by step, each
// step builds a batch of prefill chunks (any size) and decodes under a token budget and a limit on
// running sequences, sequences leave on a stop token or max_new_tokens and new ones join, so the
// batch changes every step. Out of KV pages → preemption of the newest running sequence (its pages
// are freed and it is recomputed later). Prefix sharing: a GRPO group's prompt is prefilled once by
// its leader; the other members sample their first token from the leader's last prompt row and
// fork its pages. Pure bookkeeping: the model and sampling live in rollout.h; no choice made here
// changes a bit of any token's result (the ops are batch-, chunk-, page- and split-invariant).
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/kv_cache.h"

namespace lockstep::engine {

struct SchedulerConfig {
  int64_t max_running = 32;          // sequences in the running set (the batch), >= 1
  int64_t max_batched_tokens = 256;  // tokens computed per step (chunked-prefill budget), >= 1
  bool prefix_sharing = true;        // prefill a group's prompt once and fork it

  void validate() const;          // throws lockstep::Error
  std::string to_string() const;  // "scheduler: max_running=32 max_batched_tokens=256 ..."
};

// What the scheduler needs of one request (one sequence: a prompt and its completion).
struct SeqSpec {
  int64_t id = 0;                 // unique, >= 0
  std::vector<int32_t> prompt;    // >= 1 token
  int64_t max_new_tokens = 1;     // >= 1
  std::vector<int32_t> stop_ids;  // generation ends after any of these tokens (EOS); may be empty
  int64_t arrival_step = 0;       // the first step it may be scheduled in, >= 0
  // Prefix-sharing group (a prompt × G samples; members must have equal prompts), -1 = none.
  // With prefix_sharing, a group arrives at its members' earliest arrival step and its first
  // member (in spec order) is the leader.
  int64_t group = -1;
};

enum class FinishReason { kNone, kStop, kLength };

// One sequence's work in a step: compute positions [start, start + count) (their tokens are
// tokens(seq)[start .. start+count)); KV slots for them are reserved in kv().block_table(seq).
struct ScheduledSeq {
  int64_t seq = 0;
  int64_t start = 0;
  int64_t count = 0;
  // The row of position start + count - 1 produces the next token (the sequence's pending tokens
  // are all computed after this step). Its sample position is start + count.
  bool sample = false;
  // Group members sampled from the same row (after seq's own sample), each then forking seq's KV.
  std::vector<int64_t> forks;
};

struct StepPlan {
  int64_t step = 0;
  std::vector<ScheduledSeq> seqs;  // running order; prefill chunks and decodes mixed
  std::vector<PageCopy> copies;    // copy-on-write page copies, to do in order before the forward
  std::vector<int64_t> preempted;  // sequences preempted while building this step
  int64_t num_tokens = 0;          // Σ count
  // Sample rows of the step: for each seq with sample, 1 + forks.size(), in order.
  int64_t num_samples() const;
  // A pure decode step: at least one sequence, and each computes one token and samples.
  bool decode_only() const;
};

struct SchedulerStats {
  int64_t steps = 0;
  int64_t tokens_computed = 0;  // Σ over steps of num_tokens (recompute included)
  int64_t prefill_tokens = 0;   // computed positions that did not sample (prompt chunks, recompute)
  int64_t preemptions = 0;      // running sequences whose KV was freed for recompute
  int64_t kv_drops = 0;         // waiting forked sequences whose shared KV was dropped
  int64_t forks = 0;
  int64_t page_copies = 0;
  int64_t max_step_tokens = 0;
  int64_t max_step_seqs = 0;
  int64_t min_free_pages = 0;  // lowest free-page count seen after scheduling a step
  std::string to_string() const;
};

class Scheduler {
 public:
  // Checks every request up front: ids unique, prompts non-empty, max_new_tokens >= 1, group
  // members' prompts equal, and each sequence fits the pool alone (pages for its longest KV,
  // prompt + max_new_tokens - 1 positions), else Error naming the request.
  Scheduler(const SchedulerConfig& cfg, const KvCacheConfig& kv_cfg, std::vector<SeqSpec> specs);

  bool done() const { return num_finished_ == int64_t(seqs_.size()); }
  // Builds the next step (skipping steps where nothing has arrived). Call complete() before the
  // next schedule(). Error if done().
  StepPlan schedule();
  // Applies a step's results: sampled[i] is the token of the plan's i-th sample row.
  void complete(const StepPlan& plan, std::span<const int32_t> sampled);

  const SeqSpec& spec(int64_t seq) const;
  const std::vector<int32_t>& tokens(int64_t seq) const;  // prompt + generated so far
  int64_t num_generated(int64_t seq) const;
  FinishReason finish_reason(int64_t seq) const;
  const KvCacheManager& kv() const { return kv_; }
  const SchedulerConfig& config() const { return cfg_; }
  const SchedulerStats& stats() const { return stats_; }
  int64_t num_running() const { return int64_t(running_.size()); }

 private:
  enum class State { kPending, kAwaitLeader, kWaiting, kRunning, kFinished };
  struct Seq {
    SeqSpec spec;
    std::vector<int32_t> tokens;
    int64_t computed = 0;  // positions whose KV is written (== kv length while it holds KV)
    State state = State::kPending;
    bool holds_kv = false;
    bool forked = false;           // leader: its members have been forked
    std::vector<int64_t> members;  // leader: the other members (indices), in spec order
    FinishReason finish = FinishReason::kNone;
  };
  int64_t index(int64_t id) const;
  int64_t remaining(const Seq& s) const { return int64_t(s.tokens.size()) - s.computed; }
  // Frees the KV of the last waiting holder other than seqs_[keep]; false if there is none.
  bool drop_waiting_kv(int64_t keep = -1);
  void preempt_last_running(StepPlan* plan);
  void push_scheduled(int64_t idx, int64_t n, StepPlan* plan);
  bool accept_token(Seq& s, int32_t tok);  // appends; true when the sequence finished

  SchedulerConfig cfg_;
  KvCacheManager kv_;
  std::vector<Seq> seqs_;
  std::unordered_map<int64_t, int64_t> by_id_;
  std::vector<int64_t> pending_;  // not yet arrived, by (arrival, spec order); consumed from front
  size_t pending_pos_ = 0;
  std::deque<int64_t> waiting_;   // arrived, not running (preempted and forked ones at the front)
  std::vector<int64_t> running_;  // admission order
  int64_t step_ = 0;
  int64_t num_finished_ = 0;
  bool in_step_ = false;
  SchedulerStats stats_;
};

}  // namespace lockstep::engine
