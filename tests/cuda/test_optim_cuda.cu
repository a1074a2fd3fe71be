// AdamW on the GPU (engine/cuda/optim.h) against the CPU engine::AdamW, bit for bit: after every
// step the masters, m, v (through state(), so also its names, order and step entry), the bf16
// weights and the StepStats (grad_norm, clip_scale, lr) are memcmp-equal. The model has 47
// tensors (two launches of each kernel), odd sizes, 1-D weights (no decay), tensors of exactly
// one and two norm chunks, one just past a chunk, one of 33 chunks (more chunks than a warp's 32
// lanes); gradients spread over 27 binades with zeros, −0 and subnormals; each LR schedule, with
// clipping active and inactive and weight decay on. Also: non-finite gradients throw naming the
// first bad tensor (the CPU's message) and change nothing; a gradient whose square overflows fp32
// is accepted; checkpoint round trips (from_state, entries reordered, the CPU-constructed
// optimizer uploaded, to_host) continue bitwise; bf16 rounding of NaN, ties, inf and subnormal
// masters; bad gradients and configs are refused. Harness: cuda/gpu_harness.h.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "cuda/gpu_harness.h"
#include "engine/cuda/optim.h"
#include "engine/default_model.h"
#include "engine/optim.h"
#include "lockstep/cuda/optim.h"
#include "lockstep/cuda/runtime.h"

namespace lockstep::engine {
namespace {

using gpu_test::expect_error;
using gpu_test::report;

Tensor random_tensor(DType dtype, const std::vector<int64_t>& shape, std::mt19937_64& rng,
                     float scale) {
  Tensor t(dtype, shape);
  std::normal_distribution<float> nd(0.0f, scale);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const float x = nd(rng);
    if (dtype == DType::kF32) {
      t.ptr<float>()[i] = x;
    } else {
      t.ptr<bf16>()[i] = f32_to_bf16(x);
    }
  }
  return t;
}

// 47 tensors: 7 named shapes, then 40 small ones (odd shapes, every third 1-D).
Weights make_weights(std::mt19937_64& rng) {
  const int64_t big_rows = gpu_test::g_quick ? 1100 : 2100;  // 33 chunks (18 with --quick)
  Weights w;
  w.emplace_back("model.embed_tokens.weight", random_tensor(DType::kBF16, {17, 8}, rng, 0.2f));
  w.emplace_back("model.norm.weight", random_tensor(DType::kBF16, {8}, rng, 1.0f));
  w.emplace_back("model.layers.0.mlp.down_proj.weight",
                 random_tensor(DType::kF32, {300, 257}, rng, 0.05f));  // 77100: two chunks
  w.emplace_back("two_chunks.weight", random_tensor(DType::kBF16, {2, 65536}, rng, 0.05f));
  w.emplace_back("one.weight", random_tensor(DType::kF32, {1}, rng, 1.0f));
  w.emplace_back("big.weight", random_tensor(DType::kBF16, {big_rows, 1025}, rng, 0.02f));
  w.emplace_back("chunk_plus_one.weight", random_tensor(DType::kBF16, {65537}, rng, 1.0f));
  for (int i = 0; i < 40; ++i) {
    const std::vector<int64_t> shape =
        i % 3 == 0 ? std::vector<int64_t>{i + 1} : std::vector<int64_t>{3, 2 * i + 1};
    w.emplace_back("small." + std::to_string(i) + ".weight",
                   random_tensor(i % 2 ? DType::kF32 : DType::kBF16, shape, rng, 0.1f));
  }
  return w;
}

// Gradients like `w`: normal values times 2^e, e in [-24, 2], times `scale`; one in 500 is +0,
// −0 or a subnormal.
Weights make_grads(const Weights& w, std::mt19937_64& rng, float scale) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> ex(-24, 2), special(0, 499);
  Weights out;
  for (const auto& [name, t] : w) {
    Tensor g(DType::kF32, t.shape());
    float* p = g.ptr<float>();
    for (int64_t i = 0; i < g.numel(); ++i) {
      const int s = special(rng);
      const float x = nd(rng);
      if (s == 0) {
        p[i] = 0.0f;
      } else if (s == 1) {
        p[i] = -0.0f;
      } else if (s == 2) {
        p[i] = x < 0 ? -3e-42f : 7e-41f;
      } else {
        p[i] = x * std::ldexp(1.0f, ex(rng)) * scale;
      }
    }
    out.emplace_back(name, std::move(g));
  }
  return out;
}

