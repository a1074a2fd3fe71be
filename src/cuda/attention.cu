// Launchers of the CUDA attention kernels (attention.cuh): the same argument checks as the CPU ops
// (the contract's, src/contract/checks.h, with host copies of the metadata), the work items of each
// mode (row tiles of one KV source x chunk ranges), the launch, and the split-KV / cascade /
// chunk-state plumbing. Every mode computes each (row, head) in the canonical order, so no choice
// made here (kernel, rows per CTA, splits, item order) can change bits.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "contract/checks.h"
#include "cuda/attention.cuh"
#include "cuda/attention_wg.cuh"
#include "cuda/tensor_map.h"
#include "lockstep/cuda/attention.h"
#include "lockstep/error.h"

namespace lockstep::cuda {
namespace {

using namespace attn_detail;
namespace ck = ::lockstep::contract;

void cuda_check(const char* op, cudaError_t e, const char* what) {
  LS_CHECK(e == cudaSuccess, op, what, " failed: ", cudaGetErrorString(e));
}

bool given(const TensorView& t) { return t.ndim != 0 || t.data != nullptr; }

// Number of elements spanned by a view with non-negative strides (0 when empty).
int64_t span_elems(const TensorView& t) {
  if (t.numel() == 0) return 0;
  int64_t last = 0;
  for (int d = 0; d < t.ndim; ++d) last += (t.shape[d] - 1) * t.stride[d];
  return last + 1;
}

// A metadata view readable on the host: host views as they are; device views copied back (one
// synchronous copy of the spanned bytes). Contents of device views are checked like host ones.
struct Meta {
  std::vector<uint8_t> buf;
  TensorView host;
};
Meta host_meta(const char* op, const char* arg, const TensorView& t, cudaStream_t s) {
  Meta m;
  m.host = t;
  if (t.device == Device::kCUDA && t.data != nullptr && t.numel() > 0) {
    for (int d = 0; d < t.ndim; ++d)
      LS_CHECK(t.stride[d] >= 0, op, "argument '", arg, "' must have non-negative strides");
    const size_t bytes = size_t(span_elems(t) * dtype_size(t.dtype));
    m.buf.resize(bytes);
    cuda_check(op, cudaMemcpyAsync(m.buf.data(), t.data, bytes, cudaMemcpyDeviceToHost, s),
               "metadata copy");
    cuda_check(op, cudaStreamSynchronize(s), "metadata copy");
    m.host.data = m.buf.data();
  }
  m.host.device = Device::kCPU;
  return m;
}

int num_sms() {
  static const int n = [] {
    int dev = 0, v = 132;
    if (cudaGetDevice(&dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess)
      return v;
    return 132;
  }();
  return n;
}

// 16-byte vector loads are possible: the base 16-byte aligned and every stride but the last (which
// is 1) a multiple of 8 elements.
bool vec16(const TensorView& t) {
  if ((reinterpret_cast<uintptr_t>(t.data) & 15u) != 0) return false;
  for (int d = 0; d + 1 < t.ndim; ++d)
    if (t.stride[d] % 8 != 0) return false;
  return true;
}

// s0, s1, s2 = the first three strides of t.
void strides3(const TensorView& t, int64_t& s0, int64_t& s1, int64_t& s2) {
  s0 = t.stride[0];
  s1 = t.stride[1];
  s2 = t.stride[2];
}

// ------------------------------------------------------------------------------------------------
// Kernel choice.

// The kernels, in the order of kKerns below.
enum class Kern { kCs64, kCs128, kKs64x, kKs128x, kKs64, kKs128, kKs256, kKs512 };

bool cs_ok(int64_t D, int64_t G) { return (D == 64 || D == 128) && G <= kCsCols; }

Kern pick(int64_t D, bool cs) {
  if (cs) return D == 64 ? Kern::kCs64 : Kern::kCs128;
  if (D == 64) return Kern::kKs64x;
  if (D == 128) return Kern::kKs128x;
  if (D <= 64) return Kern::kKs64;
  if (D <= 128) return Kern::kKs128;
  if (D <= 256) return Kern::kKs256;
  return Kern::kKs512;
}
int kern_cols(Kern k) { return (k == Kern::kCs64 || k == Kern::kCs128) ? kCsCols : kKsCols; }
int rows_per_item(Kern k, int64_t G) { return int(std::max<int64_t>(1, kern_cols(k) / G)); }

constexpr int kCsStages = 2;
// Key-split (decode) stages. NOTE: a decode CTA walks its chunk's blocks one after another, each
// step short and latency-bound, so CTAs per SM matter more than blocks in flight per CTA: one
// stage (4 CTAs per SM by registers) beat three (2 per SM by shared memory) on the engine's decode
// step and at large batches, and lost on small grids (docs/perf.md, session 20). The bits do not
// depend on the stage count.
template <int DM>
constexpr int ks_stages() {
  return DM <= 128 ? 1 : (DM <= 256 ? 2 : 1);
}

// NOTE: one template instance per kernel (the kernel is a template argument), so the
// once-per-process shared-memory attribute is set for every kernel, not just the first.
template <auto Kernel>
void launch_kernel(const char* op, int smem, dim3 grid, cudaStream_t s, const AttnParams& p) {
  static const cudaError_t attr =
      cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  LS_CHECK(attr == cudaSuccess, op, "cudaFuncSetAttribute failed: ", cudaGetErrorString(attr));
  Kernel<<<grid, kThreads, smem, s>>>(p);
}

// Name, dynamic shared memory and launcher of each kernel, in Kern's order.
struct KernInfo {
  const char* name;
  int smem;
  void (*launch)(const char* op, int smem, dim3 grid, cudaStream_t s, const AttnParams& p);
};
template <int DM, bool EXACT>
constexpr KernInfo ks_info(const char* name) {
  return {name, KsShape<DM, ks_stages<DM>()>::kSmem,
          launch_kernel<attn_ks_kernel<DM, EXACT, ks_stages<DM>()>>};
}
constexpr KernInfo kKerns[] = {
    {"cs<D=64>", CsShape<64, kCsStages>::kSmem, launch_kernel<attn_cs_kernel<64, kCsStages>>},
    {"cs<D=128>", CsShape<128, kCsStages>::kSmem, launch_kernel<attn_cs_kernel<128, kCsStages>>},
    ks_info<64, true>("ks<D=64>"),
    ks_info<128, true>("ks<D=128>"),
    ks_info<64, false>("ks<D<=64>"),
    ks_info<128, false>("ks<D<=128>"),
    ks_info<256, false>("ks<D<=256>"),
    ks_info<512, false>("ks<D<=512>"),
};
const KernInfo& kern_info(Kern k) { return kKerns[int(k)]; }

// ------------------------------------------------------------------------------------------------
// Work items on the host, then one upload of items, row lists and (host) block tables.

struct ItemPlan {
  int table = -1;  // -1 packed, 0 kv.block_table, 1 prefix.block_table
  int64_t own_row = 0;
  int64_t shared_row = -1;  // prefix table row, or -1
  int64_t base = 0, shared_base = 0;
  int32_t own_pages = 0, shared_pages = 0, shared_len = 0;
  int32_t rb = 0, nr = 0, c_lo = 0, c_hi = std::numeric_limits<int32_t>::max();
  int64_t cost = 0;
};

struct Plan {
  std::vector<ItemPlan> items;
  std::vector<int32_t> row_ids, row_pos;
  int32_t max_nr = 0;
};

// Device scratch of one call: freed in stream order when the call returns.
struct Scratch {
  cudaStream_t s = nullptr;
  std::vector<void*> ptrs;
  explicit Scratch(cudaStream_t st) : s(st) {}
  ~Scratch() {
    for (void* p : ptrs) cudaFreeAsync(p, s);
  }
  void* alloc(const char* op, size_t bytes) {
    void* p = nullptr;
    cuda_check(op, cudaMallocAsync(&p, std::max<size_t>(bytes, 16), s), "cudaMallocAsync");
    ptrs.push_back(p);
    return p;
  }
  template <typename T>
  T* upload(const char* op, const T* data, size_t n) {
    T* d = static_cast<T*>(alloc(op, n * sizeof(T)));
    if (n > 0)
      cuda_check(op, cudaMemcpyAsync(d, data, n * sizeof(T), cudaMemcpyHostToDevice, s), "upload");
    return d;
  }
};

// A block table usable by the kernels: the device view itself, or an uploaded copy.
const int32_t* device_table(const char* op, const TensorView& t, Scratch& scr) {
  if (t.device == Device::kCUDA) return t.ptr<const int32_t>();
  return scr.upload(op, t.ptr<const int32_t>(), size_t(span_elems(t)));
}

struct Uploaded {
  const AttnItem* items = nullptr;
  const int32_t* row_ids = nullptr;
  const int32_t* row_pos = nullptr;
  const uint8_t* extra = nullptr;  // optional per-row bytes (cascade: has_prefix)
};

// Items, row lists and optional per-row bytes in ONE allocation and ONE copy.
Uploaded upload_plan(const char* op, const Plan& plan, const int32_t* kv_bt, int64_t kv_bt_s0,
                     const int32_t* px_bt, int64_t px_bt_s0, Scratch& scr,
                     const std::vector<uint8_t>* extra = nullptr) {
  std::vector<AttnItem> items(plan.items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    const ItemPlan& ip = plan.items[i];
    AttnItem& it = items[i];
    std::memset(&it, 0, sizeof it);
    if (ip.table == 0) it.own = kv_bt + ip.own_row * kv_bt_s0;
    if (ip.table == 1) it.own = px_bt + ip.own_row * px_bt_s0;
    it.shared = ip.shared_row >= 0 ? px_bt + ip.shared_row * px_bt_s0 : nullptr;
    it.base = ip.base;
    it.shared_base = ip.shared_base;
    it.own_pages = ip.own_pages;
    it.shared_pages = ip.shared_pages;
    it.shared_len = ip.shared_len;
    it.rb = ip.rb;
    it.nr = ip.nr;
    it.c_lo = ip.c_lo;
    it.c_hi = ip.c_hi;
  }
  std::vector<uint8_t> blob;
  auto put = [&](const void* d, size_t bytes) {
    const size_t off = (blob.size() + 63) & ~size_t(63);
    blob.resize(off + bytes);
    if (bytes > 0) std::memcpy(blob.data() + off, d, bytes);
    return off;
  };
  const size_t o_items = put(items.data(), items.size() * sizeof(AttnItem));
  const size_t o_ids = put(plan.row_ids.data(), plan.row_ids.size() * 4);
  const size_t o_pos = put(plan.row_pos.data(), plan.row_pos.size() * 4);
  const size_t o_extra = extra ? put(extra->data(), extra->size()) : 0;
  uint8_t* base = scr.upload(op, blob.data(), blob.size());
  Uploaded u;
  u.items = reinterpret_cast<const AttnItem*>(base + o_items);
  u.row_ids = reinterpret_cast<const int32_t*>(base + o_ids);
  u.row_pos = reinterpret_cast<const int32_t*>(base + o_pos);
  if (extra) u.extra = base + o_extra;
  return u;
}

// Each item's cost (64-key blocks), then longest items first (better tail); the order never
// changes bits.
void sort_items(Plan& plan, int64_t K) {
  for (ItemPlan& ip : plan.items) {
    int64_t lim = -1;
    for (int32_t i = ip.rb; i < ip.rb + ip.nr; ++i) lim = std::max<int64_t>(lim, plan.row_pos[i]);
    const int64_t lo = int64_t(ip.c_lo) * K;
    const int64_t hi = std::min<int64_t>(int64_t(ip.c_hi) * K, lim + 1);
    ip.cost = hi > lo ? (hi - lo + kBlk - 1) / kBlk : 0;
  }
  std::stable_sort(plan.items.begin(), plan.items.end(),
                   [](const ItemPlan& a, const ItemPlan& b) { return a.cost > b.cost; });
}

// Sorts the plan's items, uploads them (with the block tables' rows they read and the optional
// per-row bytes, then prm.has_prefix), and launches `kern` over them: grid (items, Hkv, column
// blocks of the longest item). Returns the uploaded lists.
Uploaded launch_plan(const char* op, Kern kern, Plan& plan, AttnParams& prm, int64_t Hkv,
                     const int32_t* kv_bt, int64_t kv_bt_s0, const int32_t* px_bt, int64_t px_bt_s0,
                     Scratch& scr, cudaStream_t s, const std::vector<uint8_t>* extra = nullptr) {
  sort_items(plan, prm.K);
  const Uploaded u = upload_plan(op, plan, kv_bt, kv_bt_s0, px_bt, px_bt_s0, scr, extra);
  prm.items = u.items;
  prm.row_ids = u.row_ids;
  prm.row_pos = u.row_pos;
  if (extra) prm.has_prefix = u.extra;
  const int64_t items = int64_t(plan.items.size());
  const int64_t zb = (int64_t(plan.max_nr) * prm.G + kern_cols(kern) - 1) / kern_cols(kern);
  if (items == 0) return u;
  LS_CHECK(items < (int64_t(1) << 31) && Hkv <= 65535 && zb <= 65535, op,
           "problem too large for one launch (items ", items, ", kv heads ", Hkv, ")");
  const dim3 grid{unsigned(items), unsigned(Hkv), unsigned(zb)};
  kern_info(kern).launch(op, kern_info(kern).smem, grid, s, prm);
  cuda_check(op, cudaGetLastError(), "kernel launch");
  return u;
}

void base_params(AttnParams& p, const TensorView& q, int64_t G, const AttentionConfig& cfg) {
  std::memset(&p, 0, sizeof p);
  p.q = q.ptr<const uint16_t>();
  p.q_s0 = q.stride[0];
  p.q_s1 = q.stride[1];
  p.Hq = int32_t(q.shape[1]);
  p.D = int32_t(q.shape[2]);
  p.G = int32_t(G);
  p.K = cfg.kv_chunk;
  p.scale = cfg.scale_log2(q.shape[2]);
  p.q_vec = vec16(q);
}

void set_outputs(AttnParams& p, const TensorView& out, const TensorView& lse) {
  p.out = out.ptr<uint16_t>();
  p.o_s0 = out.stride[0];
  p.o_s1 = out.stride[1];
  if (given(lse) && lse.numel() > 0) {
    p.lse = lse.ptr<float>();
    p.l_s0 = lse.stride[0];
    p.l_s1 = lse.stride[1];
  }
}

void set_cache(AttnParams& p, const TensorView& k_cache, const TensorView& v_cache) {
  p.k = k_cache.ptr<const uint16_t>();
  p.v = v_cache.ptr<const uint16_t>();
  strides3(k_cache, p.k_s0, p.k_s1, p.k_sh);
  strides3(v_cache, p.v_s0, p.v_s1, p.v_sh);
  p.NP = k_cache.shape[0];
  p.P = int32_t(k_cache.shape[1]);
  p.kv_vec = vec16(k_cache) && vec16(v_cache);
}

void set_states(AttnParams& p, const AttentionChunkStates& st, int64_t c0) {
  p.st_m = st.m.ptr<float>();
  p.st_l = st.l.ptr<float>();
  p.st_acc = st.acc.ptr<float>();
  strides3(st.m, p.sm0, p.sm1, p.sm2);
  strides3(st.l, p.sl0, p.sl1, p.sl2);
  strides3(st.acc, p.sa0, p.sa1, p.sa2);
  p.st_c0 = c0;
}

void launch_merge(const char* op, const AttentionChunkStates& st, const int32_t* pos_dev, int64_t N,
                  int64_t Hq, int64_t D, int K, const TensorView& out, const TensorView& lse,
                  cudaStream_t s) {
  if (N == 0 || Hq == 0) return;
  MergeParams mp;
  std::memset(&mp, 0, sizeof mp);
  mp.m = st.m.ptr<const float>();
  mp.l = st.l.ptr<const float>();
  mp.acc = st.acc.ptr<const float>();
  strides3(st.m, mp.m0, mp.m1, mp.m2);
  strides3(st.l, mp.l0, mp.l1, mp.l2);
  strides3(st.acc, mp.a0, mp.a1, mp.a2);
  mp.pos = pos_dev;
  mp.Hq = int32_t(Hq);
  mp.D = int32_t(D);
  mp.K = K;
  mp.out = out.ptr<uint16_t>();
  mp.o_s0 = out.stride[0];
  mp.o_s1 = out.stride[1];
  if (given(lse) && lse.numel() > 0) {
    mp.lse = lse.ptr<float>();
    mp.ls0 = lse.stride[0];
    mp.ls1 = lse.stride[1];
  }
  LS_CHECK(N * Hq < (int64_t(1) << 31), op, "too many (row, head) pairs for the merge");
  attn_merge_kernel<<<unsigned(N * Hq), kMergeThreads, 0, s>>>(mp);
  cuda_check(op, cudaGetLastError(), "merge kernel launch");
}

// ------------------------------------------------------------------------------------------------
// Paged plumbing shared by attention_paged / split-KV / chunk states / cascade.

// The view-based entry points' metadata: device views of q_seq, q_pos, seq_lens, shared_len and
// seq_group copied back to the host, then everything checked and the meta built (block tables
// on the device are neither copied back nor checked: their contents are trusted, the kernels
// treat an entry outside the table or the cache as a zero key; host tables are checked exactly
// like the CPU op does). The meta's views point into the copies held here.
struct ViewMeta {
  Meta q_seq, q_pos, seq_lens, px_len, px_group;
  std::optional<PagedMeta> meta;
};

ViewMeta view_meta(const char* op, const TensorView& q, const TensorView& q_seq,
                   const TensorView& q_pos, const PagedKv& kv, const SharedPrefix* prefix,
                   const AttentionConfig& cfg, int64_t c_lo, int64_t c_hi, cudaStream_t s) {
  ViewMeta a;
  a.q_seq = host_meta(op, "q_seq", q_seq, s);
  a.q_pos = host_meta(op, "q_pos", q_pos, s);
  a.seq_lens = host_meta(op, "kv.seq_lens", kv.seq_lens, s);
  PagedKv hkv{kv.k_cache, kv.v_cache, kv.block_table, a.seq_lens.host};
  SharedPrefix hpx;
  if (prefix != nullptr) {
    a.px_len = host_meta(op, "prefix.shared_len", prefix->shared_len, s);
    a.px_group = host_meta(op, "prefix.seq_group", prefix->seq_group, s);
    hpx = SharedPrefix{prefix->block_table, a.px_len.host, a.px_group.host};
  }
  a.meta = ck::check_paged(op, Device::kCUDA, q, a.q_seq.host, a.q_pos.host, hkv,
                           prefix ? &hpx : nullptr, cfg, c_lo, c_hi);
  return a;
}

// Tiles of consecutive rows of one sequence (at most R rows), identity row list.
void paged_tiles(Plan& plan, const ck::Paged& p, int R, bool prefix, int64_t MPs, int64_t K,
                 bool cascade_lo) {
  const int64_t N = p.qs.N;
  const int32_t rb0 = int32_t(plan.row_ids.size());
  for (int64_t r = 0; r < N; ++r) {
    plan.row_ids.push_back(int32_t(r));
    plan.row_pos.push_back(int32_t(p.pos[size_t(r)]));
  }
  for (int64_t r = 0; r < N;) {
    int64_t e = r + 1;
    while (e < N && e - r < R && p.seq[size_t(e)] == p.seq[size_t(r)]) ++e;
    ItemPlan ip;
    const int64_t sq = p.seq[size_t(r)];
    ip.table = 0;
    ip.own_row = sq;
    ip.own_pages = int32_t(p.MP);
    ip.rb = rb0 + int32_t(r);
    ip.nr = int32_t(e - r);
    const int64_t g = p.group[size_t(sq)];
    if (prefix && g >= 0) {
      ip.shared_row = g;
      ip.shared_pages = int32_t(MPs);
      ip.shared_len = int32_t(p.shared_len[size_t(g)]);
      if (cascade_lo) ip.c_lo = int32_t(p.shared_len[size_t(g)] / K);
    }
    plan.max_nr = std::max(plan.max_nr, ip.nr);
    plan.items.push_back(ip);
    r = e;
  }
}

// Whether rows come in runs of one sequence long enough for the 64-column kernel.
bool multi_row(const ck::Paged& p, int64_t G) {
  const int64_t N = p.qs.N;
  int64_t runs = 0;
  for (int64_t r = 0; r < N; ++r)
    if (r == 0 || p.seq[size_t(r)] != p.seq[size_t(r - 1)]) ++runs;
  const int64_t ks_rows = std::max<int64_t>(1, kKsCols / G);
  return runs > 0 && N >= 2 * ks_rows * runs;
}

void paged_run(const char* op, const TensorView& q, const PagedMeta& meta,
               const TensorView& k_cache, const TensorView& v_cache, const AttentionConfig& cfg,
               int64_t num_splits, const TensorView& out, const TensorView& lse, cudaStream_t s) {
  const ck::Paged p =
      ck::check_paged_call(op, Device::kCUDA, q, meta, k_cache, v_cache, cfg, false, out, lse);
  const TensorView& table = meta.device_copies().block_table;
  const int64_t N = p.qs.N, Hq = p.qs.Hq, D = p.qs.D, G = Hq / p.Hkv, K = cfg.kv_chunk;
  if (N == 0) return;
  const Kern kern = pick(D, cs_ok(D, G) && multi_row(p, G));
  Plan plan;
  paged_tiles(plan, p, rows_per_item(kern, G), false, 0, K, false);
  const int64_t zb = (int64_t(plan.max_nr) * G + kern_cols(kern) - 1) / kern_cols(kern);
  int64_t cmax = 1;
  for (int64_t r = 0; r < N; ++r) cmax = std::max(cmax, p.pos[size_t(r)] / K + 1);
  if (num_splits == 0) {
    // Automatic: split whole chunks over CTAs when the tiles cannot fill the GPU. Bits are the
    // same for every split count.
    const int64_t ctas = int64_t(plan.items.size()) * p.Hkv * zb;
    const double ws = double(N) * double(Hq) * double(cmax) * double(D + 2) * 4.0;
    num_splits = 1;
    if (cmax > 1 && ctas < 2 * num_sms() && ws < 256.0 * (1 << 20))
      num_splits = std::min<int64_t>(cmax, (2 * num_sms() + ctas - 1) / ctas);
  }
  Scratch scr(s);
  const int32_t* bt = device_table(op, table, scr);
  AttnParams prm;
  base_params(prm, q, G, cfg);
  set_cache(prm, k_cache, v_cache);
  set_outputs(prm, out, lse);
  if (num_splits <= 1) {
    prm.finish = kFinalize;
    launch_plan(op, kern, plan, prm, p.Hkv, bt, table.stride[0], nullptr, 0, scr, s);
    return;
  }
  // Split-KV: each tile's chunks [0, Ct) cut into num_splits ranges; chunk states to a workspace;
  // then the left-to-right merge.
  Plan sp;
  sp.row_ids = plan.row_ids;
  sp.row_pos = plan.row_pos;
  sp.max_nr = plan.max_nr;
  for (const ItemPlan& b : plan.items) {
    int64_t ct = 0;
    for (int32_t i = b.rb; i < b.rb + b.nr; ++i)
      ct = std::max<int64_t>(ct, plan.row_pos[size_t(i)] / K + 1);
    for (int64_t si = 0; si < num_splits; ++si) {
      ItemPlan t = b;
      t.c_lo = int32_t(ct * si / num_splits);
      t.c_hi = int32_t(ct * (si + 1) / num_splits);
      if (t.c_hi <= t.c_lo) continue;
      sp.items.push_back(t);
    }
  }
  const size_t nst = size_t(N * Hq * cmax);
  float* ws_m = static_cast<float*>(scr.alloc(op, nst * size_t(D + 2) * 4));
  float* ws_l = ws_m + nst;
  float* ws_a = ws_l + nst;
  AttentionChunkStates st{
      TensorView::contiguous(ws_m, DType::kF32, {N, Hq, cmax}, Device::kCUDA),
      TensorView::contiguous(ws_l, DType::kF32, {N, Hq, cmax}, Device::kCUDA),
      TensorView::contiguous(ws_a, DType::kF32, {N, Hq, cmax, D}, Device::kCUDA)};
  prm.finish = kStoreChunks;
  set_states(prm, st, 0);
  const Uploaded u = launch_plan(op, kern, sp, prm, p.Hkv, bt, table.stride[0], nullptr, 0, scr, s);
  // Row list is the identity over rows 0..N-1: row_pos doubles as the per-row positions.
  launch_merge(op, st, u.row_pos, N, Hq, D, cfg.kv_chunk, out, lse, s);
}

// ------------------------------------------------------------------------------------------------
// The Hopper prefill kernel (attention_wg.cuh): packed varlen, head_dim 128, rows TMA can read.

// [rows, heads, 128] bf16 with the heads of a row adjacent (stride 128), the row stride a multiple
// of 8 elements (16 bytes) and a 16-byte aligned base: one 2-D tensor map [rows, heads·128].
bool tma_rows(const TensorView& t) {
  return t.ndim == 3 && t.shape[2] == attn_wg::kD && t.stride[2] == 1 &&
         (t.shape[1] == 1 || t.stride[1] == attn_wg::kD) && t.stride[0] % 8 == 0 &&
         (reinterpret_cast<uintptr_t>(t.data) & 15u) == 0 && t.shape[0] < (int64_t(1) << 31) - 256;
}

bool wg_prefill_ok(const ck::QShape& qs, const TensorView& q, const TensorView& k,
                   const TensorView& v, const TensorView& out) {
  static const bool sm90 = [] {
    int dev = 0, major = 0;
    return cudaGetDevice(&dev) == cudaSuccess &&
           cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
           major == 9 && detail::tensor_map_encoder() != nullptr;
  }();
  // out: 4-byte stores of column pairs.
  const bool out_ok = out.stride[2] == 1 && out.stride[0] % 2 == 0 && out.stride[1] % 2 == 0 &&
                      (reinterpret_cast<uintptr_t>(out.data) & 3u) == 0;
  return sm90 && qs.D == attn_wg::kD && tma_rows(q) && tma_rows(k) && tma_rows(v) && out_ok;
}

template <auto Kernel>
void launch_wg(const char* op, dim3 grid, cudaStream_t s, const CUtensorMap& tq,
               const CUtensorMap& tk, const CUtensorMap& tv, const attn_wg::Params& p) {
  static const cudaError_t attr =
      cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, attn_wg::kSmem);
  LS_CHECK(attr == cudaSuccess, op, "cudaFuncSetAttribute failed: ", cudaGetErrorString(attr));
  Kernel<<<grid, attn_wg::kThreads, attn_wg::kSmem, s>>>(tq, tk, tv, p);
}

// Tiles of 128 positions, the costliest first (a tile's blocks grow with its position), each over
// every query head (adjacent CTAs share a kv head's K/V in L2). The order never changes bits.
void prefill_wg(const char* op, const ck::QShape& qs, const TensorView& q, const TensorView& k,
                const TensorView& v, std::span<const int64_t> cu, const AttentionConfig& cfg,
                const TensorView& out, const TensorView& lse, cudaStream_t s) {
  const int64_t Hkv = k.shape[1], B = int64_t(cu.size()) - 1;
  struct SeqTile {
    int64_t cost;
    attn_wg::Tile t;
  };
  std::vector<SeqTile> st;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t t0 = cu[size_t(b)], len = cu[size_t(b + 1)] - t0;
    for (int64_t r0 = 0; r0 < len; r0 += attn_wg::kRows)
      st.push_back({std::min<int64_t>(r0 + attn_wg::kRows, len),
                    attn_wg::Tile{int32_t(t0), int32_t(len), int32_t(r0), 0}});
  }
  std::stable_sort(st.begin(), st.end(),
                   [](const SeqTile& a, const SeqTile& b) { return a.cost > b.cost; });
  std::vector<attn_wg::Tile> tiles;
  tiles.reserve(st.size() * size_t(qs.Hq));
  for (const SeqTile& x : st)
    for (int64_t h = 0; h < qs.Hq; ++h) {
      attn_wg::Tile t = x.t;
      t.head = int32_t(h);
      tiles.push_back(t);
    }
  if (tiles.empty()) return;
  LS_CHECK(tiles.size() < (size_t(1) << 31), op, "problem too large for one launch (", tiles.size(),
           " tiles)");
  CUtensorMap tq, tk, tv;
  const CUresult rq = detail::encode_bf16_tensor_map(
      &tq, q.ptr<const uint16_t>(), q.shape[0], qs.Hq * attn_wg::kD, q.stride[0], attn_wg::kRows);
  const CUresult rk = detail::encode_bf16_tensor_map(&tk, k.ptr<const uint16_t>(), k.shape[0],
                                                     Hkv * attn_wg::kD, k.stride[0], attn_wg::kBlk);
  const CUresult rv = detail::encode_bf16_tensor_map(&tv, v.ptr<const uint16_t>(), v.shape[0],
                                                     Hkv * attn_wg::kD, v.stride[0], attn_wg::kBlk);
  LS_CHECK(rq == CUDA_SUCCESS && rk == CUDA_SUCCESS && rv == CUDA_SUCCESS, op,
           "cuTensorMapEncodeTiled failed (", int(rq), ", ", int(rk), ", ", int(rv), ")");
  Scratch scr(s);
  attn_wg::Params p{};
  p.tiles = scr.upload(op, tiles.data(), tiles.size());
  p.G = int32_t(qs.Hq / Hkv);
  p.K = cfg.kv_chunk;
  p.scale = cfg.scale_log2(qs.D);
  AttnParams o;  // the outputs' pointers and strides, as every other mode sets them
  std::memset(&o, 0, sizeof o);
  set_outputs(o, out, lse);
  p.out = o.out;
  p.o_s0 = o.o_s0;
  p.o_s1 = o.o_s1;
  p.lse = o.lse;
  p.l_s0 = o.l_s0;
  p.l_s1 = o.l_s1;
  launch_wg<attn_wg::attn_wg_prefill_kernel>(op, dim3{unsigned(tiles.size())}, s, tq, tk, tv, p);
  cuda_check(op, cudaGetLastError(), "kernel launch");
}

// Packed rows in segments cu (checked): segment b at positions 0 .. len-1, or, when prompt_of[b] >=
// 0 (shared-prompt completions, §B.11; prompt_of empty: none), at positions Lp .. Lp+len-1 reading
// the keys below Lp from its prompt's rows. Items of at most R rows of one segment.
void prefill_packed(const char* op, const ck::QShape& qs, const TensorView& q, const TensorView& k,
                    const TensorView& v, std::span<const int64_t> cu,
                    std::span<const int64_t> prompt_of, const AttentionConfig& cfg,
                    const TensorView& out, const TensorView& lse, cudaStream_t s) {
  const int64_t T = qs.N, Hkv = k.shape[1], G = qs.Hq / Hkv, B = int64_t(cu.size()) - 1;
  if (T == 0) return;
  if (prompt_of.empty() && wg_prefill_ok(qs, q, k, v, out)) {
    prefill_wg(op, qs, q, k, v, cu, cfg, out, lse, s);
    return;
  }
  const Kern kern = pick(qs.D, cs_ok(qs.D, G));
  const int R = rows_per_item(kern, G);
  Plan plan;
  plan.row_ids.resize(size_t(T));
  plan.row_pos.resize(size_t(T));
  for (int64_t b = 0; b < B; ++b) {
    const int64_t t0 = cu[size_t(b)], t1 = cu[size_t(b + 1)];
    const int64_t pr = prompt_of.empty() ? -1 : prompt_of[size_t(b)];
    const int64_t lp = pr < 0 ? 0 : cu[size_t(pr + 1)] - cu[size_t(pr)];
    for (int64_t t = t0; t < t1; ++t) {
      plan.row_ids[size_t(t)] = int32_t(t);
      plan.row_pos[size_t(t)] = int32_t(lp + t - t0);
    }
    for (int64_t r = t0; r < t1; r += R) {
      ItemPlan ip;
      ip.table = -1;
      ip.base = t0 - lp;  // position j >= lp is token t0 + (j - lp)
      if (pr >= 0) {
        ip.shared_base = cu[size_t(pr)];
        ip.shared_len = int32_t(lp);
      }
      ip.rb = int32_t(r);
      ip.nr = int32_t(std::min<int64_t>(R, t1 - r));
      plan.max_nr = std::max(plan.max_nr, ip.nr);
      plan.items.push_back(ip);
    }
  }
  Scratch scr(s);
  AttnParams p;
  base_params(p, q, G, cfg);
  p.k = k.ptr<const uint16_t>();
  p.v = v.ptr<const uint16_t>();
  p.k_s0 = k.stride[0];
  p.k_sh = k.stride[1];
  p.v_s0 = v.stride[0];
  p.v_sh = v.stride[1];
  p.P = 1;
  p.kv_vec = vec16(k) && vec16(v);
  p.finish = kFinalize;
  set_outputs(p, out, lse);
  launch_plan(op, kern, plan, p, Hkv, nullptr, 0, nullptr, 0, scr, s);
}

}  // namespace

