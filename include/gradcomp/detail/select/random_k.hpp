/// \file detail/select/random_k.hpp
/// select::random_k's algorithm, on every backend. The index set depends on (seed,
/// step) alone, never on the data, so the host draws it (Floyd's algorithm, O(k) draws
/// over a bitmap of n bits) while the backend runs the corrector's pass, straight into
/// the index workspace where the host may write it, else into the backend's staging,
/// copied over in stream order (backend::cuda: nothing waited for). Every backend picks
/// the same set by construction. Not API.
#pragma once

#include <gradcomp/concepts.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/detail/core/selector_work.hpp>
#include <gradcomp/detail/core/random.hpp>
#include <gradcomp/detail/core/step_input.hpp>
#include <gradcomp/select/random_k.hpp>
#include <gradcomp/held_memory.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

/// The k distinct indices of [0, n) that random_k picks for (seed, step), ascending.
/// Draw j (for j = n-k .. n-1) is t = random_below(seed, step, j, j + 1); j is taken
/// instead when t already was (Floyd, CACM 1987). `taken` must be ceil(n/64) words of
/// zeros and is left so. The result is read off the bitmap in order when that is
/// cheaper than sorting the k draws.
inline void random_k_indices(std::uint64_t seed, std::uint64_t step, std::size_t n, std::size_t k, std::uint64_t* taken,
                             std::uint32_t* out) {
  for (std::size_t j = n - k, at = 0; j < n; ++j, ++at) {
    std::uint32_t t = random_below(seed, step, j, static_cast<std::uint32_t>(j + 1));
    if (taken[t / 64] & (std::uint64_t{1} << (t % 64))) t = static_cast<std::uint32_t>(j);
    taken[t / 64] |= std::uint64_t{1} << (t % 64);
    out[at] = t;
  }
  const std::size_t words = (n + 63) / 64;
  if (static_cast<double>(k) * std::log2(static_cast<double>(k) + 1.0) < static_cast<double>(words)) {
    std::sort(out, out + k);
    for (std::size_t j = 0; j < k; ++j) taken[out[j] / 64] = 0;
    return;
  }
  std::size_t at = 0;
  for (std::size_t w = 0; w < words; ++w) {
    for (std::uint64_t bits = taken[w]; bits != 0; bits &= bits - 1) {
      out[at++] = static_cast<std::uint32_t>(64 * w + static_cast<std::size_t>(std::countr_zero(bits)));
    }
    taken[w] = 0;
  }
}

/// select::random_k on any backend.
template <class Backend>
class random_k_selection {
 public:
  random_k_selection(const Backend&, const select::random_k& policy, std::size_t n) : n_(n), taken_((n + 63) / 64) {
    reserve(policy);
  }

  /// Sizes the host draw for the policy's k where it cannot go straight to the index
  /// workspace (constructor and set_density only).
  void reserve(const select::random_k& policy) {
    if constexpr (!Backend::host_accessible) drawn_.resize(std::max(drawn_.size(), policy.k(n_)));
  }

  /// Draws the indices into out and queues their count.
  queued_selection select(const Backend& be, const select::random_k& policy, const select_input& in,
                          std::span<std::uint32_t> out, step_status* status) {
    const std::size_t k = policy.k(n_);
    if constexpr (Backend::host_accessible) {
      random_k_indices(policy.seed, in.step, n_, k, taken_.data(), out.data());
    } else {
      random_k_indices(policy.seed, in.step, n_, k, taken_.data(), writable(drawn_));
      upload(be, drawn_, k, out.data());
    }
    queue_count(be, status, k);
    return {policy.value_scale(n_)};
  }
  void accept() noexcept {}
  void add_held(held_memory& use) const { use.workspace += bytes_held(taken_, drawn_); }

 private:
  std::size_t n_;
  std::vector<std::uint64_t> taken_;          // Floyd's bitmap, all zeros between steps
  staging_of<Backend, std::uint32_t> drawn_;  // the draw, where out is not host memory
};

/// Every backend runs the one above.
template <class Backend>
class engine<select::random_k, Backend> : public random_k_selection<Backend> {
 public:
  using random_k_selection<Backend>::random_k_selection;
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