Weights to_device(const Weights& host) {
  Weights out;
  for (const auto& [name, t] : host) {
    Tensor d = cuda::empty(t.dtype(), t.shape());
    cuda::copy(d.view(), t.view());
    out.emplace_back(name, std::move(d));
  }
  cuda::synchronize();
  return out;
}

// Names, order, dtypes, shapes and bytes equal; one check. On a difference, names the tensor and
// the first differing element with both bit patterns.
bool same_weights(const std::string& what, const Weights& gpu, const Weights& cpu) {
  if (gpu.size() != cpu.size()) {
    report(false,
           what + ": " + std::to_string(gpu.size()) + " entries vs " + std::to_string(cpu.size()));
    return false;
  }
  for (size_t k = 0; k < gpu.size(); ++k) {
    const auto& [gn, g] = gpu[k];
    const auto& [cn, c] = cpu[k];
    if (gn != cn || g.dtype() != c.dtype() || g.shape() != c.shape()) {
      report(false, what + ": entry " + std::to_string(k) + " is '" + gn + "', expected '" + cn +
                        "' (or dtype/shape differ)");
      return false;
    }
    if (g.numel() > 0 && std::memcmp(g.data(), c.data(), size_t(g.nbytes())) != 0) {
      const size_t es = size_t(dtype_size(g.dtype()));
      const auto* a = static_cast<const uint8_t*>(g.data());
      const auto* b = static_cast<const uint8_t*>(c.data());
      size_t first = 0, bad = 0;
      for (size_t i = size_t(g.numel()); i-- > 0;) {
        if (std::memcmp(a + i * es, b + i * es, es) != 0) {
          first = i;
          ++bad;
        }
      }
      uint64_t x = 0, y = 0;
      std::memcpy(&x, a + first * es, es);
      std::memcpy(&y, b + first * es, es);
      report(false, what + ": '" + gn + "' differs");
      std::printf("  %zu of %lld differ; first at %zu: gpu 0x%llx cpu 0x%llx\n", bad,
                  (long long)g.numel(), first, (unsigned long long)x, (unsigned long long)y);
      return false;
    }
  }
  report(true, what);
  return true;
}

uint64_t bits(double x) {
  uint64_t u;
  std::memcpy(&u, &x, 8);
  return u;
}

bool same_stats(const std::string& what, const StepStats& g, const StepStats& c) {
  const bool ok = bits(g.grad_norm) == bits(c.grad_norm) &&
                  bits(g.clip_scale) == bits(c.clip_scale) && bits(g.lr) == bits(c.lr);
  report(ok, what);
  if (!ok) {
    std::printf("  gpu norm %.17g scale %.17g lr %.17g; cpu norm %.17g scale %.17g lr %.17g\n",
                g.grad_norm, g.clip_scale, g.lr, c.grad_norm, c.clip_scale, c.lr);
  }
  return ok;
}

// Everything after a step (or at the start): the state (masters, m, v, step) and the bf16 weights.
void compare(const std::string& what, const CudaAdamW& gpu, const AdamW& cpu) {
  same_weights(what + ": state", gpu.state(), cpu.state());
  same_weights(what + ": bf16 weights", gpu.bf16_weights_host(), cpu.bf16_weights());
  report(gpu.steps_done() == cpu.steps_done(), what + ": steps_done");
}