// ------------------------------------------------------------------------------------------------

void attention_prefill_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                              const TensorView& cu_seqlens, const AttentionConfig& cfg,
                              const TensorView& out, const TensorView& lse, void* stream) {
  const char* op = "cuda::attention_prefill_varlen";
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const Meta cu = host_meta(op, "cu_seqlens", cu_seqlens, s);
  const PackedSeqs seqs =
      ck::check_prefill_varlen(op, Device::kCUDA, q, k, v, cu.host, cfg, out, lse);
  attention_prefill_varlen(q, k, v, seqs, cfg, out, lse, stream);
}

void attention_prefill_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                              const PackedSeqs& seqs, const AttentionConfig& cfg,
                              const TensorView& out, const TensorView& lse, void* stream) {
  const char* op = "cuda::attention_prefill_varlen";
  const ck::QShape qs = ck::check_prefill_call(op, Device::kCUDA, q, k, v, seqs, cfg, out, lse);
  prefill_packed(op, qs, q, k, v, seqs.cu(), {}, cfg, out, lse, static_cast<cudaStream_t>(stream));
}

void attention_prefill_shared(const TensorView& q, const TensorView& k, const TensorView& v,
                              const SharedPromptSeqs& segs, const AttentionConfig& cfg,
                              const TensorView& out, const TensorView& lse, void* stream) {
  const char* op = "cuda::attention_prefill_shared";
  const ck::QShape qs =
      ck::check_prefill_call(op, Device::kCUDA, q, k, v, segs.segments(), cfg, out, lse);
  prefill_packed(op, qs, q, k, v, segs.cu(), segs.prompt_of(), cfg, out, lse,
                 static_cast<cudaStream_t>(stream));
}

