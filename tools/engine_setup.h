// What `lockstep audit` and `lockstep bench-engine` share: the backends of a device ("cpu" or
// "cuda"; without CUDA in the build, "cuda" is a clear error), and the model source (a checkpoint
// directory, the built-in default model, or random weights of a named shape) as a ModelFactory
// that builds each (tp, device) model once and shares its weights between backends of the device.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>

#include "dist/process_transport.h"
#include "engine/audit.h"
#include "engine/backend.h"
#include "engine/config.h"
#include "engine/default_model.h"
#include "engine/model.h"
#include "engine/safetensors.h"
#include "tools/cli.h"

namespace lockstep::tools {

using LogFn = std::function<void(const std::string&)>;

// The invariant (baseline = false) or baseline backend of a device. Throws lockstep::Error when
// the device is unknown, not built in, or absent. Returns nullptr for a baseline that is not built.
std::shared_ptr<engine::OpsBackend> make_device_backend(const std::string& device, bool baseline);
// "cpu (16 threads)", "cuda: NVIDIA H200 (sm_90, 139 GiB), driver ...".
std::string device_description(const std::string& device);

// The model's configuration alone, without reading or generating weights (for commands that only
// plan, e.g. `lockstep plan`): m.dir's config.json, else the named shape's (qwen3_shape_config;
// "default" is the built-in model's).
engine::Qwen3Config model_config_of(const ModelFlags& m);

// For a side whose ranks are `launch` (`ranks_flag` "--rollout-ranks launch", `tp_flag`
// "--rollout-tp" = tp): this process's place in its job, from the variables `lockstep launch`
// sets (dist::ProcessGroupSpec::from_env; `getenv` as there, for tests). Throws lockstep::Error
// naming the flags when they are missing or malformed ("run it under `lockstep launch --nproc
// 2`") and when WORLD_SIZE differs from tp, naming both numbers.
dist::ProcessGroupSpec launched_job_spec(
    const std::string& ranks_flag, const std::string& tp_flag, int tp,
    const std::function<const char*(const char*)>& getenv = {});
// This process as the rank `spec` names: sets its threads (the job's processes share the host's
// cores: --threads not given, threads 0, becomes hardware threads / ranks, at least 1; bits never
// depend on it), joins the job and returns body(job). An exception fails the job first (the other
// ranks stop waiting for this one), then propagates.
int run_as_launched_rank(const dist::ProcessGroupSpec& spec, int threads,
                         const std::function<int(dist::Communicator*)>& body);

class ModelSource {
 public:
  // m.dir non-empty: that checkpoint; else shape "default": the built-in model in the model cache
  // (m.cache_dir, else default_model_cache_dir(); created on first use); else random weights of
  // the shape (seed 0 = kDefaultModelSeed), generated in memory.
  ModelSource(const ModelFlags& m, const LogFn& log);
  const engine::Qwen3Config& config() const { return cfg_; }
  const std::string& description() const { return desc_; }
  // Builds (and caches) the model of (tp, backend device) with `contract`, uploading weights once
  // per device and tp; other backends of the same device share them (Model::with_backend).
  engine::ModelFactory factory(const ContractConfig& contract);
  // Frees the placed models (the next factory call places them again).
  void release() { cache_.clear(); }

 private:
  LogFn log_;
  engine::Qwen3Config cfg_;
  std::string desc_;
  std::unique_ptr<engine::Checkpoint> ckpt_;
  engine::Weights weights_;  // random shapes
  std::map<std::string, TensorView> views_;
  // (tp, device, contract): a model's layout follows its contract.
  std::map<std::tuple<int, int, std::string>, std::unique_ptr<engine::Model>> cache_;
};

}  // namespace lockstep::tools
