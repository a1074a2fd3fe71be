// DLPack arrays as TensorViews, placement, and the host-side objects the bindings build.
#include "python/tensor_args.h"

#include <bit>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "lockstep/error.h"
#ifdef LOCKSTEP_PYTHON_CUDA
#include "lockstep/cuda/runtime.h"
#endif

namespace lockstep::python {

namespace {

constexpr int kDlpackCpu = 1;   // kDLCPU
constexpr int kDlpackCuda = 2;  // kDLCUDA

bool dtype_of(nb::dlpack::dtype t, DType* out) {
  using Code = nb::dlpack::dtype_code;
  if (t.lanes != 1) return false;
  const auto is = [&](Code c, int bits) { return t.code == uint8_t(c) && t.bits == bits; };
  if (is(Code::Float, 32))
    *out = DType::kF32;
  else if (is(Code::Bfloat, 16))
    *out = DType::kBF16;
  else if (is(Code::Int, 32))
    *out = DType::kI32;
  else if (is(Code::Int, 64))
    *out = DType::kI64;
  else if (is(Code::UInt, 8))
    *out = DType::kU8;
  else
    return false;
  return true;
}

std::string dlpack_dtype_name(nb::dlpack::dtype t) {
  static const char* const kCodes[] = {"int", "uint", "float", "?", "bfloat", "complex", "bool"};
  const std::string code = t.code < 7 ? kCodes[t.code] : "code" + std::to_string(int(t.code));
  return code + std::to_string(int(t.bits)) + (t.lanes != 1 ? "x" + std::to_string(t.lanes) : "");
}

}  // namespace

ArgView view_of(const char* op, const char* arg, const Array& a) {
  LS_CHECK(a.is_valid(), op, "argument '", arg, "' is missing");
  ArgView v;
  LS_CHECK(dtype_of(a.dtype(), &v.dtype), op, "argument '", arg, "' has dtype ",
           dlpack_dtype_name(a.dtype()), ": lockstep takes f32, bf16, i32, i64 or u8");
  if (a.device_type() == kDlpackCpu) {
    v.device = Device::kCPU;
  } else if (a.device_type() == kDlpackCuda) {
    v.device = Device::kCUDA;
    v.device_id = int(a.device_id());
  } else {
    LS_CHECK(false, op, "argument '", arg, "' is on DLPack device type ", a.device_type(),
             ": lockstep takes CPU or CUDA tensors");
  }
  LS_CHECK(a.ndim() <= size_t(kMaxDims), op, "argument '", arg, "' has ", a.ndim(),
           " dimensions (at most ", kMaxDims, ")");
  v.ndim = int(a.ndim());
  for (int i = 0; i < v.ndim; ++i) {
    v.shape[i] = int64_t(a.shape(size_t(i)));
    v.stride[i] = a.stride(size_t(i));
    // NOTE: the ops' overlap checks and row loops assume positive strides; a broadcast
    // (zero-stride) or flipped view is refused here rather than read or written wrongly.
    LS_CHECK(v.stride[i] > 0 || v.shape[i] <= 1, op, "argument '", arg, "' has stride ",
             v.stride[i], " in dimension ", i, " (shape ", v.shape_string(),
             "): lockstep takes views with positive strides (call .contiguous())");
  }
  v.data = a.data();
  return v;
}

ArgView view_of(const char* op, const char* arg, const OptArray& a) {
  return a ? view_of(op, arg, *a) : ArgView{};
}

Placement place(const char* op, std::initializer_list<const ArgView*> views, uint64_t stream) {
  Placement at;
  bool first = true;
  for (const ArgView* v : views) {
    if (v->ndim == 0 && v->data == nullptr) continue;
    if (first) {
      at.device = v->device;
      at.device_id = v->device_id;
    }
    LS_CHECK(v->device == at.device, op, "tensors on different devices (", device_name(at.device),
             " and ", device_name(v->device), ")");
    LS_CHECK(v->device_id == at.device_id, op,
             "CUDA tensors on different devices (cuda:", at.device_id, " and cuda:", v->device_id,
             ")");
    first = false;
  }
#ifdef LOCKSTEP_PYTHON_CUDA
  at.stream = reinterpret_cast<void*>(uintptr_t(stream));
#else
  LS_CHECK(at.device == Device::kCPU, op,
           "CUDA tensors need a CUDA build of lockstep "
           "(pip install . -C cmake.define.LOCKSTEP_CUDA=ON); this build is CPU only");
  (void)stream;
#endif
  return at;
}

#ifdef LOCKSTEP_PYTHON_CUDA
DeviceScope::DeviceScope(int ordinal) : previous_(cuda::current_device()) {
  if (ordinal != previous_) cuda::set_device(ordinal);
}

DeviceScope::~DeviceScope() {
  // NOTE: a destructor must not throw; cudaSetDevice back to a device that was current a moment
  // ago cannot fail short of a lost context, which the next op reports.
  try {
    if (cuda::current_device() != previous_) cuda::set_device(previous_);
  } catch (const Error&) {
  }
}
#endif

void check_host(const char* op, const char* arg, const TensorView& v) {
  LS_CHECK(v.device == Device::kCPU, op, "argument '", arg, "' must be a CPU (host) tensor, got ",
           device_name(v.device), ": the library reads it on the host to plan the op");
}

TokenOrder token_order(const char* op, const OptArray& cu_seqlens, const OptArray& step_indices,
                       int64_t rows) {
  if (!cu_seqlens) {
    LS_CHECK(!step_indices, op, "argument 'step_indices' needs cu_seqlens");
    return TokenOrder::make(op, {TokenSeq{0, 0, rows}}, rows);
  }
  const TensorView cu = view_of(op, "cu_seqlens", cu_seqlens);
  check_host(op, "cu_seqlens", cu);
  const PackedSeqs seqs = PackedSeqs::validate(op, cu, rows);
  std::vector<int64_t> steps(size_t(seqs.B()));
  for (int64_t b = 0; b < seqs.B(); ++b) steps[size_t(b)] = b;
  if (step_indices) {
    const TensorView s = view_of(op, "step_indices", *step_indices);
    check_host(op, "step_indices", s);
    check_tensor(op, "step_indices", s, DType::kI64, {seqs.B()});
    for (int64_t b = 0; b < seqs.B(); ++b)
      steps[size_t(b)] = s.ptr<const int64_t>()[b * s.stride[0]];
  }
  std::vector<TokenSeq> ts;
  for (int64_t b = 0; b < seqs.B(); ++b) {
    const int64_t begin = seqs.cu()[size_t(b)], end = seqs.cu()[size_t(b) + 1];
    ts.push_back({steps[size_t(b)], begin, end - begin});
  }
  return TokenOrder::make(op, std::move(ts), rows);
}

PackedSeqs packed_seqs(const char* op, const Array& cu_seqlens, int64_t T) {
  const TensorView cu = view_of(op, "cu_seqlens", cu_seqlens);
  check_host(op, "cu_seqlens", cu);
  return PackedSeqs::validate(op, cu, T);
}

std::shared_ptr<const RopeTable> rope_table(int64_t head_dim, double theta, int64_t max_positions) {
  using Key = std::tuple<int64_t, uint64_t, int64_t>;
  constexpr size_t kKept = 8;
  static std::mutex mutex;
  static std::map<Key, std::shared_ptr<const RopeTable>> tables;
  const Key key{head_dim, std::bit_cast<uint64_t>(theta), max_positions};
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = tables.find(key); it != tables.end()) return it->second;
  RopeConfig cfg;
  cfg.head_dim = head_dim;
  cfg.theta = theta;
  cfg.max_positions = max_positions;
  auto table = std::make_shared<const RopeTable>(RopeTable::build(cfg));
  if (tables.size() >= kKept) tables.clear();
  tables.emplace(key, table);
  return table;
}