void attention_paged(const TensorView& q, const TensorView& q_seq, const TensorView& q_pos,
                     const PagedKv& kv, const AttentionConfig& cfg, const TensorView& out,
                     const TensorView& lse, void* stream) {
  const char* op = "cuda::attention_paged";
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const ViewMeta a = view_meta(op, q, q_seq, q_pos, kv, nullptr, cfg, 0, ck::kAllChunks, s);
  paged_run(op, q, *a.meta, kv.k_cache, kv.v_cache, cfg, 0, out, lse, s);
}

void attention_paged_split_kv(const TensorView& q, const TensorView& q_seq, const TensorView& q_pos,
                              const PagedKv& kv, const AttentionConfig& cfg, int num_splits,
                              const TensorView& out, const TensorView& lse, void* stream) {
  const char* op = "cuda::attention_paged_split_kv";
  LS_CHECK(num_splits >= 1, op, "num_splits must be >= 1, got ", num_splits);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const ViewMeta a = view_meta(op, q, q_seq, q_pos, kv, nullptr, cfg, 0, ck::kAllChunks, s);
  paged_run(op, q, *a.meta, kv.k_cache, kv.v_cache, cfg, num_splits, out, lse, s);
}

namespace {

void paged_cascade(const char* op, const TensorView& q, const PagedMeta& meta,
                   const TensorView& k_cache, const TensorView& v_cache, const AttentionConfig& cfg,
                   const TensorView& out, const TensorView& lse, cudaStream_t s) {
  const ck::Paged p =
      ck::check_paged_call(op, Device::kCUDA, q, meta, k_cache, v_cache, cfg, true, out, lse);
  const int64_t N = p.qs.N, Hq = p.qs.Hq, D = p.qs.D, G = Hq / p.Hkv, K = cfg.kv_chunk;
  if (N == 0) return;
  const int64_t GR = int64_t(p.shared_len.size());
  const int64_t MPs = meta.MPs();
  const TensorView& table = meta.device_copies().block_table;
  const TensorView& ptable = meta.device_copies().prefix_block_table;
  Scratch scr(s);
  const int32_t* bt = device_table(op, table, scr);
  const int32_t* pbt = device_table(op, ptable, scr);
  const int64_t pbt_s0 = ptable.stride[0];

  // Phase 1: per group, its rows over the chunks wholly below shared_len, from the shared pages;
  // the folded state per (row, head) goes to a workspace.
  std::vector<uint8_t> has_prefix(size_t(N), 0);
  std::vector<std::vector<int32_t>> rows_of(static_cast<size_t>(GR));
  for (int64_t r = 0; r < N; ++r) {
    const int64_t g = p.group[size_t(p.seq[size_t(r)])];
    if (g >= 0 && p.shared_len[size_t(g)] / K > 0) {
      rows_of[size_t(g)].push_back(int32_t(r));
      has_prefix[size_t(r)] = 1;
    }
  }
  float* prefix_ws = nullptr;
  {
    Plan p1;
    int64_t total = 0, groups = 0;
    for (const auto& rows : rows_of) {
      total += int64_t(rows.size());
      groups += rows.empty() ? 0 : 1;
    }
    if (total > 0) {
      const bool cs = cs_ok(D, G) && total >= 2 * std::max<int64_t>(1, kKsCols / G) * groups;
      const Kern kern = pick(D, cs);
      const int R = rows_per_item(kern, G);
      for (int64_t g = 0; g < GR; ++g) {
        const auto& rows = rows_of[size_t(g)];
        const int32_t rb0 = int32_t(p1.row_ids.size());
        for (int32_t r : rows) {
          p1.row_ids.push_back(r);
          p1.row_pos.push_back(int32_t(p.pos[size_t(r)]));
        }
        for (int64_t i = 0; i < int64_t(rows.size()); i += R) {
          ItemPlan ip;
          ip.table = 1;
          ip.own_row = g;
          ip.own_pages = int32_t(MPs);
          ip.rb = rb0 + int32_t(i);
          ip.nr = int32_t(std::min<int64_t>(R, int64_t(rows.size()) - i));
          ip.c_lo = 0;
          ip.c_hi = int32_t(p.shared_len[size_t(g)] / K);
          p1.max_nr = std::max(p1.max_nr, ip.nr);
          p1.items.push_back(ip);
        }
      }
      prefix_ws = static_cast<float*>(scr.alloc(op, size_t(N * Hq * (D + 2)) * 4));
      AttnParams prm;
      base_params(prm, q, G, cfg);
      set_cache(prm, k_cache, v_cache);
      prm.finish = kStorePrefix;
      prm.prefix = prefix_ws;
      launch_plan(op, kern, p1, prm, p.Hkv, bt, table.stride[0], pbt, pbt_s0, scr, s);
    }
  }
  // Phase 2: every row continues from its prefix state with its remaining chunks, reading
  // positions < shared_len from the shared pages and the rest from its own table.
  const Kern kern = pick(D, cs_ok(D, G) && multi_row(p, G));
  Plan p2;
  paged_tiles(p2, p, rows_per_item(kern, G), true, MPs, K, true);
  AttnParams prm;
  base_params(prm, q, G, cfg);
  set_cache(prm, k_cache, v_cache);
  set_outputs(prm, out, lse);
  prm.finish = kFinalize;
  prm.prefix = prefix_ws;
  // Rows continue from a prefix state only when phase 1 ran (has_prefix is read with prefix).
  launch_plan(op, kern, p2, prm, p.Hkv, bt, table.stride[0], pbt, pbt_s0, scr, s,
              prefix_ws != nullptr ? &has_prefix : nullptr);
}

}  // namespace

