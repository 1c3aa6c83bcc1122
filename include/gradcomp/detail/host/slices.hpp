/// \file detail/host/slices.hpp
/// Ordered compaction on backend::host without coordination between threads: each
/// tile writes the indices it keeps into its own slice of an n-element array, and a
/// short serial gather concatenates the slices in tile order. Not API.
#pragma once

#include <gradcomp/detail/host/backend.hpp>
#include <gradcomp/detail/core/simd.hpp>
#include <gradcomp/held_memory.hpp>

#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

class host_slices {
 public:
  explicit host_slices(std::size_t n) : n_(n), indices_(n), counts_(tile_count(n)) {}

  /// Start of the slice of tile `c` (room for the tile's length).
  std::uint32_t* slice(std::size_t c) noexcept { return indices_.data() + c * host_tile; }
  const std::uint32_t* slice(std::size_t c) const noexcept { return indices_.data() + c * host_tile; }
  void set_count(std::size_t c, std::size_t count) noexcept { counts_[c] = static_cast<std::uint32_t>(count); }
  [[nodiscard]] std::uint32_t count(std::size_t c) const noexcept { return counts_[c]; }
  [[nodiscard]] std::size_t tiles() const noexcept { return counts_.size(); }

  /// Keeps, for tile `c` whose values `x` start at tensor index `begin`, the indices
  /// whose magnitude key is >= low, in order; ORs into `non_finite` whether one of them
  /// is NaN or infinite.
  void collect_tile(std::size_t c, std::size_t begin, std::span<const float> x, std::uint32_t low,
                    bool& non_finite) noexcept {
    std::uint32_t* out = slice(c);
    set_count(c, static_cast<std::size_t>(collect_at_least(x.data(), x.size(), begin, low, out, non_finite) - out));
  }

  /// Runs collect_tile over every tile of x in parallel; returns false if x holds a
  /// NaN or infinity at or above `low`.
  bool collect(int threads, std::span<const float> x, std::uint32_t low) {
    shared_flag bad;
    for_each_tile(threads, n_, [&](int, std::size_t c, std::size_t begin, std::size_t end) {
      bool tile_bad = false;
      collect_tile(c, begin, x.subspan(begin, end - begin), low, tile_bad);
      if (tile_bad) bad.raise();
    });
    return !bad.raised();
  }

  [[nodiscard]] std::size_t total() const noexcept {
    std::size_t t = 0;
    for (const auto c : counts_) t += c;
    return t;
  }

  /// Concatenates the slices into `out` (room for total()); `out` may be the slices'
  /// own storage (all_indices()), since each slice moves only left.
  std::size_t gather(std::uint32_t* out) const noexcept {
    std::size_t at = 0;
    for (std::size_t c = 0; c < counts_.size(); ++c) {
      std::memmove(out + at, slice(c), counts_[c] * sizeof(std::uint32_t));
      at += counts_[c];
    }
    return at;
  }
  std::uint32_t* all_indices() noexcept { return indices_.data(); }
  [[nodiscard]] std::size_t held_bytes() const noexcept { return bytes_held(indices_, counts_); }

 private:
  std::size_t n_;
  std::vector<std::uint32_t> indices_;
  std::vector<std::uint32_t> counts_;
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
