// Op-case table, linear log-prob (+ vocab-parallel partial / combine) and sampling; relations:
// rows, threads, layout, every vocab-parallel degree R <= vocab_segments.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <sstream>

#include "core/thread_pool.h"
#include "lockstep/error.h"
#include "ops/cases.h"
#include "ops/row_case.h"

namespace lockstep::cases {
namespace {

// ---- Linear log-prob and sampling
// ----------------------------------------------------------------

class LogprobCase : public RowCase {
 public:
  // world > 1: vocab-parallel (partial per rank + combine); world must divide vocab_segments.
  LogprobCase(int64_t T, int64_t H, int64_t V, ContractConfig cfg, float temperature, DType tgt_dt,
              bool strided, DataKind kind, int world)
      : H_(H), V_(V), cfg_(cfg), kind_(kind), world_(world), tgt_dt_(tgt_dt) {
    T_ = T;
    strided_ = strided;
    params_.temperature = temperature;
    params_.ignore_index = -100;
    RowInput h;
    h.elems = H;
    h.kind = kind;
    RowInput t;
    t.dt = tgt_dt;
    t.index_hi = V;
    t.has_special_index = true;
    t.special_index = params_.ignore_index;
    inputs_ = {h, t};
  }
  std::string op() const override { return world_ > 1 ? "linear_logprob_tp" : "linear_logprob"; }
  // The vocab's edges as targets: row 0 -> V-1 (the last real entry before the padding), row 1 ->
  // 0; the other rows random, one in ten ignored.
  void build(uint64_t seed) override {
    RowCase::build(seed);
    const Tensor& tg = rows_[1];
    for (int64_t r = 0; r < std::min<int64_t>(T_, 2); ++r) {
      const int64_t v = r == 0 ? V_ - 1 : 0;
      if (tg.dtype() == DType::kI32)
        tg.ptr<int32_t>()[r] = int32_t(v);
      else
        tg.ptr<int64_t>()[r] = v;
    }
  }
  std::string name() const override {
    std::ostringstream os;
    os << (world_ > 1 ? "linear_logprob_tp" + num(world_) : std::string("linear_logprob")) << "/T"
       << T_ << "_H" << H_ << "_V" << V_ << "_tile" << cfg_.vocab_tile << "_seg"
       << cfg_.vocab_segments << "_gemmseg" << cfg_.gemm_segments << "_temp" << params_.temperature
       << "_targets-" << dtype_name(tgt_dt_) << (strided_ ? "/strided/" : "/contiguous/")
       << data_kind_name(kind_);
    return os.str();
  }
  bool quick() const override { return T_ * V_ * H_ <= (1 << 24); }
  std::vector<Relation> relations() const override {
    std::vector<Relation> rel = RowCase::relations();
    // Vocab-parallel: every degree R <= vocab_segments (partials + combine) == the op.
    for (int R = 1; R <= cfg_.vocab_segments; R *= 2)
      rel.push_back({"TP=" + num(R) + " partials + combine == linear_logprob",
                     [this, R](Ops& ops, Mem& mem, const Outputs&, const Check& check) {
                       const Outputs one = single(ops, mem, rows_, T_, strided_);
                       const Outputs tp = vocab_parallel(ops, mem, rows_, T_, strided_, R);
                       for (size_t i = 0; i < one.size(); ++i) {
                         const Output& got = tp[tp.size() - one.size() + i];
                         for (int64_t t = 0; t < T_; ++t)
                           check(got.name + " R=" + num(R) + " row " + num(t),
                                 compare_bits(got.row(t), one[i].row(t), 1, DType::kF32));
                       }
                     }});
    return rel;
  }

