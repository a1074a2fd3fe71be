// The command line's shared options, validators and top-level handler. See cli.h.
#include "tools/cli.h"

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <new>
#include <sstream>

#include "engine/audit_workload.h"
#include "engine/default_model.h"
#include "lockstep/error.h"

namespace lockstep::tools {

namespace {

// Decimal integer, whole string, no sign for unsigned, no overflow.
template <class T>
bool parse_decimal(const std::string& s, T& out) {
  if (s.empty()) return false;
  const char* end = s.data() + s.size();
  const auto r = std::from_chars(s.data(), end, out, 10);
  return r.ec == std::errc() && r.ptr == end;
}

std::string range_text(int64_t lo, int64_t hi) {
  return "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
}

// For --help: 1024 and up as powers of two where they are one ("2^30").
std::string short_int(int64_t v) {
  if (v >= 1024 && (v & (v - 1)) == 0) {
    int k = 0;
    while ((int64_t(1) << k) != v) ++k;
    return "2^" + std::to_string(k);
  }
  return std::to_string(v);
}

}  // namespace

ContractConfig default_contract() { return engine::audit_default_contract(); }

CLI::Validator int_in(int64_t lo, int64_t hi) {
  return CLI::Validator(
      [lo, hi](std::string& s) -> std::string {
        int64_t v = 0;
        if (!parse_decimal(s, v) || v < lo || v > hi)
          return "expects an integer in " + range_text(lo, hi) + ", got '" + s + "'";
        s = std::to_string(v);  // canonical: CLI11's own conversion reads "010" as octal
        return {};
      },
      short_int(lo) + ".." + short_int(hi));
}

CLI::Validator int_one_of(std::initializer_list<int64_t> values) {
  std::string list, bars;
  for (int64_t v : values) {
    list += (list.empty() ? "" : ", ") + std::to_string(v);
    bars += (bars.empty() ? "" : "|") + std::to_string(v);
  }
  std::vector<int64_t> vals(values);
  return CLI::Validator(
      [vals, list](std::string& s) -> std::string {
        int64_t v = 0;
        if (parse_decimal(s, v))
          for (int64_t x : vals)
            if (x == v) {
              s = std::to_string(v);
              return {};
            }
        return "expects one of " + list + ", got '" + s + "'";
      },
      bars);
}

CLI::Validator uint64_any() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        uint64_t v = 0;
        if (!parse_decimal(s, v))
          return "expects a non-negative integer below 2^64, got '" + s + "'";
        s = std::to_string(v);
        return {};
      },
      "");
}

CLI::Validator float_in(float lo, float hi, bool lo_open) {
  std::ostringstream desc;
  desc << (lo_open ? "in (" : "in [") << lo << ", " << hi << "]";
  return CLI::Validator(
      [lo, hi, lo_open, d = desc.str()](std::string& s) -> std::string {
        errno = 0;
        char* end = nullptr;
        const float v = s.empty() ? 0.0f : std::strtof(s.c_str(), &end);
        const bool ok = !s.empty() && end == s.c_str() + s.size() && errno != ERANGE &&
                        std::isfinite(v) && (lo_open ? v > lo : v >= lo) && v <= hi;
        if (!ok) return "expects a finite number " + d + ", got '" + s + "'";
        char buf[32];
        std::snprintf(buf, sizeof(buf), "%.9g", double(v));
        s = buf;
        return {};
      },
      "");
}

CLI::Option* add_on_off(CLI::App& app, const std::string& name, bool& target,
                        const std::string& description) {
  return app
      .add_option_function<std::string>(
          name, [&target](const std::string& v) { target = v == "on"; }, description)
      ->check(CLI::IsMember({"on", "off"}).description(""))
      ->type_name("on|off")
      ->default_str(target ? "on" : "off");
}

