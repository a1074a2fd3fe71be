// The argument checks of the attention backward (docs/contract.md §B.9): the forward's checks of
// q, k, v, out, lse and the packed sequences, then the upstream gradient and the three outputs.
#include "contract/checks.h"

namespace lockstep::contract {

QShape check_attention_backward(const char* op, Device dev, const TensorView& q,
                                const TensorView& k, const TensorView& v, const TensorView& out,
                                const TensorView& lse, const TensorView& dout,
                                const PackedSeqs& seqs, const AttentionConfig& cfg,
                                const TensorView& dq, const TensorView& dk, const TensorView& dv) {
  const QShape qs = check_prefill_call(op, dev, q, k, v, seqs, cfg, out, lse);
  LS_CHECK(lse.ndim != 0 || lse.data != nullptr, op,
           "argument 'lse' is required (the forward's [T, Hq] f32 log-sum-exp)");
  const int64_t T = qs.N, Hq = qs.Hq, Hkv = k.shape[1], D = qs.D;
  LS_CHECK(dout.ndim == 3, op, "argument 'dout' expected shape [T, Hq, D], got ",
           dout.shape_string());
  check_tensor(op, "dout", dout, DType::kBF16, {T, Hq, D}, dev);
  check_inner_contiguous(op, "dout", dout);
  struct Out {
    const char* name;
    const TensorView& t;
    int64_t heads;
  };
  const Out outs[] = {{"dq", dq, Hq}, {"dk", dk, Hkv}, {"dv", dv, Hkv}};
  for (const Out& o : outs) {
    LS_CHECK(o.t.ndim == 3, op, "argument '", o.name, "' expected shape [T, ",
             o.heads == Hq ? "Hq" : "Hkv", ", D], got ", o.t.shape_string());
    check_tensor(op, o.name, o.t, DType::kF32, {T, o.heads, D}, dev);
    check_inner_contiguous(op, o.name, o.t);
  }
  struct In {
    const char* name;
    const TensorView& t;
  };
  const In ins[] = {{"q", q}, {"k", k}, {"v", v}, {"out", out}, {"lse", lse}, {"dout", dout}};
  for (size_t a = 0; a < 3; ++a) {
    for (const In& in : ins) {
      LS_CHECK(!overlaps(outs[a].t, in.t), op, "argument '", outs[a].name, "' overlaps '", in.name,
               "'");
    }
    for (size_t b = a + 1; b < 3; ++b) {
      LS_CHECK(!overlaps(outs[a].t, outs[b].t), op, "argument '", outs[a].name, "' overlaps '",
               outs[b].name, "'");
    }
  }
  return qs;
}

}  // namespace lockstep::contract
