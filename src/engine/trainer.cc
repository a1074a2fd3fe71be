// Training-side forward for the audit: pack, forward_packed, gather completion rows by temperature,
// logprob. See trainer.h.
#include "engine/trainer.h"

#include <chrono>
#include <map>
#include <sstream>

#include "core/philox.h"
#include "engine/rollout.h"
#include "lockstep/error.h"

namespace lockstep::engine {

namespace {
constexpr const char* kOp = "training forward";
}

void PackingConfig::validate() const {
  LS_CHECK(micro_batch_tokens >= 1, "PackingConfig", "micro_batch_tokens must be >= 1, got ",
           micro_batch_tokens);
}

std::string PackingConfig::to_string() const {
  std::ostringstream os;
  os << "packing: micro_batch_tokens=" << micro_batch_tokens << " seed=" << seed;
  return os.str();
}

std::vector<std::vector<size_t>> pack_sequences(const std::vector<int64_t>& lengths,
                                                const PackingConfig& cfg) {
  cfg.validate();
  std::vector<size_t> order(lengths.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  if (cfg.seed != 0) {
    for (size_t i = order.size(); i > 1; --i) {
      const Philox4 r = philox4x32_10(Philox4{{uint32_t(i), 0x7061636bu, 0, 0}}, uint32_t(cfg.seed),
                                      uint32_t(cfg.seed >> 32));
      const uint64_t u = (uint64_t(r.v[0]) << 32) | r.v[1];
      std::swap(order[i - 1], order[size_t(u % i)]);
    }
  }
  std::vector<std::vector<size_t>> batches;
  int64_t fill = 0;
  for (size_t idx : order) {
    const int64_t len = lengths[idx];
    if (batches.empty() || fill + len > cfg.micro_batch_tokens) {
      batches.emplace_back();
      fill = 0;
    }
    batches.back().push_back(idx);
    fill += len;
  }
  return batches;
}

std::vector<TrainSequence> train_sequences(const RolloutResult& rollout) {
  std::vector<TrainSequence> out;
  for (const Completion& c : rollout.completions) {
    TrainSequence s;
    s.id = c.id;
    s.prompt = c.prompt;
    s.completion = c.tokens;
    s.temperature = c.sampling.logprob_temperature();
    out.push_back(std::move(s));
  }
  return out;
}

TrainResult run_training_forward(const Model& model, const std::vector<TrainSequence>& seqs,
                                 const PackingConfig& cfg, const TrainHooks& hooks) {
  cfg.validate();
  const auto t0 = std::chrono::steady_clock::now();
  const Qwen3Config& mc = model.config();
  const int64_t V = mc.vocab_size, H = mc.hidden_size, ctx = model_context(model);
  std::vector<int64_t> lengths;
  for (const TrainSequence& s : seqs) {
    LS_CHECK(!s.prompt.empty(), kOp, "sequence ", s.id, ": empty prompt");
    LS_CHECK(!s.completion.empty(), kOp, "sequence ", s.id, ": empty completion");
    const int64_t len = int64_t(s.prompt.size() + s.completion.size());
    LS_CHECK(len <= ctx, kOp, "sequence ", s.id, ": ", len,
             " tokens exceed the model's context of ", ctx, " positions");
    for (const auto* part : {&s.prompt, &s.completion})
      for (int32_t t : *part)
        LS_CHECK(t >= 0 && t < V, kOp, "sequence ", s.id, ": token ", t,
                 " is outside the vocab [0, ", V, ")");
    LS_CHECK(s.temperature > 0.0f && s.temperature <= 3.4e38f, kOp, "sequence ", s.id,
             ": temperature must be finite and > 0, got ", s.temperature);
    lengths.push_back(len);
  }

  TrainResult res;
  res.sequences.resize(seqs.size());
  int64_t done = 0;
  for (const std::vector<size_t>& mb : pack_sequences(lengths, cfg)) {
    int64_t T = 0;
    std::vector<int64_t> first_row;
    for (size_t i : mb) {
      first_row.push_back(T);
      T += lengths[i];
    }
    if (hooks.before_batch && !hooks.before_batch(mb, first_row)) continue;
    const int64_t B = int64_t(mb.size());
    Tensor tokens(DType::kI32, {T}), cu(DType::kI32, {B + 1});
    cu.ptr<int32_t>()[0] = 0;
    for (int64_t b = 0; b < B; ++b) {
      const TrainSequence& s = seqs[mb[size_t(b)]];
      int32_t* dst = tokens.ptr<int32_t>() + first_row[size_t(b)];
      std::copy(s.prompt.begin(), s.prompt.end(), dst);
      std::copy(s.completion.begin(), s.completion.end(), dst + s.prompt.size());
      cu.ptr<int32_t>()[b + 1] = int32_t(first_row[size_t(b)] + lengths[mb[size_t(b)]]);
    }
    // Hidden states stay on the backend's device; rows are gathered there, log-probs come back.
    const OpsBackend& ops = model.ops();
    Tensor hidden = ops.empty(DType::kBF16, {T, H});
    model.forward_packed(tokens.view(), cu.view(), hidden.view());

    // Completion token i of a sequence is predicted by the row of position prompt + i - 1.
    // One logprob call per distinct temperature (by bits, in order of first appearance).
    std::map<uint32_t, std::vector<int64_t>> by_temp;  // temperature bits -> sequences (b)
    std::vector<uint32_t> temp_order;
    for (int64_t b = 0; b < B; ++b) {
      const uint32_t bits = f32_bits(seqs[mb[size_t(b)]].temperature);
      if (!by_temp.count(bits)) temp_order.push_back(bits);
      by_temp[bits].push_back(b);
    }
    for (uint32_t bits : temp_order) {
      const std::vector<int64_t>& members = by_temp[bits];
      int64_t Tc = 0;
      for (int64_t b : members) Tc += int64_t(seqs[mb[size_t(b)]].completion.size());
      Tensor h = ops.empty(DType::kBF16, {Tc, H});
      Tensor targets(DType::kI32, {Tc});
      Tensor logp(DType::kF32, {Tc}), lse(DType::kF32, {Tc}), ent(DType::kF32, {Tc});
      int64_t r = 0;
      for (int64_t b : members) {
        const TrainSequence& s = seqs[mb[size_t(b)]];
        const int64_t row0 = first_row[size_t(b)] + int64_t(s.prompt.size()) - 1;
        const int64_t n = int64_t(s.completion.size());
        ops.copy(h.view().rows(r, r + n), hidden.view().rows(row0, row0 + n));
        std::copy(s.completion.begin(), s.completion.end(), targets.ptr<int32_t>() + r);
        r += n;
      }
      model.logprob(h.view(), targets.view(), f32_from_bits(bits), logp.view(), lse.view(),
                    ent.view());
      r = 0;
      for (int64_t b : members) {
        const size_t idx = mb[size_t(b)];
        const int64_t n = int64_t(seqs[idx].completion.size());
        TrainTokens& out = res.sequences[idx];
        out.logp.assign(logp.ptr<float>() + r, logp.ptr<float>() + r + n);
        out.lse.assign(lse.ptr<float>() + r, lse.ptr<float>() + r + n);
        out.entropy.assign(ent.ptr<float>() + r, ent.ptr<float>() + r + n);
        r += n;
      }
    }
    ++res.micro_batches;
    res.tokens_forwarded += T;
    res.max_micro_batch_tokens = std::max(res.max_micro_batch_tokens, T);
    done += B;
    if (hooks.progress) hooks.progress(done, int64_t(seqs.size()));
  }
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

}  // namespace lockstep::engine
