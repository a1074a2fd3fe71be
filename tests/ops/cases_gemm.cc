// Op-case table, GEMM: the public entry (bias none / bf16 / f32, bf16 / f32 out, every segment
// count) and the row-parallel TP entry points (partial per rank + tree combine, also in place);
// relations: rows, threads, layout, every TP degree t <= S.
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

const char* bias_name(Bias b) {
  return b == Bias::kNone ? "none" : b == Bias::kBF16 ? "bf16" : "f32";
}

class GemmCase : public RowCase {
 public:
  explicit GemmCase(GemmShape s, int tp = 1) : s_(s), tp_(tp) {
    T_ = s.M;
    strided_ = s.strided;
    RowInput x;
    x.elems = s.K;
    x.kind = s.kind;
    inputs_ = {x};
  }
  std::string op() const override { return tp_ > 1 ? "gemm_tp" : "gemm"; }
  std::string name() const override {
    return std::string(tp_ > 1 ? "gemm_tp" + num(tp_) : "gemm") + "/M" + num(s_.M) + "_N" +
           num(s_.N) + "_K" + num(s_.K) + "_S" + num(s_.S) + "_bias-" + bias_name(s_.bias) +
           "_out-" + dtype_name(s_.out) + (s_.strided ? "/strided/" : "/contiguous/") +
           data_kind_name(s_.kind);
  }
  bool has_scalar_spec() const override { return tp_ == 1; }
  bool quick() const override { return s_.M * s_.N * s_.K <= (1 << 22); }
  std::vector<Relation> relations() const override {
    std::vector<Relation> rel = RowCase::relations();
    // Row-parallel TP: every degree t <= S (partials per rank + tree combine) == TP = 1.
    for (int t = 1; t <= s_.S; t *= 2)
      rel.push_back({"TP=" + num(t) + " partials + combine == gemm_bf16_nt",
                     [this, t](Ops& ops, Mem& mem, const Outputs& base, const Check& check) {
                       const Outputs one = full(ops, mem, rows_, T_, strided_);
                       const Outputs tp = tensor_parallel(ops, mem, rows_, T_, strided_, t);
                       // base: {y} for the public entry, {partials.., y[, y in place]} for TP.
                       const Output& y = tp_ == 1 ? base[0] : one[0];
                       for (const Output& o : tp)
                         if (o.name == "y" || o.name == "y in place")
                           for (int64_t m = 0; m < T_; ++m)
                             check(o.name + " TP=" + num(t) + " row " + num(m),
                                   compare_bits(o.row(m), y.row(m), s_.N, s_.out));
                     }});
    return rel;
  }

 private:
  GemmShape s_;
  int tp_;
  Tensor w_, b_;
  // Row padding of x and w in the strided layout: 8 keeps 16-byte row strides where K allows (the
  // TMA paths on the GPU), 7 never does (the fallback paths).
  int64_t xw_pad(bool strided) const { return strided ? (s_.K % 8 == 0 ? 8 : 7) : 0; }
  void build_shared(std::mt19937_64& g) override {
    w_ = Tensor(DType::kBF16, {s_.N, s_.K});
    fill_bf16(w_.ptr<bf16>(), w_.numel(), s_.kind, g, 0.1f);
    if (s_.bias == Bias::kBF16) {
      b_ = Tensor(DType::kBF16, {s_.N});
      fill_bf16(b_.ptr<bf16>(), s_.N, s_.kind, g);
    } else if (s_.bias == Bias::kF32) {
      b_ = Tensor(DType::kF32, {s_.N});
      fill_f32(b_.ptr<float>(), s_.N, s_.kind, g);
    }
  }
  Outputs full(Ops& ops, Mem& mem, const std::vector<Tensor>& rows, int64_t T, bool strided) const {
    const int64_t pad = xw_pad(strided);
    const TensorView x = mem.in(padded(rows[0], pad)), w = mem.in(padded(w_, pad));
    TensorView bias;
    if (s_.bias != Bias::kNone) bias = mem.in(host_arg(b_));
    const TensorView y = mem.out(s_.out, {T, s_.N}, strided ? 5 : 0);
    ops.gemm(x, w, s_.bias != Bias::kNone ? &bias : nullptr, GemmConfig{s_.S}, y);
    return {mem.read("y", y)};
  }
  Outputs compute(Ops& ops, Mem& mem, const std::vector<Tensor>& rows, int64_t T,
                  bool strided) const override {
    if (tp_ == 1) return full(ops, mem, rows, T, strided);
    return tensor_parallel(ops, mem, rows, T, strided, tp_);
  }
  // Row-parallel TP: rank r takes the K columns of its segments (column views of x and w).
  Outputs tensor_parallel(Ops& ops, Mem& mem, const std::vector<Tensor>& rows, int64_t T,
                          bool strided, int tp) const {
    const GemmConfig cfg{s_.S};
    const int64_t pad = xw_pad(strided);
    const HostArg xa = padded(rows[0], pad), wa = padded(w_, pad);
    Outputs outs;
    std::vector<TensorView> partials;
    for (int r = 0; r < tp; ++r) {
      const GemmKRange kr = gemm_tp_k_range(cfg, s_.K, tp, r);
      HostArg xs = xa, ws = wa;
      xs.view.data = xa.view.ptr<bf16>() + kr.begin;
      xs.view.shape[1] = kr.end - kr.begin;
      ws.view.data = wa.view.ptr<bf16>() + kr.begin;
      ws.view.shape[1] = kr.end - kr.begin;
      const TensorView yp = mem.out(DType::kF32, {T, s_.N});
      ops.gemm_partial(mem.in(xs), mem.in(ws), s_.K, tp, r, cfg, yp);
      outs.push_back(mem.read("partial" + num(r), yp));
      partials.push_back(yp);
    }
    TensorView bias;
    if (s_.bias != Bias::kNone) bias = mem.in(host_arg(b_));
    const TensorView y = mem.out(s_.out, {T, s_.N}, strided ? 5 : 0);
    ops.gemm_combine(partials, s_.bias != Bias::kNone ? &bias : nullptr, y);
    outs.push_back(mem.read("y", y));
    if (s_.out == DType::kF32) {  // an f32 combine may run in place, into the last partial
      ops.gemm_combine(partials, s_.bias != Bias::kNone ? &bias : nullptr, partials.back());
      Output o = mem.read("y in place", partials.back());
      outs.push_back(o);
    }
    return outs;
  }
};

}  // namespace

std::unique_ptr<OpCase> gemm_case(const GemmShape& s, int tp) {
  return std::make_unique<GemmCase>(s, tp);
}

}  // namespace lockstep::cases
