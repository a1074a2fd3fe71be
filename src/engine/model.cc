// The Qwen3 decoder on an OpsBackend: embedding, L x (input RMSNorm, fused q|k|v GEMM, per-head
// q/k RMSNorm, RoPE, causal GQA attention, o_proj, post-attention RMSNorm, fused gate|up GEMM,
// SiLU-and-mul, down_proj), final RMSNorm. Every number comes out of an OpsBackend call; this file
// only moves bf16 bits (weight packing, views, copies). Tensor parallelism is simulated rank by
// rank with the same shards a multi-GPU deployment would hold, or run rank-local: the model holds
// one rank's shards and all-gathers the parts every combine needs (dist::Communicator). Every
// weight, activation and KV
// page lives on the backend's device (ops->device()); metadata is validated on the host and
// uploaded once per call (engine/device.h). See docs/engine-model.md.
#include "engine/model.h"

#include <algorithm>
#include <functional>
#include <numeric>
#include <unordered_set>
#include <utility>

#include "engine/device.h"
#include "engine/text.h"
#include "lockstep/dist/communicator.h"

namespace lockstep::engine {

namespace {

constexpr const char* kOp = "Model";

// --- small view helpers (bf16 / f32 / i32 only; strides in elements) ---

// Columns [c0, c1) of a 2-D view (inner-contiguous).
TensorView cols(const TensorView& m, int64_t c0, int64_t c1) {
  TensorView v = m;
  v.data = static_cast<char*>(m.data) + c0 * dtype_size(m.dtype);
  v.shape[1] = c1 - c0;
  return v;
}

// [T, heads, D] view of `heads` heads starting at column `col0` of a 2-D [T, C] view.
TensorView heads_of(const TensorView& m, int64_t col0, int64_t heads, int64_t D) {
  TensorView v = TensorView::contiguous(static_cast<char*>(m.data) + col0 * dtype_size(m.dtype),
                                        m.dtype, {m.shape[0], heads, D}, m.device);
  v.stride[0] = m.stride[0];
  return v;
}

// Heads [h0, h0 + n) of a [NP, P, Hkv, D] cache.
TensorView cache_heads(const TensorView& c, int64_t h0, int64_t n) {
  TensorView v = c;
  v.data = static_cast<char*>(c.data) + h0 * c.stride[2] * dtype_size(c.dtype);
  v.shape[2] = n;
  return v;
}

int64_t read_index(const TensorView& t, int64_t i) {
  return t.dtype == DType::kI32 ? int64_t(t.ptr<const int32_t>()[i * t.stride[0]])
                                : t.ptr<const int64_t>()[i * t.stride[0]];
}

// Blocks of whole bf16 views by name (WeightBlock: rows then columns; a 1-d view is one row).
std::function<TensorView(const std::string&, const WeightBlock&)> blocks_of(
    const std::map<std::string, TensorView>& src) {
  return [&src](const std::string& name, const WeightBlock& b) {
    TensorView v = src.at(name);
    const int64_t C = v.shape[v.ndim - 1];
    const int64_t c1 = b.c1 < 0 ? C : b.c1;
    if (v.ndim == 2) v = v.rows(b.r0, b.r1 < 0 ? v.size(0) : b.r1);
    v.data = static_cast<char*>(v.data) + b.c0 * dtype_size(v.dtype);
    v.shape[v.ndim - 1] = c1 - b.c0;
    return v;
  };
}

}  // namespace

std::string ModelOptions::to_string() const {
  return "tp=" + std::to_string(tp) + " max_positions=" + std::to_string(max_positions) + " " +
         contract.to_string();
}

std::string StepOptions::to_string() const {
  return "step: kv_splits=" + std::to_string(kv_splits) + " cascade=" + (cascade ? "on" : "off");
}

// One tensor-parallel rank's share of a layer (the same for every layer).
struct RankShard {
  int64_t q0 = 0, nq = 0;    // query heads [q0, q0 + nq)
  int64_t kv0 = 0, nkv = 0;  // kv heads [kv0, kv0 + nkv) (replicated on several ranks if Hkv < tp)
  int64_t i0 = 0, ni = 0;    // intermediate columns [i0, i0 + ni) (= the down_proj K range)
};

// Per-rank weights are indexed by the model's local slot i (rank Impl::local[i]): every rank of a
// simulated-TP model, the one rank of a rank-local model.
struct LayerWeights {
  TensorView input_norm, post_norm;  // [H]
  TensorView q_norm, k_norm;         // [D]
  std::vector<TensorView> wo;        // per rank [H, nq·D]: o_proj columns of its query heads
  std::vector<TensorView> wdown;     // per rank [H, ni]: down_proj columns [i0, i0 + ni)
  std::vector<TensorView> wqkv;      // per rank [(nq + 2·nkv)·D, H]: q rows | k rows | v rows
  std::vector<TensorView> wgu;       // per rank [2·ni, H]: gate rows | up rows
};

// The weights on the backend's device (shared by models made with Model::with_backend).
struct WeightStore {
  Device device = Device::kCPU;
  std::optional<Checkpoint> ckpt;  // keeps zero-copy bf16 views valid (CPU backends)
  std::vector<Tensor> owned;       // copies, converted weights, fused per-rank weights
  TensorView final_norm;
  // Per rank: its vocab_shard rows of embed_tokens (tp = 1: the whole table) and its aligned
  // vocab-segment rows of the lm_head (tp = 1: the whole head).
  std::vector<TensorView> embed, lm_head_rows;
  TensorView lm_head;  // the whole lm_head (sampling); empty in a rank-local model with tp > 1
  std::vector<LayerWeights> layers;
  RopeTable rope;     // host table (a device backend uploads it once)
  int64_t bytes = 0;  // weight bytes held on the device by this store
};

struct Model::Impl {
  Qwen3Config cfg;
  ModelOptions opt;
  std::shared_ptr<OpsBackend> ops;
  std::shared_ptr<const WeightStore> ws;

  GemmConfig gemm_col;  // q|k|v, gate|up: one K segment (§G.5)
  GemmConfig gemm_row;  // o_proj, down_proj: the contract's gemm_segments
  AttentionConfig attn;
  RmsNormConfig norm;
  int64_t max_positions = 0;
  std::vector<RankShard> ranks;        // every rank's shard (rank-local models too)
  dist::Communicator* comm = nullptr;  // rank-local: this model's rank's communicator
  std::vector<int> local;              // the ranks this model runs: all, or the communicator's
  TraceFn trace;

  // A model's configs and rank shards on `ops`, checked; no weights yet.
  static std::unique_ptr<Impl> make(const Qwen3Config& cfg, const ModelOptions& opt,
                                    std::shared_ptr<OpsBackend> ops, dist::Communicator* comm) {
    LS_CHECK(ops != nullptr, kOp, "ops backend is null");
    auto m = std::make_unique<Impl>();
    m->cfg = cfg;
    m->opt = opt;
    m->ops = std::move(ops);
    m->comm = comm;
    m->check_setup();
    m->setup();
    return m;
  }
  void check_setup() const;
  void setup();  // configs and rank shards (no weights)
  // A bf16 view of a block of a named weight (on the host or on the backend's device).
  using BlockFn = std::function<TensorView(const std::string& name, const WeightBlock& block)>;
  // Builds the weight store from `block`: every block it uses (a simulated model's whole weights
  // and their rank slices, a rank-local model's shard blocks only). zero_copy: every view outlives
  // the model (checkpoint mappings, tensors moved into `keep`, or appended to *lazy_keep while
  // building), so a view already on the backend's device is used in place; otherwise everything
  // is copied.
  void build(const BlockFn& block, bool zero_copy, std::optional<Checkpoint> ckpt,
             std::vector<Tensor> keep, std::vector<Tensor>* lazy_keep = nullptr);

