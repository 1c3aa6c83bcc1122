/// \file detail/core/radix_select.hpp
/// Radix selection over the bit patterns of |x|. For finite floats, |a| < |b| exactly
/// when (bits(a) & 0x7fffffff) < (bits(b) & 0x7fffffff), so ranking magnitudes is
/// ranking 31-bit unsigned keys, digit by digit, without comparisons or sorting. Not API.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/detail/core/bits.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

/// 31-bit magnitude key of a float: order of keys = order of |x| for finite x; +0 and
/// -0 share key 0.
GRADCOMP_HOST_DEVICE inline std::uint32_t magnitude_key(float x) noexcept { return bits_of(x) & 0x7FFFFFFFu; }

/// Keys >= this belong to infinities and NaNs.
inline constexpr std::uint32_t non_finite_key = 0x7F800000u;

/// Whether |acc_i| >= the magnitude `key` (keys order as the floats' magnitudes): the
/// predicate of the compactions that select by a threshold.
struct magnitude_at_least {
  const float* acc;
  std::uint32_t key;
  GRADCOMP_HOST_DEVICE bool operator()(std::size_t i) const noexcept { return magnitude_key(acc[i]) >= key; }
};

/// The three digits of a key, most significant first: 11 + 10 + 10 = 31 bits.
struct radix_digit {
  int shift;
  int bits;
};
inline constexpr std::array<radix_digit, 3> magnitude_digits{{{20, 11}, {10, 10}, {0, 10}}};
inline constexpr std::size_t top_digit_bins = std::size_t{1} << 11;
/// The digits of a select whose histograms travel (comm::sparse_allreduce's global
/// top-k, detail/comm/global_topk.hpp): 8 + 8 + 8 + 7 bits, so that the four histograms
/// together are 3.5 KB of uint32 counts, not 16 KB.
inline constexpr std::array<radix_digit, 4> collective_digits{{{23, 8}, {15, 8}, {7, 8}, {0, 7}}};

/// exact_topk's sample, on every backend: every topk_sample_stride-th entry of acc
/// brackets the k-th largest key (sample_bracket); below topk_min_sampled_n entries
/// the top digit's histogram runs at once.
inline constexpr std::size_t topk_sample_stride = 512;
inline constexpr std::size_t topk_min_sampled_n = std::size_t{1} << 16;

/// Where the k-th largest key sits.
struct kth_key {
  std::uint32_t key;      ///< the k-th largest key
  std::size_t ties_left;  ///< how many entries with exactly this key are among the k
};

/// Scans histogram `bins` from the top and returns the bin holding the r-th largest
/// entry (r >= 1) and r minus the entries in higher bins.
GRADCOMP_HOST_DEVICE inline std::pair<std::uint32_t, std::size_t> find_bin_from_top(std::span<const std::uint32_t> bins,
                                                                                    std::size_t r) {
  for (std::size_t b = bins.size(); b-- > 0;) {
    if (bins[b] >= r) return {static_cast<std::uint32_t>(b), r};
    r -= bins[b];
  }
  return {0, r};  // unreachable when r <= total count
}

/// Finds the r-th largest of `size` keys (1 <= r <= size), `key_at(j)` giving key j,
/// all of which share the digits above `first_digit` with `prefix`.
template <class KeyAt>
kth_key kth_largest(KeyAt&& key_at, std::size_t size, std::size_t r, std::size_t first_digit, std::uint32_t prefix) {
  const auto& digits = magnitude_digits;
  std::array<std::uint32_t, top_digit_bins> bins{};
  std::uint32_t known_mask = 0;
  for (std::size_t d = 0; d < first_digit; ++d) known_mask |= ((1u << digits[d].bits) - 1u) << digits[d].shift;
  for (std::size_t d = first_digit; d < digits.size(); ++d) {
    const auto [shift, bits] = digits[d];
    const std::uint32_t digit_mask = (1u << bits) - 1u;
    std::fill(bins.begin(), bins.begin() + (std::size_t{1} << bits), 0u);
    for (std::size_t j = 0; j < size; ++j) {
      const std::uint32_t key = key_at(j);
      if ((key & known_mask) == prefix) ++bins[(key >> shift) & digit_mask];
    }
    const auto [digit, remaining] = find_bin_from_top(std::span(bins).first(std::size_t{1} << bits), r);
    prefix |= digit << shift;
    known_mask |= digit_mask << shift;
    r = remaining;
  }
  return {prefix, r};
}

