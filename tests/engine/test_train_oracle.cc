// Accuracy of the Qwen3 backward (engine/train.h): every parameter's gradient against an fp64
// oracle of the same math (the model's forward and its analytic backward in double, on the same
// bf16 weights and tokens, no intermediate rounding), and the oracle itself against central finite
// differences of its fp64 loss. The loss is L = Σ_t g_lp[t]·logp[t] + g_ent[t]·entropy[t], so
// dL/dlogp = g_lp and dL/dentropy = g_ent, the upstream gradients Backprop::backward takes.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/default_model.h"
#include "engine/model.h"
#include "engine/train.h"
#include "util/shared_train_util.h"
#include "util/test_util.h"

namespace lockstep::engine {
namespace {

using Vec = std::vector<double>;

Qwen3Config small_config() {
  Qwen3Config c;
  c.vocab_size = 320;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 4;
  c.head_dim = 16;
  c.rope_theta = 1e6;
  c.max_position_embeddings = 512;
  c.tie_word_embeddings = true;
  return c;
}

// ---- the fp64 model --------------------------------------------------------------------------

struct Oracle {
  Qwen3Config c;
  std::map<std::string, Vec> w;  // HF names, row-major

  const Vec& W(const std::string& n) const { return w.at(n); }

  // y [n, N] = x [n, K] · Wᵀ (W [N, K]).
  static Vec linear(const Vec& x, const Vec& Wm, int64_t n, int64_t N, int64_t K) {
    Vec y(size_t(n * N), 0.0);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t o = 0; o < N; ++o) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k) s += x[size_t(t * K + k)] * Wm[size_t(o * K + k)];
        y[size_t(t * N + o)] = s;
      }
    return y;
  }
  // dx [n, K] = dy · W; dW += dyᵀ · x.
  static Vec linear_back(const Vec& dy, const Vec& x, const Vec& Wm, Vec& dW, int64_t n, int64_t N,
                         int64_t K) {
    Vec dx(size_t(n * K), 0.0);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t o = 0; o < N; ++o) {
        const double g = dy[size_t(t * N + o)];
        for (int64_t k = 0; k < K; ++k) {
          dx[size_t(t * K + k)] += g * Wm[size_t(o * K + k)];
          dW[size_t(o * K + k)] += g * x[size_t(t * K + k)];
        }
      }
    return dx;
  }
  // RMSNorm over rows of length H (rows = x.size() / H).
  Vec norm(const Vec& x, const Vec& wt, int64_t H) const {
    Vec y(x.size());
    for (size_t r = 0; r < x.size() / size_t(H); ++r) {
      double ss = 0;
      for (int64_t k = 0; k < H; ++k)
        ss += x[r * size_t(H) + size_t(k)] * x[r * size_t(H) + size_t(k)];
      const double rr = 1.0 / std::sqrt(ss / double(H) + double(float(c.rms_norm_eps)));
      for (int64_t k = 0; k < H; ++k)
        y[r * size_t(H) + size_t(k)] = x[r * size_t(H) + size_t(k)] * rr * wt[size_t(k)];
    }
    return y;
  }
  Vec norm_back(const Vec& x, const Vec& wt, const Vec& gy, Vec& dw, int64_t H) const {
    Vec dx(x.size());
    for (size_t r = 0; r < x.size() / size_t(H); ++r) {
      const double* xr = &x[r * size_t(H)];
      const double* g = &gy[r * size_t(H)];
      double ss = 0, dot = 0;
      for (int64_t k = 0; k < H; ++k) ss += xr[k] * xr[k];
      const double rr = 1.0 / std::sqrt(ss / double(H) + double(float(c.rms_norm_eps)));
      for (int64_t k = 0; k < H; ++k) {
        dw[size_t(k)] += g[k] * xr[k] * rr;
        dot += g[k] * wt[size_t(k)] * xr[k];
      }
      for (int64_t k = 0; k < H; ++k)
        dx[r * size_t(H) + size_t(k)] =
            rr * g[k] * wt[size_t(k)] - rr * rr * rr / double(H) * xr[k] * dot;
    }
    return dx;
  }
  // RoPE (rotate_half) on [n, heads, D] at positions 0..n-1; inverse = transpose.
  void rope(Vec& x, int64_t n, int64_t heads, bool transpose) const {
    const int64_t D = c.head_dim, half = D / 2;
    for (int64_t t = 0; t < n; ++t)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t i = 0; i < half; ++i) {
          const double ang = double(t) / std::pow(c.rope_theta, double(2 * i) / double(D));
          const double co = std::cos(ang), si = transpose ? -std::sin(ang) : std::sin(ang);
          double& a = x[size_t((t * heads + h) * D + i)];
          double& b = x[size_t((t * heads + h) * D + i + half)];
          const double na = a * co - b * si, nb = b * co + a * si;
          a = na;
          b = nb;
        }
  }

  struct LayerAct {
    Vec h_in, a, q, k, v, qn, kn, qr, kr, P, o, h_mid, b, g, u, m;
  };

  // Loss of one sequence and, with `grads`, its gradient added to grads.
  double run(const std::vector<int32_t>& tok, const std::vector<int64_t>& tgt, const Vec& g_lp,
             const Vec& g_ent, std::map<std::string, Vec>* grads) const {
    const int64_t n = int64_t(tok.size()), H = c.hidden_size, I = c.intermediate_size;
    const int64_t Hq = c.num_attention_heads, Hkv = c.num_key_value_heads, D = c.head_dim;
    const int64_t V = c.vocab_size, G = Hq / Hkv;
    const double scale = 1.0 / std::sqrt(double(D));
    const Vec& E = W("model.embed_tokens.weight");
    Vec h(size_t(n * H));
    for (int64_t t = 0; t < n; ++t)
      for (int64_t k = 0; k < H; ++k) h[size_t(t * H + k)] = E[size_t(tok[size_t(t)] * H + k)];
    std::vector<LayerAct> acts(size_t(c.num_hidden_layers));
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      LayerAct& A = acts[size_t(l)];
      A.h_in = h;
      A.a = norm(h, W(p + "input_layernorm.weight"), H);
      A.q = linear(A.a, W(p + "self_attn.q_proj.weight"), n, Hq * D, H);
      A.k = linear(A.a, W(p + "self_attn.k_proj.weight"), n, Hkv * D, H);
      A.v = linear(A.a, W(p + "self_attn.v_proj.weight"), n, Hkv * D, H);
      A.qn = norm(A.q, W(p + "self_attn.q_norm.weight"), D);
      A.kn = norm(A.k, W(p + "self_attn.k_norm.weight"), D);
      A.qr = A.qn;
      A.kr = A.kn;
      rope(A.qr, n, Hq, false);
      rope(A.kr, n, Hkv, false);
      A.P.assign(size_t(Hq * n * n), 0.0);
      A.o.assign(size_t(n * Hq * D), 0.0);
      for (int64_t hh = 0; hh < Hq; ++hh) {
        const int64_t kv = hh / G;
        for (int64_t i = 0; i < n; ++i) {
          double mx = -1e300;
          Vec s(size_t(i + 1));
          for (int64_t j = 0; j <= i; ++j) {
            double d = 0;
            for (int64_t e = 0; e < D; ++e)
              d += A.qr[size_t((i * Hq + hh) * D + e)] * A.kr[size_t((j * Hkv + kv) * D + e)];
            s[size_t(j)] = d * scale;
            mx = std::max(mx, s[size_t(j)]);
          }
          double sum = 0;
          for (int64_t j = 0; j <= i; ++j) sum += std::exp(s[size_t(j)] - mx);
          for (int64_t j = 0; j <= i; ++j) {
            const double pij = std::exp(s[size_t(j)] - mx) / sum;
            A.P[size_t((hh * n + i) * n + j)] = pij;
            for (int64_t e = 0; e < D; ++e)
              A.o[size_t((i * Hq + hh) * D + e)] += pij * A.v[size_t((j * Hkv + kv) * D + e)];
          }
        }
      }
      const Vec ou = linear(A.o, W(p + "self_attn.o_proj.weight"), n, H, Hq * D);
      for (size_t i = 0; i < h.size(); ++i) h[i] += ou[i];
      A.h_mid = h;
      A.b = norm(h, W(p + "post_attention_layernorm.weight"), H);
      A.g = linear(A.b, W(p + "mlp.gate_proj.weight"), n, I, H);
      A.u = linear(A.b, W(p + "mlp.up_proj.weight"), n, I, H);
      A.m.resize(A.g.size());
      for (size_t i = 0; i < A.g.size(); ++i) A.m[i] = A.g[i] / (1.0 + std::exp(-A.g[i])) * A.u[i];
      const Vec dn = linear(A.m, W(p + "mlp.down_proj.weight"), n, H, I);
      for (size_t i = 0; i < h.size(); ++i) h[i] += dn[i];
    }
    const Vec h_final = h;
    const Vec hf = norm(h, W("model.norm.weight"), H);
    const Vec z = linear(hf, E, n, V, H);  // tied
    double loss = 0;
    Vec dz(size_t(n * V), 0.0);
    for (int64_t t = 0; t < n; ++t) {
      const double* zt = &z[size_t(t * V)];
      double mx = -1e300;
      for (int64_t v = 0; v < V; ++v) mx = std::max(mx, zt[v]);
      double s = 0;
      for (int64_t v = 0; v < V; ++v) s += std::exp(zt[v] - mx);
      const double lse = mx + std::log(s);
      double ey = 0;
      for (int64_t v = 0; v < V; ++v) ey += std::exp(zt[v] - lse) * zt[v];
      const double ent = lse - ey;
      const double lp = tgt[size_t(t)] >= 0 ? zt[tgt[size_t(t)]] - lse : 0.0;
      loss += g_lp[size_t(t)] * lp + g_ent[size_t(t)] * ent;
      for (int64_t v = 0; v < V; ++v) {
        const double pv = std::exp(zt[v] - lse);
        const double ind = (v == tgt[size_t(t)]) ? 1.0 : 0.0;
        const double a = tgt[size_t(t)] >= 0 ? g_lp[size_t(t)] * (ind - pv) : 0.0;
        dz[size_t(t * V + v)] = a + g_ent[size_t(t)] * (-pv * (zt[v] - ey));
      }
    }
    if (!grads) return loss;
    auto& gr = *grads;
    Vec dhf = linear_back(dz, hf, E, gr["model.embed_tokens.weight"], n, V, H);
    Vec dh = norm_back(h_final, W("model.norm.weight"), dhf, gr["model.norm.weight"], H);
    for (int64_t l = c.num_hidden_layers - 1; l >= 0; --l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      const LayerAct& A = acts[size_t(l)];
      const Vec dm = linear_back(dh, A.m, W(p + "mlp.down_proj.weight"),
                                 gr[p + "mlp.down_proj.weight"], n, H, I);
      Vec dg(A.g.size()), du(A.g.size());
      for (size_t i = 0; i < A.g.size(); ++i) {
        const double sg = 1.0 / (1.0 + std::exp(-A.g[i]));
        du[i] = dm[i] * A.g[i] * sg;
        dg[i] = dm[i] * A.u[i] * sg * (1.0 + A.g[i] * (1.0 - sg));
      }
      Vec db = linear_back(dg, A.b, W(p + "mlp.gate_proj.weight"), gr[p + "mlp.gate_proj.weight"],
                           n, I, H);
      const Vec db2 =
          linear_back(du, A.b, W(p + "mlp.up_proj.weight"), gr[p + "mlp.up_proj.weight"], n, I, H);
      for (size_t i = 0; i < db.size(); ++i) db[i] += db2[i];
      const Vec dhm = norm_back(A.h_mid, W(p + "post_attention_layernorm.weight"), db,
                                gr[p + "post_attention_layernorm.weight"], H);
      for (size_t i = 0; i < dh.size(); ++i) dh[i] += dhm[i];
      // Attention block.
      const Vec dO = linear_back(dh, A.o, W(p + "self_attn.o_proj.weight"),
                                 gr[p + "self_attn.o_proj.weight"], n, H, Hq * D);
      Vec dqr(A.qr.size(), 0.0), dkr(A.kr.size(), 0.0), dv(A.v.size(), 0.0);
      for (int64_t hh = 0; hh < Hq; ++hh) {
        const int64_t kv = hh / G;
        for (int64_t i = 0; i < n; ++i) {
          Vec dP(size_t(i + 1));
          double rowdot = 0;
          for (int64_t j = 0; j <= i; ++j) {
            double d = 0;
            for (int64_t e = 0; e < D; ++e)
              d += dO[size_t((i * Hq + hh) * D + e)] * A.v[size_t((j * Hkv + kv) * D + e)];
            dP[size_t(j)] = d;
            rowdot += A.P[size_t((hh * n + i) * n + j)] * d;
          }
          for (int64_t j = 0; j <= i; ++j) {
            const double pij = A.P[size_t((hh * n + i) * n + j)];
            const double dS = pij * (dP[size_t(j)] - rowdot) * scale;
            for (int64_t e = 0; e < D; ++e) {
              dv[size_t((j * Hkv + kv) * D + e)] += pij * dO[size_t((i * Hq + hh) * D + e)];
              dqr[size_t((i * Hq + hh) * D + e)] += dS * A.kr[size_t((j * Hkv + kv) * D + e)];
              dkr[size_t((j * Hkv + kv) * D + e)] += dS * A.qr[size_t((i * Hq + hh) * D + e)];
            }
          }
        }
      }
      rope(dqr, n, Hq, true);
      rope(dkr, n, Hkv, true);
      const Vec dq = norm_back(A.q, W(p + "self_attn.q_norm.weight"), dqr,
                               gr[p + "self_attn.q_norm.weight"], D);
      const Vec dk = norm_back(A.k, W(p + "self_attn.k_norm.weight"), dkr,
                               gr[p + "self_attn.k_norm.weight"], D);
      Vec da = linear_back(dq, A.a, W(p + "self_attn.q_proj.weight"),
                           gr[p + "self_attn.q_proj.weight"], n, Hq * D, H);
      const Vec da2 = linear_back(dk, A.a, W(p + "self_attn.k_proj.weight"),
                                  gr[p + "self_attn.k_proj.weight"], n, Hkv * D, H);
      const Vec da3 = linear_back(dv, A.a, W(p + "self_attn.v_proj.weight"),
                                  gr[p + "self_attn.v_proj.weight"], n, Hkv * D, H);
      for (size_t i = 0; i < da.size(); ++i) da[i] += da2[i] + da3[i];
      const Vec dhi = norm_back(A.h_in, W(p + "input_layernorm.weight"), da,
                                gr[p + "input_layernorm.weight"], H);
      for (size_t i = 0; i < dh.size(); ++i) dh[i] += dhi[i];
    }
    Vec& dE = gr["model.embed_tokens.weight"];
    for (int64_t t = 0; t < n; ++t)
      for (int64_t k = 0; k < H; ++k) dE[size_t(tok[size_t(t)] * H + k)] += dh[size_t(t * H + k)];
    return loss;
  }
};