  // The decoder over T tokens at `positions` (device views); `attend(layer, rank, q, k, v, out,
  // lse)` runs attention of one rank (its head slices) and may write the KV cache first; lse is
  // [T, the rank's heads] f32 to be written when a trace is set (the backward reads it: trace
  // "attn_lse"), else an empty view.
  using AttendFn = std::function<void(int, int, const TensorView&, const TensorView&,
                                      const TensorView&, const TensorView&, const TensorView&)>;
  // lse_out: `attend` writes lse (forward_packed), so a trace gets "attn_lse".
  void run(const TensorView& tokens, const TensorView& positions, const AttendFn& attend,
           const TensorView& hidden_out, bool lse_out = false) const;
  // forward_packed (prompt_of null) and forward_packed_shared.
  void forward_segments(const char* op, const TensorView& tokens, const TensorView& cu_seqlens,
                        const TensorView* prompt_of, const TensorView& hidden_out) const;
  // tokens [T] i32 / i64, every id in the vocabulary; returns T.
  int64_t check_tokens(const char* op, const TensorView& tokens) const;
  // An activation argument: on the host or on the backend's device, with this dtype and shape.
  void check_activation(const char* op, const char* arg, const TensorView& t, DType dtype,
                        std::initializer_list<int64_t> shape) const;
  // Trace callbacks always see host views (a device tensor is copied back first).
  void emit(const char* op, int layer, const TensorView& t) const {
    if (!trace) return;
    if (t.device == Device::kCPU) {
      trace(op, layer, t);
      return;
    }
    const Tensor h = to_host(*ops, t);
    trace(op, layer, h.view());
  }
  bool device_backend() const { return ops->device() != Device::kCPU; }

