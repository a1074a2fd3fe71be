// Reward tasks for the trainer (issue 12): built-in verifiable tasks on token ids (no tokenizer),
// and a plug-in reward command (an external program reading samples as JSONL on stdin and writing
// one reward per line).
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace lockstep::engine {

struct TaskPrompt {
  std::vector<int32_t> prompt;  // token ids
  std::vector<int32_t> answer;  // the reference answer (for verifiable tasks; may be empty)
};

struct Sample {
  int64_t id = 0;
  std::vector<int32_t> prompt, completion, answer;
};

class Task {
 public:
  virtual ~Task() = default;
  virtual std::string name() const = 0;
  // One prompt from the generator (deterministic in the generator's state).
  virtual TaskPrompt make_prompt(std::mt19937_64& g) const = 0;
  // Rewards in [0, 1] for a batch of samples (same order). Throws lockstep::Error on failure.
  virtual std::vector<double> score(const std::vector<Sample>& samples) const = 0;
  virtual int64_t max_new_tokens() const = 0;
};

// Built-in tasks over the digit tokens 3..12 (ids 0..2 are pad/bos/eos in the built-in model), a
// prompt = BOS, the operand digits, a separator token 13: "copy" (repeat the digits), "reverse",
// "sort" (ascending), "add" (two numbers, their sum's digits). Reward: the fraction of answer
// positions the completion matches (position by position, up to the answer length), so partial
// answers earn partial credit; a completion longer than the answer is not penalized beyond EOS.
// digits: the operand length. vocab_size: the model's (>= 14). Throws on an unknown name.
std::unique_ptr<Task> make_builtin_task(const std::string& name, int64_t digits,
                                        int64_t vocab_size);
std::vector<std::string> builtin_task_names();

// A plug-in reward: `command` (run with /bin/sh -c) gets one JSON object per sample on stdin
// ({"id", "prompt", "completion", "answer"} as integer arrays) and must print one number per line,
// as many lines as samples, within timeout_s. Non-numbers, NaN/inf, a wrong count, a non-zero exit,
// a crash or a timeout throw lockstep::Error naming the problem (line number, text, exit status).
// It scores the prompts of `base` (its prompts and max_new_tokens).
std::unique_ptr<Task> make_command_task(std::unique_ptr<Task> base, const std::string& command,
                                        double timeout_s);

}  // namespace lockstep::engine
