/// \file detail/host/select_sampled_threshold.hpp
/// select::sampled_threshold on backend::host. Behind a corrector, the strided sample is
/// taken before the corrector's pass (its values computed ahead from the state and g),
/// so that the pass itself collects the candidates above the sampled threshold (or,
/// with reuse_threshold, above last step's); a refinement pass reads acc only when that
/// count misses the bounds.
#pragma once

#include <gradcomp/detail/host/backend.hpp>
#include <gradcomp/concepts.hpp>
#include <gradcomp/detail/host/select_exact_topk.hpp>
#include <gradcomp/detail/host/slices.hpp>
#include <gradcomp/detail/core/radix_select.hpp>
#include <gradcomp/detail/core/random.hpp>
#include <gradcomp/detail/select/sampled_threshold_steps.hpp>
#include <gradcomp/detail/core/step_input.hpp>
#include <gradcomp/select/sampled_threshold.hpp>
#include <gradcomp/held_memory.hpp>

#include <algorithm>
#include <bit>
#include <tuple>
#include <utility>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

template <>
struct has_fast_path<select::sampled_threshold, backend::host> : std::true_type {};

template <>
class fast_engine<select::sampled_threshold, backend::host> : public carries_threshold {
 public:
  static constexpr bool checks_finite = true;  // its collect pass reads every entry

  fast_engine(const backend::host& be, const select::sampled_threshold& policy, std::size_t n)
      : threads_(be.concurrency()), n_(n), topk_(be, n), slices_(n) {
    reserve(policy);
  }

  /// Grows the sample buffer for a new density (called by set_density, never by compress).
  void reserve(const select::sampled_threshold& policy) {
    const std::size_t m = policy.sample_size(n_);
    if (m < n_ && m > sample_.size()) sample_.resize(m);
  }

  void begin_observe(const backend::host& be, const select::sampled_threshold& policy, std::uint64_t step) {
    threads_ = be.concurrency();  // the call's context, for before_pass
    topk_.use_threads(threads_);
    plan_ = sample_plan::make(policy, n_, step);
    reusing_ = policy.reuse_threshold && memory_.has();
    presampled_ = false;
    collecting_ = reusing_;
    collect_key_ = memory_.key();
    if (plan_.exact) topk_.begin_observe();
    observed_ = true;
  }

  /// Before the corrector's pass: samples acc ahead through `acc_at(i)` (the value the
  /// pass will produce at i) and collects, during the pass, the candidates at or above
  /// the sampled threshold: the count refine_threshold would start from. With a reused
  /// threshold the sample is taken in the pass as usual: it is needed only on a miss.
  template <class AccAt>
  void before_pass(const select::sampled_threshold& policy, AccAt&& acc_at) {
    if (plan_.exact || reusing_) return;
    // The sample lies scattered over the state arrays: two threads keep twice the
    // cache misses in flight.
    for_each_block(threads_, plan_.size, [&](int, block_range r) {
      for (std::size_t j = r.first; j < r.last; ++j) sample_[j] = acc_at(plan_.offset + j * plan_.stride);
    });
    collect_key_ = sampled_threshold_key(policy, std::span<const float>(sample_).first(plan_.size));
    presampled_ = true;
    collecting_ = collect_key_ < non_finite_key;  // else the pass finds the NaN or infinity
  }

  void observe(int thread, std::size_t begin, std::span<const float> acc, std::span<const float>) noexcept {
    if (plan_.exact) {
      topk_.observe(thread, begin, acc);
      return;
    }
    if (!presampled_) {
      const std::size_t end = begin + acc.size();
      std::size_t j = begin <= plan_.offset ? 0 : (begin - plan_.offset + plan_.stride - 1) / plan_.stride;
      for (std::size_t i = plan_.offset + j * plan_.stride; j < plan_.size && i < end; ++j, i += plan_.stride) {
        sample_[j] = acc[i - begin];
      }
    }
    if (collecting_) {
      bool corrector_checks_this = false;
      slices_.collect_tile(begin / host_tile, begin, acc, collect_key_, corrector_checks_this);
    }
  }