  // The ranks' parts of a combine, in rank order (each a view of `like`'s shape): a simulated
  // model's own per-rank tensors, or, rank-local, this rank's one part all-gathered from every
  // rank (the gathered tensor is kept in *keep).
  std::vector<TensorView> rank_parts(const std::vector<Tensor>& mine, Tensor* keep) const;
  // A rank-local model's all_gather of `mine` into a new [tp, mine's shape] tensor on the
  // backend's device (waits for the backend's ops first: the transport reads the bytes).
  Tensor all_gather(const TensorView& mine) const;
  // Column c0 of rank shard s's attention output (query heads) and act (intermediate columns) in
  // this model's buffers: the full-width buffer of a simulated model, the rank's own columns of
  // a rank-local one.
  int64_t attn_col(const RankShard& s) const { return comm ? 0 : s.q0 * cfg.head_dim; }
  int64_t act_col(const RankShard& s) const { return comm ? 0 : s.i0; }
  // The index of rank r's per-rank tensors and weights (r one of `local`).
  size_t slot(int r) const { return comm ? 0 : size_t(r); }
};

Tensor Model::Impl::all_gather(const TensorView& mine) const {
  std::vector<int64_t> shape = {opt.tp};
  shape.insert(shape.end(), mine.shape, mine.shape + mine.ndim);
  Tensor all = ops->empty(mine.dtype, shape);
  ops->synchronize();
  comm->all_gather(mine, all.view());
  return all;
}

std::vector<TensorView> Model::Impl::rank_parts(const std::vector<Tensor>& mine,
                                                Tensor* keep) const {
  std::vector<TensorView> parts;
  if (!comm) {
    for (const Tensor& t : mine) parts.push_back(t.view());
    return parts;
  }
  *keep = all_gather(mine.at(0).view());
  for (int r = 0; r < opt.tp; ++r) parts.push_back(slab(*keep, r));
  return parts;
}

// --- construction ---

void Model::Impl::check_setup() const {
  cfg.validate();
  opt.contract.validate();
  const int tp = opt.tp;
  const int64_t Hq = cfg.num_attention_heads, Hkv = cfg.num_key_value_heads, D = cfg.head_dim;
  LS_CHECK(tp == 1 || tp == 2 || tp == 4 || tp == 8, kOp, "options.tp must be 1, 2, 4 or 8, got ",
           tp);
  LS_CHECK(D % kAttnMmaK == 0 && D >= 16 && D <= kAttnMaxHeadDim, kOp,
           "head_dim must be a multiple of 16 in [16, 512] (attention contract), got ", D);
  LS_CHECK(opt.contract.gemm_segments % tp == 0, kOp, "options.tp=", tp,
           " needs contract.gemm_segments to be a multiple of tp (row-parallel o_proj/down_proj "
           "ranks own whole K segments), got gemm_segments=",
           opt.contract.gemm_segments);
  LS_CHECK(opt.contract.vocab_segments % tp == 0, kOp, "options.tp=", tp,
           " needs contract.vocab_segments to be a multiple of tp (vocab-parallel lm_head ranks "
           "own whole vocab segments), got vocab_segments=",
           opt.contract.vocab_segments);
  LS_CHECK(Hq % tp == 0, kOp, "num_attention_heads=", Hq, " is not divisible by tp=", tp);
  LS_CHECK(Hkv % tp == 0 || tp % Hkv == 0, kOp, "num_key_value_heads=", Hkv,
           " must be a multiple or a divisor of tp=", tp, " (kv heads are split or replicated)");
  LS_CHECK(opt.max_positions >= 0, kOp, "options.max_positions must be >= 0, got ",
           opt.max_positions);
  if (comm) {
    LS_CHECK(comm->size() == tp, kOp,
             "a rank-local model needs a communicator of options.tp = ", tp, " ranks, got one of ",
             comm->size());
    LS_CHECK(comm->rank() >= 0 && comm->rank() < tp, kOp, "communicator rank ", comm->rank(),
             " is outside [0, ", tp, ")");
  }
  // o_proj is row-parallel over the attention output: each rank's K range (whole GEMM segments)
  // must be exactly its query heads.
  const GemmConfig g = GemmConfig::for_layer(opt.contract, LayerRole::kRowParallel);
  for (int r = 0; r < tp; ++r) {
    const GemmKRange kr = gemm_tp_k_range(g, Hq * D, tp, r);
    const int64_t b = r * (Hq / tp) * D, e = (r + 1) * (Hq / tp) * D;
    LS_CHECK(kr.begin == b && kr.end == e, kOp, "tp=", tp, " rank ", r, ": o_proj K range [",
             kr.begin, ", ", kr.end, ") (gemm_segments=", opt.contract.gemm_segments,
             ", K = Hq·D = ", Hq * D, ") is not the rank's query heads' columns [", b, ", ", e,
             "); Hq·D must be a multiple of 16·gemm_segments");
  }
}

void Model::Impl::setup() {
  const int tp = opt.tp;
  const int64_t I = cfg.intermediate_size;
  const int64_t Hq = cfg.num_attention_heads, Hkv = cfg.num_key_value_heads, G = Hq / Hkv;
  gemm_col = GemmConfig::for_layer(opt.contract, LayerRole::kColumnParallel);
  gemm_row = GemmConfig::for_layer(opt.contract, LayerRole::kRowParallel);
  attn = AttentionConfig::from_contract(opt.contract);  // scale 1/sqrt(D), as Qwen3
  attn.validate();
  norm.eps = cfg.rms_norm_eps_f32();
  norm.validate();
  max_positions = opt.max_positions > 0 ? opt.max_positions : cfg.max_position_embeddings;
  ranks.assign(size_t(tp), RankShard{});
  for (int r = 0; r < tp; ++r) {
    RankShard& s = ranks[size_t(r)];
    s.nq = Hq / tp;
    s.q0 = r * s.nq;
    // kv heads used by this rank's query heads (one replicated head when Hkv < tp).
    s.kv0 = s.q0 / G;
    s.nkv = (s.q0 + s.nq - 1) / G + 1 - s.kv0;
    const GemmKRange kr = gemm_tp_k_range(gemm_row, I, tp, r);
    s.i0 = kr.begin;
    s.ni = kr.end - kr.begin;
  }
  local.clear();
  if (comm) {
    local.push_back(comm->rank());
  } else {
    for (int r = 0; r < tp; ++r) local.push_back(r);
  }
}

void Model::Impl::build(const BlockFn& block, bool zero_copy, std::optional<Checkpoint> ckpt,
                        std::vector<Tensor> keep, std::vector<Tensor>* lazy_keep) {
  const OpsBackend& op = *ops;
  const int64_t H = cfg.hidden_size, D = cfg.head_dim;
  auto store = std::make_shared<WeightStore>();
  WeightStore& st = *store;
  st.device = op.device();
  st.ckpt = std::move(ckpt);
  if (zero_copy) st.owned = std::move(keep);
  RopeConfig rc;
  rc.head_dim = D;
  rc.theta = cfg.rope_theta;
  rc.max_positions = max_positions;
  st.rope = RopeTable::build(rc);

  // A weight (or a rank's slice of one) on the backend's device: in place when allowed, else one
  // exact, contiguous copy. A rank-local model copies only its slices' bytes.
  auto place_view = [&](const TensorView& v) -> TensorView {
    if (zero_copy && v.device == op.device()) return v;
    Tensor t = op.empty(DType::kBF16, std::vector<int64_t>(v.shape, v.shape + v.ndim));
    op.copy(t.view(), v);
    st.bytes += t.nbytes();
    st.owned.push_back(std::move(t));
    return st.owned.back().view();
  };
  auto place = [&](const std::string& name) { return place_view(block(name, WeightBlock{})); };
  auto rows_of = [&](const std::string& name, int64_t r0, int64_t r1) {
    return block(name, WeightBlock{r0, r1, 0, -1});
  };
  auto cols_of = [&](const std::string& name, int64_t c0, int64_t c1) {
    return block(name, WeightBlock{0, -1, c0, c1});
  };
  const int tp = opt.tp;
  const int64_t V = cfg.vocab_size;
  const std::string head_name =
      cfg.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
  // Whole tensors where a simulated model uses them (its slices are views of them), else only
  // the rank's rows.
  const bool whole = !comm || tp == 1;
  const TensorView embed_all = whole ? place("model.embed_tokens.weight") : TensorView{};
  st.lm_head = !whole                    ? TensorView{}
               : cfg.tie_word_embeddings ? embed_all
                                         : place("lm_head.weight");
  const LogprobVocabLayout lay = logprob_vocab_layout(opt.contract, V);
  const int per = opt.contract.vocab_segments / tp;
  for (int r : local) {
    if (tp == 1) {
      st.embed.push_back(embed_all);
      st.lm_head_rows.push_back(st.lm_head);
      continue;
    }
    const VocabShard sh = vocab_shard(V, r, tp);
    const int64_t v0 = std::min(V, int64_t(r * per) * lay.segment_len);
    const int64_t v1 = std::min(V, int64_t((r + 1) * per) * lay.segment_len);
    st.embed.push_back(whole ? embed_all.rows(sh.begin, sh.end)
                             : place_view(rows_of("model.embed_tokens.weight", sh.begin, sh.end)));
    st.lm_head_rows.push_back(whole ? st.lm_head.rows(v0, v1)
                                    : place_view(rows_of(head_name, v0, v1)));
  }
  st.final_norm = place("model.norm.weight");
  st.layers.resize(size_t(cfg.num_hidden_layers));
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    LayerWeights& L = st.layers[size_t(l)];
    L.input_norm = place(p + "input_layernorm.weight");
    L.post_norm = place(p + "post_attention_layernorm.weight");
    L.q_norm = place(p + "self_attn.q_norm.weight");
    L.k_norm = place(p + "self_attn.k_norm.weight");
    const TensorView wo_all = whole ? place(p + "self_attn.o_proj.weight") : TensorView{};
    const TensorView wdown_all = whole ? place(p + "mlp.down_proj.weight") : TensorView{};
    // NOTE: fusing q|k|v and gate|up into one GEMM each gives the same bits as separate GEMMs:
    // every output column is its own reduction over K, independent of the other columns. The
    // fused per-rank weights are built straight from the source rows (exact copies).
    for (int r : local) {
      const RankShard& s = ranks[size_t(r)];
      // o_proj / down_proj: the rank's K columns (row-parallel), whole K at tp = 1.
      const int64_t q0 = s.q0 * D, q1 = (s.q0 + s.nq) * D;
      L.wo.push_back(whole ? cols(wo_all, q0, q1)
                           : place_view(cols_of(p + "self_attn.o_proj.weight", q0, q1)));
      L.wdown.push_back(whole ? cols(wdown_all, s.i0, s.i0 + s.ni)
                              : place_view(cols_of(p + "mlp.down_proj.weight", s.i0, s.i0 + s.ni)));
      Tensor qkv = op.empty(DType::kBF16, {(s.nq + 2 * s.nkv) * D, H});
      const TensorView q = qkv.view();
      op.copy(q.rows(0, s.nq * D),
              rows_of(p + "self_attn.q_proj.weight", s.q0 * D, (s.q0 + s.nq) * D));
      op.copy(q.rows(s.nq * D, (s.nq + s.nkv) * D),
              rows_of(p + "self_attn.k_proj.weight", s.kv0 * D, (s.kv0 + s.nkv) * D));
      op.copy(q.rows((s.nq + s.nkv) * D, (s.nq + 2 * s.nkv) * D),
              rows_of(p + "self_attn.v_proj.weight", s.kv0 * D, (s.kv0 + s.nkv) * D));
      Tensor gu = op.empty(DType::kBF16, {2 * s.ni, H});
      const TensorView g = gu.view();
      op.copy(g.rows(0, s.ni), rows_of(p + "mlp.gate_proj.weight", s.i0, s.i0 + s.ni));
      op.copy(g.rows(s.ni, 2 * s.ni), rows_of(p + "mlp.up_proj.weight", s.i0, s.i0 + s.ni));
      L.wqkv.push_back(q);
      L.wgu.push_back(g);
      st.bytes += qkv.nbytes() + gu.nbytes();
      st.owned.push_back(std::move(qkv));
      st.owned.push_back(std::move(gu));
    }
  }
  // Copies from host memory must finish before the sources may go away; blocks converted while
  // building are kept where the store uses them in place.
  op.synchronize();
  if (zero_copy && lazy_keep)
    for (Tensor& t : *lazy_keep) st.owned.push_back(std::move(t));
  ws = std::move(store);
}