struct Problem {
  Qwen3Config cfg = small_config();
  Weights weights;
  std::map<std::string, TensorView> views;
  Oracle oracle;
  std::vector<std::vector<int32_t>> seqs;
  std::vector<std::vector<int64_t>> targets;
  std::vector<Vec> g_lp, g_ent;
};

Problem make_problem() {
  Problem pr;
  pr.weights = random_qwen3_weights(pr.cfg, 5);
  pr.oracle.c = pr.cfg;
  for (auto& [name, t] : pr.weights) {
    pr.views[name] = t.view();
    Vec v(size_t(t.numel()));
    for (int64_t i = 0; i < t.numel(); ++i) v[size_t(i)] = double(bf16_to_f32(t.ptr<bf16>()[i]));
    pr.oracle.w[name] = std::move(v);
  }
  auto g = test::rng(7);
  std::uniform_int_distribution<int32_t> id(0, int32_t(pr.cfg.vocab_size - 1));
  std::normal_distribution<double> nd(0.0, 0.1);
  for (int n : {9, 23, 4}) {
    std::vector<int32_t> s(static_cast<size_t>(n));
    for (auto& x : s) x = id(g);
    std::vector<int64_t> tg(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) tg[size_t(i)] = i + 1 < n ? s[size_t(i + 1)] : -1;
    Vec a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
    for (auto& x : a) x = double(float(nd(g)));
    for (auto& x : b) x = double(float(nd(g)));
    pr.seqs.push_back(s);
    pr.targets.push_back(tg);
    pr.g_lp.push_back(a);
    pr.g_ent.push_back(b);
  }
  return pr;
}