CLI::Option* add_ranks(CLI::App& app, const std::string& name, engine::RankMode& mode,
                       const std::string& description, const std::string& group) {
  using engine::RankMode;
  return app
      .add_option_function<std::string>(
          name,
          [&mode](const std::string& v) {
            mode = v == "threads"  ? RankMode::kThreads
                   : v == "launch" ? RankMode::kLaunch
                                   : RankMode::kSimulated;
          },
          description)
      ->check(CLI::IsMember({"simulated", "threads", "launch"}).description(""))
      ->type_name("simulated|threads|launch")
      ->default_str("simulated")
      ->group(group);
}

void add_contract_options(CLI::App& app, ContractConfig& c) {
  const std::string g = "contract (both sides; every setting that can change bits)";
  // NOTE: CLI11 runs option callbacks in the order they are defined, so --gemm-segments and
  // --vocab-segments override --segments whatever their order on the command line.
  app.add_option_function<int>(
         "--segments", [&c](int s) { c.gemm_segments = c.vocab_segments = s; },
         "row-parallel GEMM K and vocab segments (>= every TP degree)")
      ->transform(int_one_of({1, 2, 4, 8}))
      ->type_name("N")
      ->default_str(std::to_string(c.gemm_segments))
      ->group(g);
  app.add_option("--gemm-segments", c.gemm_segments,
                 "K segments of the row-parallel GEMMs (o_proj, down) only (overrides --segments)")
      ->transform(int_one_of({1, 2, 4, 8}))
      ->type_name("N")
      ->capture_default_str()
      ->group(g);
  app.add_option("--vocab-segments", c.vocab_segments,
                 "log-prob vocab segments only (overrides --segments)")
      ->transform(int_one_of({1, 2, 4, 8}))
      ->type_name("N")
      ->capture_default_str()
      ->group(g);
  app.add_option("--kv-chunk", c.kv_chunk, "attention KV chunk (keys; a multiple of 64)")
      ->transform(int_in(64, int64_t(1) << 24))
      ->type_name("N")
      ->capture_default_str()
      ->group(g);
  app.add_option("--vocab-tile", c.vocab_tile, "log-prob vocab tile (a multiple of 8)")
      ->transform(int_in(8, int64_t(1) << 24))
      ->type_name("N")
      ->capture_default_str()
      ->group(g);
}

void add_threads_option(CLI::App& app, int& threads) {
  app.add_option("--threads", threads,
                 "CPU threads (bits never depend on it) [all cores; a rank of a launched job: "
                 "cores / WORLD_SIZE]")
      ->transform(int_in(1, 1024))
      ->type_name("N")
      ->group("run");
}

void add_model_options(CLI::App& app, ModelFlags& m) {
  const std::string g = "model";
  app.add_option("--model", m.dir,
                 "Qwen3 checkpoint dir (config.json + safetensors) [the built-in model]")
      ->type_name("DIR")
      ->group(g);
  app.add_option("--model-shape", m.shape,
                 "default (the built-in model) or random bf16 weights of a shape, generated in "
                 "memory (excludes --model)")
      ->check(CLI::IsMember({"default", "qwen3-0.6b", "qwen3-8b"}).description(""))
      ->type_name("default|qwen3-0.6b|qwen3-8b")
      ->capture_default_str()
      ->group(g);
  app.add_option("--weight-seed", m.weight_seed,
                 "seed of the random weights (0 = the built-in model's)")
      ->transform(uint64_any())
      ->type_name("S")
      ->capture_default_str()
      ->group(g);
  app.add_option("--model-cache", m.cache_dir,
                 "where the built-in model is created and kept [$XDG_CACHE_HOME/lockstep, "
                 "else ~/.cache/lockstep]")
      ->type_name("DIR")
      ->group(g);
  add_strict_option(app, m.strict, g);
}

void add_strict_option(CLI::App& app, bool& strict, const std::string& group) {
  app.add_flag("--strict", strict,
               "refuse a checkpoint with warnings (tensors the config does not use, a dtype other "
               "than torch_dtype, ...) instead of printing them")
      ->group(group);
}

