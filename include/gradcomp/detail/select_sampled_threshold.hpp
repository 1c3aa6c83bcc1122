/// \file detail/select_sampled_threshold.hpp
/// select::sampled_threshold's algorithm (DGC's hierarchical selection, ALGORITHMS.md)
/// over the backend primitives. The backend gathers the strided sample, compacts the
/// candidates at a threshold and gathers their keys; the host runs the steps of
/// detail/sampled_threshold_steps.hpp (the sample's threshold, the refinement loop,
/// the cut to the top k) on what it reads back: the sample, one count per compaction,
/// and the candidates with their keys when they must be cut to k. Where the sample
/// would be all of acc, the backend's exact_topk engine selects instead. What
/// backend::kokkos and backend::cuda run; backend::host's engine
/// (detail/host/sampled_threshold.hpp) samples ahead of and collects in the
/// corrector's pass, a fast path the tests prove equal to this. Not API.
#pragma once

#include <gradcomp/concepts.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/detail/selector_work.hpp>
#include <gradcomp/detail/radix_select.hpp>
#include <gradcomp/detail/sampled_threshold_steps.hpp>
#include <gradcomp/detail/step_input.hpp>
#include <gradcomp/select/exact_topk.hpp>
#include <gradcomp/select/sampled_threshold.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <tuple>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

/// select::sampled_threshold on any backend. A NaN or infinity is the corrector's to
/// flag; meeting one in the sample only ends the selection early (count 0).
template <class Backend>
class sampled_threshold_selection : public carries_threshold {
  static constexpr bool staged = !Backend::host_accessible;  // host copies of what the host steps read

 public:
  sampled_threshold_selection(const Backend& be, const select::sampled_threshold& policy, std::size_t n)
      : backend_(be),
        n_(n),
        topk_(be, select::exact_topk{.count = policy.k(n)}, n),
        candidates_(be.template allocate<std::uint32_t>(n)),
        keys_(be.template allocate<std::uint32_t>(n)),
        found_(be.template allocate<std::uint32_t>(1)),
        workspace_(be.template allocate<std::byte>(be.template compact_workspace<magnitude_at_least>(n))),
        candidates_host_(staged ? n : 0),
        keys_host_(staged ? n : 0) {
    reserve(policy);
  }

  /// Sizes the sample and the exact fallback for the policy's density (constructor and
  /// set_density only). Growing either early is harmless if the other throws.
  void reserve(const select::sampled_threshold& policy) {
    topk_.reserve(select::exact_topk{.count = policy.k(n_)});
    const std::size_t m = policy.sample_size(n_);
    if (m < n_ && m > static_cast<std::size_t>(sample_.size())) {
      if constexpr (staged) sample_host_.resize(m);
      sample_ = backend_.template allocate<float>(m);
    }
  }

  /// Runs the selection: ascending indices in out, their count queued in the status.
  queued_selection select(const Backend& be, const select::sampled_threshold& policy, const select_input& in,
                          std::span<std::uint32_t> out, step_status* status) {
    const std::size_t k = policy.k(n_);
    const sample_plan plan = sample_plan::make(policy, n_, in.step);
    if (plan.exact) return select_exact(be, k, in, out, status);
    const float* acc = in.acc.data();
    const auto collect = [&](std::uint32_t key) -> std::size_t {
      be.compact(n_, magnitude_at_least{acc, key}, candidates_.data(), workspace_bytes(workspace_), found_.data());
      return be.read(static_cast<const std::uint32_t*>(found_.data()));
    };
    std::uint32_t key = memory_.key();
    const bool reusing = policy.reuse_threshold && memory_.has();
    std::size_t count = reusing ? collect(key) : 0;
    if (!reusing || !within_bounds(policy, k, count)) {
      be.for_each(plan.size, gather_strided{acc, plan.offset, plan.stride, sample_.data()});
      key = sampled_threshold_key(policy, on_host(be, sample_.data(), plan.size, sample_host_));
      if (key >= non_finite_key) return finish(be, status, 0);  // a NaN or infinity: the step is rejected
      std::tie(count, key) = refine_threshold(policy, k, key, collect(key), collect);
    }
    if (needs_top_k(policy, k, count)) {
      be.for_each(count, keys_at{acc, candidates_.data(), keys_.data()});
      const std::span<std::uint32_t> list = on_host(be, candidates_.data(), count, candidates_host_);
      const std::span<std::uint32_t> keys = on_host(be, keys_.data(), count, keys_host_);
      std::tie(count, key) = keep_top_keys(list, keys, k, 0, 0);
      if constexpr (staged) {
        be.to_device(list.data(), count, out.data());
      } else {
        std::copy_n(list.data(), count, out.data());
      }
    } else {
      be.for_each(count, copy_elements<std::uint32_t>{candidates_.data(), out.data()});
    }
    memory_.propose(key);
    return finish(be, status, count);
  }
  void accept() noexcept { carries_threshold::accept(); }

 private:
  // The sample would be all of acc: the backend's exact top k, whose smallest key is
  // the threshold carried to the next step.
  queued_selection select_exact(const Backend& be, std::size_t k, const select_input& in,
                                std::span<std::uint32_t> out, step_status* status) {
    topk_.select(be, select::exact_topk{.count = k}, in, out, status);
    be.for_each(k, keys_at{in.acc.data(), out.data(), keys_.data()});
    const std::span<std::uint32_t> keys = on_host(be, keys_.data(), k, keys_host_);
    memory_.propose(*std::min_element(keys.begin(), keys.end()));
    return {};
  }

  queued_selection finish(const Backend& be, step_status* status, std::size_t count) {
    queue_count(be, status, count);
    return {};
  }

  Backend backend_;
  std::size_t n_;
  engine<select::exact_topk, Backend> topk_;  // where the sample would be all of acc
  typename Backend::template buffer<std::uint32_t> candidates_, keys_, found_;
  typename Backend::template buffer<std::byte> workspace_;
  typename Backend::template buffer<float> sample_;
  std::vector<std::uint32_t> candidates_host_, keys_host_;  // host copies (staged backends only)
  std::vector<float> sample_host_;
};

/// Every backend without an engine of its own for select::sampled_threshold runs the
/// one above.
template <class Backend>
class engine<select::sampled_threshold, Backend> : public sampled_threshold_selection<Backend> {
 public:
  using sampled_threshold_selection<Backend>::sampled_threshold_selection;
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
