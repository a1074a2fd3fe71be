// `lockstep score --model DIR --tokens FILE [--out FILE] [--tp N] [--temperature T]
//   [contract flags] [--threads N]`
// Reads token sequences (one per line, ids separated by spaces), runs the packed training forward
// and writes, per sequence, one line "i logp lse entropy" per predicted token i >= 1 (fp32 printed
// with 9 significant digits: exact round trip), sequences separated by a blank line.
#include "tools/score_cmd.h"

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "engine/model.h"
#include "engine/trainer.h"
#include "lockstep/error.h"

namespace lockstep::tools {

const char* const kScoreFooter =
    "Writes, per sequence, one line \"i logp lse entropy\" per predicted token i >= 1 (fp32 with 9 "
    "significant digits: exact round trip), sequences separated by a blank line.\nExit status: 0 "
    "done, 2 bad usage, bad input or an error (also a failed write of the output).";

void add_score_options(CLI::App& app, ScoreCommandLine& o) {
  o.contract = default_contract();
  // NOTE: --model and --tokens are checked in run_score, not marked required(): CLI11 reports a
  // missing required option before an unknown one, and a mistyped flag must be named.
  app.add_option("--model", o.model_dir,
                 "Qwen3 checkpoint directory (config.json + safetensors) (required)")
      ->type_name("DIR")
      ->group("input and output");
  app.add_option("--tokens", o.tokens_path,
                 "one sequence per line, token ids separated by spaces (>= 2 tokens each) "
                 "(required)")
      ->type_name("FILE")
      ->group("input and output");
  app.add_option("--out", o.out_path, "where the scores go [stdout]")
      ->type_name("FILE")
      ->group("input and output");
  app.add_option("--tp", o.tp, "tensor-parallel degree of the training forward")
      ->transform(int_one_of({1, 2, 4, 8}))
      ->type_name("N")
      ->capture_default_str()
      ->group("run");
  app.add_option("--temperature", o.temperature, "log-prob temperature (finite, > 0)")
      ->transform(float_in(0, 1e6, true))
      ->type_name("T")
      ->capture_default_str()
      ->group("run");
  add_strict_option(app, o.strict, "input and output");
  add_threads_option(app, o.threads);
  add_contract_options(app, o.contract);
}

int run_score(const ScoreCommandLine& o) {
  if (o.model_dir.empty() || o.tokens_path.empty())
    throw Error("--model DIR and --tokens FILE are required (see --help)");
  if (o.threads > 0) set_num_threads(o.threads);
  o.contract.validate();
  const std::string& tokens_path = o.tokens_path;
  // A FIFO or a device would block or never end: only a regular file (or a link to one).
  std::error_code ec;
  LS_CHECK(std::filesystem::is_regular_file(tokens_path, ec), "--tokens", "'", tokens_path,
           "' is not a readable regular file", ec ? " (" + ec.message() + ")" : std::string());
  std::ifstream in(tokens_path);
  LS_CHECK(in.good(), "--tokens", "cannot read '", tokens_path, "'");
  std::vector<engine::TrainSequence> seqs;
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    std::istringstream ls(line);
    std::vector<int32_t> ids;
    std::string tok;
    while (ls >> tok) {
      char* end = nullptr;
      long long v = std::strtoll(tok.c_str(), &end, 10);
      LS_CHECK(end && *end == '\0' && v >= 0 && v <= INT32_MAX, "--tokens", tokens_path, ":",
               line_no, ": '", tok, "' is not a token id");
      ids.push_back(int32_t(v));
    }
    if (ids.empty()) continue;
    LS_CHECK(ids.size() >= 2, "--tokens", tokens_path, ":", line_no,
             ": a sequence needs at least 2 tokens, got ", ids.size());
    engine::TrainSequence s;
    s.id = int64_t(seqs.size());
    s.prompt.assign(ids.begin(), ids.begin() + 1);
    s.completion.assign(ids.begin() + 1, ids.end());
    s.temperature = o.temperature;
    seqs.push_back(std::move(s));
  }
  LS_CHECK(!seqs.empty(), "--tokens", "no sequences in '", tokens_path, "'");

  // The output before the model: an unwritable --out fails before the forward pass.
  std::FILE* out = stdout;
  if (!o.out_path.empty()) {
    out = std::fopen(o.out_path.c_str(), "w");
    LS_CHECK(out != nullptr, "--out", "cannot open '", o.out_path,
             "' for writing: ", std::strerror(errno));
  }
  struct Closer {
    std::FILE* f;
    ~Closer() {
      if (f != nullptr && f != stdout) std::fclose(f);
    }
  } closer{out};

  const engine::Checkpoint ckpt =
      engine::Checkpoint::load(o.model_dir, checkpoint_load_options(o.strict));
  engine::ModelOptions mo;
  mo.contract = o.contract;
  mo.tp = o.tp;
  engine::Model model(ckpt.config(), ckpt, mo, engine::make_invariant_backend());
  std::fprintf(stderr, "lockstep score: %s; %zu sequences; %s\n", ckpt.config().to_string().c_str(),
               seqs.size(), mo.to_string().c_str());
  engine::PackingConfig pc;
  pc.micro_batch_tokens = 4096;
  engine::TrainHooks hooks;
  hooks.progress = [](int64_t done, int64_t total) {
    std::fprintf(stderr, "lockstep score: %lld / %lld sequences\n", (long long)done,
                 (long long)total);
  };
  engine::TrainResult r = engine::run_training_forward(model, seqs, pc, hooks);

  for (size_t s = 0; s < r.sequences.size(); ++s) {
    const engine::TrainTokens& t = r.sequences[s];
    for (size_t i = 0; i < t.logp.size(); ++i)
      std::fprintf(out, "%zu %.9g %.9g %.9g\n", i + 1, t.logp[i], t.lse[i], t.entropy[i]);
    std::fprintf(out, "\n");
  }
  if (out == stdout) {
    flush_stdout();
  } else {
    closer.f = nullptr;
    const bool write_failed = std::ferror(out) != 0;
    const int saved = errno;
    const bool close_failed = std::fclose(out) != 0;
    LS_CHECK(!write_failed && !close_failed, "--out", "writing '", o.out_path,
             "' failed: ", std::strerror(close_failed ? errno : saved));
  }
  std::fprintf(stderr, "lockstep score: %lld tokens in %.1f s\n", (long long)r.tokens_forwarded,
               r.seconds);
  return kExitOk;
}

Command add_score_command(CLI::App& top) {
  auto o = std::make_shared<ScoreCommandLine>();
  CLI::App* sub = top.add_subcommand(
      "score", "per-token log-probs of token sequences (the packed training forward)");
  sub->footer(kScoreFooter);
  add_score_options(*sub, *o);
  return {sub, [o] { return run_score(*o); }};
}

}  // namespace lockstep::tools