Model::Model(const Qwen3Config& cfg, const Checkpoint& ckpt, const ModelOptions& opt,
             std::shared_ptr<OpsBackend> ops, dist::Communicator* comm)
    : impl_(Impl::make(cfg, opt, std::move(ops), comm)) {
  Impl& m = *impl_;
  const bool host = m.ops->device() == Device::kCPU;
  if (comm) {
    // A rank-local model reads its shard's bytes only: names, shapes and dtypes of every weight
    // first, then each block it uses scanned for non-finite values and converted on its own.
    LoadOptions names_only;
    names_only.check_finite = false;
    ckpt.check_qwen3(cfg, names_only);
    std::map<std::string, std::vector<int64_t>> shapes;
    for (const WeightSpec& spec : qwen3_weight_specs(cfg)) shapes[spec.name] = spec.shape;
    std::vector<Tensor> converted;
    m.build(
        [&](const std::string& name, const WeightBlock& b) {
          return ckpt.get_block_bf16(name, shapes.at(name), b, /*check_finite=*/true, &converted);
        },
        true, host ? std::optional<Checkpoint>(ckpt) : std::nullopt, {}, &converted);
    return;
  }
  // Layer count, names, shapes, dtypes and finite values, before any weight is used (the finite
  // scan is cached in the checkpoint: Checkpoint::load or an earlier Model already did it).
  // Warnings have no sink here: a caller that wants them (or strict) uses Checkpoint::load.
  ckpt.check_qwen3(cfg);
  std::map<std::string, TensorView> src;
  std::vector<Tensor> converted;
  for (const WeightSpec& spec : qwen3_weight_specs(cfg)) {
    if (ckpt.info(spec.name).dtype == "BF16") {
      src[spec.name] = ckpt.get(spec.name, DType::kBF16, spec.shape);
    } else {
      converted.push_back(ckpt.get_converted(spec.name, DType::kBF16, spec.shape));
      src[spec.name] = converted.back().view();
    }
  }
  // Zero-copy on a CPU backend (the mapping and the converted tensors are kept); a device
  // backend gets its own copy of every weight and the checkpoint's mapping is not needed.
  m.build(blocks_of(src), true, host ? std::optional<Checkpoint>(ckpt) : std::nullopt,
          host ? std::move(converted) : std::vector<Tensor>{});
}

Model::Model(const Qwen3Config& cfg, const std::map<std::string, TensorView>& weights,
             const ModelOptions& opt, std::shared_ptr<OpsBackend> ops, dist::Communicator* comm)
    : impl_(Impl::make(cfg, opt, std::move(ops), comm)) {
  Impl& m = *impl_;
  const std::vector<WeightSpec> specs = qwen3_weight_specs(cfg);
  for (const auto& [name, view] : weights) {
    const bool known = std::any_of(specs.begin(), specs.end(),
                                   [&](const WeightSpec& s) { return s.name == name; });
    LS_CHECK(known, kOp, "weight ", name, " is not part of the Qwen3 architecture for this config",
             cfg.tie_word_embeddings ? " (tie_word_embeddings: no lm_head.weight)" : "");
  }
  std::map<std::string, TensorView> src;
  std::vector<Tensor> converted;
  for (const WeightSpec& spec : specs) {
    auto it = weights.find(spec.name);
    LS_CHECK(it != weights.end(), kOp, "missing weight ", spec.name, " (shape ",
             list_text(spec.shape), ")");
    const TensorView& v = it->second;
    std::vector<int64_t> got(v.shape, v.shape + v.ndim);
    LS_CHECK(got == spec.shape, kOp, "weight ", spec.name, " has shape ", list_text(got),
             ", the config expects ", list_text(spec.shape));
    LS_CHECK(v.dtype == DType::kBF16 || v.dtype == DType::kF32, kOp, "weight ", spec.name,
             " has dtype ", dtype_name(v.dtype), ", expected bf16 or f32");
    LS_CHECK(v.device == Device::kCPU || v.device == m.ops->device(), kOp, "weight ", spec.name,
             " is on ", device_name(v.device), ": expected the host or the backend's device (",
             device_name(m.ops->device()), ")");
    LS_CHECK(v.dtype == DType::kBF16 || v.device == Device::kCPU, kOp, "weight ", spec.name,
             ": an f32 weight must be on the host (it is rounded to bf16 there)");
    check_inner_contiguous(kOp, spec.name.c_str(), v);
    if (v.dtype == DType::kBF16) {
      src[spec.name] = v;
      continue;
    }
    Tensor t(DType::kBF16, spec.shape);
    const int64_t C = spec.shape.back();
    const int64_t R = t.numel() / std::max<int64_t>(C, 1);
    const int64_t rs = v.ndim == 2 ? v.stride[0] : C;
    for (int64_t r = 0; r < R; ++r) {
      bf16* d = t.ptr<bf16>() + r * C;
      const float* s = v.ptr<const float>() + r * rs;
      for (int64_t c = 0; c < C; ++c) d[c] = f32_to_bf16(s[c]);  // RNE, once
    }
    src[spec.name] = t.view();
    converted.push_back(std::move(t));
  }
  // The caller's views need not outlive the model: every weight is copied.
  m.build(blocks_of(src), false, std::nullopt, {});
}

std::unique_ptr<Model> Model::with_backend(std::shared_ptr<OpsBackend> ops) const {
  LS_CHECK(ops != nullptr, kOp, "with_backend: ops backend is null");
  LS_CHECK(ops->device() == impl_->ws->device, kOp, "with_backend: backend '", ops->name(),
           "' runs on ", device_name(ops->device()), " but the weights are on ",
           device_name(impl_->ws->device));
  std::unique_ptr<Model> m(new Model());
  m->impl_ = Impl::make(impl_->cfg, impl_->opt, std::move(ops), impl_->comm);
  m->impl_->ws = impl_->ws;
  return m;
}

Model::Model() = default;

Model::~Model() = default;

const Qwen3Config& Model::config() const { return impl_->cfg; }
const ModelOptions& Model::options() const { return impl_->opt; }
const OpsBackend& Model::ops() const { return *impl_->ops; }
const RopeTable& Model::rope_table() const { return impl_->ws->rope; }
int64_t Model::weight_bytes() const { return impl_->ws->bytes; }
int Model::rank() const { return impl_->comm ? impl_->comm->rank() : -1; }
int64_t Model::cache_kv_heads() const {
  return impl_->comm ? impl_->ranks[size_t(impl_->comm->rank())].nkv
                     : impl_->cfg.num_key_value_heads;
}
void Model::set_trace(TraceFn fn) { impl_->trace = std::move(fn); }

// --- forward ---

int64_t Model::Impl::check_tokens(const char* op, const TensorView& tokens) const {
  LS_CHECK(tokens.ndim == 1, op, "argument 'tokens' expected shape [T], got ",
           tokens.shape_string());
  const int64_t T = tokens.size(0);
  check_tensor_dtypes(op, "tokens", tokens, {DType::kI32, DType::kI64}, {T});
  for (int64_t t = 0; t < T; ++t) {
    const int64_t id = read_index(tokens, t);
    LS_CHECK(id >= 0 && id < cfg.vocab_size, op, "tokens[", t, "] = ", id,
             " is outside the vocabulary [0, ", cfg.vocab_size, ")");
  }
  return T;
}

void Model::Impl::check_activation(const char* op, const char* arg, const TensorView& t,
                                   DType dtype, std::initializer_list<int64_t> shape) const {
  LS_CHECK(t.device == Device::kCPU || t.device == ops->device(), op, "argument '", arg,
           "' must be on the host or on the backend's device (", device_name(ops->device()),
           "), got ", t.describe());
  check_tensor(op, arg, t, dtype, shape, t.device);
}