void attention_paged(const TensorView& q, const PagedMeta& meta, const TensorView& k_cache,
                     const TensorView& v_cache, const AttentionConfig& cfg, const TensorView& out,
                     const TensorView& lse, void* stream) {
  paged_run("cuda::attention_paged", q, meta, k_cache, v_cache, cfg, 0, out, lse,
            static_cast<cudaStream_t>(stream));
}

void attention_paged_split_kv(const TensorView& q, const PagedMeta& meta, const TensorView& k_cache,
                              const TensorView& v_cache, const AttentionConfig& cfg, int num_splits,
                              const TensorView& out, const TensorView& lse, void* stream) {
  const char* op = "cuda::attention_paged_split_kv";
  LS_CHECK(num_splits >= 1, op, "num_splits must be >= 1, got ", num_splits);
  paged_run(op, q, meta, k_cache, v_cache, cfg, num_splits, out, lse,
            static_cast<cudaStream_t>(stream));
}

void attention_paged_cascade(const TensorView& q, const PagedMeta& meta, const TensorView& k_cache,
                             const TensorView& v_cache, const AttentionConfig& cfg,
                             const TensorView& out, const TensorView& lse, void* stream) {
  paged_cascade("cuda::attention_paged_cascade", q, meta, k_cache, v_cache, cfg, out, lse,
                static_cast<cudaStream_t>(stream));
}

