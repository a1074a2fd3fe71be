// The GRPO loop on the GPU (engine/grpo.h over engine/cuda/grpo_device.h): a short run (tiny
// model, copy task, a supervised warm-up, several mini-batches and micro-batches per step) on
// cuda gives, step after step, 0 rollout-vs-trainer log-prob mismatches, first-mini-batch ratios
// of exactly 1, and the CPU run's weights (sha256), warm-up losses, grad norms and rewards bit for
// bit; checkpoints are the same files on both devices, and a checkpoint of either device resumed
// on the other ends with the uninterrupted run's weights. Harness: cuda/gpu_harness.h (exits
// non-zero on any failure, 2 without a GPU).
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "cuda/gpu_harness.h"
#include "engine/cuda/grpo_device.h"
#include "engine/default_model.h"
#include "engine/grpo.h"
#include "util/grpo_test_util.h"

namespace lockstep::engine {
namespace {

namespace fs = std::filesystem;
using gpu_test::report;

// tests/engine/test_grpo.cc's model (tests/util/grpo_test_util.h).
Qwen3Config tiny_config() { return test::grpo_test_model(); }

// Closer to the real shapes: D=64 with 2 query heads per KV head (the grouped attention kernels),
// an untied lm_head. V=256 H=128 I=256 L=2 Hq=8 Hkv=4.
Qwen3Config small_config() {
  Qwen3Config c = tiny_config();
  c.vocab_size = 256;
  c.hidden_size = 128;
  c.intermediate_size = 256;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 4;
  c.head_dim = 64;
  c.tie_word_embeddings = false;
  return c;
}

// 3 steps of 4 prompts x G=4 after 2 warm-up steps; 2 mini-batches per step (the second one
// trains on weights one version newer than the samples'); micro-batches of at most 40 tokens;
// rollout TP 2 vs training TP 1; the command line's rollout settings (16-token pages, prefix
// sharing) with a small chunked-prefill budget.
GrpoConfig tiny_run(Device device) {
  GrpoConfig g = test::grpo_test_run();
  g.device = device;
  g.sft_steps = 2;
  g.sft_prompts = 16;
  g.mini_batches = 2;
  g.rollout.kv.page_size = 16;
  g.rollout.scheduler.prefix_sharing = true;
  return g;
}

struct Run {
  std::vector<SftStepMetrics> sft;
  std::vector<GrpoStepMetrics> steps;
  std::string final_sha;
};

Run run(const GrpoConfig& g, const Qwen3Config& c = tiny_config()) {
  const Weights w0 = random_qwen3_weights(c, 3);
  Run r;
  GrpoHooks h;
  h.on_sft_step = [&](const SftStepMetrics& m) { r.sft.push_back(m); };
  h.on_step = [&](const GrpoStepMetrics& m) { r.steps.push_back(m); };
  const GrpoDevice dev = g.device == Device::kCUDA ? cuda_grpo_device() : cpu_grpo_device();
  r.final_sha = weights_sha256(run_grpo(g, c, w0, dev, h));
  return r;
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Every step of `gpu` on-policy and bit-exact, and equal to `cpu` step for step.
void compare_runs(const Run& gpu, const Run& cpu, const std::string& what) {
  report(gpu.steps.size() == cpu.steps.size() && !gpu.steps.empty(),
         what + ": " + std::to_string(gpu.steps.size()) + " GRPO steps on both devices");
  report(gpu.sft.size() == cpu.sft.size(), what + ": warm-up steps on both devices");
  for (size_t i = 0; i < gpu.sft.size() && i < cpu.sft.size(); ++i) {
    const SftStepMetrics &a = gpu.sft[i], &b = cpu.sft[i];
    const bool ok = same_bits(a.loss, b.loss) && same_bits(a.grad_norm, b.grad_norm) &&
                    same_bits(a.token_accuracy, b.token_accuracy);
    report(ok, what + ": warm-up step " + std::to_string(i) + " loss / grad norm cuda == cpu");
    if (!ok)
      std::printf("  cuda loss %.17g grad norm %.17g, cpu loss %.17g grad norm %.17g\n", a.loss,
                  a.grad_norm, b.loss, b.grad_norm);
  }
  for (size_t i = 0; i < gpu.steps.size() && i < cpu.steps.size(); ++i) {
    const GrpoStepMetrics &a = gpu.steps[i], &b = cpu.steps[i];
    const std::string s = what + ": step " + std::to_string(a.step);
    report(a.logp_compared > 0 && a.logp_compared == b.logp_compared,
           s + ": log-probs compared (" + std::to_string(a.logp_compared) + ")");
    report(a.logp_mismatches == 0, s + ": 0 rollout-vs-trainer mismatches on cuda (got " +
                                       std::to_string(a.logp_mismatches) + ")");
    report(a.ratio_min == 1.0 && a.ratio_max == 1.0,
           s + ": first mini-batch ratios exactly 1 on cuda");
    if (a.ratio_min != 1.0 || a.ratio_max != 1.0)
      std::printf("  ratio min %.17g max %.17g\n", a.ratio_min, a.ratio_max);
    report(same_bits(a.reward_mean, b.reward_mean) && a.generated_tokens == b.generated_tokens,
           s + ": same samples and rewards (cuda == cpu)");
    const bool scalars = same_bits(a.loss, b.loss) && same_bits(a.grad_norm, b.grad_norm) &&
                         same_bits(a.kl, b.kl) && same_bits(a.entropy_mean, b.entropy_mean);
    report(scalars, s + ": loss, grad norm, kl, entropy cuda == cpu");
    if (!scalars)
      std::printf("  cuda loss %.17g gnorm %.17g, cpu loss %.17g gnorm %.17g\n", a.loss,
                  a.grad_norm, b.loss, b.grad_norm);
    report(a.weights_sha256 == b.weights_sha256, s + ": weights sha256 cuda == cpu");
    if (a.weights_sha256 != b.weights_sha256)
      std::printf("  cuda %s\n  cpu  %s\n", a.weights_sha256.c_str(), b.weights_sha256.c_str());
    report(
        a.rollout_weight_version == b.rollout_weight_version && a.max_staleness == b.max_staleness,
        s + ": weight versions");
    std::printf(
        "  %s: cuda step %.3f s (rollout %.3f, forward %.3f, backward %.3f, optimizer "
        "%.3f, weight sync %.3f)\n",
        s.c_str(), a.step_s, a.rollout_s, a.forward_s, a.backward_s, a.optimizer_s,
        a.weight_sync_s);
  }
  report(gpu.final_sha == cpu.final_sha, what + ": final weights cuda == cpu");
  // Not vacuous: some GRPO step has a non-zero gradient (non-zero advantages).
  bool moved = false;
  for (const GrpoStepMetrics& m : gpu.steps) moved = moved || m.grad_norm > 0;
  report(moved, what + ": some GRPO step has a non-zero gradient");
}

void test_cuda_equals_cpu() {
  {
    GrpoConfig g = tiny_run(Device::kCPU);
    g.contract.vocab_tile = 32;
    const Run cpu_small = run(g, small_config());
    g.device = Device::kCUDA;
    compare_runs(run(g, small_config()), cpu_small, "small");
  }
  const Run cpu = run(tiny_run(Device::kCPU));
  const Run gpu = run(tiny_run(Device::kCUDA));
  compare_runs(gpu, cpu, "tiny");
  const Run again = run(tiny_run(Device::kCUDA));
  report(again.final_sha == gpu.final_sha, "tiny: cuda rerun gives the same weights");
  // The rollout's attention paths on the GPU (cascade over the shared prompts, split-KV) and one
  // micro-batch per mini-batch: the same bits.
  GrpoConfig other = tiny_run(Device::kCUDA);
  other.rollout.step.cascade = true;
  other.rollout.step.kv_splits = 3;
  other.micro_batch_tokens = 4096;
  other.train_tp = 2;
  const Run o = run(other);
  report(o.final_sha == cpu.final_sha,
         "tiny: cuda with cascade + split-KV rollout, one micro-batch, training TP 2: the same "
         "weights");
  for (const GrpoStepMetrics& m : o.steps)
    report(m.logp_mismatches == 0 && m.ratio_min == 1.0 && m.ratio_max == 1.0,
           "tiny cascade: step " + std::to_string(m.step) + " 0 mismatches, ratios 1");
}

// Checkpoints: the GPU's files equal the CPU's byte for byte, and a checkpoint of one device
// resumed on the other ends with the uninterrupted run's weights.
void test_checkpoints_cross_device() {
  const fs::path root =
      fs::temp_directory_path() / ("lockstep_grpo_cuda_" + std::to_string(::getpid()));
  fs::remove_all(root);
  GrpoConfig g_gpu = tiny_run(Device::kCUDA), g_cpu = tiny_run(Device::kCPU);
  g_gpu.checkpoint_dir = (root / "gpu").string();
  g_cpu.checkpoint_dir = (root / "cpu").string();
  g_gpu.checkpoint_every = g_cpu.checkpoint_every = 1;
  const Run full_gpu = run(g_gpu);
  const Run full_cpu = run(g_cpu);
  report(full_gpu.final_sha == full_cpu.final_sha, "checkpointed runs: cuda == cpu");
  for (int k = 1; k <= 3; ++k) {
    const std::string step = "step-" + std::to_string(k);
    for (const char* file :
         {"model.safetensors", "optimizer.safetensors", "config.json", "trainer.txt"}) {
      const std::string a = read_file(root / "gpu" / step / file);
      const std::string b = read_file(root / "cpu" / step / file);
      report(!a.empty() && a == b, step + "/" + file + ": the same bytes from cuda and cpu");
    }
  }
  // GPU step-1 resumed on the CPU; CPU step-2 resumed on the GPU; GPU latest (step-3) resumed on
  // the GPU with more steps equals the CPU's uninterrupted longer run.
  GrpoConfig r_cpu = tiny_run(Device::kCPU);
  r_cpu.resume = (root / "gpu" / "step-1").string();
  const Run a = run(r_cpu);
  report(a.steps.size() == 2 && a.final_sha == full_gpu.final_sha,
         "cuda checkpoint step-1 resumed on cpu: the uninterrupted run's weights");
  for (size_t i = 0; i < a.steps.size() && i + 1 < full_gpu.steps.size(); ++i)
    report(a.steps[i].weights_sha256 == full_gpu.steps[i + 1].weights_sha256,
           "resumed on cpu: step " + std::to_string(a.steps[i].step) + " weights");
  GrpoConfig r_gpu = tiny_run(Device::kCUDA);
  r_gpu.resume = (root / "cpu" / "step-2").string();
  const Run b = run(r_gpu);
  report(b.steps.size() == 1 && b.final_sha == full_cpu.final_sha,
         "cpu checkpoint step-2 resumed on cuda: the uninterrupted run's weights");
  for (const GrpoStepMetrics& m : b.steps)
    report(m.logp_mismatches == 0 && m.ratio_min == 1.0 && m.ratio_max == 1.0,
           "resumed on cuda: 0 mismatches, ratios 1");
  GrpoConfig longer_gpu = tiny_run(Device::kCUDA), longer_cpu = tiny_run(Device::kCPU);
  longer_gpu.steps = longer_cpu.steps = 4;
  longer_gpu.resume = (root / "gpu").string();  // 'latest': step-3
  const Run c = run(longer_gpu);
  const Run d = run(longer_cpu);
  report(c.steps.size() == 1 && c.final_sha == d.final_sha,
         "cuda latest (step-3) resumed on cuda for a 4th step == cpu's uninterrupted 4 steps");
  fs::remove_all(root);
}

// The baseline loop on the GPU (cuBLAS / ordinary kernels for rollout and training forward, the
// invariant backward): it runs and compares every log-prob (mismatches are expected, not
// asserted: a tiny model may agree by chance).
void test_baseline_runs() {
  GrpoConfig g = tiny_run(Device::kCUDA);
  g.baseline = true;
  g.steps = 2;
  const Run r = run(g);
  report(r.steps.size() == 2, "baseline on cuda: 2 steps");
  for (const GrpoStepMetrics& m : r.steps) {
    report(m.logp_compared > 0, "baseline on cuda: step " + std::to_string(m.step) + " compared");
    std::printf("  baseline on cuda step %lld: %lld of %lld log-probs differ, ratios %.9g..%.9g\n",
                (long long)m.step, (long long)m.logp_mismatches, (long long)m.logp_compared,
                m.ratio_min, m.ratio_max);
  }
}

void test_device_errors() {
  const Qwen3Config c = tiny_config();
  const Weights w0 = random_qwen3_weights(c, 3);
  gpu_test::expect_error(
      "a cuda config without its GrpoDevice", [&] { run_grpo(tiny_run(Device::kCUDA), c, w0); },
      "GrpoDevice");
  gpu_test::expect_error(
      "a cpu config on the cuda GrpoDevice",
      [&] { run_grpo(tiny_run(Device::kCPU), c, w0, cuda_grpo_device()); }, "device");
}

}  // namespace
}  // namespace lockstep::engine

int main(int argc, char** argv) {
  namespace gt = lockstep::gpu_test;
  using namespace lockstep::engine;
  if (!gt::start("test_grpo_cuda", argc, argv)) return 2;
  gt::section("cuda == cpu", [] { test_cuda_equals_cpu(); });
  gt::section("checkpoints", [] { test_checkpoints_cross_device(); });
  gt::section("baseline", [] { test_baseline_runs(); });
  gt::section("errors", [] { test_device_errors(); });
  return gt::finish("test_grpo_cuda");
}
