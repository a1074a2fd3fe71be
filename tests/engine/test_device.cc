// The engine on a device backend, checked on the CPU: a simulated device whose memory is host
// memory locked with mprotect(PROT_NONE) except while one of its own ops or copies runs. Any host
// access to a weight, an activation or a KV page (a device pointer read on the host) faults; every
// op argument must be tagged Device::kCUDA. Its ops are the invariant CPU ops, so the engine on it
// must give the CPU invariant backend's bits exactly: forward, rollout, training forward, audit
// (also cross-device: rollout on the device, training on the CPU). Also: one metadata upload per
// forward call, no wait inside a forward whose outputs stay on the device, shared weights
// (Model::with_backend), trace capture, and the host checks a device backend relies on.
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/audit.h"
#include "engine/backend.h"
#include "engine/device.h"
#include "engine/kv_cache.h"
#include "engine/model.h"
#include "engine/rollout.h"
#include "engine/rollout_test_util.h"
#include "engine/trainer.h"
#include "lockstep/error.h"
#include "util/test_util.h"

namespace lockstep::engine {
namespace {

using test_util::TinyModel;

// --- the simulated device ---

class DeviceMemory {
 public:
  static DeviceMemory& get() {
    static DeviceMemory m;
    return m;
  }
  std::shared_ptr<void> allocate(int64_t bytes) {
    const size_t page = size_t(sysconf(_SC_PAGESIZE));
    const size_t len = (size_t(bytes) + page - 1) / page * page;
    void* p = mmap(nullptr, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    LS_CHECK(p != MAP_FAILED, "fake device", "mmap of ", bytes, " bytes failed");
    {
      std::lock_guard<std::mutex> g(mu_);
      blocks_[p] = len;
      if (open_ > 0) mprotect(p, len, PROT_READ | PROT_WRITE);
    }
    return std::shared_ptr<void>(p, [this, len](void* q) {
      std::lock_guard<std::mutex> g(mu_);
      blocks_.erase(q);
      munmap(q, len);
    });
  }
  // While a guard lives, device memory is accessible (the "device" is running).
  void open() {
    std::lock_guard<std::mutex> g(mu_);
    if (open_++ == 0)
      for (auto& [p, len] : blocks_) mprotect(p, len, PROT_READ | PROT_WRITE);
  }
  void close() {
    std::lock_guard<std::mutex> g(mu_);
    if (--open_ == 0)
      for (auto& [p, len] : blocks_) mprotect(p, len, PROT_NONE);
  }

 private:
  std::mutex mu_;
  std::map<void*, size_t> blocks_;
  int open_ = 0;
};

struct DeviceGuard {
  DeviceGuard() { DeviceMemory::get().open(); }
  ~DeviceGuard() { DeviceMemory::get().close(); }
};

// A view as the CPU op sees it (same memory, host tag); requires the device tag first.
TensorView host_of(const TensorView& v, const char* op, const char* arg) {
  if (v.ndim == 0 && v.data == nullptr) return v;  // "not wanted" (lse)
  if (v.device != Device::kCUDA)
    throw Error(std::string("fake device: ") + op + ": argument '" + arg +
                "' is not a device view: " + v.describe());
  TensorView h = v;
  h.device = Device::kCPU;
  return h;
}
std::vector<TensorView> host_of(const std::vector<TensorView>& vs, const char* op,
                                const char* arg) {
  std::vector<TensorView> out;
  for (const TensorView& v : vs) out.push_back(host_of(v, op, arg));
  return out;
}

struct Counters {
  std::atomic<int64_t> uploads{0}, downloads{0}, device_copies{0}, syncs{0}, ops{0}, paged_calls{0},
      meta_changes{0}, packed_calls{0};
  void reset() {
    uploads = downloads = device_copies = syncs = ops = paged_calls = meta_changes = packed_calls =
        0;
  }
};

class FakeDeviceBackend final : public OpsBackend {
 public:
  FakeDeviceBackend() : b_(make_invariant_backend()) {}
  mutable Counters n;
  std::string name() const override { return "invariant"; }
  Device device() const override { return Device::kCUDA; }
  Tensor empty(DType dtype, std::vector<int64_t> shape) const override {
    int64_t bytes = dtype_size(dtype);
    for (int64_t e : shape) bytes *= e;
    // Poisoned like fresh device memory may be: NaN bytes.
    std::shared_ptr<void> mem = DeviceMemory::get().allocate(std::max<int64_t>(bytes, 1));
    {
      DeviceGuard g;
      std::memset(mem.get(), 0xFF, size_t(bytes));
    }
    return Tensor::adopt(dtype, std::move(shape), std::move(mem), Device::kCUDA);
  }
  void copy(const TensorView& dst, const TensorView& src) const override {
    LS_CHECK(dst.device == Device::kCUDA || src.device == Device::kCUDA, "fake device copy",
             "host to host copy through the device backend");
    if (dst.device == Device::kCUDA && src.device == Device::kCUDA)
      ++n.device_copies;
    else if (dst.device == Device::kCUDA)
      ++n.uploads;
    else
      ++n.downloads;
    TensorView d = dst, s = src;
    d.device = s.device = Device::kCPU;
    DeviceGuard g;
    OpsBackend::copy(d, s);
  }
  void synchronize() const override { ++n.syncs; }

#define FAKE_OP_BEGIN(op) \
  ++n.ops;                \
  DeviceGuard guard;      \
  const char* op_name = op;
#define H(v) host_of(v, op_name, #v)
  // The packed sequences as the CPU op reads them: the device copy must be a device view holding
  // the validated host values; the CPU op then runs on that copy.
  PackedSeqs packed(const PackedSeqs& p, const char* op) const {
    if (p.device() != Device::kCUDA)
      throw Error(std::string("fake device: ") + op + ": cu_seqlens' copy is not on the device");
    ++n.packed_calls;
    const TensorView d = host_of(p.device_copy(), op, "cu_seqlens");
    for (int64_t b = 0; b <= p.B(); ++b)
      if (d.ptr<const int32_t>()[b * d.stride[0]] != p.cu()[size_t(b)])
        throw Error(std::string("fake device: ") + op +
                    ": device copy of cu_seqlens differs from the validated host view");
    return PackedSeqs::validate(op, d, p.T());
  }
  // The step's paged meta as the CPU op reads it: its device copies must be device views holding
  // the validated host tables' values (what a kernel reads); the CPU op then runs on those
  // copies. Counts how often the meta object changes between paged calls (once per step).
  PagedMeta paged_meta(const PagedMeta& m, const AttentionConfig& cfg, const char* op) const {
    if (m.device() != Device::kCUDA)
      throw Error(std::string("fake device: ") + op + ": the meta's copies are not on the device");
    ++n.paged_calls;
    if (&m != last_meta_ || m.host().q_seq.data != last_q_seq_) ++n.meta_changes;
    last_meta_ = &m;
    last_q_seq_ = m.host().q_seq.data;
    const PagedTables& h = m.host();
    PagedTables d = m.device_copies();
    for (auto [hv, dv, arg] :
         {std::tuple{&h.q_seq, &d.q_seq, "q_seq"}, std::tuple{&h.q_pos, &d.q_pos, "q_pos"},
          std::tuple{&h.block_table, &d.block_table, "block_table"},
          std::tuple{&h.seq_lens, &d.seq_lens, "seq_lens"},
          std::tuple{&h.prefix_block_table, &d.prefix_block_table, "prefix_block_table"},
          std::tuple{&h.shared_len, &d.shared_len, "shared_len"},
          std::tuple{&h.seq_group, &d.seq_group, "seq_group"}}) {
      if (hv->ndim == 0 && hv->data == nullptr) continue;
      *dv = host_of(*dv, op, arg);
      const int64_t cols = hv->ndim == 2 ? hv->shape[1] : 1, rows = hv->shape[0];
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) {
          const int64_t ho = r * hv->stride[0] + (hv->ndim == 2 ? c * hv->stride[1] : 0);
          const int64_t dof = r * dv->stride[0] + (dv->ndim == 2 ? c * dv->stride[1] : 0);
          if (hv->ptr<const int32_t>()[ho] != dv->ptr<const int32_t>()[dof])
            throw Error(std::string("fake device: ") + op + ": device copy of '" + arg +
                        "' differs from the validated host table");
        }
    }
    return PagedMeta::validate(op, d, m.NP(), m.P(), cfg);
  }
  void gemm(const TensorView& x, const TensorView& w, const GemmConfig& cfg,
            const TensorView& y) const override {
    FAKE_OP_BEGIN("gemm");
    b_->gemm(H(x), H(w), cfg, H(y));
  }
  void gemm_partial(const TensorView& x, const TensorView& w, int64_t k, int tp, int r,
                    const GemmConfig& cfg, const TensorView& y) const override {
    FAKE_OP_BEGIN("gemm_partial");
    b_->gemm_partial(H(x), H(w), k, tp, r, cfg, H(y));
  }
  void gemm_combine(const std::vector<TensorView>& p, const TensorView& y) const override {
    FAKE_OP_BEGIN("gemm_combine");
    b_->gemm_combine(H(p), H(y));
  }
  void rmsnorm(const TensorView& x, const TensorView& w, const RmsNormConfig& c,
               const TensorView& y) const override {
    FAKE_OP_BEGIN("rmsnorm");
    b_->rmsnorm(H(x), H(w), c, H(y));
  }
  void rmsnorm_residual(const TensorView& x, const TensorView& r, const TensorView& w,
                        const RmsNormConfig& c, const TensorView& ro,
                        const TensorView& y) const override {
    FAKE_OP_BEGIN("rmsnorm_residual");
    b_->rmsnorm_residual(H(x), H(r), H(w), c, H(ro), H(y));
  }
  void rope(const TensorView& x, const TensorView& p, const RopeTable& t,
            const TensorView& y) const override {
    FAKE_OP_BEGIN("rope");
    b_->rope(H(x), H(p), t, H(y));
  }
  void silu_mul(const TensorView& g, const TensorView& u, const TensorView& o) const override {
    FAKE_OP_BEGIN("silu_mul");
    b_->silu_mul(H(g), H(u), H(o));
  }
  void embedding(const TensorView& i, const TensorView& t, const TensorView& o) const override {
    FAKE_OP_BEGIN("embedding");
    b_->embedding(H(i), H(t), H(o));
  }
  void embedding_vocab_parallel(const TensorView& i, const TensorView& t, const VocabShard& s,
                                int64_t v, const TensorView& o) const override {
    FAKE_OP_BEGIN("embedding_vocab_parallel");
    b_->embedding_vocab_parallel(H(i), H(t), s, v, H(o));
  }
  void embedding_combine(const std::vector<TensorView>& p, const TensorView& o) const override {
    FAKE_OP_BEGIN("embedding_combine");
    b_->embedding_combine(H(p), H(o));
  }
  void attention_prefill_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                                const PackedSeqs& p, const AttentionConfig& c, const TensorView& o,
                                const TensorView& l) const override {
    FAKE_OP_BEGIN("attention_prefill_varlen");
    b_->attention_prefill_varlen(H(q), H(k), H(v), packed(p, op_name), c, H(o), H(l));
  }
  void attention_paged(const TensorView& q, const PagedMeta& m, const TensorView& kc,
                       const TensorView& vc, const AttentionConfig& c, const TensorView& o,
                       const TensorView& l) const override {
    FAKE_OP_BEGIN("attention_paged");
    b_->attention_paged(H(q), paged_meta(m, c, op_name), H(kc), H(vc), c, H(o), H(l));
  }
  void attention_paged_split_kv(const TensorView& q, const PagedMeta& m, const TensorView& kc,
                                const TensorView& vc, const AttentionConfig& c, int splits,
                                const TensorView& o, const TensorView& l) const override {
    FAKE_OP_BEGIN("attention_paged_split_kv");
    b_->attention_paged_split_kv(H(q), paged_meta(m, c, op_name), H(kc), H(vc), c, splits, H(o),
                                 H(l));
  }
  void attention_paged_cascade(const TensorView& q, const PagedMeta& m, const TensorView& kc,
                               const TensorView& vc, const AttentionConfig& c, const TensorView& o,
                               const TensorView& l) const override {
    FAKE_OP_BEGIN("attention_paged_cascade");
    b_->attention_paged_cascade(H(q), paged_meta(m, c, op_name), H(kc), H(vc), c, H(o), H(l));
  }
  void kv_cache_write(const TensorView& k, const TensorView& v, const TensorView& s,
                      const TensorView& kc, const TensorView& vc) const override {
    FAKE_OP_BEGIN("kv_cache_write");
    b_->kv_cache_write(H(k), H(v), H(s), H(kc), H(vc));
  }
  void linear_logprob(const TensorView& h, const TensorView& w, const TensorView& t,
                      const LogprobParams& p, const ContractConfig& c, const TensorView& lp,
                      const TensorView& ls, const TensorView& en) const override {
    FAKE_OP_BEGIN("linear_logprob");
    b_->linear_logprob(H(h), H(w), H(t), p, c, H(lp), H(ls), H(en));
  }
  void linear_logprob_partial(const TensorView& h, const TensorView& w, const TensorView& t,
                              const LogprobParams& p, const ContractConfig& c,
                              const LogprobShard& s, const TensorView& st) const override {
    FAKE_OP_BEGIN("linear_logprob_partial");
    b_->linear_logprob_partial(H(h), H(w), H(t), p, c, s, H(st));
  }
  void linear_logprob_combine(const TensorView& st, const TensorView& t, const LogprobParams& p,
                              const ContractConfig& c, int64_t v, const TensorView& lp,
                              const TensorView& ls, const TensorView& en) const override {
    FAKE_OP_BEGIN("linear_logprob_combine");
    b_->linear_logprob_combine(H(st), H(t), p, c, v, H(lp), H(ls), H(en));
  }
  void sample(const TensorView& h, const TensorView& w, std::span<const SamplingParams> p,
              const TensorView& r, const TensorView& pos, const ContractConfig& c,
              const TensorView& ids, const TensorView& lp, const TensorView& ls,
              const TensorView& en) const override {
    FAKE_OP_BEGIN("sample");
    b_->sample(H(h), H(w), p, H(r), H(pos), c, H(ids), H(lp), H(ls), H(en));
  }
#undef H
#undef FAKE_OP_BEGIN

