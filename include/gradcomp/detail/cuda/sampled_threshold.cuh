/// \file detail/cuda/sampled_threshold.cuh
/// select::sampled_threshold (DGC's hierarchical selection) on backend::cuda. The
/// device gathers the strided sample and compacts the candidates at a threshold
/// (cub::DeviceSelect::If); the host runs the backend-independent steps
/// (detail/sampled_threshold_steps.hpp: the sample's threshold, the refinement loop,
/// the cut to the top k) on what it reads back, so the result is backend::host's. Each
/// step reads the sample and one count per refinement back to the host, and the
/// candidates when they must be cut to k. Where the sample would be all of acc, the
/// exact top k is found the same way from the k-th largest key of all of acc. Not API.
#pragma once

#include <gradcomp/backend/cuda.cuh>
#include <gradcomp/concepts.hpp>
#include <gradcomp/detail/cuda/compaction.cuh>
#include <gradcomp/detail/cuda/device_buffer.cuh>
#include <gradcomp/detail/cuda/launch.cuh>
#include <gradcomp/detail/radix_select.hpp>
#include <gradcomp/detail/sampled_threshold_steps.hpp>
#include <gradcomp/detail/step_input.hpp>
#include <gradcomp/select/sampled_threshold.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <tuple>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {
namespace cuda_sampled {

/// sample[j] = acc[offset + j * stride].
template <class = void>
__global__ void gather_sample(const float* acc, std::uint64_t offset, std::uint64_t stride, std::uint64_t size,
                              float* sample) {
  cuda_launch::grid_stride(size, [&](std::uint64_t j) { sample[j] = acc[offset + j * stride]; });
}

/// keys[j] = the magnitude key of acc[list[j]].
template <class = void>
__global__ void list_keys(const float* acc, const std::uint32_t* list, std::uint64_t count, std::uint32_t* keys) {
  cuda_launch::grid_stride(count, [&](std::uint64_t j) { keys[j] = magnitude_key(acc[list[j]]); });
}

}  // namespace cuda_sampled

template <>
class engine<select::sampled_threshold, backend::cuda> : public carries_threshold {
 public:
  engine(const backend::cuda& be, const select::sampled_threshold& policy, std::size_t n)
      : backend_(be),
        n_(n),
        grid_(cuda_launch::grid_for(n)),
        candidates_(n),
        keys_(n),
        found_(1),
        compact_(n, be.stream),
        candidates_host_(n),
        keys_host_(n) {
    reserve(policy);
  }

  /// Sizes the sample for the policy's density (constructor and set_density only).
  void reserve(const select::sampled_threshold& policy) {
    const std::size_t m = std::min(policy.sample_size(n_), n_);
    if (m > sample_.size()) {
      device_buffer<float> sample(m);
      sample_host_.resize(m);
      sample_ = std::move(sample);
    }
  }

  /// Runs the selection, reading back what the host steps need: ascending indices in
  /// out, their count in the status. A NaN or infinity is the corrector's to flag (the
  /// status then makes every later stage write nothing); this only stops early.
  queued_selection select(const select::sampled_threshold& policy, const select_input& in,
                          std::span<std::uint32_t> out, step_status* status) {
    const std::size_t k = policy.k(n_);
    const sample_plan plan = sample_plan::make(policy, n_, in.step);
    const auto collect = [&](std::uint32_t key) { return compact_at_least(in.acc.data(), key); };
    std::uint32_t key = memory_.key();
    std::size_t count = 0;
    if (plan.exact) {
      // The sample would be all of acc: the exact top k, as the k-th largest key of
      // all of acc, its candidates, and the cut below (ties to the lower index).
      const std::span<const float> all = read_sample(in.acc.data(), 0, 1, n_);
      key = kth_largest([&](std::size_t i) { return magnitude_key(all[i]); }, n_, k, 0, 0).key;
      if (key >= non_finite_key) return finish(status, 0);  // a NaN or infinity: the step is rejected
      count = collect(key);
    } else {
      const bool reusing = policy.reuse_threshold && memory_.has();
      count = reusing ? collect(key) : 0;
      if (!reusing || !within_bounds(policy, k, count)) {
        key = sampled_threshold_key(policy, read_sample(in.acc.data(), plan.offset, plan.stride, plan.size));
        if (key >= non_finite_key) return finish(status, 0);
        std::tie(count, key) = refine_threshold(policy, k, key, collect(key), collect);
      }
    }
    if (plan.exact ? count > k : needs_top_k(policy, k, count)) {
      cuda_sampled::list_keys<<<grid_, cuda_launch::block_threads, 0, backend_.stream>>>(
          in.acc.data(), candidates_.data(), count, keys_.data());
      cuda_check(cudaGetLastError(), "list_keys (launch)");
      backend_.to_host(candidates_.data(), count, candidates_host_.data());
      backend_.to_host(keys_.data(), count, keys_host_.data());
      std::tie(count, key) = keep_top_keys(std::span<std::uint32_t>(candidates_host_.data(), count),
                                           std::span<const std::uint32_t>(keys_host_.data(), count), k, 0, 0);
      backend_.to_device(candidates_host_.data(), count, out.data());
    } else {
      cuda_check(cudaMemcpyAsync(out.data(), candidates_.data(), count * sizeof(std::uint32_t),
                                 cudaMemcpyDeviceToDevice, backend_.stream),
                 "cudaMemcpyAsync (candidates)");
    }
    memory_.propose(key);
    return finish(status, count);
  }

 private:
  // acc[offset + j * stride] for j < size, read back to the host.
  std::span<const float> read_sample(const float* acc, std::size_t offset, std::size_t stride, std::size_t size) {
    cuda_sampled::gather_sample<<<cuda_launch::grid_for(size), cuda_launch::block_threads, 0, backend_.stream>>>(
        acc, offset, stride, size, sample_.data());
    cuda_check(cudaGetLastError(), "gather_sample (launch)");
    backend_.to_host(sample_.data(), size, sample_host_.data());
    return {sample_host_.data(), size};
  }

  // C = {i : key_i >= key}, ascending, into candidates_; returns |C| (read back).
  std::size_t compact_at_least(const float* acc, std::uint32_t key) {
    compact_(magnitude_at_least{acc, key}, candidates_.data(), found_.data());
    return backend_.read(found_.data());
  }

  queued_selection finish(step_status* status, std::size_t count) {
    cuda_launch::set_count<<<1, 1, 0, backend_.stream>>>(status, static_cast<std::uint32_t>(count));
    cuda_check(cudaGetLastError(), "set_count (launch)");
    return {};
  }

  backend::cuda backend_;
  std::size_t n_;
  unsigned grid_;
  device_buffer<float> sample_;  // the strided sample, or all of acc for the exact fallback
  device_buffer<std::uint32_t> candidates_, keys_, found_;
  cuda_launch::index_compaction<magnitude_at_least> compact_;
  std::vector<float> sample_host_;
  std::vector<std::uint32_t> candidates_host_, keys_host_;
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