// One step on both with the same gradients; compares everything.
void step_both(const std::string& what, CudaAdamW& gpu, AdamW& cpu, const Weights& host_grads) {
  const StepStats c = cpu.step(host_grads);
  const StepStats g = gpu.step(to_device(host_grads));
  same_stats(what + ": stats", g, c);
  compare(what, gpu, cpu);
}

// The kernel alone: every chunk's sum equals the sequential host chain (a named first failure when
// the norm is wrong, before the optimizer's comparisons).
void test_chunk_sums() {
  gpu_test::section("chunk sums", [] {
    std::mt19937_64 rng(gpu_test::g_seed + 3);
    const Weights w = make_weights(rng);
    const Weights g = make_grads(w, rng, 1.0f);
    const Weights dg = to_device(g);
    std::vector<TensorView> views;
    for (const auto& [name, t] : dg) views.push_back(t.view());
    const std::vector<double> got = cuda::sum_of_squares_chunks(views);
    std::vector<double> want;
    for (const auto& [name, t] : g) {
      const float* p = t.ptr<float>();
      for (int64_t begin = 0; begin < t.numel(); begin += cuda::kNormChunk) {
        const int64_t end = std::min(t.numel(), begin + cuda::kNormChunk);
        double sum = 0.0;
        for (int64_t i = begin; i < end; ++i) {
          const double x = p[i];
          sum = sum + x * x;
        }
        want.push_back(sum);
      }
    }
    report(got.size() == want.size(),
           "chunk count " + std::to_string(got.size()) + " vs " + std::to_string(want.size()));
    if (got.size() == want.size())
      gpu_test::bitwise("every chunk's chain", got.data(), want.data(), got.size(), 8);
  });
}

struct Schedule {
  std::string name;
  AdamWConfig cfg;
  int steps;
};

std::vector<Schedule> schedules() {
  std::vector<Schedule> s;
  AdamWConfig cos;  // cosine with warmup, decay, clipping; runs past total_steps
  cos.lr = 3e-3;
  cos.beta1 = 0.9;
  cos.beta2 = 0.95;
  cos.weight_decay = 0.1;
  cos.max_grad_norm = 1.0;
  cos.schedule = LrSchedule::kCosine;
  cos.warmup_steps = 2;
  cos.total_steps = 6;
  cos.min_lr_ratio = 0.1;
  s.push_back({"cosine", cos, 8});
  AdamWConfig constant;  // the defaults: constant, clipping at 1, no decay
  s.push_back({"constant", constant, 6});
  AdamWConfig warm;  // linear warmup, decay, clipping off
  warm.lr = 1e-2;
  warm.eps = 1e-6;
  warm.weight_decay = 0.05;
  warm.max_grad_norm = 0.0;
  warm.schedule = LrSchedule::kLinearWarmup;
  warm.warmup_steps = 3;
  s.push_back({"linear_warmup", warm, 6});
  AdamWConfig decay;  // constant, strong decay, clipping at 50
  decay.lr = 1e-3;
  decay.beta1 = 0.8;
  decay.beta2 = 0.99;
  decay.weight_decay = 0.5;
  decay.max_grad_norm = 50.0;
  s.push_back({"constant decay", decay, 5});
  return s;
}

// Gradient scales per step: the large ones make clipping active, the small ones inactive.
float step_scale(int step) {
  static const float kScales[] = {1.0f, 1e-5f, 1.0f, 1e-4f, 3.0f, 1e-5f, 1.0f, 2e-5f};
  return kScales[step % 8];
}