void attention_paged_cascade(const TensorView& q, const TensorView& q_seq, const TensorView& q_pos,
                             const PagedKv& kv, const SharedPrefix& prefix,
                             const AttentionConfig& cfg, const TensorView& out,
                             const TensorView& lse, void* stream) {
  const char* op = "cuda::attention_paged_cascade";
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const ViewMeta a = view_meta(op, q, q_seq, q_pos, kv, &prefix, cfg, 0, ck::kAllChunks, s);
  paged_cascade(op, q, *a.meta, kv.k_cache, kv.v_cache, cfg, out, lse, s);
}

void attention_paged_chunk_states(const TensorView& q, const TensorView& q_seq,
                                  const TensorView& q_pos, const PagedKv& kv,
                                  const AttentionConfig& cfg, int64_t chunk_begin,
                                  const AttentionChunkStates& states, void* stream) {
  const char* op = "cuda::attention_paged_chunk_states";
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  LS_CHECK(chunk_begin >= 0, op, "chunk_begin must be >= 0, got ", chunk_begin);
  LS_CHECK(states.m.ndim == 3, op, "argument 'states.m' expected shape [N, Hq, C], got ",
           states.m.shape_string());
  const int64_t C = states.m.shape[2];
  const ViewMeta a =
      view_meta(op, q, q_seq, q_pos, kv, nullptr, cfg, chunk_begin, chunk_begin + C, s);
  const ck::Paged p = ck::paged_problem(q, kv.k_cache, *a.meta);
  const int64_t N = p.qs.N, Hq = p.qs.Hq, D = p.qs.D, G = Hq / p.Hkv, K = cfg.kv_chunk;
  ck::check_chunk_states(op, Device::kCUDA, p, C, states);
  if (N == 0 || C == 0) return;
  LS_CHECK(chunk_begin + C < std::numeric_limits<int32_t>::max(), op, "chunk range too large");
  const Kern kern = pick(D, cs_ok(D, G) && multi_row(p, G));
  Plan plan;
  paged_tiles(plan, p, rows_per_item(kern, G), false, 0, K, false);
  for (ItemPlan& ip : plan.items) {
    ip.c_lo = int32_t(chunk_begin);
    ip.c_hi = int32_t(chunk_begin + C);
  }
  Scratch scr(s);
  const int32_t* bt = device_table(op, kv.block_table, scr);
  AttnParams prm;
  base_params(prm, q, G, cfg);
  set_cache(prm, kv.k_cache, kv.v_cache);
  prm.finish = kStoreChunks;
  set_states(prm, states, chunk_begin);
  launch_plan(op, kern, plan, prm, p.Hkv, bt, kv.block_table.stride[0], nullptr, 0, scr, s);
}