TEST(TrainOracle, GradientsMatchAnFp64OracleOfTheSameMath) {
  const Problem pr = make_problem();
  // The oracle's gradient, summed over the sequences.
  std::map<std::string, Vec> ref;
  for (const auto& [name, v] : pr.oracle.w) ref[name].assign(v.size(), 0.0);
  for (size_t s = 0; s < pr.seqs.size(); ++s)
    pr.oracle.run(pr.seqs[s], pr.targets[s], pr.g_lp[s], pr.g_ent[s], &ref);

  // lockstep: one micro-batch of the three sequences.
  ModelOptions opt;
  opt.contract.gemm_segments = 2;
  opt.contract.kv_chunk = 64;
  opt.contract.vocab_tile = 32;
  opt.contract.vocab_segments = 2;
  Model model(pr.cfg, pr.views, opt, make_invariant_backend());
  Backprop bp(pr.cfg, pr.views, opt);
  Gradients grads(pr.cfg);
  std::vector<int32_t> tokens, cu = {0};
  std::vector<int64_t> targets;
  std::vector<float> g_lp, g_ent;
  for (size_t s = 0; s < pr.seqs.size(); ++s) {
    for (size_t p = 0; p < pr.seqs[s].size(); ++p) {
      tokens.push_back(pr.seqs[s][p]);
      targets.push_back(pr.targets[s][p]);
      g_lp.push_back(float(pr.g_lp[s][p]));
      g_ent.push_back(float(pr.g_ent[s][p]));
    }
    cu.push_back(int32_t(tokens.size()));
  }
  const int64_t T = int64_t(tokens.size());
  const SavedForward f = bp.forward(model, TensorView::contiguous(tokens.data(), DType::kI32, {T}),
                                    TensorView::contiguous(cu.data(), DType::kI32, {4}));
  Tensor logp(DType::kF32, {T}), lse(DType::kF32, {T}), ent(DType::kF32, {T});
  const TensorView tg = TensorView::contiguous(targets.data(), DType::kI64, {T});
  model.logprob(f.hidden.view(), tg, 1.0f, logp.view(), lse.view(), ent.view());
  const TensorView gent = TensorView::contiguous(g_ent.data(), DType::kF32, {T});
  const std::vector<int64_t> idx = {0, 1, 2};
  bp.backward(f, tg, LogprobParams{}, lse.view(), ent.view(),
              TensorView::contiguous(g_lp.data(), DType::kF32, {T}), &gent, idx, grads);
  grads.finish();

  // Per tensor: relative L2 error. The forward rounds every activation to bf16 (and the backward
  // its GEMM operands), so agreement is at bf16 level, not fp32 level; the bound is twice the
  // worst measured (docs/engine-model.md §9). A wrong formula (sign, missing term, wrong order of
  // a chain rule) gives O(1) errors.
  double worst = 0;
  std::string worst_name;
  for (const auto& [name, t] : grads.all()) {
    const Vec& r = ref.at(name);
    double num = 0, den = 0;
    for (int64_t i = 0; i < t.numel(); ++i) {
      const double d = double(t.ptr<float>()[i]) - r[size_t(i)];
      num += d * d;
      den += r[size_t(i)] * r[size_t(i)];
    }
    ASSERT_GT(den, 0.0) << name;
    const double rel = std::sqrt(num / den);
    EXPECT_LT(rel, 0.1) << name;
    if (rel > worst) worst = rel, worst_name = name;
  }
  std::printf("[train oracle] worst relative L2 error %.4f (%s)\n", worst, worst_name.c_str());
}