void test_schedules() {
  for (const Schedule& s : schedules()) {
    gpu_test::section("steps: " + s.name, [&] {
      std::mt19937_64 rng(gpu_test::g_seed ^ std::hash<std::string>{}(s.name));
      const Weights w = make_weights(rng);
      AdamW cpu(w, s.cfg);
      CudaAdamW gpu(w, s.cfg);
      compare(s.name + ": initial", gpu, cpu);
      const int steps = gpu_test::g_quick ? std::min(s.steps, 3) : s.steps;
      int clipped = 0, unclipped = 0;
      for (int k = 0; k < steps; ++k) {
        const Weights g = make_grads(w, rng, step_scale(k));
        const StepStats c = cpu.step(g);
        const StepStats d = gpu.step(to_device(g));
        const std::string what = s.name + ": step " + std::to_string(k + 1);
        same_stats(what + ": stats", d, c);
        compare(what, gpu, cpu);
        (c.clip_scale < 1.0 ? clipped : unclipped) += 1;
      }
      if (s.cfg.max_grad_norm > 0 && s.cfg.max_grad_norm < 10 && steps >= 2) {
        report(clipped > 0 && unclipped > 0,
               s.name + ": clipping active on some steps and inactive on others (" +
                   std::to_string(clipped) + " clipped, " + std::to_string(unclipped) + " not)");
      }
    });
  }
}

// Gradients with one non-finite element (bad_tensor, bad_index) and maybe a second one later.
Weights poisoned_grads(const Weights& w, std::mt19937_64& rng, size_t bad_tensor, int64_t bad_index,
                       float bad, size_t second_tensor = SIZE_MAX) {
  Weights g = make_grads(w, rng, 1.0f);
  g[bad_tensor].second.ptr<float>()[bad_index] = bad;
  if (second_tensor < g.size()) g[second_tensor].second.ptr<float>()[0] = INFINITY;
  return g;
}

void test_non_finite() {
  gpu_test::section("non-finite gradients", [] {
    std::mt19937_64 rng(gpu_test::g_seed + 11);
    const Weights w = make_weights(rng);
    const AdamWConfig cfg = schedules()[0].cfg;
    AdamW cpu(w, cfg);
    CudaAdamW gpu(w, cfg);
    step_both("before", gpu, cpu, make_grads(w, rng, 1.0f));
    struct Case {
      const char* what;
      size_t tensor;
      int64_t index;
      float value;
      size_t second;
    };
    const Case cases[] = {
        {"NaN in the second chunk of tensor 2, +inf in tensor 5", 2, 70000, NAN, 5},
        {"-inf in the first tensor", 0, 3, -INFINITY, SIZE_MAX},
        {"+inf in the 33rd chunk of big.weight", 5, 32 * 65536 + 17, INFINITY, SIZE_MAX},
        {"NaN in the last tensor (the second launch)", w.size() - 1, 0, NAN, SIZE_MAX},
    };
    for (const Case& c : cases) {
      if (c.index >= w[c.tensor].second.numel()) continue;  // --quick: big.weight is smaller
      const Weights g = poisoned_grads(w, rng, c.tensor, c.index, c.value, c.second);
      const Weights before = gpu.state();
      const Weights bf16_before = gpu.bf16_weights_host();
      std::string cpu_msg, gpu_msg;
      try {
        cpu.step(g);
      } catch (const Error& e) {
        cpu_msg = e.what();
      }
      const Weights dg = to_device(g);
      const std::string needle = "non-finite gradient in '" + w[c.tensor].first + "'";
      expect_error(
          std::string(c.what) + ": names the tensor", [&] { gpu.step(dg); }, needle.c_str());
      try {
        gpu.step(dg);
      } catch (const Error& e) {
        gpu_msg = e.what();
      }
      report(!cpu_msg.empty() && gpu_msg == cpu_msg, std::string(c.what) + ": the CPU's message");
      if (gpu_msg != cpu_msg)
        std::printf("  gpu '%s'\n  cpu '%s'\n", gpu_msg.c_str(), cpu_msg.c_str());
      same_weights(std::string(c.what) + ": state unchanged", gpu.state(), before);
      same_weights(std::string(c.what) + ": bf16 unchanged", gpu.bf16_weights_host(), bf16_before);
      compare(std::string(c.what) + ": still the CPU's", gpu, cpu);
    }
    // |g|² overflows fp32, not double: accepted, as on the CPU.
    Weights g = make_grads(w, rng, 1.0f);
    g[2].second.ptr<float>()[5] = 3e38f;
    g[2].second.ptr<float>()[6] = -3e38f;
    step_both("a gradient of 3e38", gpu, cpu, g);
    step_both("after", gpu, cpu, make_grads(w, rng, 1e-5f));
  });
}