void Model::Impl::run(const TensorView& tokens, const TensorView& positions, const AttendFn& attend,
                      const TensorView& hidden_out, bool lse_out) const {
  const OpsBackend& op = *ops;
  const WeightStore& W = *ws;
  const int tp = opt.tp;
  const int64_t T = tokens.size(0), H = cfg.hidden_size, I = cfg.intermediate_size;
  const int64_t D = cfg.head_dim, Hq = cfg.num_attention_heads, Hkv = cfg.num_key_value_heads;
  const int64_t V = cfg.vocab_size;

  // Activations on the backend's device.
  Tensor res = op.empty(DType::kBF16, {T, H});  // residual stream
  Tensor xn = op.empty(DType::kBF16, {T, H});   // normed input of a sublayer
  Tensor out = op.empty(DType::kBF16, {T, H});  // o_proj / down_proj output
  // Attention output (query heads) and SiLU-and-mul output (intermediate columns): every rank's
  // columns in a simulated model, the rank's own in a rank-local one (attn_col, act_col).
  const RankShard& own = ranks[size_t(local[0])];
  Tensor attn = op.empty(DType::kBF16, {T, comm ? own.nq * D : Hq * D});
  Tensor act = op.empty(DType::kBF16, {T, comm ? own.ni : I});
  std::vector<Tensor> qkv, gu, partial;
  for (int r : local) {
    const RankShard& s = ranks[size_t(r)];
    qkv.push_back(op.empty(DType::kBF16, {T, (s.nq + 2 * s.nkv) * D}));
    gu.push_back(op.empty(DType::kBF16, {T, 2 * s.ni}));
    if (tp > 1) partial.push_back(op.empty(DType::kF32, {T, H}));
  }

  // Row-parallel projection (o_proj / down_proj): y = x · wᵀ over K; ranks own their K ranges
  // (w_parts: the ranks' column blocks of w), their fp32 partials combine in the canonical tree.
  auto row_parallel = [&](const TensorView& x, const std::vector<TensorView>& w_parts,
                          bool attn_side) {
    if (tp == 1) {
      op.gemm(x, w_parts[0], gemm_row, out.view());
      return;
    }
    const int64_t K = attn_side ? Hq * D : I;
    for (size_t i = 0; i < local.size(); ++i) {
      const RankShard& s = ranks[size_t(local[i])];
      const int64_t c0 = attn_side ? attn_col(s) : act_col(s);
      const int64_t c1 = c0 + (attn_side ? s.nq * D : s.ni);
      op.gemm_partial(cols(x, c0, c1), w_parts[i], K, tp, local[i], gemm_row, partial[i].view());
    }
    Tensor gathered;
    op.gemm_combine(rank_parts(partial, &gathered), out.view());
  };

  // Gathers a per-rank column block of every rank into one host [T, C] tensor for the trace
  // (rank-local: each rank's block padded to the widest, all-gathered, then placed).
  // source(r): the buffer holding rank r's block; col_range(s): (its first column there, its
  // first column in the full tensor, its width).
  auto trace_gather = [&](const char* name, int layer, auto source, auto col_range, int64_t C,
                          DType dtype = DType::kBF16) {
    if (!trace) return;
    Tensor full(dtype, {T, C});
    if (!comm) {
      for (int r = 0; r < tp; ++r) {
        auto [src0, dst0, n] = col_range(ranks[size_t(r)]);
        op.copy(cols(full.view(), dst0, dst0 + n), cols(source(r), src0, src0 + n));
      }
      op.synchronize();
    } else {
      int64_t widest = 0;
      for (const RankShard& s : ranks) widest = std::max(widest, std::get<2>(col_range(s)));
      Tensor mine = op.empty(dtype, {T, widest});
      auto [src0, dst0, n] = col_range(own);
      op.copy(cols(mine.view(), 0, n), cols(source(local[0]), src0, src0 + n));
      const Tensor all = all_gather(mine.view());
      for (int r = 0; r < tp; ++r) {
        auto [s0, d0, w] = col_range(ranks[size_t(r)]);
        op.copy(cols(full.view(), d0, d0 + w), cols(slab(all, r), 0, w));
      }
      op.synchronize();
    }
    emit(name, layer, full.view());
  };
  auto trace_qkv = [&](const char* name, int layer, int part) {  // part 0 q, 1 k, 2 v
    trace_gather(
        name, layer, [&](int r) { return qkv[slot(r)].view(); },
        [&](const RankShard& s) {
          if (part == 0) return std::tuple<int64_t, int64_t, int64_t>{0, s.q0 * D, s.nq * D};
          const int64_t base = (s.nq + (part == 2 ? s.nkv : 0)) * D;
          return std::tuple<int64_t, int64_t, int64_t>{base, s.kv0 * D, s.nkv * D};
        },
        part == 0 ? Hq * D : Hkv * D);
  };

  // Embedding (vocab-parallel for tp > 1: each rank gathers its rows, exact -0.0 elsewhere).
  if (tp == 1) {
    op.embedding(tokens, W.embed[0], res.view());
  } else {
    std::vector<Tensor> parts;
    for (size_t i = 0; i < local.size(); ++i) {
      parts.push_back(op.empty(DType::kBF16, {T, H}));
      op.embedding_vocab_parallel(tokens, W.embed[i], vocab_shard(V, local[i], tp), V,
                                  parts.back().view());
    }
    Tensor gathered;
    op.embedding_combine(rank_parts(parts, &gathered), res.view());
  }
  emit("embed", -1, res.view());

  for (int64_t li = 0; li < cfg.num_hidden_layers; ++li) {
    const int l = int(li);
    const LayerWeights& L = W.layers[size_t(l)];
    // (residual, x) = input_layernorm(out + residual); layer 0: residual = embedding, no add.
    if (l == 0) {
      op.rmsnorm(res.view(), L.input_norm, norm, xn.view());
    } else {
      op.rmsnorm_residual(out.view(), res.view(), L.input_norm, norm, res.view(), xn.view());
      emit("input_residual", l, res.view());
    }
    emit("input_norm", l, xn.view());

    // Attention block, rank by rank (column-parallel q|k|v, heads split).
    const size_t n_local = local.size();
    for (size_t i = 0; i < n_local; ++i) op.gemm(xn.view(), L.wqkv[i], gemm_col, qkv[i].view());
    trace_qkv("q", l, 0);
    trace_qkv("k", l, 1);
    trace_qkv("v", l, 2);
    if (trace) {
      // Step by step, so the trace holds every intermediate (q_norm, k_norm, q_rope, k_rope).
      for (size_t i = 0; i < n_local; ++i) {
        const RankShard& s = ranks[size_t(local[i])];
        const TensorView m = qkv[i].view();
        const TensorView q = heads_of(m, 0, s.nq, D);
        const TensorView k = heads_of(m, s.nq * D, s.nkv, D);
        op.rmsnorm(q, L.q_norm, norm, q);  // per head over D, in place
        op.rmsnorm(k, L.k_norm, norm, k);
      }
      trace_qkv("q_norm", l, 0);
      trace_qkv("k_norm", l, 1);
      for (size_t i = 0; i < n_local; ++i) {
        // The q and k heads are adjacent in a row of q|k|v: one RoPE call rotates both (RoPE acts
        // per (row, head, pair), so the bits are those of one call per part).
        const RankShard& s = ranks[size_t(local[i])];
        const TensorView qk = heads_of(qkv[i].view(), 0, s.nq + s.nkv, D);
        op.rope(qk, positions, W.rope, qk);
      }
      trace_qkv("q_rope", l, 0);
      trace_qkv("k_rope", l, 1);
    } else {
      // The same three steps as one backend call (fused on the GPU: one launch, the same bits).
      for (size_t i = 0; i < n_local; ++i) {
        const RankShard& s = ranks[size_t(local[i])];
        op.qk_norm_rope(heads_of(qkv[i].view(), 0, s.nq + s.nkv, D), s.nq, L.q_norm, L.k_norm, norm,
                        positions, W.rope);
      }
    }
    const bool keep_lse = trace && lse_out;
    std::vector<Tensor> lse_r(keep_lse ? n_local : 0);
    for (size_t i = 0; i < n_local; ++i) {
      const RankShard& s = ranks[size_t(local[i])];
      const TensorView m = qkv[i].view();
      if (keep_lse) lse_r[i] = op.empty(DType::kF32, {T, s.nq});
      attend(l, local[i], heads_of(m, 0, s.nq, D), heads_of(m, s.nq * D, s.nkv, D),
             heads_of(m, (s.nq + s.nkv) * D, s.nkv, D), heads_of(attn.view(), attn_col(s), s.nq, D),
             keep_lse ? lse_r[i].view() : TensorView{});
    }
    trace_gather(
        "attn", l, [&](int) { return attn.view(); },
        [&](const RankShard& s) {
          return std::tuple<int64_t, int64_t, int64_t>{attn_col(s), s.q0 * D, s.nq * D};
        },
        Hq * D);
    if (keep_lse)
      trace_gather(
          "attn_lse", l, [&](int r) { return lse_r[slot(r)].view(); },
          [&](const RankShard& s) {
            return std::tuple<int64_t, int64_t, int64_t>{0, s.q0, s.nq};
          },
          Hq, DType::kF32);
    row_parallel(attn.view(), L.wo, true);
    emit("o_proj", l, out.view());

    // (residual, x) = post_attention_layernorm(o + residual).
    op.rmsnorm_residual(out.view(), res.view(), L.post_norm, norm, res.view(), xn.view());
    emit("post_residual", l, res.view());
    emit("post_norm", l, xn.view());

    // MLP block (column-parallel gate|up over the rank's intermediate range, row-parallel down).
    for (size_t i = 0; i < n_local; ++i) op.gemm(xn.view(), L.wgu[i], gemm_col, gu[i].view());
    trace_gather(
        "gate", l, [&](int r) { return gu[slot(r)].view(); },
        [&](const RankShard& s) {
          return std::tuple<int64_t, int64_t, int64_t>{0, s.i0, s.ni};
        },
        I);
    trace_gather(
        "up", l, [&](int r) { return gu[slot(r)].view(); },
        [&](const RankShard& s) {
          return std::tuple<int64_t, int64_t, int64_t>{s.ni, s.i0, s.ni};
        },
        I);
    for (size_t i = 0; i < n_local; ++i) {
      const RankShard& s = ranks[size_t(local[i])];
      if (s.ni == 0) continue;
      const TensorView g = gu[i].view();
      op.silu_mul(cols(g, 0, s.ni), cols(g, s.ni, 2 * s.ni),
                  cols(act.view(), act_col(s), act_col(s) + s.ni));
    }
    trace_gather(
        "act", l, [&](int) { return act.view(); },
        [&](const RankShard& s) {
          return std::tuple<int64_t, int64_t, int64_t>{act_col(s), s.i0, s.ni};
        },
        I);
    row_parallel(act.view(), L.wdown, false);
    emit("down", l, out.view());
  }
  // Final norm with the last residual add.
  op.rmsnorm_residual(out.view(), res.view(), W.final_norm, norm, res.view(), hidden_out);
  emit("final_residual", -1, res.view());
  emit("final_norm", -1, hidden_out);
}