DeviceRopeTable device_rope_table(int64_t head_dim, double theta, int64_t max_positions,
                                  int device_id) {
#ifdef LOCKSTEP_PYTHON_CUDA
  using Key = std::tuple<int64_t, uint64_t, int64_t, int>;
  static std::mutex mutex;
  // NOTE: never destroyed (a leak by design): freeing device memory from a static destructor
  // would run after the CUDA runtime has shut down at exit. A few configurations per process.
  static auto* tables = new std::map<Key, std::pair<Tensor, Tensor>>();
  const Key key{head_dim, std::bit_cast<uint64_t>(theta), max_positions, device_id};
  std::lock_guard<std::mutex> lock(mutex);
  auto it = tables->find(key);
  if (it == tables->end()) {
    const auto host = rope_table(head_dim, theta, max_positions);
    const DeviceScope scope(device_id);
    Tensor cos = cuda::empty(DType::kF32, {host->cos_view().shape[0], host->half_dim()});
    Tensor sin = cuda::empty(DType::kF32, {host->sin_view().shape[0], host->half_dim()});
    cuda::copy(cos.view(), host->cos_view());
    cuda::copy(sin.view(), host->sin_view());
    // Uploaded on the legacy default stream: done before any stream of the caller reads it.
    cuda::synchronize();
    it = tables->emplace(key, std::make_pair(std::move(cos), std::move(sin))).first;
  }
  return {it->second.first.view(), it->second.second.view()};
#else
  (void)head_dim, (void)theta, (void)max_positions, (void)device_id;
  LS_CHECK(false, "rope", "CUDA tensors need a CUDA build of lockstep");
  return {};
#endif
}

ContractConfig contract_config(int gemm_segments, int kv_chunk, int vocab_tile,
                               int vocab_segments) {
  ContractConfig c;
  c.gemm_segments = gemm_segments;
  c.kv_chunk = kv_chunk;
  c.vocab_tile = vocab_tile;
  c.vocab_segments = vocab_segments;
  c.validate();
  return c;
}

}  // namespace lockstep::python