void attention_merge_chunk_states(const AttentionChunkStates& states, const TensorView& q_pos,
                                  const AttentionConfig& cfg, const TensorView& out,
                                  const TensorView& lse, void* stream) {
  const char* op = "cuda::attention_merge_chunk_states";
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const Meta pos = host_meta(op, "q_pos", q_pos, s);
  const ck::MergeShape ms =
      ck::check_merge_states(op, Device::kCUDA, states, pos.host, cfg, out, lse);
  const int64_t N = ms.qs.N, Hq = ms.qs.Hq, D = ms.qs.D;
  const std::vector<int32_t> pv(ms.pos.begin(), ms.pos.end());
  if (N == 0 || Hq == 0) return;
  Scratch scr(s);
  const int32_t* pos_dev = scr.upload(op, pv.data(), pv.size());
  launch_merge(op, states, pos_dev, N, Hq, D, cfg.kv_chunk, out, lse, s);
}

void kv_cache_write(const TensorView& k, const TensorView& v, const TensorView& slot_mapping,
                    const TensorView& k_cache, const TensorView& v_cache, void* stream) {
  const char* op = "cuda::kv_cache_write";
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const ck::KvWrite kw =
      ck::check_kv_write(op, Device::kCUDA, k, v, slot_mapping, k_cache, v_cache);
  const int64_t T = kw.T, Hkv = kw.Hkv, D = kw.D, NP = kw.NP, P = kw.P;
  Scratch scr(s);
  const void* slot_dev = slot_mapping.data;
  if (slot_mapping.device == Device::kCPU) {  // host slots: checked there, uploaded here
    if (T == 0) return;
    slot_dev = scr.upload(op, kw.slots.data(), kw.slots.size());
  }
  if (T == 0) return;
  KvWriteParams w;
  std::memset(&w, 0, sizeof w);
  w.k = k.ptr<const uint16_t>();
  w.v = v.ptr<const uint16_t>();
  w.k_s0 = k.stride[0];
  w.k_s1 = k.stride[1];
  w.v_s0 = v.stride[0];
  w.v_s1 = v.stride[1];
  w.slots = slot_dev;
  w.slots_i64 = (slot_mapping.device == Device::kCPU || slot_mapping.dtype == DType::kI64) ? 1 : 0;
  w.slot_s0 = slot_mapping.device == Device::kCPU ? 1 : slot_mapping.stride[0];
  w.kc = k_cache.ptr<uint16_t>();
  w.vc = v_cache.ptr<uint16_t>();
  strides3(k_cache, w.kc0, w.kc1, w.kc2);
  strides3(v_cache, w.vc0, w.vc1, w.vc2);
  w.NP = NP;
  w.P = P;
  w.Hkv = int32_t(Hkv);
  w.D = int32_t(D);
  w.vec = vec16(k) && vec16(v) && vec16(k_cache) && vec16(v_cache) && D % 8 == 0;
  LS_CHECK(T < (int64_t(1) << 31), op, "too many tokens for one launch: ", T);
  kv_cache_write_kernel<<<unsigned(T), kThreads, 0, s>>>(w);
  cuda_check(op, cudaGetLastError(), "kernel launch");
}

