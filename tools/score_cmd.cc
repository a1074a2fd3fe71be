// `lockstep score --model DIR --tokens FILE [--out FILE] [--tp N] [--temperature T]
//   [--gemm-segments S] [--vocab-segments S] [--threads N]`
// Reads token sequences (one per line, ids separated by spaces), runs the packed training forward
// and writes, per sequence, one line "i logp lse entropy" per predicted token i >= 1 (fp32 printed
// with 9 significant digits: exact round trip), sequences separated by a blank line.
#include "tools/score_cmd.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
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

static const char* kUsage =
    "usage: lockstep score --model DIR --tokens FILE [--out FILE] [--tp N] [--temperature T]\n"
    "                      [--gemm-segments S] [--vocab-segments S] [--threads N]\n"
    "  FILE: one sequence per line, token ids separated by spaces (>= 2 tokens each)\n";

int run_score_command(int argc, char** argv) {
  std::string model_dir, tokens_path, out_path;
  int tp = 1, threads = 0;
  float temperature = 1.0f;
  ContractConfig contract;
  auto need = [&](int& i) -> std::string {
    LS_CHECK(i + 1 < argc, "lockstep score", "flag ", argv[i], " needs a value");
    return argv[++i];
  };
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--model")
      model_dir = need(i);
    else if (a == "--tokens")
      tokens_path = need(i);
    else if (a == "--out")
      out_path = need(i);
    else if (a == "--tp")
      tp = std::stoi(need(i));
    else if (a == "--threads")
      threads = std::stoi(need(i));
    else if (a == "--temperature")
      temperature = std::stof(need(i));
    else if (a == "--gemm-segments")
      contract.gemm_segments = std::stoi(need(i));
    else if (a == "--vocab-segments")
      contract.vocab_segments = std::stoi(need(i));
    else if (a == "--help" || a == "-h") {
      std::printf("%s", kUsage);
      return 0;
    } else {
      std::fprintf(stderr, "lockstep score: unknown flag '%s'\n%s", a.c_str(), kUsage);
      return 2;
    }
  }
  if (model_dir.empty() || tokens_path.empty()) {
    std::fprintf(stderr, "lockstep score: --model and --tokens are required\n%s", kUsage);
    return 2;
  }
  if (threads > 0) set_num_threads(threads);
  contract.validate();

  std::ifstream in(tokens_path);
  LS_CHECK(in.good(), "lockstep score", "cannot read --tokens file '", tokens_path, "'");
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
      LS_CHECK(end && *end == '\0' && v >= 0 && v <= INT32_MAX, "lockstep score", tokens_path, ":",
               line_no, ": '", tok, "' is not a token id");
      ids.push_back(int32_t(v));
    }
    if (ids.empty()) continue;
    LS_CHECK(ids.size() >= 2, "lockstep score", tokens_path, ":", line_no,
             ": a sequence needs at least 2 tokens, got ", ids.size());
    engine::TrainSequence s;
    s.id = int64_t(seqs.size());
    s.prompt.assign(ids.begin(), ids.begin() + 1);
    s.completion.assign(ids.begin() + 1, ids.end());
    s.temperature = temperature;
    seqs.push_back(std::move(s));
  }
  LS_CHECK(!seqs.empty(), "lockstep score", "no sequences in '", tokens_path, "'");

  const engine::Checkpoint ckpt = engine::Checkpoint::open(model_dir);
  engine::ModelOptions mo;
  mo.contract = contract;
  mo.tp = tp;
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

  std::FILE* out = out_path.empty() ? stdout : std::fopen(out_path.c_str(), "w");
  LS_CHECK(out != nullptr, "lockstep score", "cannot write --out file '", out_path, "'");
  for (size_t s = 0; s < r.sequences.size(); ++s) {
    const engine::TrainTokens& t = r.sequences[s];
    for (size_t i = 0; i < t.logp.size(); ++i)
      std::fprintf(out, "%zu %.9g %.9g %.9g\n", i + 1, t.logp[i], t.lse[i], t.entropy[i]);
    std::fprintf(out, "\n");
  }
  if (out != stdout) std::fclose(out);
  std::fprintf(stderr, "lockstep score: %lld tokens in %.1f s\n", (long long)r.tokens_forwarded,
               r.seconds);
  return 0;
}

}  // namespace lockstep::tools
