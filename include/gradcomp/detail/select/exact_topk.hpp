/// \file detail/select/exact_topk.hpp
/// select::exact_topk's algorithm over the backend primitives: the k entries of
/// largest |acc|, ties to the lower index. A strided sample (every 512th entry, read
/// back) brackets the k-th largest key in [lo, hi]; one ordered compaction collects the
/// entries with key >= lo, whose keys are gathered and read back with them; the host
/// keeps the top k of that short list in order (detail/core/radix_select.hpp). Where the
/// bracket misses (fewer than k entries at or above lo, or k or more above hi), a
/// histogram of the keys' top digit gives a lo that cannot miss. What backend::kokkos
/// runs; backend::host's engine (a SIMD radix select fused with the corrector's pass)
/// and backend::cuda's (a radix select that never leaves the device) are fast paths,
/// the first proved equal to this by the tests. Not API.
#pragma once

#include <gradcomp/concepts.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/detail/core/selector_work.hpp>
#include <gradcomp/detail/core/radix_select.hpp>
#include <gradcomp/detail/core/step_input.hpp>
#include <gradcomp/select/exact_topk.hpp>
#include <gradcomp/held_memory.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <tuple>
#include <utility>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

/// out[i] = i.
struct identity_indices {
  std::uint32_t* out;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t i) const { out[i] = static_cast<std::uint32_t>(i); }
};

/// The top digit of acc_i's magnitude key: its histogram bin.
struct top_digit_of {
  const float* acc;
  GRADCOMP_HOST_DEVICE static constexpr std::size_t bins() { return top_digit_bins; }
  GRADCOMP_HOST_DEVICE std::size_t operator()(std::size_t i) const {
    return magnitude_key(acc[i]) >> magnitude_digits[0].shift;
  }
};

/// select::exact_topk on any backend.
/// A NaN or infinity ranks above every finite value; the corrector's pass rejects the
/// step.
template <class Backend>
class exact_topk_selection {
  static constexpr std::size_t sample_stride = topk_sample_stride;
  static constexpr std::size_t min_sampled_n = topk_min_sampled_n;
  static constexpr bool staged = !Backend::host_accessible;  // host copies of what the host reads

 public:
  exact_topk_selection(const Backend& be, const select::exact_topk&, std::size_t n)
      : n_(n),
        candidates_(be.template allocate<std::uint32_t>(n)),
        keys_(be.template allocate<std::uint32_t>(n)),
        found_(be.template allocate<std::uint32_t>(1)),
        bins_(be.template allocate<std::uint32_t>(top_digit_bins)),
        sample_(be.template allocate<float>(n >= min_sampled_n ? n / sample_stride : 0)),
        workspace_(be.template allocate<std::byte>(be.template compact_workspace<magnitude_at_least>(n))),
        candidates_host_(staged ? n : 0),
        keys_host_(staged ? n : 0),
        bins_host_(staged ? top_digit_bins : 0),
        sample_host_(staged ? static_cast<std::size_t>(sample_.size()) : 0) {}

  void reserve(const select::exact_topk&) noexcept {}  // the workspace is sized by n, not k

  /// Runs the selection: the k ascending indices in out, k queued in the status.
  queued_selection select(const Backend& be, const select::exact_topk& policy, const select_input& in,
                          std::span<std::uint32_t> out, step_status* status) {
    const std::size_t k = policy.k(n_);
    const float* acc = in.acc.data();
    if (k == n_) {
      be.for_each(n_, identity_indices{out.data()});
    } else {
      std::span<std::uint32_t> list, keys;
      if (sample_.size() > 0) {
        const auto m = static_cast<std::size_t>(sample_.size());
        be.for_each(m, gather_strided{acc, 0, sample_stride, sample_.data()});
        const auto [lo, hi] = sample_bracket(on_host(be, sample_.data(), m, sample_host_), n_, k);
        std::tie(list, keys) = collect(be, acc, lo);
        const auto above_hi =
            std::count_if(keys.begin(), keys.end(), [hi = hi](std::uint32_t key) { return key > hi; });
        if (list.size() < k || static_cast<std::size_t>(above_hi) >= k) list = {};  // the bracket missed
      }
      if (list.empty()) {
        be.clear(bins_.data(), top_digit_bins);
        be.histogram(n_, top_digit_of{acc}, bins_.data());
        const std::uint32_t bin = find_bin_from_top(on_host(be, bins_.data(), top_digit_bins, bins_host_), k).first;
        std::tie(list, keys) = collect(be, acc, bin << magnitude_digits[0].shift);
      }
      keep_top_keys(list, keys, k, 0, 0);
      if constexpr (staged) {
        be.to_device(list.data(), k, out.data());
      } else {
        std::copy_n(list.data(), k, out.data());
      }
    }
    queue_count(be, status, k);
    return {};
  }
  void accept() noexcept {}
  void add_held(held_memory& use) const {
    use.workspace += bytes_held(candidates_, keys_, found_, bins_, sample_, workspace_, candidates_host_, keys_host_,
                                bins_host_, sample_host_);
  }

 private:
  // The entries with key >= lo, ascending, and their keys, readable on the host.
  std::pair<std::span<std::uint32_t>, std::span<std::uint32_t>> collect(const Backend& be, const float* acc,
                                                                        std::uint32_t lo) {
    be.compact(n_, magnitude_at_least{acc, lo}, candidates_.data(), workspace_bytes(workspace_), found_.data());
    const std::size_t count = be.read(static_cast<const std::uint32_t*>(found_.data()));
    be.for_each(count, keys_at{acc, candidates_.data(), keys_.data()});
    return {on_host(be, candidates_.data(), count, candidates_host_), on_host(be, keys_.data(), count, keys_host_)};
  }

  std::size_t n_;
  typename Backend::template buffer<std::uint32_t> candidates_, keys_, found_, bins_;
  typename Backend::template buffer<float> sample_;
  typename Backend::template buffer<std::byte> workspace_;
  std::vector<std::uint32_t> candidates_host_, keys_host_, bins_host_;  // host copies (staged backends only)
  std::vector<float> sample_host_;
};

/// Every backend without an engine of its own for select::exact_topk runs the one above.
template <class Backend>
class engine<select::exact_topk, Backend> : public exact_topk_selection<Backend> {
 public:
  using exact_topk_selection<Backend>::exact_topk_selection;
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
