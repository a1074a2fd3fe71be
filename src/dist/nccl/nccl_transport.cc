// The NCCL transport (nccl_transport.h). A collective is two NCCL operations on the rank's stream,
// each waited for by polling (never a blocking NCCL or CUDA wait, so a deadline can end it):
//   1. the descriptor exchange: every rank's CallDesc (op, dtype, shape, root, its own argument
//      error) all-gathered from pinned host memory through a device buffer and back, then checked
//      (check_agree, the rank errors) identically on every rank;
//   2. only when all agree and the call moves any bytes: ncclAllGather / ncclBroadcast of the
//      bytes as ncclUint8 (no NCCL arithmetic). A barrier is the exchange alone.
// A wait ends with the stream idle and the communicator's state ncclSuccess, or with
// ncclCommAbort and a lockstep::Error on an NCCL or CUDA error or at the deadline.
#include "dist/nccl/nccl_transport.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "dist/collective.h"

// ncclConfig_t (non-blocking communicators), ncclCommFinalize and ncclGetLastError.
#if NCCL_VERSION_CODE < NCCL_VERSION(2, 14, 0)
#error "the NCCL transport needs NCCL >= 2.14 (non-blocking communicators)"
#endif

namespace lockstep::dist {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kDescBytes = 256;
constexpr uint32_t kDescMagic = 0x4c534331u;  // "LSC1"

// One rank's call as every rank sees it in the descriptor exchange: fixed size, plain bytes.
struct CallDesc {
  uint32_t magic;     // kDescMagic: a descriptor, not stale or foreign bytes
  int32_t op;         // CollectiveOp
  int32_t dtype;      // DType of send (buf); barrier: unused
  int32_t ndim;       // of send (buf)
  int32_t root;       // broadcast only
  int32_t error_len;  // > 0: this rank's arguments failed its local checks, error says why
  int64_t shape[kMaxDims];
  char error[kDescBytes - 6 * 4 - 8 * kMaxDims];  // the rank's Error message, cut to fit
};
static_assert(sizeof(CallDesc) == kDescBytes);

CallDesc describe(const CollectiveCall& call, const std::string& error) {
  CallDesc d{};
  d.magic = kDescMagic;
  d.op = int32_t(call.op);
  d.dtype = int32_t(call.send.dtype);
  d.ndim = call.send.ndim;
  d.root = call.root;
  for (int i = 0; i < call.send.ndim; ++i) d.shape[i] = call.send.shape[i];
  std::string e = error;
  if (e.size() > sizeof(d.error)) e = e.substr(0, sizeof(d.error) - 3) + "...";
  std::memcpy(d.error, e.data(), e.size());
  d.error_len = int32_t(e.size());
  return d;
}

bool well_formed(const CallDesc& d) {
  return d.magic == kDescMagic && d.op >= int32_t(CollectiveOp::kAllGather) &&
         d.op <= int32_t(CollectiveOp::kBarrier) && d.dtype >= 0 &&
         d.dtype <= int32_t(DType::kU8) && d.ndim >= 0 && d.ndim <= kMaxDims && d.error_len >= 0 &&
         d.error_len <= int32_t(sizeof(d.error));
}

// The call a descriptor stands for, as check_agree reads it (op, dtype, shape, root; no data).
CollectiveCall call_of(const CallDesc& d) {
  CollectiveCall c;
  c.op = CollectiveOp(d.op);
  c.send.dtype = DType(d.dtype);
  c.send.ndim = d.ndim;
  for (int i = 0; i < d.ndim; ++i) c.send.shape[i] = d.shape[i];
  c.root = d.root;
  return c;
}

int64_t nbytes(const TensorView& t) { return t.numel() * dtype_size(t.dtype); }

// Between polls: yield for the first 200 us (an exchange among ranks that have all arrived takes
// tens of microseconds), then sleep 50 us at a time.
void pause_since(Clock::time_point start) {
  if (Clock::now() - start < std::chrono::microseconds(200))
    std::this_thread::yield();
  else
    std::this_thread::sleep_for(std::chrono::microseconds(50));
}

// Makes `device` current for a scope, then restores the caller's device.
class DeviceGuard {
 public:
  DeviceGuard(int device, const char* op, int rank) {
    cudaError_t e = cudaGetDevice(&saved_);
    if (e == cudaSuccess && saved_ != device) e = cudaSetDevice(device);
    LS_CHECK(e == cudaSuccess, op, "rank ", rank, ": cannot make cuda device ", device,
             " current: ", cudaGetErrorString(e));
    restore_ = saved_ != device;
  }
  ~DeviceGuard() {
    if (restore_) cudaSetDevice(saved_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int saved_ = 0;
  bool restore_ = false;
};

constexpr const char* kJoining = "joining the communicator, waiting for every rank to join";
constexpr const char* kExchanging =
    "exchanging the ranks' call descriptors, waiting for every rank to make this call";
constexpr const char* kMoving = "moving the bytes";

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(int rank, int size, int device, const CommOptions& options)
      : rank_(rank), size_(size), device_(device), options_(options) {}
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  // Creates the stream and buffers and joins the NCCL communicator `id` (throws; the destructor
  // frees whatever was made).
  void init(const ncclUniqueId& id);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const CommOptions& options() const override { return options_; }

  void all_gather(const TensorView& send, const TensorView& recv) override {
    run(CollectiveCall{CollectiveOp::kAllGather, send, recv, 0}, [&](size_t bytes) {
      return ncclAllGather(send.data, recv.data, bytes, ncclUint8, comm_, stream_);
    });
  }

  void broadcast(const TensorView& buf, int root) override {
    run(CollectiveCall{CollectiveOp::kBroadcast, buf, TensorView{}, root}, [&](size_t bytes) {
      return ncclBroadcast(buf.data, buf.data, bytes, ncclUint8, root, comm_, stream_);
    });
  }

  void barrier() override {
    run(CollectiveCall{}, [](size_t) { return ncclSuccess; });
  }

 private:
  template <typename Move>
  void run(const CollectiveCall& call, const Move& move);
  void exchange(const CollectiveCall& call, const std::string& local_error,
                Clock::time_point deadline);
  void check_device_memory(const CollectiveCall& call) const;
  void settle(const char* op, const char* phase, ncclResult_t issued, Clock::time_point deadline);
  void wait_stream(const char* op, const char* phase, Clock::time_point deadline);
  void check_cuda(const char* op, const char* phase, cudaError_t e);
  [[noreturn]] void fail(const std::string& what);
  [[noreturn]] void fail_nccl(const char* op, const char* phase, ncclResult_t state);
  [[noreturn]] void fail_timeout(const char* op, const char* phase, ncclResult_t state);
  [[noreturn]] void break_job(const std::string& what) {
    broken_ = what;
    throw Error(what);
  }

  const int rank_, size_, device_;
  const CommOptions options_;
  ncclComm_t comm_ = nullptr;
  // NOTE: a blocking stream (cudaStreamCreate): work on it waits for earlier work on the
  // device's legacy default stream, where lockstep's CUDA ops run, so a call sends what those
  // ops wrote before it.
  cudaStream_t stream_ = nullptr;
  char* d_desc_ = nullptr;      // [size, kDescBytes] device: the exchange's send and recv
  CallDesc* h_desc_ = nullptr;  // [size] pinned host: this rank's descriptor, then everyone's
  std::string broken_;          // the job's first error; non-empty: every call throws
};

void NcclCommunicator::init(const ncclUniqueId& id) {
  const char* op = "make_nccl_communicator";
  const Clock::time_point deadline = Clock::now() + options_.timeout;
  DeviceGuard guard(device_, op, rank_);
  check_cuda(op, "creating its stream", cudaStreamCreate(&stream_));
  check_cuda(op, "allocating its buffers", cudaMalloc(&d_desc_, size_t(size_) * kDescBytes));
  check_cuda(op, "allocating its buffers",
             cudaMallocHost(reinterpret_cast<void**>(&h_desc_), size_t(size_) * kDescBytes));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every call returns at once; settle / wait_stream poll with a deadline
  settle(op, kJoining, ncclCommInitRankConfig(&comm_, size_, id, rank_, &config), deadline);
  int count = -1, user_rank = -1, cu_device = -1;
  ncclCommCount(comm_, &count);
  ncclCommUserRank(comm_, &user_rank);
  ncclCommCuDevice(comm_, &cu_device);
  if (count != size_ || user_rank != rank_ || cu_device != device_)
    fail(detail::concat(op, ": rank ", rank_, ": NCCL made rank ", user_rank, " of ", count,
                        " on cuda device ", cu_device, ", expected rank ", rank_, " of ", size_,
                        " on cuda device ", device_, "; communicator aborted"));
}

NcclCommunicator::~NcclCommunicator() {
  int saved = -1;
  if (cudaGetDevice(&saved) != cudaSuccess || cudaSetDevice(device_) != cudaSuccess) saved = -1;
  if (comm_ != nullptr) {
    // ncclCommFinalize completes when every rank's use of the communicator is over ("globally
    // quiescent"), so no buffer another rank may still read is freed early; bounded by the
    // timeout, then aborted.
    const Clock::time_point deadline = Clock::now() + options_.timeout;
    ncclResult_t state = ncclCommFinalize(comm_);
    while (state == ncclInProgress && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
      if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) state = ncclInternalError;
    }
    if (state == ncclSuccess)
      ncclCommDestroy(comm_);
    else
      ncclCommAbort(comm_);
  }
  if (stream_ != nullptr) {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
  if (d_desc_ != nullptr) cudaFree(d_desc_);
  if (h_desc_ != nullptr) cudaFreeHost(h_desc_);
  if (saved >= 0) cudaSetDevice(saved);
}

template <typename Move>
void NcclCommunicator::run(const CollectiveCall& call, const Move& move) {
  const char* op = collective_name(call.op);
  if (!broken_.empty())
    throw Error(
        detail::concat(op, ": rank ", rank_, ": the job is broken by an earlier error: ", broken_));
  const Clock::time_point deadline = Clock::now() + options_.timeout;
  DeviceGuard guard(device_, op, rank_);
  // A rank whose own arguments are bad still takes part in the exchange, carrying its error, so
  // the others throw at once instead of waiting for it until the timeout.
  std::string local_error;
  try {
    check_local(call, rank_, size_, Device::kCUDA, "nccl");
    check_device_memory(call);
  } catch (const Error& e) {
    local_error = e.what();
  }
  exchange(call, local_error, deadline);
  const int64_t bytes = nbytes(call.send);
  if (call.op == CollectiveOp::kBarrier || bytes == 0) return;  // the same on every rank
  settle(op, kMoving, move(size_t(bytes)), deadline);
  wait_stream(op, kMoving, deadline);
}

void NcclCommunicator::exchange(const CollectiveCall& call, const std::string& local_error,
                                Clock::time_point deadline) {
  const char* op = collective_name(call.op);
  char* mine = d_desc_ + size_t(rank_) * kDescBytes;
  h_desc_[rank_] = describe(call, local_error);
  check_cuda(op, kExchanging,
             cudaMemcpyAsync(mine, &h_desc_[rank_], kDescBytes, cudaMemcpyHostToDevice, stream_));
  // In place (send = recv[rank]); the copy back is issued only once NCCL has enqueued the
  // all-gather (a non-blocking communicator may still be enqueueing when the call returns).
  settle(op, kExchanging, ncclAllGather(mine, d_desc_, kDescBytes, ncclUint8, comm_, stream_),
         deadline);
  check_cuda(op, kExchanging,
             cudaMemcpyAsync(h_desc_, d_desc_, size_t(size_) * kDescBytes, cudaMemcpyDeviceToHost,
                             stream_));
  wait_stream(op, kExchanging, deadline);
  // Every rank holds the same descriptors now and decides the same below.
  std::vector<CollectiveCall> calls(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) {
    if (!well_formed(h_desc_[r]))
      fail(detail::concat(op, ": rank ", rank_, ": rank ", r,
                          " sent a malformed call descriptor (a transport bug or a rank "
                          "running other code); communicator aborted"));
    calls[size_t(r)] = call_of(h_desc_[r]);
  }
  if (!local_error.empty()) break_job(local_error);
  for (int r = 0; r < size_; ++r)
    if (h_desc_[r].error_len > 0)
      break_job(detail::concat(op, ": rank ", rank_, ": rank ", r, " failed: ",
                               std::string(h_desc_[r].error, size_t(h_desc_[r].error_len))));
  try {
    check_agree(calls);
  } catch (const Error& e) {
    break_job(e.what());
  }
}

// The views' memory must be device memory of this rank's device (check_local has checked that
// they are contiguous views marked Device::kCUDA).
void NcclCommunicator::check_device_memory(const CollectiveCall& call) const {
  const char* op = collective_name(call.op);
  auto check = [&](const char* arg, const TensorView& t) {
    if (nbytes(t) == 0) return;
    cudaPointerAttributes a{};
    const cudaError_t e = cudaPointerGetAttributes(&a, t.data);
    if (e != cudaSuccess) cudaGetLastError();  // not sticky; clear it
    LS_CHECK(e == cudaSuccess, op, "rank ", rank_, ": ", arg,
             ": cudaPointerGetAttributes failed: ", cudaGetErrorString(e));
    LS_CHECK(a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged, op, "rank ", rank_,
             ": ", arg, ": the nccl transport moves device memory only, but ", t.describe(),
             " points to ", a.type == cudaMemoryTypeHost ? "pinned host" : "host", " memory");
    LS_CHECK(a.device == device_, op, "rank ", rank_, ": ", arg, ": ", t.describe(),
             " is memory of cuda device ", a.device,
             ", this rank's communicator runs on cuda "
             "device ",
             device_);
  };
  if (call.op == CollectiveOp::kBarrier) return;
  check(call.op == CollectiveOp::kBroadcast ? "buf" : "send", call.send);
  if (call.op == CollectiveOp::kAllGather) check("recv", call.recv);
}

// After an NCCL call on the non-blocking communicator: waits until it has been enqueued (state
// ncclSuccess); fails on an error or at the deadline.
void NcclCommunicator::settle(const char* op, const char* phase, ncclResult_t issued,
                              Clock::time_point deadline) {
  const Clock::time_point start = Clock::now();
  ncclResult_t state = issued;
  while (state == ncclInProgress) {
    if (Clock::now() > deadline) fail_timeout(op, phase, state);
    pause_since(start);
    const ncclResult_t q = ncclCommGetAsyncError(comm_, &state);
    if (q != ncclSuccess) state = q;
  }
  if (state != ncclSuccess) fail_nccl(op, phase, state);
}

// Waits until every operation issued on the stream has finished, watching the communicator for
// asynchronous errors (a peer or network failure); fails on an error or at the deadline.
void NcclCommunicator::wait_stream(const char* op, const char* phase, Clock::time_point deadline) {
  const Clock::time_point start = Clock::now();
  while (true) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t q = ncclCommGetAsyncError(comm_, &state);
    if (q != ncclSuccess) state = q;
    if (state != ncclSuccess && state != ncclInProgress) fail_nccl(op, phase, state);
    const cudaError_t e = cudaStreamQuery(stream_);
    if (e == cudaSuccess && state == ncclSuccess) return;
    if (e != cudaSuccess && e != cudaErrorNotReady) check_cuda(op, phase, e);
    if (Clock::now() > deadline) fail_timeout(op, phase, state);
    pause_since(start);
  }
}

void NcclCommunicator::check_cuda(const char* op, const char* phase, cudaError_t e) {
  if (e == cudaSuccess) return;
  cudaGetLastError();
  fail(detail::concat(op, ": rank ", rank_, ": CUDA error while ", phase, " on cuda device ",
                      device_, ": ", cudaGetErrorString(e), "; communicator aborted"));
}

void NcclCommunicator::fail_nccl(const char* op, const char* phase, ncclResult_t state) {
  fail(detail::concat(op, ": rank ", rank_, ": NCCL error while ", phase, " on cuda device ",
                      device_, ": ", ncclGetErrorString(state), " (", ncclGetLastError(comm_),
                      "); communicator aborted"));
}

void NcclCommunicator::fail_timeout(const char* op, const char* phase, ncclResult_t state) {
  fail(detail::concat(op, ": rank ", rank_, " timed out after ", options_.timeout.count(),
                      " ms while ", phase, " (NCCL on cuda device ", device_,
                      ", state: ", ncclGetErrorString(state),
                      "; NCCL cannot tell which ranks are missing); communicator aborted"));
}

// Aborts the communicator (ending its kernels), breaks the job and throws.
void NcclCommunicator::fail(const std::string& what) {
  if (comm_ != nullptr) {
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }
  break_job(what);
}

std::string version_string(int code) {
  // NCCL_VERSION(X, Y, Z) is X * 10000 + Y * 100 + Z from 2.9 on.
  return detail::concat(code / 10000, ".", (code / 100) % 100, ".", code % 100);
}

}  // namespace