/// kth_largest over the magnitudes `acc[list[j]]`.
inline kth_key kth_largest_in_list(std::span<const float> acc, std::span<const std::uint32_t> list, std::size_t r,
                                   std::size_t first_digit, std::uint32_t prefix) {
  return kth_largest([&](std::size_t j) { return magnitude_key(acc[list[j]]); }, list.size(), r, first_digit, prefix);
}

/// Keeps, in order, the entries of `list` whose key is above `kth.key`, and the first
/// `kth.ties_left` whose key equals it (ties go to the lower index). Returns the new size.
inline std::size_t keep_top_in_list(std::span<const float> acc, std::span<std::uint32_t> list, kth_key kth) {
  std::size_t kept = 0;
  std::size_t ties = kth.ties_left;
  for (const std::uint32_t i : list) {
    const std::uint32_t key = magnitude_key(acc[i]);
    const bool take = key > kth.key || (key == kth.key && ties > 0);
    ties -= (key == kth.key && ties > 0) ? 1 : 0;
    list[kept] = i;
    kept += take ? 1 : 0;
  }
  return kept;
}

/// Keeps, in order, the entries of `list` (with keys `keys[j]`) that are among the r
/// largest keys, ties to the lower position; keys share the digits above `first_digit`
/// with `prefix`. Returns {entries kept, the r-th largest key}.
inline std::pair<std::size_t, std::uint32_t> keep_top_keys(std::span<std::uint32_t> list,
                                                           std::span<const std::uint32_t> keys, std::size_t r,
                                                           std::size_t first_digit, std::uint32_t prefix) {
  const kth_key kth = kth_largest([&](std::size_t j) { return keys[j]; }, keys.size(), r, first_digit, prefix);
  std::size_t ties = kth.ties_left;
  std::size_t kept = 0;
  for (std::size_t j = 0; j < list.size(); ++j) {
    const bool take = keys[j] > kth.key || (keys[j] == kth.key && ties > 0);
    ties -= (keys[j] == kth.key && ties > 0) ? 1 : 0;
    list[kept] = list[j];
    kept += take ? 1 : 0;
  }
  return {kept, kth.key};
}

/// Merges ascending a[0, na) (stored at the front of `out`) with ascending b[0, nb) into
/// out[0, na + nb), from the back so no extra buffer is needed.
inline void merge_backwards(std::uint32_t* out, std::size_t na, const std::uint32_t* b, std::size_t nb) noexcept {
  std::size_t w = na + nb;
  while (nb > 0) {
    if (na > 0 && out[na - 1] > b[nb - 1]) {
      out[--w] = out[--na];
    } else {
      out[--w] = b[--nb];
    }
  }
}

/// Keys of two sample order statistics around the expected rank r = k m / n of the k-th
/// largest of n keys, +- (4 sqrt(r) + 8) ranks: {lo, hi}, hi = ~0 when no rank is above.
/// The k-th largest key falls outside [lo, hi] with negligible probability.
inline std::pair<std::uint32_t, std::uint32_t> sample_bracket(std::span<const float> sample, std::size_t n,
                                                              std::size_t k) {
  const double m = static_cast<double>(sample.size());
  const double r = static_cast<double>(k) * m / static_cast<double>(n);
  const double margin = 4.0 * std::sqrt(r) + 8.0;
  auto key_at_rank = [&](double rank) {  // rank-th largest sample key, 1-based
    const auto at = static_cast<std::size_t>(std::clamp(rank, 1.0, m));
    return kth_largest([&](std::size_t j) { return magnitude_key(sample[j]); }, sample.size(), at, 0, 0).key;
  };
  const std::uint32_t lo = r + margin >= m ? 0u : key_at_rank(std::ceil(r + margin));
  const std::uint32_t hi = r - margin < 1.0 ? ~0u : key_at_rank(std::floor(r - margin));
  return {lo, hi};
}

}  // namespace detail
GRADCOMP_NAMESPACE_END
