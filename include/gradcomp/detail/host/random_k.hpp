/// \file detail/host/random_k.hpp
/// select::random_k on backend::host: Floyd's algorithm (k draws for k distinct values,
/// no rejection loop) over a bitmap of n bits, then an ascending sort of the k indices.
#pragma once

#include <gradcomp/backend/host.hpp>
#include <gradcomp/concepts.hpp>
#include <gradcomp/detail/random.hpp>
#include <gradcomp/detail/step_input.hpp>
#include <gradcomp/select/random_k.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

/// The k distinct indices of [0, n) that random_k picks for (seed, step), ascending.
/// Draw j (for j = n-k .. n-1) is t = random_below(seed, step, j, j + 1); j is taken
/// instead when t already was (Floyd, CACM 1987). `taken` must be ceil(n/64) words of
/// zeros and is left so. The result is read off the bitmap in order when that is
/// cheaper than sorting the k draws.
inline void random_k_indices(std::uint64_t seed, std::uint64_t step, std::size_t n, std::size_t k,
                             std::uint64_t* taken, std::uint32_t* out) {
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

template <>
class engine<select::random_k, backend::host> {
 public:
  engine(const backend::host&, const select::random_k&, std::size_t n) : n_(n), taken_((n + 63) / 64) {}

  void reserve(const select::random_k&) noexcept {}  // the workspace (a bit per element) does not depend on k
  void begin_observe(const select::random_k&, std::uint64_t) noexcept {}
  void observe(int, std::size_t, std::span<const float>, std::span<const float>) noexcept {}
  selection select(const select::random_k& policy, const select_input& in, std::span<std::uint32_t> out) {
    const std::size_t k = policy.k(n_);
    random_k_indices(policy.seed, in.step, n_, k, taken_.data(), out.data());
    return {k, policy.value_scale(n_)};
  }
  void accept() noexcept {}

 private:
  std::size_t n_;
  std::vector<std::uint64_t> taken_;
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
