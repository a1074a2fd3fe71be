// Backends by device and the model source shared by `lockstep audit` and `lockstep bench-engine`.
#include "tools/engine_setup.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <thread>

#include "core/thread_pool.h"
#include "lockstep/error.h"

#ifdef LOCKSTEP_WITH_CUDA
#include "engine/cuda/backends.h"
#include "lockstep/cuda/runtime.h"
#endif

namespace lockstep::tools {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string gib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f GiB", double(bytes) / double(int64_t(1) << 30));
  return buf;
}

}  // namespace

std::shared_ptr<engine::OpsBackend> make_device_backend(const std::string& device, bool baseline) {
  if (device == "cpu") {
    if (baseline) return engine::shared_baseline_backend();
    return std::shared_ptr<engine::OpsBackend>(engine::make_invariant_backend());
  }
  LS_CHECK(device == "cuda", "device", "unknown device '", device, "' (expected cpu or cuda)");
#ifdef LOCKSTEP_WITH_CUDA
  LS_CHECK(cuda::available(), "device",
           "--device cuda: no usable CUDA device on this machine (the build has CUDA support)");
  if (baseline) return std::shared_ptr<engine::OpsBackend>(engine::make_cuda_baseline_backend());
  return std::shared_ptr<engine::OpsBackend>(engine::make_cuda_invariant_backend());
#else
  throw Error(
      "device: --device cuda: this lockstep binary was built without CUDA (configure with "
      "-DLOCKSTEP_CUDA=ON where nvcc is installed); only --device cpu is available");
#endif
}

std::string device_description(const std::string& device) {
  if (device == "cpu") return "cpu (" + std::to_string(num_threads()) + " threads)";
#ifdef LOCKSTEP_WITH_CUDA
  if (device == "cuda") return "cuda: " + cuda::device_summary();
#endif
  return device;
}

dist::ProcessGroupSpec launched_job_spec(const std::string& ranks_flag, const std::string& tp_flag,
                                         int tp,
                                         const std::function<const char*(const char*)>& getenv) {
  const std::string how = detail::concat("run it under `lockstep launch --nproc ", tp,
                                         "` (one process per TP rank, ", tp_flag, " ", tp, ")");
  dist::ProcessGroupSpec spec;
  try {
    spec = dist::ProcessGroupSpec::from_env(getenv);
  } catch (const Error& e) {
    throw Error(
        detail::concat(ranks_flag, ": this process is one rank of a job: ", how, "; ", e.what()));
  }
  LS_CHECK(spec.world_size == tp, ranks_flag, "the job has WORLD_SIZE=", spec.world_size,
           " ranks but ", tp_flag, " is ", tp, ": ", how);
  return spec;
}

int run_as_launched_rank(const dist::ProcessGroupSpec& spec, int threads,
                         const std::function<int(dist::Communicator*)>& body) {
  set_num_threads(threads > 0 ? threads
                              : std::max(1, int(std::max(1u, std::thread::hardware_concurrency())) /
                                                spec.world_size));
  const std::unique_ptr<dist::ProcessCommunicator> job = dist::join_process_group(spec);
  try {
    return body(job.get());
  } catch (const std::exception& e) {
    job->fail(e.what());  // the other ranks stop waiting for this one
    throw;
  }
}

engine::Qwen3Config model_config_of(const ModelFlags& m) {
  if (!m.dir.empty())
    return engine::load_qwen3_config((std::filesystem::path(m.dir) / "config.json").string());
  return engine::qwen3_shape_config(m.shape);
}

ModelSource::ModelSource(const ModelFlags& m, const LogFn& log) : log_(log) {
  const std::string& shape = m.shape;
  if (!m.dir.empty() || shape == "default") {
    std::string dir = m.dir;
    if (dir.empty()) {
      dir =
          engine::default_model_dir(m.cache_dir.empty() ? engine::model_cache_root() : m.cache_dir);
      if (!std::filesystem::exists(std::filesystem::path(dir) / "model.safetensors"))
        log_("creating the built-in default model in " + dir);
      engine::ensure_default_model(dir);
      desc_ = "built-in default model (" + dir + ", shape default)";
    } else {
      desc_ = dir;
    }
    ckpt_ = std::make_unique<engine::Checkpoint>(
        engine::Checkpoint::load(dir, checkpoint_load_options(m.strict)));
    cfg_ = ckpt_->config();
    desc_ += ": " + cfg_.to_string();
    return;
  }
  cfg_ = engine::qwen3_shape_config(shape);
  const uint64_t seed = m.weight_seed == 0 ? engine::kDefaultModelSeed : m.weight_seed;
  const int64_t n = engine::qwen3_num_parameters(cfg_);
  char buf[256];
  std::snprintf(buf, sizeof(buf),
                "generating random %s weights: %.3g parameters (%s bf16), seed 0x%llx, %d threads",
                shape.c_str(), double(n), gib(2 * n).c_str(), (unsigned long long)seed,
                num_threads());
  log_(buf);
  const auto t0 = std::chrono::steady_clock::now();
  auto last = t0;
  weights_ = engine::random_qwen3_weights(cfg_, seed, [&](int64_t done, int64_t total) {
    const auto now = std::chrono::steady_clock::now();
    if (done < total && std::chrono::duration<double>(now - last).count() < 2.0) return;
    last = now;
    char b[128];
    std::snprintf(b, sizeof(b), "  weights: %.0f%% (%.1f s)", 100.0 * double(done) / double(total),
                  seconds_since(t0));
    log_(b);
  });
  for (auto& [name, t] : weights_) views_[name] = t.view();
  std::snprintf(buf, sizeof(buf), "random %s weights (seed 0x%llx, shape %s)", shape.c_str(),
                (unsigned long long)seed, shape.c_str());
  desc_ = std::string(buf) + ": " + cfg_.to_string();
}

engine::ModelFactory ModelSource::factory(const ContractConfig& contract) {
  return [this, contract](int tp, std::shared_ptr<engine::OpsBackend> backend,
                          dist::Communicator* comm) -> std::unique_ptr<engine::Model> {
    if (comm) {  // a rank-local model: one per rank and job, not cached
      engine::ModelOptions mo;
      mo.contract = contract;
      mo.tp = tp;
      return ckpt_ ? std::make_unique<engine::Model>(cfg_, *ckpt_, mo, backend, comm)
                   : std::make_unique<engine::Model>(cfg_, views_, mo, backend, comm);
    }
    const std::tuple<int, int, std::string> key{tp, int(backend->device()), contract.to_string()};
    auto it = cache_.find(key);
    if (it == cache_.end()) {
      engine::ModelOptions mo;
      mo.contract = contract;
      mo.tp = tp;
      const auto t0 = std::chrono::steady_clock::now();
      std::unique_ptr<engine::Model> m =
          ckpt_ ? std::make_unique<engine::Model>(cfg_, *ckpt_, mo, backend)
                : std::make_unique<engine::Model>(cfg_, views_, mo, backend);
      if (backend->device() != Device::kCPU || !ckpt_) {
        char buf[160];
        std::snprintf(buf, sizeof(buf), "model tp=%d on %s: %s of weights placed in %.1f s", tp,
                      device_name(backend->device()), gib(m->weight_bytes()).c_str(),
                      seconds_since(t0));
        log_(buf);
      }
      it = cache_.emplace(key, std::move(m)).first;
    }
    return it->second->with_backend(std::move(backend));
  };
}

}  // namespace lockstep::tools