void test_checkpoints() {
  gpu_test::section("checkpoints", [] {
    std::mt19937_64 rng(gpu_test::g_seed + 23);
    const Weights w = make_weights(rng);
    const AdamWConfig cfg = schedules()[0].cfg;
    AdamW cpu(w, cfg);
    CudaAdamW gpu(w, cfg);
    std::vector<Weights> grads;
    for (int k = 0; k < 5; ++k) grads.push_back(make_grads(w, rng, step_scale(k)));
    for (int k = 0; k < 2; ++k) step_both("run " + std::to_string(k + 1), gpu, cpu, grads[k]);

    // The GPU's state loads on the CPU and the CPU's on the GPU.
    const Weights st = cpu.state();
    same_weights("to_host() == the CPU's state", gpu.to_host().state(), st);
    CudaAdamW restored = CudaAdamW::from_state(gpu.state(), cfg);
    compare("from_state(gpu.state())", restored, cpu);
    // Entries in another order: v/ first, then the masters, then the step, then m/ reversed.
    Weights shuffled;
    const size_t n = w.size();
    for (size_t k = 0; k < n; ++k) shuffled.push_back(st[2 * n + k]);
    for (size_t k = 0; k < n; ++k) shuffled.push_back(st[k]);
    shuffled.push_back(st[3 * n]);
    for (size_t k = n; k-- > 0;) shuffled.push_back(st[n + k]);
    CudaAdamW reordered = CudaAdamW::from_state(shuffled, cfg);
    compare("from_state(entries reordered)", reordered, cpu);
    CudaAdamW uploaded(cpu);
    compare("CudaAdamW(cpu)", uploaded, cpu);

    // 2 steps, save, load, 3 steps == 5 steps (on the CPU), for each restored copy.
    for (int k = 2; k < 5; ++k) {
      const std::string s = "continued step " + std::to_string(k + 1);
      const StepStats c = cpu.step(grads[k]);
      const Weights dg = to_device(grads[k]);
      same_stats(s + ": restored stats", restored.step(dg), c);
      same_stats(s + ": reordered stats", reordered.step(dg), c);
      same_stats(s + ": uploaded stats", uploaded.step(dg), c);
      same_stats(s + ": original stats", gpu.step(dg), c);
      compare(s + ": restored", restored, cpu);
      compare(s + ": reordered", reordered, cpu);
      compare(s + ": uploaded", uploaded, cpu);
      compare(s + ": original", gpu, cpu);
    }
    expect_error(
        "from_state refuses what the CPU refuses (no step entry)",
        [&] {
          Weights bad = cpu.state();
          bad.pop_back();
          CudaAdamW::from_state(bad, cfg);
        },
        "no 'step' entry");
  });
}