engine::LoadOptions checkpoint_load_options(bool strict) {
  engine::LoadOptions opt;
  opt.strict = strict;
  opt.warn = [](const std::string& w) {
    std::fprintf(stderr, "lockstep: warning: %s\n", w.c_str());
  };
  return opt;
}

void flush_stdout() {
  if (std::fflush(stdout) != 0 || std::ferror(stdout))
    throw Error(std::string("writing standard output: ") + std::strerror(errno));
}

namespace {

// "lockstep audit" for the parsed subcommand, "lockstep" (or the app's name) otherwise.
std::string program_of(const CLI::App& app) {
  std::string name = app.get_name();
  for (const CLI::App* sub : app.get_subcommands()) name += " " + sub->get_name();
  return name;
}

int report_parse_error(const CLI::App& app, const CLI::ParseError& e) {
  const std::string prog = program_of(app);
  std::fprintf(stderr, "%s: error: %s\n(see %s --help)\n", prog.c_str(), e.what(), prog.c_str());
  return kExitUsage;
}

}  // namespace

int run_cli(CLI::App& app, const std::vector<Command>& commands, int argc, char** argv) {
  const bool has_subcommands = !(commands.size() == 1 && commands[0].app == &app);
  try {
    if (has_subcommands) {
      // `lockstep` alone: the usage, and a failure (a script that forgot the command must not
      // pass). A flag before the command, or an unknown first word, is named as such (CLI11
      // would first complain that a subcommand is required).
      if (argc < 2) {
        std::fprintf(stderr, "%s", app.help().c_str());
        return kExitUsage;
      }
      const std::string first = argv[1];
      if (first != "-h" && first != "--help" && !first.empty() && first[0] == '-') {
        std::fprintf(stderr, "%s: error: unknown flag '%s' before the command (see %s --help)\n",
                     app.get_name().c_str(), first.c_str(), app.get_name().c_str());
        return kExitUsage;
      }
      if (first.empty() || first[0] != '-') {
        bool known = false;
        for (const Command& c : commands) known = known || c.app->get_name() == first;
        if (!known) {
          std::string names;
          for (const Command& c : commands)
            names += (names.empty() ? "" : ", ") + c.app->get_name();
          std::fprintf(stderr, "%s: error: unknown command '%s' (commands: %s; see %s --help)\n",
                       app.get_name().c_str(), first.c_str(), names.c_str(),
                       app.get_name().c_str());
          return kExitUsage;
        }
      }
    }
    try {
      app.parse(argc, argv);
    } catch (const CLI::CallForHelp&) {
      std::fputs(app.help().c_str(), stdout);
      return std::fflush(stdout) == 0 && !std::ferror(stdout) ? kExitOk : kExitUsage;
    } catch (const CLI::CallForAllHelp&) {
      std::fputs(app.help("", CLI::AppFormatMode::All).c_str(), stdout);
      return std::fflush(stdout) == 0 && !std::ferror(stdout) ? kExitOk : kExitUsage;
    } catch (const CLI::ParseError& e) {
      return report_parse_error(app, e);
    }
    const std::string prog = program_of(app);
    try {
      for (const Command& c : commands)
        if (c.app == &app || c.app->parsed()) return c.run();
      std::fprintf(stderr, "%s: error: no command given (see %s --help)\n", prog.c_str(),
                   prog.c_str());
      return kExitUsage;
    } catch (const Error& e) {
      std::fprintf(stderr, "%s: error: %s\n", prog.c_str(), e.what());
    } catch (const std::bad_alloc&) {
      std::fprintf(stderr, "%s: error: out of memory\n", prog.c_str());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: error: %s\n", prog.c_str(), e.what());
    }
    return kExitUsage;
  } catch (...) {
    // A run's exception of no std type, or one thrown while reporting.
    std::fprintf(stderr, "%s: error: unexpected exception\n", app.get_name().c_str());
    return kExitUsage;
  }
}

}  // namespace lockstep::tools
