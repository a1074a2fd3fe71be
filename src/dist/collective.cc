// CommOptions and the argument checks shared by the transports (collective.h).
#include "dist/collective.h"

#include <cstdint>

#include "lockstep/dist/communicator.h"

namespace lockstep::dist {

void CommOptions::validate() const {
  LS_CHECK(timeout.count() > 0, "CommOptions", "timeout: expected > 0 ms, got ", timeout.count(),
           " ms");
}

std::string CommOptions::to_string() const {
  return detail::concat("comm: timeout=", timeout.count(), "ms");
}

const char* collective_name(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::kAllGather:
      return "all_gather";
    case CollectiveOp::kBroadcast:
      return "broadcast";
    case CollectiveOp::kBarrier:
      return "barrier";
  }
  return "?";
}

namespace {

void check_view(const char* op, int rank, const char* arg, const TensorView& t, Device device,
                const char* transport) {
  LS_CHECK(t.device == device, op, "rank ", rank, ": ", arg, ": the ", transport,
           " transport moves ", device == Device::kCPU ? "host" : device_name(device),
           " memory only, got a ", device_name(t.device), " view");
  LS_CHECK(t.is_contiguous(), op, "rank ", rank, ": ", arg, ": expected a contiguous view, got ",
           t.describe());
  LS_CHECK(t.empty() || t.data != nullptr, op, "rank ", rank, ": ", arg, ": null data for ",
           t.describe());
}

}  // namespace

void check_local(const CollectiveCall& call, int rank, int size, Device device,
                 const char* transport) {
  const char* op = collective_name(call.op);
  if (call.op == CollectiveOp::kBarrier) return;
  check_view(op, rank, call.op == CollectiveOp::kBroadcast ? "buf" : "send", call.send, device,
             transport);
  if (call.op == CollectiveOp::kBroadcast) {
    LS_CHECK(call.root >= 0 && call.root < size, op, "rank ", rank, ": root: expected in [0, ",
             size, "), got ", call.root);
    return;
  }
  const TensorView& s = call.send;
  const TensorView& r = call.recv;
  LS_CHECK(s.ndim < kMaxDims, op, "rank ", rank, ": send: at most ", kMaxDims - 1,
           " dimensions (recv adds one), got ", s.describe());
  check_view(op, rank, "recv", r, device, transport);
  bool shape_ok = r.dtype == s.dtype && r.ndim == s.ndim + 1 && r.shape[0] == size;
  for (int d = 0; shape_ok && d < s.ndim; ++d) shape_ok = r.shape[d + 1] == s.shape[d];
  LS_CHECK(shape_ok, op, "rank ", rank, ": recv: expected ", dtype_name(s.dtype), "[", size,
           s.ndim > 0 ? ", " : "", s.shape_string().substr(1), " (size() copies of send ",
           s.describe(), "), got ", r.describe());
  const int64_t n = view_bytes(s);
  if (n == 0) return;
  const auto* sb = static_cast<const char*>(s.data);
  const auto* rb = static_cast<const char*>(r.data);
  const bool in_place = sb == rb + rank * n;
  const bool overlap = sb < rb + size * n && rb < sb + n;
  LS_CHECK(in_place || !overlap, op, "rank ", rank,
           ": send overlaps recv without being exactly recv[", rank, "]");
}

void check_agree(std::span<const CollectiveCall> calls) {
  const CollectiveCall& c0 = calls[0];
  const char* op = collective_name(c0.op);
  for (size_t r = 1; r < calls.size(); ++r) {
    const CollectiveCall& c = calls[r];
    LS_CHECK(c.op == c0.op, op, "ranks called different collectives: rank 0 called ", op, ", rank ",
             r, " called ", collective_name(c.op));
    if (c0.op == CollectiveOp::kBarrier) continue;
    const char* arg = c0.op == CollectiveOp::kBroadcast ? "buf" : "send";
    bool same = c.send.dtype == c0.send.dtype && c.send.ndim == c0.send.ndim;
    for (int d = 0; same && d < c0.send.ndim; ++d) same = c.send.shape[d] == c0.send.shape[d];
    LS_CHECK(same, op, "ranks disagree on ", arg, ": rank 0 has ", dtype_name(c0.send.dtype),
             c0.send.shape_string(), ", rank ", r, " has ", dtype_name(c.send.dtype),
             c.send.shape_string());
    LS_CHECK(c0.op != CollectiveOp::kBroadcast || c.root == c0.root, op,
             "ranks disagree on root: rank 0 has ", c0.root, ", rank ", r, " has ", c.root);
  }
}

int64_t view_bytes(const TensorView& t) { return t.numel() * dtype_size(t.dtype); }

std::string rank_list(std::span<const uint8_t> flags, bool value) {
  std::string s = "[";
  for (size_t r = 0; r < flags.size(); ++r)
    if ((flags[r] != 0) == value) s += (s.size() > 1 ? ", " : "") + std::to_string(r);
  return s + "]";
}

int missing_and_exited(std::span<const uint8_t> arrived, std::span<const uint8_t> exited) {
  for (size_t r = 0; r < arrived.size(); ++r)
    if (arrived[r] == 0 && exited[r] != 0) return int(r);
  return -1;
}

std::string timeout_message(const char* op, int rank, std::chrono::milliseconds timeout,
                            std::span<const uint8_t> arrived) {
  return detail::concat(op, ": rank ", rank, " timed out after ", timeout.count(),
                        " ms waiting for ranks ", rank_list(arrived, false),
                        " (arrived: ", rank_list(arrived, true), ")");
}

std::string returned_message(const char* op, int rank, int returned) {
  return detail::concat(op, ": rank ", rank, ": rank ", returned, " returned without calling ", op);
}

}  // namespace lockstep::dist