// NOTE: NVLink SHARP (NVLS) makes NCCL create multicast objects (cuMulticastCreate) on NVSwitch
// hosts. On the shared H200 hosts this project runs on, a program that uses multicast can put the
// host's GPUs, which others share, out of service for a day or more, so no communicator of
// lockstep may use it: the variable is set whatever its value was. The transport only moves
// bytes, so it loses at most NVLS's all-gather bandwidth. NCCL reads its environment once per
// process: a program that ran NCCL before (e.g. through PyTorch) must set NCCL_NVLS_ENABLE=0
// itself; setenv runs once, under call_once, so concurrent callers wait for it.
void disable_nccl_nvls() {
  static std::once_flag once;
  std::call_once(once, [] { setenv("NCCL_NVLS_ENABLE", "0", 1); });
}

std::string nccl_version() {
  int code = 0;
  if (ncclGetVersion(&code) != ncclSuccess) code = 0;
  return detail::concat("NCCL ", version_string(code), " (built with ",
                        version_string(NCCL_VERSION_CODE), ")");
}

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, int cuda_device,
                                                     const CommOptions& options) {
  const char* op = "make_nccl_communicator";
  options.validate();
  const int rank = bootstrap.rank(), size = bootstrap.size();
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess) cudaGetLastError();
  LS_CHECK(e == cudaSuccess, op, "rank ", rank, ": no CUDA device: ", cudaGetErrorString(e));
  LS_CHECK(cuda_device >= 0 && cuda_device < devices, op, "rank ", rank,
           ": cuda_device: expected in [0, ", devices, "), got ", cuda_device);
  int code = 0;
  LS_CHECK(ncclGetVersion(&code) == ncclSuccess && code >= NCCL_VERSION(2, 14, 0), op, "rank ",
           rank, ": needs NCCL >= 2.14 at run time, loaded ", version_string(code));
  disable_nccl_nvls();
  // The id travels as a host u8 tensor through the bootstrap (any transport: it moves bytes).
  Tensor id_bytes(DType::kU8, {int64_t(sizeof(ncclUniqueId))});
  ncclUniqueId id{};
  if (rank == 0) {
    const ncclResult_t r = ncclGetUniqueId(&id);
    LS_CHECK(r == ncclSuccess, op, "rank 0: ncclGetUniqueId: ", ncclGetErrorString(r), " (",
             ncclGetLastError(nullptr), ")");
    std::memcpy(id_bytes.data(), &id, sizeof(id));
  }
  bootstrap.broadcast(id_bytes.view(), 0);
  std::memcpy(&id, id_bytes.data(), sizeof(id));
  auto comm = std::make_unique<NcclCommunicator>(rank, size, cuda_device, options);
  comm->init(id);
  return comm;
}

}  // namespace lockstep::dist