 private:
  std::unique_ptr<OpsBackend> b_;
  mutable const PagedMeta* last_meta_ = nullptr;
  mutable const void* last_q_seq_ = nullptr;
};

std::shared_ptr<FakeDeviceBackend> fake() { return std::make_shared<FakeDeviceBackend>(); }
std::shared_ptr<OpsBackend> cpu() { return std::shared_ptr<OpsBackend>(make_invariant_backend()); }

std::vector<RolloutRequest> requests(const Qwen3Config& mc, int n, uint64_t seed) {
  AuditConfig a;
  a.prompts = n;
  a.group_size = 3;
  a.prompt_len_min = 5;
  a.prompt_len_max = 90;  // past kv_chunk 64: split-KV and cascade really split
  a.max_new_tokens = 12;
  a.seed = seed;
  a.contract = test_util::tiny_contract();
  return make_audit_requests(a, mc);
}

RolloutConfig rollout_config(bool cascade, int kv_splits, int64_t pages) {
  RolloutConfig r;
  r.kv.page_size = 8;
  r.kv.num_pages = pages;
  r.scheduler.max_running = 6;
  r.scheduler.max_batched_tokens = 40;
  r.scheduler.prefix_sharing = true;
  r.step.cascade = cascade;
  r.step.kv_splits = kv_splits;
  return r;
}

std::vector<TrainSequence> train_seqs(const RolloutResult& rr) {
  std::vector<TrainSequence> out;
  for (const Completion& c : rr.completions)
    out.push_back(TrainSequence{c.id, c.prompt, c.tokens, c.sampling.logprob_temperature()});
  return out;
}

// --- tests ---

TEST(Device, KvStorageIsOnTheDeviceAndPoisoned) {
  auto b = fake();
  KvCacheConfig kc;
  kc.page_size = 4;
  kc.num_pages = 3;
  KvCacheStorage st(*b, 2, 2, 16, kc);
  ASSERT_EQ(st.k_views().size(), 2u);
  EXPECT_EQ(st.k_views()[0].device, Device::kCUDA);
  EXPECT_EQ(st.bytes(), 2 * 2 * 3 * 4 * 2 * 16 * 2);
  // NaN-filled; a page copy moves exactly the requested slots.
  Tensor h = to_host(*b, st.v_views()[1]);
  for (int64_t i = 0; i < h.numel(); ++i) ASSERT_EQ(h.ptr<uint16_t>()[i], 0xFFFF);
  Tensor src(DType::kBF16, {4, 32});
  for (int64_t i = 0; i < src.numel(); ++i) src.ptr<uint16_t>()[i] = uint16_t(i);
  TensorView page0 =
      TensorView::contiguous(st.k_views()[0].data, DType::kBF16, {12, 32}, Device::kCUDA);
  b->copy(page0.rows(0, 4), src.view());
  st.copy_pages({PageCopy{0, 2, 3}});
  Tensor k = to_host(*b, st.k_views()[0]);
  for (int64_t i = 0; i < 3 * 32; ++i) ASSERT_EQ(k.ptr<uint16_t>()[8 * 32 + i], uint16_t(i));
  for (int64_t i = 3 * 32; i < 4 * 32; ++i) ASSERT_EQ(k.ptr<uint16_t>()[8 * 32 + i], 0xFFFF);
}

TEST(Device, ForwardEqualsCpuBitForBitAndUploadsOncePerCall) {
  TinyModel tm(0xd15c, test_util::small_untied_config());
  auto g = test::rng(1);
  for (int tp : {1, 2, 4}) {
    auto b = fake();
    auto dev = tm.make(tp, b);
    auto ref = tm.make(tp, cpu());
    const int64_t H = tm.config().hidden_size;
    std::vector<int32_t> tokens(37), cu = {0, 5, 5, 37};
    for (auto& t : tokens) t = int32_t(g() % uint64_t(tm.config().vocab_size));
    auto i32 = [](std::vector<int32_t>& v) {
      return TensorView::contiguous(v.data(), DType::kI32, {int64_t(v.size())});
    };
    Tensor want(DType::kBF16, {37, H}), got(DType::kBF16, {37, H});
    ref->forward_packed(i32(tokens), i32(cu), want.view());
    // Host output: one upload (all metadata), one download, one wait.
    b->n.reset();
    dev->forward_packed(i32(tokens), i32(cu), got.view());
    EXPECT_EQ(b->n.uploads.load(), 1);
    EXPECT_EQ(b->n.downloads.load(), 1);
    EXPECT_EQ(b->n.syncs.load(), 1);
    EXPECT_TRUE(test::bitwise_equal(want.ptr<bf16>(), got.ptr<bf16>(), 37 * H, DType::kBF16));
    // Device output: one upload, no wait at all.
    Tensor dh = b->empty(DType::kBF16, {37, H});
    b->n.reset();
    dev->forward_packed(i32(tokens), i32(cu), dh.view());
    EXPECT_EQ(b->n.uploads.load(), 1);
    EXPECT_EQ(b->n.syncs.load(), 0);
    EXPECT_EQ(b->n.downloads.load(), 0);
    Tensor back = to_host(*b, dh.view());
    EXPECT_TRUE(test::bitwise_equal(want.ptr<bf16>(), back.ptr<bf16>(), 37 * H, DType::kBF16));

    // Heads from the device hidden: log-probs equal the CPU's.
    std::vector<int32_t> tg(37);
    for (auto& t : tg) t = int32_t(g() % uint64_t(tm.config().vocab_size));
    tg[3] = -1;
    Tensor lp1(DType::kF32, {37}), ls1(DType::kF32, {37}), en1(DType::kF32, {37});
    Tensor lp2(DType::kF32, {37}), ls2(DType::kF32, {37}), en2(DType::kF32, {37});
    ref->logprob(want.view(), i32(tg), 0.75f, lp1.view(), ls1.view(), en1.view());
    b->n.reset();
    dev->logprob(dh.view(), i32(tg), 0.75f, lp2.view(), ls2.view(), en2.view());
    EXPECT_EQ(b->n.uploads.load(), 1);
    EXPECT_EQ(b->n.syncs.load(), 1);
    for (auto [x, y] : {std::pair{&lp1, &lp2}, std::pair{&ls1, &ls2}, std::pair{&en1, &en2}})
      EXPECT_TRUE(test::bitwise_equal(x->ptr<float>(), y->ptr<float>(), 37, DType::kF32));
  }
}

TEST(Device, RolloutAndTrainingEqualCpuBitForBit) {
  TinyModel tm(0xbeef);
  const auto reqs = requests(tm.config(), 5, 11);
  for (auto [tp, cascade, splits] :
       {std::tuple{1, true, 2}, std::tuple{2, false, 1}, std::tuple{4, true, 3},
        std::tuple{1, false, 2}, std::tuple{2, false, 3}}) {
    const RolloutConfig rc = rollout_config(cascade, splits, 40);
    auto ref_model = tm.make(tp, cpu());
    const RolloutResult want = run_rollout(*ref_model, reqs, rc);
    auto b = fake();
    auto dev_model = tm.make(tp, b);
    const RolloutResult got = run_rollout(*dev_model, reqs, rc);
    EXPECT_TRUE(test_util::same_completions(want.completions, got.completions))
        << "tp=" << tp << " cascade=" << cascade << " splits=" << splits;
    // Every paged call gets the step's one meta (device copies checked against the host tables):
    // it changes at most once per step, and is shared by every layer and rank of the step.
    EXPECT_LE(b->n.meta_changes.load(), want.stats.steps);
    EXPECT_GE(b->n.paged_calls.load(),
              b->n.meta_changes.load() * tm.config().num_hidden_layers * tp);
    EXPECT_GT(want.stats.preemptions + want.stats.forks, 0);
    // One wait per step (the sampled values come back), a bounded number of uploads per step.
    EXPECT_LE(b->n.syncs.load(), want.stats.steps + 2);

    PackingConfig pc;
    pc.micro_batch_tokens = 150;
    pc.seed = 5;
    const TrainResult tw = run_training_forward(*ref_model, train_seqs(want), pc);
    const TrainResult tg = run_training_forward(*dev_model, train_seqs(want), pc);
    ASSERT_EQ(tw.sequences.size(), tg.sequences.size());
    // Every packed prefill got validated sequences with their device copy.
    EXPECT_GT(b->n.packed_calls.load(), 0);
    for (size_t i = 0; i < tw.sequences.size(); ++i) {
      EXPECT_TRUE(test::bitwise_equal(tw.sequences[i].logp, tg.sequences[i].logp));
      EXPECT_TRUE(test::bitwise_equal(tw.sequences[i].entropy, tg.sequences[i].entropy));
      // And the rollout's own records: on-policy.
      EXPECT_TRUE(test::bitwise_equal(want.completions[i].logp, tg.sequences[i].logp));
    }
  }
}

TEST(Device, WithBackendSharesWeights) {
  TinyModel tm(0x5a5a);
  auto b1 = fake();
  auto m1 = tm.make(2, b1);
  EXPECT_GT(m1->weight_bytes(), 0);
  auto b2 = fake();
  auto m2 = m1->with_backend(b2);
  EXPECT_EQ(m2->weight_bytes(), m1->weight_bytes());
  EXPECT_EQ(&m2->rope_table(), &m1->rope_table());
  EXPECT_EQ(&m2->ops(), b2.get());
  const auto reqs = requests(tm.config(), 2, 3);
  const RolloutConfig rc = rollout_config(true, 2, 60);
  EXPECT_TRUE(test_util::same_completions(run_rollout(*m1, reqs, rc).completions,
                                          run_rollout(*m2, reqs, rc).completions));
  EXPECT_GT(b2->n.ops.load(), 0);
  // A backend of another device cannot take these weights.
  try {
    m1->with_backend(cpu());
    ADD_FAILURE() << "with_backend across devices did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("weights are on cuda"), std::string::npos) << e.what();
  }
}

TEST(Device, AuditCrossDevicePasses) {
  TinyModel tm(0xc0de);
  AuditConfig a;
  a.prompts = 4;
  a.group_size = 3;
  a.prompt_len_min = 4;
  a.prompt_len_max = 70;
  a.max_new_tokens = 10;
  a.contract = test_util::tiny_contract();
  a.rollout.kv.num_pages = 0;
  a.localize = true;
  ModelFactory f = [&](int tp, std::shared_ptr<OpsBackend> b, dist::Communicator* comm) {
    return tm.make(tp, b, test_util::tiny_contract(), comm);
  };
  auto d = fake();
  const AuditSide cross = run_audit_side(a, f, d, cpu());
  EXPECT_EQ(cross.mismatches, 0);
  EXPECT_EQ(cross.entropy_mismatches, 0);
  EXPECT_GT(cross.tokens_compared, 0);
  EXPECT_EQ(cross.backend, "invariant@cuda/cpu");
  EXPECT_EQ(cross.rollout_device, "cuda");
  EXPECT_EQ(cross.train_device, "cpu");
  const AuditSide on_dev = run_audit_side(a, f, d);
  EXPECT_EQ(on_dev.mismatches, 0);
  EXPECT_EQ(on_dev.backend, "invariant@cuda");
  const AuditSide reverse = run_audit_side(a, f, cpu(), d);
  EXPECT_EQ(reverse.mismatches, 0);
  EXPECT_EQ(reverse.tokens_compared, cross.tokens_compared);
}

TEST(Device, TraceSeesHostCopies) {
  TinyModel tm(0x7ace, test_util::small_untied_config());
  for (int tp : {1, 2}) {
    auto dev = tm.make(tp, fake());
    auto ref = tm.make(tp, cpu());
    std::vector<std::pair<std::string, std::vector<uint8_t>>> a, b;
    auto record = [](std::vector<std::pair<std::string, std::vector<uint8_t>>>* out) {
      return [out](const std::string& op, int layer, const TensorView& t) {
        ASSERT_EQ(t.device, Device::kCPU) << op;
        const int64_t es = dtype_size(t.dtype);
        std::vector<uint8_t> bytes;
        for (int64_t r = 0; r < t.shape[0]; ++r) {
          const int64_t row = t.numel() / std::max<int64_t>(t.shape[0], 1);
          const uint8_t* p = static_cast<const uint8_t*>(t.data) + r * t.stride[0] * es;
          bytes.insert(bytes.end(), p, p + row * es);  // rows of these traces are contiguous
        }
        out->emplace_back(op + "/" + std::to_string(layer), std::move(bytes));
      };
    };
    dev->set_trace(record(&a));
    ref->set_trace(record(&b));
    std::vector<int32_t> tokens = {3, 17, 250, 9, 9, 41, 100}, cu = {0, 3, 7};
    auto i32 = [](std::vector<int32_t>& v) {
      return TensorView::contiguous(v.data(), DType::kI32, {int64_t(v.size())});
    };
    Tensor h1(DType::kBF16, {7, tm.config().hidden_size}),
        h2(DType::kBF16, {7, tm.config().hidden_size});
    dev->forward_packed(i32(tokens), i32(cu), h1.view());
    ref->forward_packed(i32(tokens), i32(cu), h2.view());
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].first, b[i].first);
      EXPECT_TRUE(a[i].second == b[i].second) << a[i].first;
    }
  }
}