  /// Selects at once (the pass, or what observe() collected in the corrector's): the
  /// indices into out, their count and NaN verdict into the status (host memory).
  queued_selection select(const backend::host& be, const select::sampled_threshold& policy, const select_input& in,
                          std::span<std::uint32_t> out, step_status* status) {
    threads_ = be.concurrency();  // the call's context
    topk_.use_threads(threads_);
    return record_selection(select_now(policy, in, out), status);
  }
  void add_held(held_memory& use) const {
    use.workspace += topk_.held_bytes() + slices_.held_bytes() + bytes_held(sample_);
  }

 private:
  selection select_now(const select::sampled_threshold& policy, const select_input& in, std::span<std::uint32_t> out) {
    const std::size_t k = policy.k(n_);
    bool finite = true;
    const bool observed = std::exchange(observed_, false);
    if (!observed) {
      presampled_ = false;
      // Standalone (no corrector pass): sample directly; the reuse candidates are
      // collected by the full pass below, which also checks finiteness.
      plan_ = sample_plan::make(policy, n_, in.step);
      reusing_ = policy.reuse_threshold && memory_.has();
      if (!plan_.exact) {
        for (std::size_t j = 0; j < plan_.size; ++j) sample_[j] = in.acc[plan_.offset + j * plan_.stride];
        if (reusing_) finite = slices_.collect(threads_, in.acc, memory_.key());
      }
    }
    if (plan_.exact) {
      finite = topk_.select(in.acc, k, out);
      if (!finite) return {0, 1.0f, false};
      std::uint32_t kth = magnitude_key(in.acc[out[0]]);
      for (std::size_t j = 0; j < k; ++j) kth = std::min(kth, magnitude_key(in.acc[out[j]]));
      memory_.propose(kth);
      return {k};
    }
    std::uint32_t key = memory_.key();
    std::size_t count = reusing_ ? slices_.total() : 0;
    if (!reusing_ || !within_bounds(policy, k, count)) {
      const auto collect = [&](std::uint32_t t) -> std::size_t {
        finite = slices_.collect(threads_, in.acc, t) && finite;
        return finite ? slices_.total() : k;  // k stops the loop: in bounds
      };
      key =
          presampled_ ? collect_key_ : sampled_threshold_key(policy, std::span<const float>(sample_).first(plan_.size));
      if (key >= non_finite_key) return {0, 1.0f, false};  // the sample met a NaN or infinity
      if (presampled_) {                                   // the pass collected at the sampled threshold already
        std::tie(count, key) = refine_threshold(policy, k, key, slices_.total(), collect);
      } else {
        std::tie(count, key) = refine_threshold(policy, k, key, collect(key), collect);
      }
    }
    if (!finite) return {0, 1.0f, false};
    std::uint32_t* candidates = slices_.all_indices();
    count = slices_.gather(candidates);
    if (needs_top_k(policy, k, count)) {
      const std::span<std::uint32_t> list(candidates, count);
      const kth_key kth = kth_largest_in_list(in.acc, list, k, 0, 0);
      count = keep_top_in_list(in.acc, list, kth);
      key = kth.key;
    }
    std::copy_n(candidates, count, out.begin());
    memory_.propose(key);
    return {count};
  }

  int threads_;
  std::size_t n_;
  host_topk topk_;
  host_slices slices_;
  std::vector<float> sample_;
  sample_plan plan_;
  bool reusing_ = false;
  bool observed_ = false;
  bool presampled_ = false;        // this step's sample was taken by before_pass
  bool collecting_ = false;        // observe() collects the candidates at or above:
  std::uint32_t collect_key_ = 0;  // last step's threshold, or the sampled one
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