void Model::forward_packed(const TensorView& tokens, const TensorView& cu_seqlens,
                           const TensorView& hidden_out) const {
  impl_->forward_segments("Model::forward_packed", tokens, cu_seqlens, nullptr, hidden_out);
}

void Model::forward_packed_shared(const TensorView& tokens, const TensorView& cu_seqlens,
                                  const TensorView& prompt_of, const TensorView& hidden_out) const {
  impl_->forward_segments("Model::forward_packed_shared", tokens, cu_seqlens, &prompt_of,
                          hidden_out);
}

void Model::Impl::forward_segments(const char* op, const TensorView& tokens,
                                   const TensorView& cu_seqlens, const TensorView* prompt_of,
                                   const TensorView& hidden_out) const {
  const Impl& m = *this;
  const int64_t T = m.check_tokens(op, tokens), H = m.cfg.hidden_size;
  LS_CHECK(cu_seqlens.ndim == 1 && cu_seqlens.size(0) >= 1, op,
           "argument 'cu_seqlens' expected shape [B+1], got ", cu_seqlens.shape_string());
  check_tensor(op, "cu_seqlens", cu_seqlens, DType::kI32, {-1});
  m.check_activation(op, "hidden_out", hidden_out, DType::kBF16, {T, H});
  check_inner_contiguous(op, "hidden_out", hidden_out);
  const int64_t B = cu_seqlens.size(0) - 1;
  LS_CHECK(read_index(cu_seqlens, 0) == 0 && read_index(cu_seqlens, B) == T, op,
           "cu_seqlens must start at 0 and end at T = ", T, ", got ", read_index(cu_seqlens, 0),
           " .. ", read_index(cu_seqlens, B));
  for (int64_t b = 0; b < B; ++b) {
    const int64_t s0 = read_index(cu_seqlens, b), s1 = read_index(cu_seqlens, b + 1);
    LS_CHECK(s0 <= s1, op, "cu_seqlens must be non-decreasing: cu_seqlens[", b, "] = ", s0,
             " > cu_seqlens[", b + 1, "] = ", s1);
  }
  // Shared-prompt segments (§B.11): a completion's positions continue its prompt's.
  std::optional<SharedPromptSeqs> shared;
  if (prompt_of) shared = SharedPromptSeqs::validate(op, cu_seqlens, *prompt_of, T);
  Tensor pos(DType::kI32, {T});
  for (int64_t b = 0; b < B; ++b) {
    const int64_t s0 = read_index(cu_seqlens, b), s1 = read_index(cu_seqlens, b + 1);
    const int64_t p0 = shared ? shared->first_position(b) : 0;
    LS_CHECK(p0 + s1 - s0 <= m.max_positions, op, "sequence ", b, " has ", s1 - s0, " tokens",
             p0 > 0 ? " after its prompt's " + std::to_string(p0) : std::string(),
             ", more than the model's max positions (", m.max_positions, ")");
    for (int64_t t = s0; t < s1; ++t) pos.ptr<int32_t>()[t] = int32_t(p0 + t - s0);
  }
  if (T == 0) return;
  // Metadata validated above: one upload, used by every layer.
  DeviceStage stage(*m.ops);
  const std::vector<TensorView> md =
      stage.upload(op, {"tokens", "cu_seqlens", "positions"}, {tokens, cu_seqlens, pos.view()});
  const TensorView hidden = stage.output(hidden_out);
  const PackedSeqs seqs =
      PackedSeqs::validate(op, cu_seqlens, T).with_device_copy(m.ops->device(), md[1]);
  m.run(
      md[0], md[2],
      [&](int, int, const TensorView& q, const TensorView& k, const TensorView& v,
          const TensorView& out, const TensorView& lse) {
        if (shared)
          m.ops->attention_prefill_shared(q, k, v, *shared, m.attn, out, lse);
        else
          m.ops->attention_prefill_varlen(q, k, v, seqs, m.attn, out, lse);
      },
      hidden, /*lse_out=*/true);
  stage.finish();
}

