// Packed-attention case parts (attn_rows.h).
#include "ops/attn_rows.h"

#include <cstring>

#include "ops/row_case.h"

namespace lockstep::cases {
namespace {

// The rows' tensor `which` concatenated along tokens: [T, heads, D].
Tensor concat(const std::vector<const AttnRows*>& pack, Tensor AttnRows::*which, int64_t heads,
              int64_t D) {
  int64_t T = 0;
  for (const AttnRows* s : pack) T += s->len;
  Tensor t(DType::kBF16, {T, heads, D});
  int64_t at = 0;
  for (const AttnRows* s : pack) {
    const int64_t n = s->len * heads * D;
    if (n > 0) std::memcpy(t.ptr<bf16>() + at, (s->*which).ptr<bf16>(), size_t(n) * 2);
    at += n;
  }
  return t;
}

// A [T, heads, D] input: contiguous, or (strided) inside rows `pad` elements wider.
HostArg layout(const Tensor& t, int64_t heads, int64_t D, bool strided, int64_t pad) {
  if (!strided) return host_arg(t);
  const int64_t T = t.shape()[0];
  Tensor flat(t.dtype(), {T, heads * D});
  if (t.nbytes() > 0) std::memcpy(flat.data(), t.data(), size_t(t.nbytes()));
  HostArg a = padded(flat, pad);
  a.view = heads_view(a.view, heads, D);
  return a;
}

HostArg i32_arg(const std::vector<int32_t>& v) {
  Tensor t(DType::kI32, {int64_t(v.size())});
  if (!v.empty()) std::memcpy(t.data(), v.data(), v.size() * 4);
  return host_arg(std::move(t));
}

}  // namespace

AttnRows make_attn_rows(const AttnDims& d, int64_t len, DataKind kind, std::mt19937_64& g) {
  AttnRows s;
  s.len = len;
  s.q = Tensor(DType::kBF16, {len, d.Hq, d.D});
  s.k = Tensor(DType::kBF16, {len, d.Hkv, d.D});
  s.v = Tensor(DType::kBF16, {len, d.Hkv, d.D});
  s.dout = Tensor(DType::kBF16, {len, d.Hq, d.D});
  for (Tensor* t : {&s.q, &s.k, &s.v, &s.dout}) fill_bf16(t->ptr<bf16>(), t->numel(), kind, g);
  return s;
}

AttnRows join_rows(const AttnDims& d, const AttnRows& a, const AttnRows& b) {
  AttnRows s;
  s.len = a.len + b.len;
  const std::vector<const AttnRows*> both = {&a, &b};
  s.q = concat(both, &AttnRows::q, d.Hq, d.D);
  s.k = concat(both, &AttnRows::k, d.Hkv, d.D);
  s.v = concat(both, &AttnRows::v, d.Hkv, d.D);
  s.dout = concat(both, &AttnRows::dout, d.Hq, d.D);
  return s;
}

Outputs run_attention_pack(Ops& ops, Mem& mem, const AttnDims& d, const AttentionConfig& cfg,
                           const std::vector<const AttnRows*>& pack,
                           const std::vector<int32_t>& prompt_of, bool strided) {
  const int64_t Hq = d.Hq, Hkv = d.Hkv, D = d.D;
  std::vector<int32_t> cu{0};
  for (const AttnRows* s : pack) cu.push_back(cu.back() + int32_t(s->len));
  const int64_t T = cu.back();
  const HostArg cu_arg = i32_arg(cu), po_arg = i32_arg(prompt_of);
  const TensorView q = mem.in(layout(concat(pack, &AttnRows::q, Hq, D), Hq, D, strided, 5));
  const TensorView k = mem.in(layout(concat(pack, &AttnRows::k, Hkv, D), Hkv, D, strided, 3));
  const TensorView v = mem.in(layout(concat(pack, &AttnRows::v, Hkv, D), Hkv, D, strided, 8));
  const TensorView dout = mem.in(layout(concat(pack, &AttnRows::dout, Hq, D), Hq, D, strided, 7));
  const int64_t pad = strided ? 3 : 0;
  const TensorView out = mem.out(DType::kBF16, {T, Hq, D}, pad);
  const TensorView lse = mem.out(DType::kF32, {T, Hq}, pad);
  const TensorView dq = mem.out(DType::kF32, {T, Hq, D}, pad);
  const TensorView dk = mem.out(DType::kF32, {T, Hkv, D}, 2 * pad);
  const TensorView dv = mem.out(DType::kF32, {T, Hkv, D}, pad + 1);
  if (prompt_of.empty()) {
    ops.attention_prefill_varlen(q, k, v, mem.host(cu_arg), cfg, out, lse);
    ops.attention_backward_varlen(q, k, v, out, lse, dout, mem.host(cu_arg), cfg, dq, dk, dv);
  } else {
    const TensorView cuv = mem.host(cu_arg), pov = mem.host(po_arg);
    ops.attention_prefill_shared(q, k, v, cuv, pov, cfg, out, lse);
    ops.attention_backward_shared(q, k, v, out, lse, dout, cuv, pov, cfg, dq, dk, dv);
  }
  return {mem.read("out", out), mem.read("lse", lse), mem.read("dq", dq), mem.read("dk", dk),
          mem.read("dv", dv)};
}

void check_rows(const Check& check, const std::string& what, const Outputs& got, int64_t t_got,
                const Outputs& want, int64_t t_want, int64_t n, const std::vector<size_t>& which) {
  std::vector<size_t> outs = which;
  if (outs.empty())
    for (size_t o = 0; o < got.size(); ++o) outs.push_back(o);
  for (size_t o : outs) {
    Verdict all;
    for (int64_t r = 0; r < n && all.ok; ++r) {
      const Verdict v = compare_bits(got[o].row(t_got + r), want[o].row(t_want + r),
                                     got[o].row_elems, got[o].dtype);
      if (!v.ok) all = {false, "row " + num(r) + ": " + v.message};
    }
    check(got[o].name + " " + what, all);
  }
}

}  // namespace lockstep::cases
