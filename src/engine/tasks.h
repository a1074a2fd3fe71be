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
  // The version of the weights that generated it: optimizer steps applied to the policy so far
  // (warm-up steps included). The reward command sees it as "weight_version".
  int64_t weight_version = 0;
};

class Task {
 public:
  virtual ~Task() = default;
  virtual std::string name() const = 0;
  // One prompt from the generator (deterministic in the generator's state).
  virtual TaskPrompt make_prompt(std::mt19937_64& g) const = 0;
  // Finite rewards for a batch of samples (same order; the built-in tasks' lie in [0, 1]). Throws
  // lockstep::Error on failure.
  virtual std::vector<double> score(const std::vector<Sample>& samples) const = 0;
  virtual int64_t max_new_tokens() const = 0;
};

// Built-in tasks over the digit tokens 3..12 = digits 0..9 (ids 0..2 are pad/bos/eos in the
// built-in model), a prompt = BOS, the operand digits, a separator token 13: "copy" (repeat the
// digits), "reverse", "sort" (ascending), "add" (prompt BOS, a, '+' = token 14, b, 13; a and b of
// exactly `digits` digits, no leading zero unless digits = 1; the answer is the sum's digits, most
// significant first, so digits or digits + 1 of them). The answer holds no EOS; max_new_tokens is
// the longest answer + 1 (room for EOS). Reward: matched positions / answer length, comparing
// completion[i] with answer[i] for i < answer length (missing positions count as wrong), so
// partial answers earn partial credit and nothing past the answer (EOS or not) counts. Digits are
// drawn from the generator's raw outputs (the same on every standard library). digits: the operand
// length, in [1, 1024]. vocab_size: the model's (>= 14; add: >= 15). Throws on an unknown name.
std::unique_ptr<Task> make_builtin_task(const std::string& name, int64_t digits,
                                        int64_t vocab_size);
std::vector<std::string> builtin_task_names();

// A plug-in reward: `command` (run with /bin/sh -c) gets one JSON object per sample on stdin
// ({"id", "prompt", "completion", "answer"} as integer arrays) and must print one number per line,
// as many lines as samples, within timeout_s. Non-numbers, NaN/inf, a wrong count, a non-zero exit,
// a crash or a timeout throw lockstep::Error naming the problem (line number, text, exit status,
// the tail of its stderr). Each line may carry surrounding whitespace; the numbers are parsed
// locale-independently. The command runs in its own process group, which is killed (SIGKILL) on a
// timeout; every child is reaped before score returns or throws. SIGPIPE (a command that does not
// read all its input) is blocked in the calling thread while writing, never delivered. It scores
// the prompts of `base` (its prompts and max_new_tokens); timeout_s in (0, 1e6].
std::unique_ptr<Task> make_command_task(std::unique_ptr<Task> base, const std::string& command,
                                        double timeout_s);

}  // namespace lockstep::engine