 private:
  int64_t H_, V_;
  ContractConfig cfg_;
  DataKind kind_;
  int world_;
  DType tgt_dt_;
  LogprobParams params_;
  Tensor w_;
  void build_shared(std::mt19937_64& g) override {
    w_ = Tensor(DType::kBF16, {V_, H_});
    fill_bf16(w_.ptr<bf16>(), w_.numel(), kind_ == DataKind::kSpecials ? DataKind::kNormal : kind_,
              g, 0.5f);
  }
  Outputs single(Ops& ops, Mem& mem, const std::vector<Tensor>& rows, int64_t T,
                 bool strided) const {
    const int64_t pad = strided ? 3 : 0;
    const TensorView h = mem.in(padded(rows[0], pad)), w = mem.in(padded(w_, pad));
    const TensorView tg = mem.in(vector_arg(rows[1], strided ? 2 : 1));
    const int64_t step = strided ? 2 : 1;
    const TensorView logp = mem.out(DType::kF32, {T, step}), lse = mem.out(DType::kF32, {T, step}),
                     ent = mem.out(DType::kF32, {T, step});
    auto col = [&](TensorView v) {
      v.ndim = 1;
      v.stride[0] = step;
      return v;
    };
    ops.linear_logprob(h, w, tg, params_, cfg_, col(logp), col(lse), col(ent));
    return {mem.read("logp", col(logp)), mem.read("lse", col(lse)), mem.read("entropy", col(ent))};
  }
  Outputs compute(Ops& ops, Mem& mem, const std::vector<Tensor>& rows, int64_t T,
                  bool strided) const override {
    if (world_ == 1) return single(ops, mem, rows, T, strided);
    return vocab_parallel(ops, mem, rows, T, strided, world_);
  }
  Outputs vocab_parallel(Ops& ops, Mem& mem, const std::vector<Tensor>& rows, int64_t T,
                         bool strided, int world) const {
    const int64_t pad = strided ? 3 : 0;
    const LogprobVocabLayout lay = logprob_vocab_layout(cfg_, V_);
    const int per = cfg_.vocab_segments / world;
    const TensorView h = mem.in(padded(rows[0], pad));
    const TensorView tg = mem.in(vector_arg(rows[1], 1));
    const HostArg wa = padded(w_, pad);
    const TensorView states = mem.out(DType::kF32, {world, T, 4});
    for (int r = 0; r < world; ++r) {
      LogprobShard sh;
      sh.vocab_size = V_;
      sh.seg_begin = r * per;
      sh.seg_count = per;
      const int64_t v0 = std::min(V_, sh.seg_begin * lay.segment_len);
      const int64_t v1 = std::min(V_, (sh.seg_begin + per) * lay.segment_len);
      HostArg ws = wa;
      ws.view.data = wa.view.ptr<bf16>() + v0 * (H_ + pad);
      ws.view.shape[0] = v1 - v0;
      TensorView st = TensorView::contiguous(states.ptr<float>() + r * T * 4, DType::kF32, {T, 4},
                                             states.device);
      ops.linear_logprob_partial(h, mem.in(ws), tg, params_, cfg_, sh, st);
    }
    const TensorView logp = mem.out(DType::kF32, {T}), lse = mem.out(DType::kF32, {T}),
                     ent = mem.out(DType::kF32, {T});
    ops.linear_logprob_combine(states, tg, params_, cfg_, V_, logp, lse, ent);
    return {not_by_row(mem.read("states", states)), mem.read("logp", logp), mem.read("lse", lse),
            mem.read("entropy", ent)};
  }
};

class SampleCase : public RowCase {
 public:
  // dup_rows: every other w row repeats the one before it (exactly tied logits).
  SampleCase(int64_t T, int64_t H, int64_t V, SamplingParams p, bool dup_rows, DataKind kind,
             std::string label)
      : H_(H), V_(V), p_(p), dup_(dup_rows), kind_(kind), label_(std::move(label)) {
    T_ = T;
    RowInput h;
    h.elems = H;
    h.kind = kind;
    RowInput req;
    req.dt = DType::kI64;
    req.index_hi = int64_t(1) << 40;
    RowInput pos;
    pos.dt = DType::kI32;
    pos.index_hi = 1 << 20;
    inputs_ = {h, req, pos};
  }
  std::string op() const override { return "sample"; }
  std::string name() const override {
    return "sample/T" + num(T_) + "_H" + num(H_) + "_V" + num(V_) + "_" + label_ +
           (dup_ ? "/tied-rows/" : "/contiguous/") + data_kind_name(kind_);
  }

 private:
  int64_t H_, V_;
  SamplingParams p_;
  bool dup_;
  DataKind kind_;
  std::string label_;
  Tensor w_;
  void build_shared(std::mt19937_64& g) override {
    w_ = Tensor(DType::kBF16, {V_, H_});
    fill_bf16(w_.ptr<bf16>(), w_.numel(), kind_, g, 0.5f);
    if (dup_)
      for (int64_t v = 1; v < V_; v += 2)
        std::memcpy(w_.ptr<bf16>() + v * H_, w_.ptr<bf16>() + (v - 1) * H_, size_t(H_) * 2);
  }
  Outputs compute(Ops& ops, Mem& mem, const std::vector<Tensor>& rows, int64_t T,
                  bool strided) const override {
    const TensorView h = mem.in(padded(rows[0], 0)), w = mem.in(padded(w_, 0));
    // request ids and positions stay host views (every backend checks them on the host).
    const HostArg reqa = vector_arg(rows[1], 1), posa = vector_arg(rows[2], 1);
    const std::vector<SamplingParams> params(size_t(T), p_);
    const TensorView ids = mem.out(DType::kI64, {T}), logp = mem.out(DType::kF32, {T}),
                     lse = mem.out(DType::kF32, {T}), ent = mem.out(DType::kF32, {T});
    ops.sample(h, w, params, mem.host(reqa), mem.host(posa), ContractConfig{}, ids, logp, lse, ent);
    return {mem.read("token_ids", ids), mem.read("logp", logp), mem.read("lse", lse),
            mem.read("entropy", ent)};
  }
};

}  // namespace

ContractConfig logprob_contract(int vocab_tile, int vocab_segments, int gemm_segments) {
  ContractConfig c;
  c.vocab_tile = vocab_tile;
  c.vocab_segments = vocab_segments;
  c.gemm_segments = gemm_segments;
  return c;
}

std::unique_ptr<OpCase> logprob_case(int64_t T, int64_t H, int64_t V, ContractConfig cfg,
                                     float temperature, DType tgt_dt, bool strided, DataKind kind,
                                     int world) {
  return std::make_unique<LogprobCase>(T, H, V, cfg, temperature, tgt_dt, strided, kind, world);
}
std::unique_ptr<OpCase> sample_case(int64_t T, int64_t H, int64_t V, SamplingParams p,
                                    bool dup_rows, DataKind kind, std::string label) {
  return std::make_unique<SampleCase>(T, H, V, p, dup_rows, kind, std::move(label));
}

}  // namespace lockstep::cases
