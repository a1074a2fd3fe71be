// The command line: the engine commands' flags parse into the right settings (tools/
// engine_options.h), and the built `lockstep` and `lockstep-score` binaries give the documented
// exit codes (0 ok, 1 a check failed, 2 bad usage or input) with a message naming what was wrong,
// for every bad-input case of the command line; the built-in model goes to the model cache, never
// into the current directory.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "engine/default_model.h"
#include "engine/safetensors.h"
#include "lockstep/error.h"
#include "tools/engine_options.h"
#include "tools/engine_setup.h"

namespace lockstep::tools {
namespace {

namespace fs = std::filesystem;

// ----- the flags, parsed in-process -----

std::string parse_error(const std::vector<std::string>& args) {
  try {
    parse_engine_args(args);
  } catch (const CLI::ParseError& e) {
    return e.what();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(CliEngineFlags, RolloutRanks) {
  using engine::RankMode;
  EXPECT_EQ(parse_engine_args({}).cfg.rollout_ranks, RankMode::kSimulated);
  EXPECT_EQ(parse_engine_args({"--rollout-ranks", "threads"}).cfg.rollout_ranks,
            RankMode::kThreads);
  EXPECT_EQ(parse_engine_args({"--rollout-ranks", "launch"}).cfg.rollout_ranks, RankMode::kLaunch);
  EXPECT_EQ(parse_engine_args({"--rollout-ranks", "simulated"}).cfg.rollout_ranks,
            RankMode::kSimulated);
  EXPECT_NE(parse_error({"--rollout-ranks", "processes"}).find("--rollout-ranks"),
            std::string::npos);
  EXPECT_NE(parse_error({"--rollout-ranks", "threads", "--rollout-tp", "1"})
                .find("--rollout-ranks threads needs --rollout-tp > 1"),
            std::string::npos);
  EXPECT_NE(parse_error({"--rollout-ranks", "launch", "--rollout-tp", "1"})
                .find("--rollout-ranks launch needs --rollout-tp > 1"),
            std::string::npos);
  EXPECT_EQ(parse_engine_args({"--train-ranks", "threads", "--train-tp", "2"}).cfg.train_ranks,
            RankMode::kThreads);
  EXPECT_EQ(parse_engine_args({"--train-ranks", "launch", "--train-tp", "2"}).cfg.train_ranks,
            RankMode::kLaunch);
  EXPECT_NE(parse_error({"--train-ranks", "threads"}).find("--train-ranks threads needs"),
            std::string::npos);
  // Both sides launched: one job, one TP degree.
  EXPECT_NE(parse_error({"--rollout-ranks", "launch", "--train-ranks", "launch", "--train-tp", "4"})
                .find("need --rollout-tp == --train-tp, got 2 and 4"),
            std::string::npos);
  EXPECT_EQ(
      parse_engine_args({"--rollout-ranks", "launch", "--train-ranks", "launch", "--train-tp", "2"})
          .cfg.train_ranks,
      RankMode::kLaunch);
}

// --rollout-ranks / --train-ranks launch: the job from the environment `lockstep launch` sets,
// with WORLD_SIZE equal to the side's TP degree; errors name the flags, the numbers and the fix.
TEST(CliEngineFlags, LaunchedRanksReadTheJobFromTheEnvironment) {
  std::map<std::string, std::string> env = {
      {"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCKSTEP_JOB_ID", "job-x"}};
  auto getenv = [&](const char* name) -> const char* {
    const auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  const dist::ProcessGroupSpec spec =
      launched_job_spec("--rollout-ranks launch", "--rollout-tp", 2, getenv);
  EXPECT_EQ(spec.rank, 1);
  EXPECT_EQ(spec.world_size, 2);
  EXPECT_EQ(spec.job_id, "job-x");
  auto error = [&](int tp) {
    try {
      launched_job_spec("--train-ranks launch", "--train-tp", tp, getenv);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("<no error>");
  };
  EXPECT_EQ(error(4),
            "--train-ranks launch: the job has WORLD_SIZE=2 ranks but --train-tp is 4: run it "
            "under `lockstep launch --nproc 4` (one process per TP rank, --train-tp 4)");
  env.erase("WORLD_SIZE");
  const std::string missing = error(2);
  EXPECT_NE(missing.find("--train-ranks launch: this process is one rank of a job: run it under "
                         "`lockstep launch --nproc 2`"),
            std::string::npos)
      << missing;
  EXPECT_NE(missing.find("WORLD_SIZE is not set"), std::string::npos) << missing;
  env["WORLD_SIZE"] = "two";
  EXPECT_NE(error(2).find("WORLD_SIZE: expected a decimal integer, got 'two'"), std::string::npos);
}

TEST(CliEngineFlags, DefaultsAndFlags) {
  const EngineCommandLine d = parse_engine_args({});
  EXPECT_EQ(d.cfg.prompts, 64);
  EXPECT_EQ(d.cfg.group_size, 8);
  EXPECT_EQ(d.cfg.max_new_tokens, 96);
  EXPECT_EQ(d.cfg.rollout_tp, 2);
  EXPECT_EQ(d.cfg.train_tp, 1);
  EXPECT_TRUE(d.model.dir.empty());
  EXPECT_TRUE(d.model.cache_dir.empty());
  EXPECT_FALSE(d.json);
  EXPECT_TRUE(d.cfg.mixed_sampling);
  EXPECT_TRUE(d.cfg.rollout.step.cascade);
  const EngineCommandLine o = parse_engine_args({"--model",
                                                 "/m",
                                                 "--prompts=5",
                                                 "--group",
                                                 "2",
                                                 "--prompt-len",
                                                 "4:9",
                                                 "--max-new-tokens",
                                                 "7",
                                                 "--rollout-tp",
                                                 "4",
                                                 "--train-tp=2",
                                                 "--page-size",
                                                 "3",
                                                 "--kv-pages",
                                                 "50",
                                                 "--chunk-budget",
                                                 "11",
                                                 "--max-batch",
                                                 "6",
                                                 "--kv-splits",
                                                 "3",
                                                 "--prefix-sharing",
                                                 "off",
                                                 "--micro-batch-tokens",
                                                 "99",
                                                 "--packing-seed",
                                                 "0",
                                                 "--arrival-seed",
                                                 "5",
                                                 "--arrival-stagger",
                                                 "0",
                                                 "--temperature",
                                                 "0.5",
                                                 "--json",
                                                 "--localize",
                                                 "--quiet",
                                                 "--threads",
                                                 "1",
                                                 "--no-eos",
                                                 "--model-cache",
                                                 "/c"});
  EXPECT_EQ(o.model.dir, "/m");
  EXPECT_EQ(o.model.cache_dir, "/c");
  EXPECT_EQ(o.cfg.prompts, 5);
  EXPECT_EQ(o.cfg.group_size, 2);
  EXPECT_EQ(o.cfg.prompt_len_min, 4);
  EXPECT_EQ(o.cfg.prompt_len_max, 9);
  EXPECT_EQ(o.cfg.max_new_tokens, 7);
  EXPECT_EQ(o.cfg.rollout_tp, 4);
  EXPECT_EQ(o.cfg.train_tp, 2);
  EXPECT_EQ(o.cfg.rollout.kv.page_size, 3);
  EXPECT_EQ(o.cfg.rollout.kv.num_pages, 50);
  EXPECT_EQ(o.cfg.rollout.scheduler.max_batched_tokens, 11);
  EXPECT_EQ(o.cfg.rollout.scheduler.max_running, 6);
  EXPECT_EQ(o.cfg.rollout.step.kv_splits, 3);
  EXPECT_FALSE(o.cfg.rollout.scheduler.prefix_sharing);
  EXPECT_FALSE(o.cfg.rollout.step.cascade);  // follows sharing
  EXPECT_EQ(o.cfg.packing.micro_batch_tokens, 99);
  EXPECT_EQ(o.cfg.packing.seed, 0u);
  EXPECT_EQ(o.cfg.arrival_seed, 5u);
  EXPECT_EQ(o.cfg.arrival_stagger, 0);
  EXPECT_FALSE(o.cfg.mixed_sampling);  // --temperature implies uniform
  EXPECT_EQ(o.cfg.sampling.temperature, 0.5f);
  EXPECT_FALSE(o.cfg.stop_on_eos);
  EXPECT_TRUE(o.json && o.cfg.localize && o.quiet);
  EXPECT_EQ(o.threads, 1);
  // One number for --prompt-len; "010" is ten, not octal.
  const EngineCommandLine p = parse_engine_args({"--prompt-len", "12", "--prompts", "010"});
  EXPECT_EQ(p.cfg.prompt_len_min, 12);
  EXPECT_EQ(p.cfg.prompt_len_max, 12);
  EXPECT_EQ(p.cfg.prompts, 10);
  // The float is the one strtof reads, as before the CLI11 parser.
  EXPECT_EQ(parse_engine_args({"--temperature", "0.7"}).cfg.sampling.temperature, 0.7f);
}

TEST(CliEngineFlags, ContractStartsFromTheOneDefault) {
  const ContractConfig d = default_contract();
  EXPECT_EQ(d.to_string(), engine::AuditConfig().contract.to_string());
  EXPECT_EQ(parse_engine_args({}).cfg.contract.to_string(), d.to_string());
  const EngineCommandLine s = parse_engine_args({"--segments", "8", "--kv-chunk", "128"});
  EXPECT_EQ(s.cfg.contract.gemm_segments, 8);
  EXPECT_EQ(s.cfg.contract.vocab_segments, 8);
  EXPECT_EQ(s.cfg.contract.kv_chunk, 128);
  const EngineCommandLine g =
      parse_engine_args({"--gemm-segments", "8", "--vocab-segments", "2", "--rollout-tp", "2"});
  EXPECT_EQ(g.cfg.contract.gemm_segments, 8);
  EXPECT_EQ(g.cfg.contract.vocab_segments, 2);
  // The specific flag wins over --segments whatever the order.
  const EngineCommandLine h = parse_engine_args({"--gemm-segments", "2", "--segments", "8"});
  EXPECT_EQ(h.cfg.contract.gemm_segments, 2);
  EXPECT_EQ(h.cfg.contract.vocab_segments, 8);
}

TEST(CliEngineFlags, Devices) {
  const EngineCommandLine d = parse_engine_args({});
  EXPECT_EQ(d.rollout_device, "cpu");
  EXPECT_EQ(d.train_device, "cpu");
  EXPECT_EQ(d.model.shape, "default");
  const EngineCommandLine a = parse_engine_args({"--device", "cuda", "--model-shape=qwen3-8b"});
  EXPECT_EQ(a.rollout_device, "cuda");
  EXPECT_EQ(a.train_device, "cuda");
  EXPECT_EQ(a.model.shape, "qwen3-8b");
  const EngineCommandLine x =
      parse_engine_args({"--rollout-device", "cuda", "--train-device=cpu", "--model-shape",
                         "qwen3-0.6b", "--weight-seed", "12"});
  EXPECT_EQ(x.rollout_device, "cuda");
  EXPECT_EQ(x.train_device, "cpu");
  EXPECT_EQ(x.model.weight_seed, 12u);
  // The specific device flag wins over --device whatever the order.
  const EngineCommandLine y = parse_engine_args({"--train-device", "cpu", "--device", "cuda"});
  EXPECT_EQ(y.rollout_device, "cuda");
  EXPECT_EQ(y.train_device, "cpu");
}

TEST(CliEngineFlags, BadFlagsAreClearErrors) {
  auto has = [](const std::vector<std::string>& args, const std::string& what) {
    const std::string e = parse_error(args);
    EXPECT_NE(e.find(what), std::string::npos) << "args[0] " << args[0] << ": " << e;
  };
  has({"--bogus"}, "--bogus");
  has({"--prompts"}, "--prompts");
  has({"--prompts", "x"}, "expects an integer in [1, 1048576], got 'x'");
  has({"--prompts", "0"}, "--prompts");
  has({"--prompts", "99999999999999999999999"}, "--prompts");
  has({"--page-size", "-3"}, "--page-size");
  has({"--prompt-len", "9:4"}, "MIN <= MAX");
  has({"--rollout-tp", "3"}, "expects one of 1, 2, 4, 8, got '3'");
  has({"--train-tp", "8"}, "raise --segments");
  has({"--prefix-sharing", "maybe"}, "--prefix-sharing");
  has({"--prefix-sharing", "off", "--cascade", "on"}, "--cascade on needs --prefix-sharing on");
  has({"--temperature", "-1"}, "--temperature");
  has({"--temperature", "1.5x"}, "got '1.5x'");
  has({"--temperature", "inf"}, "finite");
  has({"--top-p", "nan"}, "--top-p");
  has({"--kv-chunk", "100"}, "kv_chunk");
  has({"--baseline", "--no-baseline"}, "exclude each other");
  has({"--seed", "-5"}, "--seed");
  has({"--seed", "18446744073709551616"}, "--seed");
  has({"--threads", "100000"}, "--threads");
  has({"--device", "tpu"}, "--device");
  has({"--model-shape", "qwen3-1t"}, "--model-shape");
  has({"--model", "/m", "--model-shape", "qwen3-8b"},
      "--model and --model-shape exclude each other");
}

// ----- the built binaries -----

struct Result {
  int rc = -1;
  std::string out;  // stdout and stderr together
};

// Runs `binary args` through the shell (args are shell words), in `cwd` when given.
Result run(const std::string& binary, const std::string& args, const std::string& env = "",
           const std::string& cwd = "") {
  // stderr joins the pipe first, so a redirection of stdout in `args` leaves it there.
  std::string cmd = (cwd.empty() ? "" : "cd '" + cwd + "' && ") + env + (env.empty() ? "" : " ") +
                    "'" + binary + "' 2>&1 " + args;
  Result r;
  std::FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int st = pclose(p);
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
  return r;
}

Result lockstep(const std::string& args, const std::string& env = "", const std::string& cwd = "") {
  return run(LOCKSTEP_CLI, args, env, cwd);
}

#define EXPECT_RUN(result, code, text)                                                            \
  do {                                                                                            \
    const Result r_ = (result);                                                                   \
    EXPECT_EQ(r_.rc, code) << r_.out;                                                             \
    EXPECT_NE(r_.out.find(text), std::string::npos) << "wanted '" << text << "' in:\n" << r_.out; \
  } while (0)

// A scratch directory, removed at the end of the test.
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& name) {
    path =
        fs::temp_directory_path() / ("lockstep_test_cli_" + name + "_" + std::to_string(getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string str() const { return path.string(); }
};

// The built-in model's files and a tokens file, made once for the score tests.
struct ScoreInputs {
  TempDir dir{"score"};
  std::string model, tokens;
  ScoreInputs() {
    model = engine::ensure_default_model((dir.path / "model").string());
    tokens = (dir.path / "tokens.txt").string();
    std::ofstream(tokens) << "1 5 9 13\n2 7 7\n";
  }
};
const ScoreInputs& score_inputs() {
  static ScoreInputs s;
  return s;
}
std::string score_args(const std::string& extra) {
  return "score --model '" + score_inputs().model + "' --tokens '" + score_inputs().tokens + "' " +
         extra;
}

// The config alone, for commands that only plan: a checkpoint's config.json or a named shape's.
TEST(CliModelFlags, ConfigWithoutWeights) {
  ModelFlags m;
  m.shape = "qwen3-8b";
  EXPECT_EQ(model_config_of(m).hidden_size, 4096);
  m.shape = "default";
  EXPECT_EQ(model_config_of(m).hidden_size, engine::default_model_config().hidden_size);
  m.dir = score_inputs().model;
  EXPECT_EQ(model_config_of(m).to_string(), engine::default_model_config().to_string());
  m.dir = "/nonexistent/model";
  EXPECT_THROW(model_config_of(m), Error);
}

TEST(CliBinary, BenchEngineRuns) {
  EXPECT_RUN(lockstep("bench-engine --prompts 1 --group 2 --max-new-tokens 2 --prompt-len 8:16 "
                      "--threads 1 --quiet "
                      "--json --model '" +
                      score_inputs().model + "'"),
             0, "\"same_schedule\":true");
  EXPECT_RUN(lockstep("bench-engine --prompts 0"), 2, "--prompts");
}

// --profile-ops: per backend a table of the rollout's, its decode steps' and the training
// forward's ops (text), or the same as "op_profile" in each backend's JSON object.
TEST(CliBinary, BenchEngineProfilesOps) {
  const std::string small =
      "bench-engine --prompts 1 --group 2 --max-new-tokens 3 --prompt-len 8:16 --threads 1 "
      "--quiet --rollout-tp 1 --no-baseline --profile-ops --model '" +
      score_inputs().model + "'";
  const Result text = lockstep(small);
  ASSERT_EQ(text.rc, 0) << text.out;
  for (const char* want :
       {"op profile [flags, invariant] (--profile-ops)", "perturb the run slightly",
        "[flags, invariant] rollout (steps: ",
        "[flags, invariant] decode steps only (decode steps: ",
        "[flags, invariant] training forward (micro-batches: 1)", "attention_paged", "sample",
        "linear_logprob", "not covered by device work (host work, launches, waits)"})
    EXPECT_NE(text.out.find(want), std::string::npos) << want << " in:\n" << text.out;
  const Result json = lockstep(small + " --json");
  ASSERT_EQ(json.rc, 0) << json.out;
  const nlohmann::json j = nlohmann::json::parse(json.out);
  const nlohmann::json& prof = j["backends"]["invariant"]["op_profile"];
  for (const char* section : {"rollout", "decode", "train"}) {
    ASSERT_TRUE(prof.contains(section)) << json.out;
    EXPECT_GE(prof[section]["steps"].get<int64_t>(), 1) << section;
    EXPECT_GT(prof[section]["ops"].size(), 0u) << section;
    EXPECT_GE(prof[section]["device_seconds"].get<double>(), 0.0) << section;
  }
  EXPECT_EQ(prof["rollout"]["steps"], j["backends"]["invariant"]["rollout_steps"]);
  EXPECT_EQ(prof["decode"]["steps"], j["backends"]["invariant"]["decode_steps"]);
  // Without the flag there is no profile.
  const Result plain = lockstep(
      "bench-engine --prompts 1 --group 2 --max-new-tokens 2 --prompt-len 8:16 --threads 1 "
      "--quiet --rollout-tp 1 --no-baseline --json --model '" +
      score_inputs().model + "'");
  ASSERT_EQ(plain.rc, 0) << plain.out;
  EXPECT_FALSE(nlohmann::json::parse(plain.out)["backends"]["invariant"].contains("op_profile"));
}

// Without a contract or TP flag bench-engine times both deployment contracts, one JSON line each,
// every engine step set beside its memory floor; a contract flag times that one configuration.
TEST(CliBinary, BenchEngineTimesBothContractsAndTheMemoryFloor) {
  const TempDir dir("bench_engine");
  const std::string csv = (dir.path / "steps.csv").string();
  const std::string small =
      "bench-engine --prompts 1 --group 2 --max-new-tokens 3 --prompt-len "
      "12:20 --threads 1 --quiet --json --model '" +
      score_inputs().model + "'";
  const Result r = lockstep(small + " --steps-csv '" + csv + "'");
  ASSERT_EQ(r.rc, 0) << r.out;
  std::vector<nlohmann::json> lines;
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(lines.size(), 2u) << r.out;
  EXPECT_EQ(lines[0]["config"], "audit");
  EXPECT_EQ(lines[1]["config"], "one-gpu");
  EXPECT_NE(lines[0]["contract"], lines[1]["contract"]);
  for (const auto& j : lines) {
    EXPECT_GT(j["copy_bandwidth_bytes_per_s"].get<double>(), 0.0);
    for (const auto& [name, b] : j["backends"].items()) {
      EXPECT_GE(b["decode_steps"].get<int64_t>(), 1) << name;
      EXPECT_LT(b["decode_steps"].get<int64_t>(), b["rollout_steps"].get<int64_t>()) << name;
      EXPECT_GT(b["decode_step_ms"].get<double>(), 0.0) << name;
      EXPECT_GT(b["decode_step_floor_ms"].get<double>(), 0.0) << name;
    }
    EXPECT_EQ(j["backends"]["invariant"]["logp_mismatches"], 0);
  }
  std::ifstream f(csv);
  std::string header, row;
  ASSERT_TRUE(std::getline(f, header));
  EXPECT_EQ(header, "config,backend,step,tokens,seqs,keys,decode,seconds,floor_seconds");
  int64_t rows = 0, decode_rows = 0, steps = 0, decode_steps = 0;
  while (std::getline(f, row)) {
    ++rows;
    std::vector<std::string> field;
    std::istringstream fields(row);
    for (std::string v; std::getline(fields, v, ',');) field.push_back(v);
    ASSERT_EQ(field.size(), 9u) << row;
    decode_rows += field[6] == "1";
  }
  for (const auto& j : lines)
    for (const auto& [name, b] : j["backends"].items()) {
      steps += b["rollout_steps"].get<int64_t>();
      decode_steps += b["decode_steps"].get<int64_t>();
    }
  EXPECT_EQ(rows, steps);  // one row per engine step of each configuration and backend
  EXPECT_EQ(decode_rows, decode_steps);

  const Result one = lockstep(small + " --segments 2");
  ASSERT_EQ(one.rc, 0) << one.out;
  EXPECT_EQ(std::count(one.out.begin(), one.out.end(), '\n'), 1) << one.out;
  EXPECT_NE(one.out.find("\"config\":\"flags\""), std::string::npos) << one.out;
  EXPECT_RUN(lockstep(small + " --steps-csv /nonexistent/dir/steps.csv"), 2, "--steps-csv");
}

TEST(CliBinary, TopLevel) {
  EXPECT_RUN(lockstep(""), 2, "Usage: lockstep");
  EXPECT_RUN(lockstep("frobnicate"), 2, "unknown command 'frobnicate'");
  EXPECT_RUN(lockstep("--frobnicate"), 2, "--frobnicate");
  EXPECT_RUN(lockstep("--help"), 0, "Usage: lockstep");
  EXPECT_RUN(lockstep("--help"), 0, "Exit status of every command");
}

TEST(CliBinary, EverySubcommandHasHelpAndRejectsUnknownFlags) {
  for (const char* cmd : {"audit", "bench-engine", "score", "selfcheck", "contract", "plan", "grpo",
                          "launch", "dist-selftest"}) {
    EXPECT_RUN(lockstep(std::string(cmd) + " --help"), 0, std::string("Usage: lockstep ") + cmd);
    // launch checks its required flags first: give them.
    const std::string rest = std::string(cmd) == "launch" ? " --nproc 1 -- true" : "";
    EXPECT_RUN(lockstep(std::string(cmd) + " --frob" + rest), 2, "--frob");
  }
  EXPECT_RUN(lockstep("selfcheck extra"), 2, "extra");
  EXPECT_RUN(run(LOCKSTEP_SCORE_CLI, "--help"), 0, "Usage: lockstep-score");
}

TEST(CliBinary, OneDefaultContract) {
  const std::string line = default_contract().to_string();
  EXPECT_RUN(lockstep("contract"), 0, line);
  EXPECT_RUN(lockstep("contract --segments 8"), 0, "gemm_segments=8");
  EXPECT_RUN(lockstep("contract --vocab-tile 100"), 2, "vocab_tile");
  EXPECT_RUN(lockstep("audit --help"), 0, "--segments N:1|2|4|8=4");
  EXPECT_RUN(lockstep("score --help"), 0, "--kv-chunk N:64..2^24=64");
}

TEST(CliBinary, ScoreBadValuesExit2NamingTheFlag) {
  EXPECT_RUN(lockstep("score"), 2, "--model");
  EXPECT_RUN(lockstep("score --tokens x"), 2, "--model DIR and --tokens FILE are required");
  EXPECT_RUN(lockstep(score_args("--tp abc")), 2, "--tp");
  EXPECT_RUN(lockstep(score_args("--tp 3")), 2, "--tp");
  EXPECT_RUN(lockstep(score_args("--threads abc")), 2, "--threads");
  EXPECT_RUN(lockstep(score_args("--threads 99999999999999999999")), 2, "--threads");
  EXPECT_RUN(lockstep(score_args("--threads 100000")), 2, "--threads");
  EXPECT_RUN(lockstep(score_args("--threads 0")), 2, "--threads");
  EXPECT_RUN(lockstep(score_args("--temperature 1.5x")), 2, "got '1.5x'");
  EXPECT_RUN(lockstep(score_args("--temperature nan")), 2, "--temperature");
  EXPECT_RUN(lockstep(score_args("--temperature 0")), 2, "--temperature");
  EXPECT_RUN(lockstep(score_args("--temperature 1e40")), 2, "--temperature");
  EXPECT_RUN(lockstep(score_args("--gemm-segments x")), 2, "--gemm-segments");
  EXPECT_RUN(lockstep(score_args("--vocab-segments x")), 2, "--vocab-segments");
  EXPECT_RUN(lockstep(score_args("--vocab-segments 99999999999")), 2, "--vocab-segments");
  EXPECT_RUN(lockstep(score_args("--bogus 1")), 2, "--bogus");
  EXPECT_RUN(run(LOCKSTEP_SCORE_CLI, "--tp abc"), 2, "--tp");
  EXPECT_RUN(lockstep("score --model /nonexistent/m --tokens /nonexistent/t"), 2, "--tokens");
  EXPECT_RUN(lockstep("score --model /nonexistent/m --tokens /dev/zero"), 2,
             "not a readable regular file");
}

TEST(CliBinary, ScoreRunsAndReportsWriteErrors) {
  const TempDir out("score_out");
  const std::string path = (out.path / "scores.txt").string();
  EXPECT_RUN(lockstep(score_args("--threads 1 --out '" + path + "'")), 0, "tokens in");
  std::ifstream in(path);
  std::string first;
  std::getline(in, first);
  EXPECT_EQ(first.rfind("1 ", 0), 0u) << first;
  // The standalone binary computes the same bytes.
  const std::string path2 = (out.path / "scores2.txt").string();
  const std::string args = "--model '" + score_inputs().model + "' --tokens '" +
                           score_inputs().tokens + "' --threads 1 --out '" + path2 + "'";
  EXPECT_RUN(run(LOCKSTEP_SCORE_CLI, args), 0, "tokens in");
  std::ifstream a(path), b(path2);
  const std::string sa((std::istreambuf_iterator<char>(a)), {}),
      sb((std::istreambuf_iterator<char>(b)), {});
  EXPECT_FALSE(sa.empty());
  EXPECT_EQ(sa, sb);
  if (fs::exists("/dev/full")) {
    EXPECT_RUN(lockstep(score_args("--threads 1 --out /dev/full")), 2, "--out");
    EXPECT_RUN(lockstep(score_args("--threads 1 > /dev/full")), 2, "standard output");
  }
  EXPECT_RUN(lockstep(score_args("--out /nonexistent/dir/x")), 2, "--out");
}

// Loading refuses what is silently wrong, through the command line: exit 2 and the message names
// the problem; tensors the config does not use are a warning, an error with --strict.
TEST(CliBinary, ScoreRefusesBadCheckpoints) {
  const TempDir root("bad_ckpt");
  const std::string good = score_inputs().model, tokens = score_inputs().tokens;
  std::ifstream cin((fs::path(good) / "config.json").string());
  const std::string config((std::istreambuf_iterator<char>(cin)), {});
  const engine::Qwen3Config cfg =
      engine::load_qwen3_config((fs::path(good) / "config.json").string());
  // A checkpoint dir with config.json `cfg_text` and the built-in weights, edited by `edit`.
  auto make = [&](const std::string& name, const std::string& cfg_text,
                  const std::function<void(engine::Weights&)>& edit) {
    const fs::path d = root.path / name;
    fs::create_directories(d);
    std::ofstream(d / "config.json") << cfg_text;
    engine::Weights w = engine::random_qwen3_weights(cfg, engine::kDefaultModelSeed);
    edit(w);
    std::vector<engine::NamedTensor> nt;
    for (auto& [n, t] : w) nt.push_back({n, t.view()});
    engine::write_safetensors((d / "model.safetensors").string(), nt);
    return d.string();
  };
  auto score = [&](const std::string& dir, const std::string& extra = "") {
    return lockstep("score --threads 1 --model '" + dir + "' --tokens '" + tokens + "' " + extra +
                    " > /dev/null");
  };
  Tensor junk(DType::kBF16, {4});
  std::memset(junk.data(), 0, size_t(junk.nbytes()));
  const std::string extra = make("extra", config, [&](engine::Weights& w) {
    w.push_back({"junk.weight", junk});
  });
  EXPECT_RUN(score(extra), 0, "warning");
  EXPECT_RUN(score(extra), 0, "junk.weight");
  EXPECT_RUN(score(extra, "--strict"), 2, "junk.weight");
  const std::string nan = make("nan", config, [](engine::Weights& w) {
    for (auto& [n, t] : w)
      if (n == "model.norm.weight") t.ptr<uint16_t>()[3] = 0x7fc0;
  });
  EXPECT_RUN(score(nan), 2, "model.norm.weight");
  EXPECT_RUN(score(nan), 2, "NaN");
  std::string fewer = config;
  const size_t at = fewer.find("\"num_hidden_layers\": ");
  ASSERT_NE(at, std::string::npos) << config;
  fewer.replace(at, std::string("\"num_hidden_layers\": 4").size(), "\"num_hidden_layers\": 2");
  const std::string layers = make("layers", fewer, [](engine::Weights&) {});
  EXPECT_RUN(score(layers), 2, "num_hidden_layers = 2");
  const fs::path fifo = root.path / "fifo";
  fs::create_directories(fifo);
  fs::copy_file(fs::path(good) / "model.safetensors", fifo / "model.safetensors");
  ASSERT_EQ(mkfifo((fifo / "config.json").c_str(), 0600), 0);
  EXPECT_RUN(score(fifo.string()), 2, "FIFO");
  const fs::path loop = root.path / "loop";
  fs::create_directories(loop);
  fs::create_symlink(loop / "config.json", loop / "config.json");
  EXPECT_RUN(score(loop.string()), 2, "symlink loop");
}

TEST(CliBinary, PlanPrintsTheKernelPlan) {
  EXPECT_RUN(lockstep("plan --model-shape qwen3-8b"), 0, "down     N=4096 K=12288 S=4");
  EXPECT_RUN(lockstep("plan --model-shape qwen3-8b --segments 1 --rows 1 4096"), 0, "M=4096");
  EXPECT_RUN(lockstep("plan --model-shape qwen3-8b --tp 4"), 0, "a rank's fp32 partial");
  EXPECT_RUN(lockstep("plan --model-shape qwen3-8b --tp 3"), 2, "--tp");
  EXPECT_RUN(lockstep("plan --model-shape qwen3-8b --segments 2 --tp 4"), 2, "multiple");
  EXPECT_RUN(lockstep("plan --model-shape qwen3-8b --rows 0"), 2, "--rows");
  EXPECT_RUN(lockstep("plan --model /x --model-shape qwen3-8b"), 2, "exclude");
  EXPECT_RUN(lockstep("plan --model /nonexistent"), 2, "/nonexistent");
}

TEST(CliBinary, GrpoRunsPlotsCheckpointsAndResumes) {
  const TempDir d("grpo");
  const std::string tiny = "grpo --steps 2 --sft-steps 2 --prompts 2 --group 2 --threads 1 ";
  EXPECT_RUN(lockstep(tiny + "--metrics '" + d.str() + "/m.jsonl' --checkpoint-dir '" + d.str() +
                      "/ck' --checkpoint-every 1"),
             0, "PASS: 0 log-prob mismatches");
  EXPECT_TRUE(fs::exists(d.path / "ck" / "step-1" / "optimizer.safetensors"));
  EXPECT_TRUE(fs::exists(d.path / "ck" / "step-2" / "model.safetensors"));
  EXPECT_RUN(lockstep(tiny + "--json --plot '" + d.str() + "/p.svg' --plot-with '" + d.str() +
                      "/m.jsonl'"),
             0, "\"logp_mismatches\": 0");
  std::ifstream svg(d.path / "p.svg");
  const std::string text((std::istreambuf_iterator<char>(svg)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("<svg"), std::string::npos);
  EXPECT_NE(text.find("<polyline"), std::string::npos);
  // A .png plot: the same chart rasterized (rsvg-convert: scripts/setup.sh installs it).
  EXPECT_RUN(
      lockstep(tiny + "--plot '" + d.str() + "/p.png' --plot-with '" + d.str() + "/m.jsonl'"), 0,
      "p.png");
  std::ifstream png(d.path / "p.png", std::ios::binary);
  char sig[8] = {};
  png.read(sig, 8);
  EXPECT_EQ(std::string(sig, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  EXPECT_FALSE(fs::exists(d.path / "p.png.tmp.svg"));
  // Resume from step 1: the last step's weights equal the uninterrupted run's.
  const Result a = lockstep(tiny + "--json");
  const Result b = lockstep(tiny + "--json --resume '" + d.str() + "/ck/step-1'");
  ASSERT_EQ(a.rc, 0) << a.out;
  ASSERT_EQ(b.rc, 0) << b.out;
  auto last_sha = [](const std::string& out) {
    const size_t at = out.rfind("\"weights_sha256\": \"");
    return at == std::string::npos ? std::string() : out.substr(at + 19, 64);
  };
  EXPECT_FALSE(last_sha(a.out).empty());
  EXPECT_EQ(last_sha(a.out), last_sha(b.out));
  EXPECT_RUN(lockstep("grpo --steps -1"), 2, "--steps");
  EXPECT_RUN(
      lockstep(tiny + "--plot '" + d.str() + "/q.svg' --plot-with '" + d.str() + "/absent.jsonl'"),
      2, "cannot read --plot-with");
  EXPECT_RUN(lockstep("grpo --task nope --steps 1 --sft-steps 0"), 2, "nope");
  // No GPU here (CI, the build machine): a clear error, never a silent CPU run.
  EXPECT_RUN(lockstep("grpo --device cuda --steps 1 --sft-steps 0"), 2, "--device cuda");
  EXPECT_RUN(lockstep("grpo --device tpu --steps 1"), 2, "--device");
  EXPECT_RUN(lockstep("grpo --reward-command 'cat >/dev/null; echo x' --steps 1 --sft-steps 0 "
                      "--prompts 1 --group 2"),
             2, "not a number");
}

TEST(CliBinary, SelfcheckPassesWithTheDefaultContract) {
  EXPECT_RUN(lockstep("selfcheck --json"), 0, default_contract().to_string());
  EXPECT_RUN(lockstep("selfcheck --json --segments 2 --kv-chunk 128"), 0, "\"mismatches\": 0");
}

// The built-in model goes to --model-cache, else $XDG_CACHE_HOME/lockstep, else
// ~/.cache/lockstep; never into the current directory.
TEST(CliBinary, BuiltInModelGoesToTheCache) {
  const TempDir cwd("cwd"), cache("cache"), xdg("xdg"), home("home");
  const std::string tiny = "audit --prompts 1 --group 2 --max-new-tokens 2 --threads 1 --quiet ";
  EXPECT_RUN(lockstep(tiny + "--json --model-cache '" + cache.str() + "'", "", cwd.str()), 0,
             "\"passed\":true");
  EXPECT_TRUE(fs::exists(cache.path / (std::string("default-v") + engine::kDefaultModelVersion) /
                         "model.safetensors"));
  EXPECT_RUN(lockstep(tiny, "XDG_CACHE_HOME='" + xdg.str() + "'", cwd.str()), 0, "PASS");
  EXPECT_TRUE(fs::exists(xdg.path / "lockstep"));
  EXPECT_RUN(lockstep(tiny, "XDG_CACHE_HOME= HOME='" + home.str() + "'", cwd.str()), 0, "PASS");
  EXPECT_TRUE(fs::exists(home.path / ".cache" / "lockstep"));
  EXPECT_TRUE(fs::is_empty(cwd.path));
  EXPECT_RUN(lockstep(tiny, "env -u XDG_CACHE_HOME -u HOME", cwd.str()), 2, "--model-cache");
  EXPECT_RUN(lockstep(tiny + "--model-cache '" + cache.str() + "' > /dev/full"), 2,
             "standard output");
  EXPECT_RUN(lockstep(tiny + "--temperature 1.5x"), 2, "got '1.5x'");
}

// ----- lockstep launch (and its rank, lockstep dist-selftest) -----

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The job id a rank printed as "[rank R] id=<id>".
std::string job_id_in(const std::string& out, int rank) {
  const std::string key = "[rank " + std::to_string(rank) + "] id=";
  const size_t at = out.find(key);
  if (at == std::string::npos) return "";
  const size_t begin = at + key.size();
  return out.substr(begin, out.find('\n', begin) - begin);
}

TEST(Launch, EveryRankGetsItsVariablesAndItsLinesLabelled) {
  const Result r = lockstep(
      "launch --nproc 3 -- sh -c 'echo \"$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE\"; "
      "echo id=$LOCKSTEP_JOB_ID; echo to-stderr >&2; printf no-newline'");
  ASSERT_EQ(r.rc, 0) << r.out;
  const std::string job = job_id_in(r.out, 0);
  EXPECT_FALSE(job.empty()) << r.out;
  for (int rank = 0; rank < 3; ++rank) {
    const std::string label = "[rank " + std::to_string(rank) + "] ", rs = std::to_string(rank);
    EXPECT_NE(r.out.find(label + rs + " 3 " + rs + " 3\n"), std::string::npos) << r.out;
    EXPECT_EQ(job_id_in(r.out, rank), job) << r.out;
    EXPECT_NE(r.out.find(label + "to-stderr\n"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(label + "no-newline\n"), std::string::npos) << r.out;
  }
  // Each launch is its own job; what follows "--" is the command's, flags included.
  const Result again = lockstep("launch --nproc 1 -- sh -c 'echo id=$LOCKSTEP_JOB_ID $0' --nproc");
  ASSERT_EQ(again.rc, 0) << again.out;
  EXPECT_NE(job_id_in(again.out, 0), job) << again.out;
  EXPECT_NE(again.out.find(" --nproc\n"), std::string::npos) << again.out;
  EXPECT_RUN(lockstep("launch --nproc 2 -- true"), 0, "");
}

TEST(Launch, DistSelftestPassesOnEveryRank) {
  const Result r = lockstep("launch --nproc 3 --timeout 300 -- '" + std::string(LOCKSTEP_CLI) +
                            "' dist-selftest --slot-bytes 256");
  ASSERT_EQ(r.rc, 0) << r.out;
  for (int rank = 0; rank < 3; ++rank) {
    const std::string rs = std::to_string(rank);
    EXPECT_NE(r.out.find("[rank " + rs + "] dist-selftest: rank " + rs + " of 3 (pid "),
              std::string::npos)
        << r.out;
  }
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 3) << r.out;
  // One rank alone, from the environment.
  EXPECT_RUN(lockstep("dist-selftest",
                      "RANK=0 WORLD_SIZE=1 LOCKSTEP_JOB_ID=test-cli-" + std::to_string(getpid())),
             0, "rank 0 of 1 (pid ");
}

TEST(Launch, FailingRankStopsTheOthersAndNamesItself) {
  // Rank 1 fails once rank 0's dist-selftest has made the job's segment and waits in its join for
  // rank 1 (60 s): the launcher must stop rank 0, and unlink the segment rank 0 leaves.
  const auto t0 = std::chrono::steady_clock::now();
  Result r = lockstep(
      "launch --nproc 2 -- sh -c 'echo id=$LOCKSTEP_JOB_ID; if [ $RANK = 0 ]; then exec \"$0\" "
      "dist-selftest; fi; for i in $(seq 1000); do [ -e /dev/shm/lockstep.$LOCKSTEP_JOB_ID ] && "
      "break; sleep 0.01; done; echo failing >&2; exit 3' '" +
      std::string(LOCKSTEP_CLI) + "'");
  EXPECT_LT(seconds_since(t0), 30.0);
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("[rank 1] failing\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("lockstep launch: failed: rank 1 (pid "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(") exited with status 3 (the first rank to fail); stopped ranks [0]"),
            std::string::npos)
      << r.out;
  const std::string job = job_id_in(r.out, 0);
  ASSERT_FALSE(job.empty()) << r.out;
  EXPECT_FALSE(fs::exists("/dev/shm/lockstep." + job)) << "the job's segment is left";

  EXPECT_RUN(lockstep("launch --nproc 3 -- sh -c 'if [ $RANK = 1 ]; then exit 3; fi; "
                      "exec sleep 60'"),
             1, ") exited with status 3 (the first rank to fail); stopped ranks [0, 2]");
  EXPECT_RUN(lockstep("launch --nproc 2 -- sh -c 'if [ $RANK = 0 ]; then kill -9 $$; fi; "
                      "exec sleep 60'"),
             1, ") was killed by signal 9 (Killed) (the first rank to fail); stopped ranks [1]");
  EXPECT_RUN(lockstep("launch --nproc 2 --timeout 1 -- sleep 60"), 1,
             "lockstep launch: failed: the job ran past --timeout 1 s; stopped ranks [0, 1]");
  EXPECT_LT(seconds_since(t0), 60.0);  // none of them waited for its sleep
}

// ----- rank-local models under lockstep launch (--rollout-ranks / --train-ranks launch) -----

// The lines of rank `rank` in a launch's output, without their label.
std::vector<std::string> rank_lines(const std::string& out, int rank) {
  const std::string label = "[rank " + std::to_string(rank) + "] ";
  std::vector<std::string> lines;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);)
    if (line.rfind(label, 0) == 0) lines.push_back(line.substr(label.size()));
  return lines;
}

// The audit's JSON object: the one line of `out` (a plain run's, or rank 0's of a launch) that
// starts with '{'.
nlohmann::json audit_json(const std::string& out, bool launched) {
  const std::vector<std::string> lines = launched ? rank_lines(out, 0) : [&] {
    std::vector<std::string> all;
    std::istringstream in(out);
    for (std::string line; std::getline(in, line);) all.push_back(line);
    return all;
  }();
  for (const std::string& line : lines)
    if (!line.empty() && line[0] == '{') return nlohmann::json::parse(line);
  ADD_FAILURE() << "no JSON object in:\n" << out;
  return nlohmann::json::object();
}

// What must be equal whatever the rank mode: each column's comparison and its records' digests
// (sha256 of every record's tokens and fp32 log-prob, logsumexp and entropy bit patterns).
void expect_same_audit(const nlohmann::json& a, const nlohmann::json& b) {
  for (const char* key : {"tokens_compared", "mismatches", "entropy_mismatches", "sequences",
                          "generated_tokens", "rollout_sha256", "train_sha256", "passed"})
    EXPECT_EQ(a[key], b[key]) << key;
  EXPECT_EQ(a["rollout_sha256"].get<std::string>().size(), 64u);
  ASSERT_TRUE(a.contains("baseline") && b.contains("baseline"));
  for (const char* key : {"tokens_compared", "mismatches", "rollout_sha256", "train_sha256"})
    EXPECT_EQ(a["baseline"][key], b["baseline"][key]) << "baseline " << key;
}

// `lockstep launch --nproc 2 -- lockstep audit --*-ranks launch`: one rank-local model per
// process over the process transport gives the simulated TP's and the threads' bits (invariant
// and baseline columns), for the rollout side, the training side and both; rank 0 alone prints
// (progress lines included), and the report says how the ranks ran.
TEST(Launch, AuditRanksAsProcessesGiveTheSimulatedAndThreadsBits) {
  const std::string audit =
      "audit --prompts 2 --group 2 --max-new-tokens 6 --prompt-len 8:40 "
      "--threads 1 --json --model '" +
      score_inputs().model + "' ";
  const std::string launch =
      "launch --nproc 2 --timeout 120 -- '" + std::string(LOCKSTEP_CLI) + "' " + audit;
  struct Case {
    std::string tp, simulated, threads, launched;
  };
  for (const Case& c :
       {Case{"--rollout-tp 2 ", "", "--rollout-ranks threads", "--rollout-ranks launch"},
        Case{"--train-tp 2 ", "", "--train-ranks threads", "--train-ranks launch"},
        Case{"--rollout-tp 2 --train-tp 2 ", "", "--rollout-ranks threads --train-ranks threads",
             "--rollout-ranks launch --train-ranks launch"}}) {
    SCOPED_TRACE(c.tp + c.launched);
    const Result sim = lockstep(audit + "--quiet " + c.tp + c.simulated);
    const Result thr = lockstep(audit + "--quiet " + c.tp + c.threads);
    const Result lau = lockstep(launch + c.tp + c.launched);
    ASSERT_EQ(sim.rc, 0) << sim.out;
    ASSERT_EQ(thr.rc, 0) << thr.out;
    ASSERT_EQ(lau.rc, 0) << lau.out;
    const nlohmann::json js = audit_json(sim.out, false), jl = audit_json(lau.out, true);
    expect_same_audit(js, audit_json(thr.out, false));
    expect_same_audit(js, jl);
    EXPECT_GT(js["tokens_compared"].get<int64_t>(), 0);
    EXPECT_EQ(js["mismatches"], 0);
    EXPECT_TRUE(rank_lines(lau.out, 1).empty()) << "rank 1 printed:\n" << lau.out;
    EXPECT_NE(lau.out.find("[rank 0] [invariant] rollout: step"), std::string::npos) << lau.out;
    const bool rollout = c.launched.find("--rollout-ranks") != std::string::npos;
    const bool train = c.launched.find("--train-ranks") != std::string::npos;
    EXPECT_EQ(jl["rollout"]["ranks"], rollout ? "launch" : "simulated");
    EXPECT_EQ(jl["training"]["ranks"], train ? "launch" : "simulated");
    EXPECT_NE(jl["devices"].get<std::string>().find("2 processes (lockstep launch)"),
              std::string::npos);
  }
}

// A rank's job comes from `lockstep launch`: a wrong WORLD_SIZE and a missing environment are
// clear errors naming the flags, the numbers and the command to run; a rank that fails ends the
// whole job at once; a mismatch or an error makes every rank's exit status non-zero.
TEST(Launch, AuditRanksNeedTheirJobAndEveryRankFails) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string cli = "'" + std::string(LOCKSTEP_CLI) + "'";
  const std::string audit =
      "audit --prompts 2 --group 2 --max-new-tokens 6 --prompt-len 8:40 "
      "--threads 1 --quiet --model '" +
      score_inputs().model + "' ";
  const Result wrong = lockstep("launch --nproc 3 -- " + cli + " " + audit +
                                "--rollout-tp 2 --rollout-ranks launch");
  // Every rank fails alike; the launcher may stop the others before they print.
  EXPECT_EQ(wrong.rc, 1) << wrong.out;
  EXPECT_NE(wrong.out.find("] lockstep audit: error: --rollout-ranks launch: the job has "
                           "WORLD_SIZE=3 ranks but --rollout-tp is 2: run it under `lockstep "
                           "launch --nproc 2` (one process per TP rank, --rollout-tp 2)"),
            std::string::npos)
      << wrong.out;
  const std::string no_job =
      "env -u RANK -u WORLD_SIZE -u LOCAL_RANK -u LOCAL_WORLD_SIZE -u "
      "LOCKSTEP_JOB_ID -u MASTER_ADDR -u MASTER_PORT";
  for (const char* flags : {"--rollout-ranks launch", "--train-tp 4 --train-ranks launch"}) {
    const Result r = lockstep(audit + flags, no_job);
    EXPECT_EQ(r.rc, 2) << r.out;
    EXPECT_NE(r.out.find("lockstep audit: error: " +
                         std::string(flags).substr(std::string(flags).rfind("--")) +
                         ": this process is one rank of a job: run it under `lockstep launch "
                         "--nproc "),
              std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find("WORLD_SIZE is not set"), std::string::npos) << r.out;
  }
  EXPECT_RUN(lockstep("grpo --steps 1 --sft-steps 0 --train-tp 2 --train-ranks launch", no_job), 2,
             "lockstep grpo: error: --train-ranks launch: this process is one rank of a job: run "
             "it under `lockstep launch --nproc 2` (one process per TP rank, --train-tp 2)");

  // Rank 1 fails after joining (its model does not exist): the job ends, naming it.
  const Result failed = lockstep(
      "launch --nproc 2 -- sh -c 'if [ $RANK = 1 ]; then set -- --model /nonexistent/model; fi; "
      "exec \"$0\" audit --prompts 2 --group 2 --max-new-tokens 6 --threads 1 --quiet "
      "--rollout-ranks launch \"$@\"' " +
      cli);
  EXPECT_EQ(failed.rc, 1) << failed.out;
  EXPECT_NE(failed.out.find("[rank 1] lockstep audit: error: checkpoint /nonexistent/model"),
            std::string::npos)
      << failed.out;
  // Which rank the launcher sees exit first is a race: rank 1 with its error, or rank 0, whose
  // pending all_gather fails at once naming rank 1's error (CI saw rank 0 first).
  const bool rank1_first =
      failed.out.find("lockstep launch: failed: rank 1 (pid ") != std::string::npos;
  const bool rank0_first =
      failed.out.find("lockstep launch: failed: rank 0 (pid ") != std::string::npos &&
      failed.out.find("[rank 0] lockstep audit: error: ") != std::string::npos &&
      failed.out.find("rank 0: rank 1 failed: checkpoint /nonexistent/model") != std::string::npos;
  EXPECT_TRUE(rank1_first || rank0_first) << failed.out;

  // Every rank's own exit status: 1 on a mismatch (the baseline kernels at train TP 2 differ from
  // the rollout's), 2 when rank 0 cannot write its report (the final barrier fails rank 1 too).
  const std::string each = "launch --nproc 2 -- sh -c '\"$0\" " + audit +
                           "--train-tp 2 --train-ranks launch --baseline %s; echo \"exit status "
                           "$?\"' " +
                           cli;
  auto with = [&](const std::string& extra) {
    std::string cmd = each;
    cmd.replace(cmd.find("%s"), 2, extra);
    return lockstep(cmd);
  };
  const Result mismatch = with("--json > /dev/null");
  ASSERT_EQ(mismatch.rc, 0) << mismatch.out;
  EXPECT_EQ(rank_lines(mismatch.out, 0), std::vector<std::string>{"exit status 1"}) << mismatch.out;
  EXPECT_EQ(rank_lines(mismatch.out, 1), std::vector<std::string>{"exit status 1"}) << mismatch.out;
  const Result full = with("> /dev/full");
  ASSERT_EQ(full.rc, 0) << full.out;
  EXPECT_NE(full.out.find("[rank 0] lockstep audit: error: writing standard output"),
            std::string::npos)
      << full.out;
  EXPECT_NE(full.out.find("[rank 1] lockstep audit: error: barrier: rank 1: rank 0 failed: "
                          "writing standard output"),
            std::string::npos)
      << full.out;
  EXPECT_NE(full.out.find("[rank 0] exit status 2"), std::string::npos) << full.out;
  EXPECT_NE(full.out.find("[rank 1] exit status 2"), std::string::npos) << full.out;
  EXPECT_LT(seconds_since(t0), 60.0);
}

// `lockstep grpo --train-ranks launch`: the training side as one rank-local rank per process;
// every step's weights equal the simulated run's; the reward command runs once per step (rank 0
// scores and broadcasts); rank 1 prints nothing.
TEST(Launch, GrpoTrainRanksAsProcessesGiveTheSimulatedWeights) {
  const TempDir d("grpo_launch");
  const std::string calls = (d.path / "calls").string();
  const std::string grpo =
      "grpo --steps 2 --sft-steps 1 --prompts 2 --group 2 --threads 1 --train-tp 2 --lr 0.01 "
      "--json --reward-command \"echo run >> '" +
      calls + "'; awk '{print NR % 2}'\" ";
  auto shas = [](const std::vector<std::string>& lines) {
    std::vector<std::string> out;
    for (const std::string& line : lines)
      if (line.rfind("{\"step\": ", 0) == 0)
        out.push_back(nlohmann::json::parse(line)["weights_sha256"].get<std::string>());
    return out;
  };
  auto lines_of = [](const std::string& text) {
    std::vector<std::string> lines;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
  };
  const Result sim = lockstep(grpo);
  ASSERT_EQ(sim.rc, 0) << sim.out;
  const std::vector<std::string> want = shas(lines_of(sim.out));
  ASSERT_EQ(want.size(), 2u) << sim.out;
  EXPECT_NE(want[0], want[1]) << "the rewards did not change the weights";
  fs::remove(calls);
  const Result lau = lockstep("launch --nproc 2 --timeout 120 -- '" + std::string(LOCKSTEP_CLI) +
                              "' " + grpo + "--train-ranks launch");
  ASSERT_EQ(lau.rc, 0) << lau.out;
  EXPECT_EQ(shas(rank_lines(lau.out, 0)), want) << lau.out;
  EXPECT_TRUE(rank_lines(lau.out, 1).empty()) << lau.out;
  std::ifstream in(calls);
  const std::string ran((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(ran, "run\nrun\n") << "the reward command ran other than once per step";
}

TEST(Launch, BadUsageIsAClearError) {
  EXPECT_RUN(lockstep("launch"), 2, "--nproc is required");
  EXPECT_RUN(lockstep("launch --nproc 0 -- true"), 2,
             "--nproc: expects an integer in [1, 1024], got '0'");
  EXPECT_RUN(lockstep("launch --nproc 1025 -- true"), 2, "--nproc");
  EXPECT_RUN(lockstep("launch --nproc two -- true"), 2, "got 'two'");
  EXPECT_RUN(lockstep("launch --nproc 2"), 2, "command is required");
  EXPECT_RUN(lockstep("launch --nproc 2 --"), 2, "command is required");
  EXPECT_RUN(lockstep("launch --nproc 2 true"), 2, "put the command after '--'");
  EXPECT_RUN(lockstep("launch --nproc 2 --timeout 0 -- true"), 2, "--timeout");
  EXPECT_RUN(lockstep("launch --nproc 2 --timeout nan -- true"), 2, "--timeout");
  EXPECT_RUN(lockstep("launch --nproc 2 -- /nonexistent/command"), 2,
             "lockstep launch: error: cannot run '/nonexistent/command': No such file or "
             "directory");
  EXPECT_RUN(lockstep("dist-selftest", "env -u WORLD_SIZE"), 2, "WORLD_SIZE is not set");
  EXPECT_RUN(lockstep("dist-selftest", "RANK=0 WORLD_SIZE=1 LOCKSTEP_JOB_ID= MASTER_ADDR="), 2,
             "LOCKSTEP_JOB_ID: expected 1..200 characters");
  EXPECT_RUN(lockstep("dist-selftest", "RANK=1 WORLD_SIZE=1"), 2,
             "RANK: expected in [0, 1) (WORLD_SIZE=1), got 1");
  EXPECT_RUN(lockstep("dist-selftest --slot-bytes 63"), 2, "--slot-bytes");
}

}  // namespace
}  // namespace lockstep::tools