template <typename F>
void expect_error(F&& f, const std::string& what) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one containing: " << what;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos)
        << "message: " << e.what() << "\nexpected to contain: " << what;
  }
}

TEST(Device, HostChecksForDeviceMetadata) {
  TinyModel tm(0xe44, test_util::small_untied_config());
  auto b = fake();
  auto m = tm.make(1, b);
  const Qwen3Config& mc = tm.config();
  const int64_t H = mc.hidden_size;
  auto i32 = [](std::vector<int32_t>& v) {
    return TensorView::contiguous(v.data(), DType::kI32, {int64_t(v.size())});
  };
  // Metadata on the device is refused (it is validated on the host).
  {
    std::vector<int32_t> tok = {1, 2, 3}, cu = {0, 3};
    Tensor dtok = b->empty(DType::kI32, {3});
    b->copy(dtok.view(), i32(tok));
    Tensor out(DType::kBF16, {3, H});
    expect_error([&] { m->forward_packed(dtok.view(), i32(cu), out.view()); },
                 "argument 'tokens' expected device cpu");
    Tensor dout = b->empty(DType::kBF16, {3, H});
    m->forward_packed(i32(tok), i32(cu), dout.view());  // a device output is fine
  }
  // forward_step: the checks the device kernels rely on.
  KvCacheConfig kc;
  kc.page_size = 4;
  kc.num_pages = 6;
  KvCacheStorage st(*b, mc.num_hidden_layers, mc.num_key_value_heads, mc.head_dim, kc);
  std::vector<int32_t> bt = {0, 1, 2, 3, 4, 5}, lens = {6};
  auto step = [&](std::vector<int32_t> t, std::vector<int32_t> s, std::vector<int32_t> p) {
    KvCacheView v;
    v.k = st.k_views();
    v.v = st.v_views();
    v.block_table = TensorView::contiguous(bt.data(), DType::kI32, {1, 6});
    v.seq_lens = i32(lens);
    Tensor o(DType::kBF16, {int64_t(t.size()), H});
    m->forward_step(i32(t), i32(s), i32(p), v, StepOptions{}, o.view());
  };
  step({5, 6}, {0, 0}, {0, 1});
  expect_error([&] { step({5, 6}, {0, 0}, {2, 2}); }, "more than once");
  bt[0] = 9;
  expect_error([&] { step({5}, {0}, {2}); }, "cache.block_table[0][0] = 9 is not a page");
  bt[0] = 0;
  lens[0] = 30;
  expect_error([&] { step({5}, {0}, {2}); }, "cache.seq_lens[0] = 30 needs more than");
  lens[0] = 6;
  // Heads: targets and positions are checked on the host.
  Tensor h(DType::kBF16, {2, H});
  for (int64_t i = 0; i < 2 * H; ++i) h.ptr<bf16>()[i] = f32_to_bf16(0.01f * float(i % 7));
  std::vector<int32_t> tg = {5, 300};
  Tensor lp(DType::kF32, {2}), ls(DType::kF32, {2}), en(DType::kF32, {2});
  expect_error([&] { m->logprob(h.view(), i32(tg), 1.0f, lp.view(), ls.view(), en.view()); },
               "targets[1] = 300 is outside the vocabulary");
  std::vector<SamplingParams> sp(2);
  std::vector<int64_t> rid = {1, 2};
  std::vector<int32_t> pos = {3, -4}, ids(2);
  expect_error(
      [&] {
        m->sample(h.view(), sp, TensorView::contiguous(rid.data(), DType::kI64, {2}), i32(pos),
                  i32(ids), lp.view(), ls.view(), en.view());
      },
      "positions[1] = -4");
}

}  // namespace
}  // namespace lockstep::engine
