// Launchers of the baseline log-prob and sampling kernels (baseline_logprob.cuh). Filtered
// sampling rows are sorted by CUB's segmented radix sort (descending, stable) into scratch.
#include <algorithm>
#include <cub/device/device_segmented_radix_sort.cuh>
#include <vector>

#include "baseline/cuda/logprob.cuh"

namespace lockstep::cuda::baseline {

void logprob_rows(const StatsArgs& a, void* stream) {
  if (a.rows == 0) return;
  LS_CHECK(a.rows <= 0x7fffffff, "baseline linear_logprob", "too many rows: ", a.rows);
  kernels::logprob_rows_kernel<<<unsigned(a.rows), kernels::kStatsThreads, 0, as_stream(stream)>>>(
      a);
  LS_BASE_LAUNCHED("baseline linear_logprob");
}

void logprob_partial_rows(const PartialArgs& a, void* stream) {
  if (a.rows == 0) return;
  LS_CHECK(a.rows <= 0x7fffffff, "baseline linear_logprob_partial", "too many rows: ", a.rows);
  kernels::
      logprob_partial_kernel<<<unsigned(a.rows), kernels::kStatsThreads, 0, as_stream(stream)>>>(a);
  LS_BASE_LAUNCHED("baseline linear_logprob_partial");
}

void logprob_combine(const CombineArgs& a, void* stream) {
  if (a.T == 0) return;
  kernels::logprob_combine_kernel<<<grid_1d(a.T, 128), 128, 0, as_stream(stream)>>>(a);
  LS_BASE_LAUNCHED("baseline linear_logprob_combine");
}

void sample_rows(const SampleArgs& a, const int32_t* filtered_rows_host, int64_t n_filtered,
                 void* stream) {
  const char* op = "baseline sample";
  if (a.rows == 0) return;
  LS_CHECK(a.rows <= 0x7fffffff && a.rows * a.ldz <= 0x7fffffff, op, "logit block of ", a.rows,
           " x ", a.ldz, " is too large");
  cudaStream_t s = as_stream(stream);
  DeviceBuffer row_lse(size_t(a.rows) * sizeof(float), stream);
  kernels::sample_kernel<<<unsigned(a.rows), kernels::kStatsThreads, 0, s>>>(a,
                                                                             row_lse.as<float>());
  LS_BASE_LAUNCHED(op);
  if (n_filtered == 0) return;

  // Sorted copies of the filtered rows (keys: y descending; values: vocab ids).
  const int64_t items = a.rows * a.ldz;
  DeviceBuffer ids_in(size_t(items) * 4, stream), ids_out(size_t(items) * 4, stream),
      keys_out(size_t(items) * 4, stream), offsets(size_t(2 * n_filtered) * 4, stream),
      rows_dev(size_t(n_filtered) * 4, stream);
  const unsigned iota_grid = std::min(grid_1d(items, 256), 65535u * 16);
  kernels::iota_rows_kernel<<<iota_grid, 256, 0, s>>>(ids_in.as<int32_t>(), a.rows, a.ldz);
  LS_BASE_LAUNCHED(op);
  std::vector<int32_t> off(size_t(2 * n_filtered));
  for (int64_t i = 0; i < n_filtered; ++i) {
    off[size_t(i)] = int32_t(filtered_rows_host[i] * a.ldz);
    off[size_t(n_filtered + i)] = int32_t(filtered_rows_host[i] * a.ldz + a.V);
  }
  upload(offsets.get(), off.data(), off.size() * 4, stream);
  upload(rows_dev.get(), filtered_rows_host, size_t(n_filtered) * 4, stream);
  const int32_t* begins = offsets.as<int32_t>();
  const int32_t* ends = begins + n_filtered;
  size_t temp_bytes = 0;
  LS_BASE_CUDA(op, cub::DeviceSegmentedRadixSort::SortPairsDescending(
                       nullptr, temp_bytes, a.z, keys_out.as<float>(), ids_in.as<int32_t>(),
                       ids_out.as<int32_t>(), int(items), int(n_filtered), begins, ends, 0, 32, s));
  DeviceBuffer temp(temp_bytes, stream);
  LS_BASE_CUDA(op, cub::DeviceSegmentedRadixSort::SortPairsDescending(
                       temp.get(), temp_bytes, a.z, keys_out.as<float>(), ids_in.as<int32_t>(),
                       ids_out.as<int32_t>(), int(items), int(n_filtered), begins, ends, 0, 32, s));
  kernels::sample_filtered_kernel<<<unsigned(n_filtered), kernels::kFilterThreads, 0, s>>>(
      a, rows_dev.as<int32_t>(), keys_out.as<float>(), ids_out.as<int32_t>(), row_lse.as<float>());
  LS_BASE_LAUNCHED(op);
}

}  // namespace lockstep::cuda::baseline