// Shared prompts (docs/contract.md §B.11): the shared form's gradients and the unshared form's
// are two roundings of the same sum; both against the fp64 oracle of the unshared loss (each
// completion with its own copy of the prompt), within the same tolerance.
TEST(TrainOracle, SharedPromptGradientsMatchTheOracleLikeTheUnsharedOnes) {
  Problem pr = make_problem();
  auto g = test::rng(9);
  const test_shared::GroupStep st =
      test_shared::make_group_step(pr.cfg, {{21, {6, 13, 3}}, {18, {9, 2}}}, g, 0.1f);
  std::map<std::string, Vec> ref;
  for (const auto& [name, v] : pr.oracle.w) ref[name].assign(v.size(), 0.0);
  for (size_t k = 0; k < st.groups.size(); ++k) {
    const PromptGroup& grp = st.groups[k];
    const int64_t P = int64_t(grp.prompt.size());
    for (size_t c = 0; c < grp.completions.size(); ++c) {
      std::vector<int32_t> seq = grp.prompt;
      seq.insert(seq.end(), grp.completions[c].begin(), grp.completions[c].end());
      const int64_t n = int64_t(seq.size());
      std::vector<int64_t> tg(size_t(n), -1);
      Vec a(size_t(n), 0.0), b(size_t(n), 0.0);
      for (int64_t p = P - 1; p + 1 < n; ++p) {
        tg[size_t(p)] = seq[size_t(p + 1)];
        a[size_t(p)] = double(st.g_lp[k][c][size_t(p - P + 1)]);
        b[size_t(p)] = double(st.g_ent[k][c][size_t(p - P + 1)]);
      }
      pr.oracle.run(seq, tg, a, b, &ref);
    }
  }
  ModelOptions opt;
  opt.contract.gemm_segments = 2;
  opt.contract.kv_chunk = 64;
  opt.contract.vocab_tile = 32;
  opt.contract.vocab_segments = 2;
  const test_shared::StepOut sh = test_shared::run_shared_step(pr.cfg, pr.views, opt, st, {{0, 1}});
  const test_shared::StepOut un =
      test_shared::run_unshared_step(pr.cfg, pr.views, opt, st, {{0, 1}});
  double worst_sh = 0, worst_un = 0;
  for (size_t i = 0; i < sh.grads.all().size(); ++i) {
    const std::string& name = sh.grads.all()[i].first;
    const Vec& r = ref.at(name);
    double ns = 0, nu = 0, den = 0;
    for (size_t j = 0; j < r.size(); ++j) {
      const double ds = double(sh.grads.all()[i].second.ptr<float>()[j]) - r[j];
      const double du = double(un.grads.all()[i].second.ptr<float>()[j]) - r[j];
      ns += ds * ds;
      nu += du * du;
      den += r[j] * r[j];
    }
    ASSERT_GT(den, 0.0) << name;
    const double rs = std::sqrt(ns / den), ru = std::sqrt(nu / den);
    EXPECT_LT(rs, 0.1) << name;  // the model backward's stated tolerance (above)
    EXPECT_LT(ru, 0.1) << name;
    worst_sh = std::max(worst_sh, rs);
    worst_un = std::max(worst_un, ru);
  }
  std::printf("[train oracle] shared prompts: worst relative L2 error %.4f (unshared %.4f)\n",
              worst_sh, worst_un);
}