// bf16 rounding of special masters (no step: a NaN master's update is not covered, see
// docs/training-optimizer.md): NaNs of any payload and sign, ±inf, ties to even, the largest
// float (rounds to inf), subnormals, −0; and bf16 NaN inputs to the constructor.
void test_bf16_rounding() {
  gpu_test::section("bf16 rounding", [] {
    const uint32_t specials[] = {0x7FA00001u, 0xFFC00001u, 0x7F800001u, 0xFF800000u, 0x7F800000u,
                                 0x3F808000u, 0x3F818000u, 0x3F80C000u, 0x7F7FFFFFu, 0x00000001u,
                                 0x80400000u, 0x007FFFFFu, 0x80000000u, 0x00008000u, 0x00018000u};
    std::mt19937_64 rng(gpu_test::g_seed + 31);
    const Weights w = make_weights(rng);
    const AdamWConfig cfg;
    Weights st = AdamW(w, cfg).state();
    for (size_t k = 0; k < w.size(); ++k) {
      float* p = st[k].second.ptr<float>();
      const int64_t n = st[k].second.numel();
      for (size_t j = 0; j < std::size(specials); ++j) {
        const int64_t i = int64_t(j * 977 + k) % n;
        std::memcpy(&p[i], &specials[j], 4);
      }
    }
    const AdamW cpu = AdamW::from_state(st, cfg);
    const CudaAdamW gpu = CudaAdamW::from_state(st, cfg);
    compare("special masters", gpu, cpu);

    Weights nan_w = make_weights(rng);
    nan_w[0].second.ptr<bf16>()[3] = bf16{0x7FA1};
    nan_w[0].second.ptr<bf16>()[4] = bf16{0xFF81};
    nan_w[1].second.ptr<bf16>()[0] = bf16{0xFFC0};
    compare("bf16 NaN weights in", CudaAdamW(nan_w, cfg), AdamW(nan_w, cfg));
  });
}

void test_refusals() {
  gpu_test::section("refusals", [] {
    std::mt19937_64 rng(gpu_test::g_seed + 41);
    Weights w;
    w.emplace_back("a.weight", random_tensor(DType::kBF16, {5, 3}, rng, 0.1f));
    w.emplace_back("b.weight", random_tensor(DType::kF32, {7}, rng, 0.1f));
    const AdamWConfig cfg;
    AdamW cpu(w, cfg);
    CudaAdamW gpu(w, cfg);
    const Weights good = make_grads(w, rng, 1.0f);
    const Weights before = gpu.state();
    auto try_step = [&](const char* what, Weights g, const char* needle) {
      expect_error(
          what, [&] { gpu.step(g); }, needle);
      same_weights(std::string(what) + ": nothing changed", gpu.state(), before);
    };
    try_step("one gradient missing", Weights{to_device(good)[0]}, "expected 2 gradients, got 1");
    {
      Weights g = to_device(good);
      std::swap(g[0], g[1]);
      try_step("gradients out of order", g, "gradient 0 is 'b.weight', expected 'a.weight'");
    }
    {
      Weights g = to_device(good);
      g[1].second = cuda::empty(DType::kF32, {8});
      try_step("wrong shape", g, "has shape [8], expected [7]");
    }
    {
      Weights g = to_device(good);
      g[0].second = cuda::empty(DType::kBF16, {5, 3});
      try_step("bf16 gradient", g, "must be f32 on the GPU, got bf16 on cuda");
    }
    try_step("host gradients", good, "must be f32 on the GPU, got f32 on cpu");
    step_both("then a good step", gpu, cpu, good);

    expect_error(
        "bad config",
        [&] {
          AdamWConfig bad;
          bad.lr = -1;
          CudaAdamW x(w, bad);
        },
        "lr must be finite and > 0");
    expect_error(
        "device weights", [&] { CudaAdamW x(to_device(w), cfg); }, "must be on the CPU");
    expect_error(
        "duplicate names",
        [&] {
          Weights d = w;
          d[1].first = d[0].first;
          CudaAdamW x(d, cfg);
        },
        "duplicate weight name 'a.weight'");
  });
}

}  // namespace
}  // namespace lockstep::engine

int main(int argc, char** argv) {
  using namespace lockstep;
  if (!gpu_test::start("test_optim_cuda", argc, argv)) return 2;
  std::printf("%s\n", cuda::device_summary().c_str());
  engine::test_chunk_sums();
  engine::test_schedules();
  engine::test_non_finite();
  engine::test_checkpoints();
  engine::test_bf16_rounding();
  engine::test_refusals();
  return gpu_test::finish("test_optim_cuda");
}
