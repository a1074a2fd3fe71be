// What every `lockstep` subcommand (and `lockstep-score`) shares on the command line: the exit
// codes, the one default contract, the option groups several subcommands take (contract, model,
// threads), strict typed validators, and the top-level handler that parses, runs and turns every
// exception into a message and an exit code. Parsing is CLI11 (header-only, <CLI/CLI.hpp>).
//
// Adding a subcommand `lockstep plan`: write tools/plan_cmd.{h,cc} with
//   Command add_plan_command(CLI::App& top);
// which calls top.add_subcommand("plan", "one line"), binds its options to state it owns (a
// std::shared_ptr captured by the returned run function), reusing add_contract_options /
// add_model_options / add_threads_option below (tools/engine_setup.h: model_config_of gives the
// model's config without its weights), and returns {sub, run}; then add one line to
// tools/lockstep_main.cc. The run function returns an ExitCode and may throw lockstep::Error for
// bad input (reported as exit 2 by run_cli).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "engine/ranks.h"
#include "engine/safetensors.h"
#include "lockstep/contract.h"

namespace lockstep::tools {

// Exit codes of every `lockstep` subcommand and of lockstep-score.
enum ExitCode : int {
  kExitOk = 0,           // the command ran and every check passed
  kExitCheckFailed = 1,  // it ran and a check failed (audit: log-probs differ; selfcheck: mismatch)
  kExitUsage = 2,        // bad usage or bad input, or any error that kept it from producing its
                         // result (unknown flag or command, bad value, unreadable or unwritable
                         // file, invalid model, device absent, out of memory)
};

// The contract every subcommand starts from (engine::audit_default_contract: segments 4 for GEMM
// and vocab, kv_chunk 64, vocab_tile 256); the contract flags override it.
ContractConfig default_contract();

// Contract flags, group "contract": --segments N (GEMM and vocab), --gemm-segments N,
// --vocab-segments N (1, 2, 4, 8), --kv-chunk N, --vocab-tile N. Starts from `c` as it is.
void add_contract_options(CLI::App& app, ContractConfig& c);

// --threads N (1..1024; 0 = not given: all cores).
void add_threads_option(CLI::App& app, int& threads);

// Where the model comes from (audit, bench-engine; later plan).
struct ModelFlags {
  std::string dir;                // --model DIR: a checkpoint (config.json + safetensors)
  std::string shape = "default";  // --model-shape: "default" = the built-in model's files;
                                  // "qwen3-0.6b", "qwen3-8b" = random weights in memory
  uint64_t weight_seed = 0;       // --weight-seed (random shapes; 0 = the built-in model's seed)
  std::string cache_dir;          // --model-cache DIR; empty = engine::model_cache_root()
  bool strict = false;            // --strict: a checkpoint warning (unused tensor, ...) is an error
};
// Group "model": --model, --model-shape, --weight-seed, --model-cache, --strict. --model and
// --model-shape exclude each other.
void add_model_options(CLI::App& app, ModelFlags& m);

// Strict validators (decimal digits only, no trailing characters, no overflow, in range). They
// rewrite the text to its canonical form, so add them with Option::transform (check() copies the
// text: CLI11's own conversion would then read "010" as octal).
CLI::Validator int_in(int64_t lo, int64_t hi);
CLI::Validator int_one_of(std::initializer_list<int64_t> values);
CLI::Validator uint64_any();  // any decimal 0 .. 2^64-1
// A finite fp32 value in [lo, hi] (lo excluded when lo_open), read by strtof as the hand-written
// parsers before CLI11 did; the text is rewritten to 9 digits so that CLI11's own conversion
// (strtold, then a cast) gives exactly that float.
CLI::Validator float_in(float lo, float hi, bool lo_open = false);
// on | off into a bool.
CLI::Option* add_on_off(CLI::App& app, const std::string& name, bool& target,
                        const std::string& description);

// --rollout-ranks / --train-ranks: simulated | threads | launch (how TP ranks run,
// engine/ranks.h), into `mode`.
CLI::Option* add_ranks(CLI::App& app, const std::string& name, engine::RankMode& mode,
                       const std::string& description, const std::string& group);

// Flushes stdout; throws lockstep::Error when a write to it failed (e.g. `> /dev/full`), so a
// lost result is never reported as success. Every command calls it after its output.
void flush_stdout();

// --strict (group `group`): checkpoint warnings (tensors the config does not use, a dtype other
// than the config's torch_dtype, ...) become errors.
void add_strict_option(CLI::App& app, bool& strict, const std::string& group);
// How the commands load a checkpoint: warnings to stderr ("lockstep: warning: ..."), --strict.
engine::LoadOptions checkpoint_load_options(bool strict);

// A subcommand: its CLI11 App and what runs it after a successful parse (returns an ExitCode).
struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;
};

// Parses argv with `app` and runs the parsed command: the Command whose app was parsed, or, for an
// app without subcommands (lockstep-score), commands = {{&app, run}}. --help prints the help on
// stdout (exit 0). No command, an unknown command, a parse error, and every exception of the run
// (lockstep::Error, bad_alloc, std::exception, anything else) print one message on stderr and
// give kExitUsage; no exception leaves this function.
int run_cli(CLI::App& app, const std::vector<Command>& commands, int argc, char** argv);

}  // namespace lockstep::tools