TEST(TrainOracle, OracleMatchesFiniteDifferences) {
  Problem pr = make_problem();
  std::map<std::string, Vec> ref;
  for (const auto& [name, v] : pr.oracle.w) ref[name].assign(v.size(), 0.0);
  pr.oracle.run(pr.seqs[0], pr.targets[0], pr.g_lp[0], pr.g_ent[0], &ref);
  auto g = test::rng(8);
  int checked = 0;
  for (const auto& [name, grad] : ref) {
    std::uniform_int_distribution<size_t> pick(0, grad.size() - 1);
    for (int rep = 0; rep < 2; ++rep) {
      const size_t i = pick(g);
      Vec& w = pr.oracle.w[name];
      const double w0 = w[i], h = 1e-5 * std::max(1.0, std::fabs(w0));
      w[i] = w0 + h;
      const double lp = pr.oracle.run(pr.seqs[0], pr.targets[0], pr.g_lp[0], pr.g_ent[0], nullptr);
      w[i] = w0 - h;
      const double lm = pr.oracle.run(pr.seqs[0], pr.targets[0], pr.g_lp[0], pr.g_ent[0], nullptr);
      w[i] = w0;
      const double fd = (lp - lm) / (2 * h);
      EXPECT_NEAR(fd, grad[i], 1e-6 + 1e-4 * std::fabs(grad[i])) << name << "[" << i << "]";
      ++checked;
    }
  }
  EXPECT_GT(checked, 20);
}

}  // namespace
}  // namespace lockstep::engine