void Model::forward_step(const TensorView& tokens, const TensorView& seq, const TensorView& pos,
                         KvCacheView& cache, const StepOptions& step,
                         const TensorView& hidden_out) const {
  const char* op = "Model::forward_step";
  const Impl& m = *impl_;
  const Device dev = m.ops->device();
  const int64_t L = m.cfg.num_hidden_layers, D = m.cfg.head_dim;
  const int64_t Hkv = cache_kv_heads();  // the heads this model's cache holds
  const int64_t N = m.check_tokens(op, tokens);
  check_tensor(op, "seq", seq, DType::kI32, {N});
  check_tensor(op, "pos", pos, DType::kI32, {N});
  m.check_activation(op, "hidden_out", hidden_out, DType::kBF16, {N, m.cfg.hidden_size});
  check_inner_contiguous(op, "hidden_out", hidden_out);
  LS_CHECK(step.kv_splits >= 1, op, "step.kv_splits must be >= 1, got ", step.kv_splits);
  LS_CHECK(!step.cascade || cache.prefix.has_value(), op,
           "step.cascade is on but cache.prefix is not set");
  LS_CHECK(int64_t(cache.k.size()) == L && int64_t(cache.v.size()) == L, op, "cache holds ",
           cache.k.size(), " k and ", cache.v.size(), " v layers, the model has ", L);
  for (int64_t l = 0; l < L; ++l) {
    LS_CHECK(cache.k[size_t(l)].ndim == 4, op, "cache.k[", l,
             "] expected shape [NP, P, Hkv, D], got ", cache.k[size_t(l)].shape_string());
    const TensorView& k0 = cache.k[0];
    const std::string kn = "cache.k[" + std::to_string(l) + "]";
    const std::string vn = "cache.v[" + std::to_string(l) + "]";
    check_tensor(op, kn.c_str(), cache.k[size_t(l)], DType::kBF16,
                 {k0.shape[0], k0.shape[1], Hkv, D}, dev);
    check_tensor(op, vn.c_str(), cache.v[size_t(l)], DType::kBF16,
                 {k0.shape[0], k0.shape[1], Hkv, D}, dev);
    check_inner_contiguous(op, kn.c_str(), cache.k[size_t(l)]);
    check_inner_contiguous(op, vn.c_str(), cache.v[size_t(l)]);
  }
  LS_CHECK(cache.block_table.ndim == 2, op, "cache.block_table expected shape [S, MP], got ",
           cache.block_table.shape_string());
  check_tensor(op, "cache.block_table", cache.block_table, DType::kI32, {-1, -1});
  check_inner_contiguous(op, "cache.block_table", cache.block_table);
  const int64_t S = cache.block_table.size(0), MP = cache.block_table.size(1);
  check_tensor(op, "cache.seq_lens", cache.seq_lens, DType::kI32, {S});
  if (N == 0) return;
  const int64_t NP = cache.k[0].shape[0], P = cache.k[0].shape[1];
  LS_CHECK(P >= 1, op, "cache page size must be >= 1, got ", P);
  auto table_at = [&](const TensorView& t, int64_t r, int64_t c) {
    return int64_t(t.ptr<const int32_t>()[r * t.stride[0] + c * t.stride[1]]);
  };

  Tensor slots(DType::kI64, {N});
  for (int64_t i = 0; i < N; ++i) {
    const int64_t s = read_index(seq, i), p = read_index(pos, i);
    LS_CHECK(s >= 0 && s < S, op, "seq[", i, "] = ", s,
             " is not a row of cache.block_table (S = ", S, ")");
    const int64_t len = read_index(cache.seq_lens, s);
    LS_CHECK(p >= 0 && p < len, op, "pos[", i, "] = ", p, " outside [0, cache.seq_lens[", s,
             "] = ", len, ")");
    LS_CHECK(p < m.max_positions, op, "pos[", i, "] = ", p, " >= the model's max positions (",
             m.max_positions, ")");
    // Slot through the sequence's own block table.
    LS_CHECK(p / P < MP, op, "pos[", i, "] = ", p, " needs page-slot ", p / P,
             " but cache.block_table has ", MP, " per row (page size ", P, ")");
    const int64_t page = table_at(cache.block_table, s, p / P);
    LS_CHECK(page >= 0 && page < NP, op, "cache.block_table[", s, "][", p / P, "] = ", page,
             " is not a page of the cache (NP = ", NP, ")");
    slots.ptr<int64_t>()[i] = page * P + p % P;
  }

  // Every slot is written once (chunked prefill and decode rows of one step never share a slot)
  // and every sequence's length fits its block-table row.
  {
    std::unordered_set<int64_t> seen;
    for (int64_t i = 0; i < N; ++i)
      LS_CHECK(seen.insert(slots.ptr<int64_t>()[i]).second, op, "row ", i, " (seq ",
               read_index(seq, i), ", pos ", read_index(pos, i),
               ") writes a KV slot that another row of the step writes too: a slot is written "
               "more than once");
    for (int64_t s = 0; s < S; ++s) {
      const int64_t len = read_index(cache.seq_lens, s);
      LS_CHECK(len >= 0 && (len + P - 1) / P <= MP, op, "cache.seq_lens[", s, "] = ", len,
               " needs more than the ", MP, " pages of a block-table row (page size ", P, ")");
    }
  }
  // The step's paged metadata, validated once here (every page each row reads, prefix tables,
  // ...: PagedMeta::validate) and passed to every layer and rank with its device copies.
  const std::optional<SharedPrefix> prefix = step.cascade ? cache.prefix : std::nullopt;
  PagedTables tables;
  tables.q_seq = seq;
  tables.q_pos = pos;
  tables.block_table = cache.block_table;
  tables.seq_lens = cache.seq_lens;
  if (prefix) {
    tables.prefix_block_table = prefix->block_table;
    tables.shared_len = prefix->shared_len;
    tables.seq_group = prefix->seq_group;
  }
  PagedMeta host_meta = PagedMeta::validate(op, tables, NP, P, m.attn);

  // One upload of the step's metadata (tokens, slots and the meta's tables), used by every layer
  // and rank.
  DeviceStage stage(*m.ops);
  std::vector<const char*> names = {"tokens",        "seq", "pos", "slots", "cache.block_table",
                                    "cache.seq_lens"};
  std::vector<TensorView> host = {tokens,        seq, pos, slots.view(), cache.block_table,
                                  cache.seq_lens};
  if (prefix) {
    names.insert(names.end(),
                 {"cache.prefix.block_table", "cache.prefix.shared_len", "cache.prefix.seq_group"});
    host.insert(host.end(), {prefix->block_table, prefix->shared_len, prefix->seq_group});
  }
  const std::vector<TensorView> md = stage.upload(op, names, host);
  PagedTables copies;
  copies.q_seq = md[1];
  copies.q_pos = md[2];
  copies.block_table = md[4];
  copies.seq_lens = md[5];
  if (prefix) {
    copies.prefix_block_table = md[6];
    copies.shared_len = md[7];
    copies.seq_group = md[8];
  }
  const PagedMeta meta = std::move(host_meta).with_device_copies(dev, copies);
  const TensorView hidden = stage.output(hidden_out);

  m.run(
      md[0], md[2],
      [&](int l, int r, const TensorView& q, const TensorView& k, const TensorView& v,
          const TensorView& out, const TensorView&) {
        const RankShard& s = m.ranks[size_t(r)];
        const int64_t h0 = m.comm ? 0 : s.kv0;  // a rank-local cache holds the rank's heads only
        const TensorView kc = cache_heads(cache.k[size_t(l)], h0, s.nkv);
        const TensorView vc = cache_heads(cache.v[size_t(l)], h0, s.nkv);
        // Every new token's K/V goes in before attention (chunked prefill reads its own
        // chunk's keys from the cache). Replicated kv heads (Hkv < tp) are written by each of
        // their ranks with identical bits.
        m.ops->kv_cache_write(k, v, md[3], kc, vc);
        if (step.cascade) {
          m.ops->attention_paged_cascade(q, meta, kc, vc, m.attn, out, TensorView{});
        } else if (step.kv_splits > 1) {
          m.ops->attention_paged_split_kv(q, meta, kc, vc, m.attn, step.kv_splits, out,
                                          TensorView{});
        } else {
          m.ops->attention_paged(q, meta, kc, vc, m.attn, out, TensorView{});
        }
      },
      hidden);
  stage.finish();
}