std::string attention_launch_plan(const AttentionConfig& cfg, int64_t hq, int64_t hkv,
                                  int64_t head_dim) {
  cfg.validate();
  LS_CHECK(hkv >= 1 && hq % hkv == 0, "cuda::attention_launch_plan", "Hq=", hq,
           " must be a multiple of Hkv=", hkv);
  const int64_t G = hq / hkv, D = head_dim;
  const Kern pre = pick(D, cs_ok(D, G));
  const Kern dec = pick(D, false);
  char buf[1400];
  const std::string packed =
      D == attn_wg::kD
          ? "packed prefill (TMA-readable rows, sm_90): attn_wg_prefill_kernel (128 rows of one "
            "head per CTA, producer + 2 consumer warpgroups, wgmma, " +
                std::to_string(attn_wg::kStages) + " K/V stages, smem " +
                std::to_string(attn_wg::kSmem) + " B); "
          : std::string();
  std::snprintf(
      buf, sizeof buf,
      "%s | cuda: Hq=%lld Hkv=%lld G=%lld D=%lld; %sprefill/chunked: %s (%d columns = %d rows x "
      "%lld heads per CTA, 4 warps, 64-key blocks, smem %d B); decode: %s (%d columns per CTA, "
      "4 warps split keys/D, smem %d B); split-KV: whole kv_chunk=%d chunks per CTA when "
      "CTAs < 2 x SMs, per-chunk states + left-to-right merge kernel (128 threads per row x "
      "head); grid = (items, Hkv, column blocks)",
      cfg.to_string().c_str(), (long long)hq, (long long)hkv, (long long)G, (long long)D,
      packed.c_str(), kern_info(pre).name, kern_cols(pre), rows_per_item(pre, G),
      (long long)std::min<int64_t>(G, kern_cols(pre)), kern_info(pre).smem, kern_info(dec).name,
      kern_cols(dec), kern_info(dec).smem, cfg.kv_chunk);
  return buf;
}

}  // namespace lockstep::cuda