// --- heads ---

void Model::logprob(const TensorView& hidden, const TensorView& targets, float temperature,
                    const TensorView& logp, const TensorView& lse,
                    const TensorView& entropy) const {
  const Impl& m = *impl_;
  const char* op = "Model::logprob";
  LogprobParams params;
  params.temperature = temperature;
  params.ignore_index = -1;
  const int tp = m.opt.tp;
  const int64_t V = m.cfg.vocab_size;
  LS_CHECK(hidden.ndim == 2, op, "argument 'hidden' expected shape [T, H], got ",
           hidden.shape_string());
  const int64_t T = hidden.size(0);
  if (m.device_backend()) {
    // The device ops trust device targets: check them here (the CPU op does it itself).
    m.check_activation(op, "hidden", hidden, DType::kBF16, {T, m.cfg.hidden_size});
    check_tensor_dtypes(op, "targets", targets, {DType::kI32, DType::kI64}, {T});
    for (int64_t t = 0; t < T; ++t) {
      const int64_t id = read_index(targets, t);
      LS_CHECK(id == params.ignore_index || (id >= 0 && id < V), op, "targets[", t, "] = ", id,
               " is outside the vocabulary [0, ", V, ") and not the ignore index -1");
    }
    for (auto [name, v] :
         {std::pair{"logp", &logp}, std::pair{"lse", &lse}, std::pair{"entropy", &entropy}})
      m.check_activation(op, name, *v, DType::kF32, {T});
  }
  DeviceStage stage(*m.ops);
  const TensorView tg = stage.upload(op, {"targets"}, {targets})[0];
  const TensorView h = stage.input(hidden);
  const TensorView lp = stage.output(logp), ls = stage.output(lse), en = stage.output(entropy);
  if (tp == 1) {
    m.ops->linear_logprob(h, m.ws->lm_head, tg, params, m.opt.contract, lp, ls, en);
    stage.finish();
    return;
  }
  // Vocab-parallel: rank r owns the aligned subtree of vocab segments [r·S/tp, (r+1)·S/tp);
  // states [tp, T, 4] in rank order (rank-local: this rank's, all-gathered).
  const int per = m.opt.contract.vocab_segments / tp;
  Tensor states = m.ops->empty(DType::kF32, {int64_t(m.local.size()), T, 4});
  for (size_t i = 0; i < m.local.size(); ++i) {
    const int r = m.local[i];
    m.ops->linear_logprob_partial(h, m.ws->lm_head_rows[i], tg, params, m.opt.contract,
                                  LogprobShard{V, r * per, per}, slab(states, int64_t(i)));
  }
  if (m.comm) states = m.all_gather(slab(states, 0));
  m.ops->linear_logprob_combine(states.view(), tg, params, m.opt.contract, V, lp, ls, en);
  stage.finish();
}

void Model::sample(const TensorView& hidden, std::span<const SamplingParams> params,
                   const TensorView& request_ids, const TensorView& positions,
                   const TensorView& token_ids, const TensorView& logp, const TensorView& lse,
                   const TensorView& entropy) const {
  // NOTE: vocab-parallel sampling = the ranks' fp32 logits are gathered and one sampler decides.
  // A logit z[t, v] is one GEMM output column (its own K reduction from row v of the lm_head), so
  // the gathered row has the same bits for every tp; simulated by sampling on the full lm_head.
  const Impl& m = *impl_;
  const char* op = "Model::sample";
  if (m.device_backend()) {
    LS_CHECK(hidden.ndim == 2, op, "argument 'hidden' expected shape [T, H], got ",
             hidden.shape_string());
    const int64_t T = hidden.size(0);
    m.check_activation(op, "hidden", hidden, DType::kBF16, {T, m.cfg.hidden_size});
    LS_CHECK(int64_t(params.size()) == T, op, "params has ", params.size(), " entries for ", T,
             " rows");
    check_tensor(op, "request_ids", request_ids, DType::kI64, {T});
    check_tensor_dtypes(op, "positions", positions, {DType::kI32, DType::kI64}, {T});
    for (int64_t t = 0; t < T; ++t) {
      const int64_t p = read_index(positions, t);
      LS_CHECK(p >= 0 && p <= int64_t(UINT32_MAX), op, "positions[", t, "] = ", p,
               " is outside [0, 2^32)");
    }
    check_tensor_dtypes(op, "token_ids", token_ids, {DType::kI32, DType::kI64}, {T},
                        token_ids.device);
    for (auto [name, v] : {std::pair{"token_ids", &token_ids}, std::pair{"logp", &logp},
                           std::pair{"lse", &lse}, std::pair{"entropy", &entropy}})
      LS_CHECK(v->device == Device::kCPU || v->device == m.ops->device(), op, "argument '", name,
               "' must be on the host or on the backend's device, got ", v->describe());
  }
  DeviceStage stage(*m.ops);
  const std::vector<TensorView> md =
      stage.upload(op, {"request_ids", "positions"}, {request_ids, positions});
  const TensorView h = stage.input(hidden);
  const TensorView ids = stage.output(token_ids), lp = stage.output(logp), ls = stage.output(lse),
                   en = stage.output(entropy);
  if (!m.comm || m.opt.tp == 1) {
    m.ops->sample(h, m.ws->lm_head, params, md[0], md[1], m.opt.contract, ids, lp, ls, en);
    stage.finish();
    return;
  }
  // Rank-local: every rank computes the logits of its lm_head rows (padded to the widest shard),
  // they are all-gathered and placed side by side, and each rank samples from the same [T, V]
  // logits (the same bits as sample() over the whole lm_head: a logit is its own column).
  const int64_t T = h.size(0), V = m.cfg.vocab_size;
  const LogprobVocabLayout lay = logprob_vocab_layout(m.opt.contract, V);
  const int per = m.opt.contract.vocab_segments / m.opt.tp;
  const int64_t widest = std::min(V, int64_t(per) * lay.segment_len);
  const int64_t own_rows = m.ws->lm_head_rows[0].size(0);
  Tensor mine = m.ops->empty(DType::kF32, {T, widest});
  m.ops->lm_head_logits(h, m.ws->lm_head_rows[0], m.opt.contract, cols(mine.view(), 0, own_rows));
  const Tensor all = m.all_gather(mine.view());
  Tensor z = m.ops->empty(DType::kF32, {T, V});
  for (int r = 0; r < m.opt.tp; ++r) {
    const int64_t v0 = std::min(V, int64_t(r * per) * lay.segment_len);
    const int64_t v1 = std::min(V, int64_t((r + 1) * per) * lay.segment_len);
    if (v1 > v0) m.ops->copy(cols(z.view(), v0, v1), cols(slab(all, r), 0, v1 - v0));
  }
  m.ops->sample_logits(z.view(), params, md[0], md[1], m.opt.contract, ids, lp, ls, en);
  stage.finish();
}

}  // namespace lockstep::engine
