/// \file detail/host/slices.hpp
/// Ordered compaction on backend::host without coordination between threads: each
/// chunk writes the indices it keeps into its own slice of an n-element array, and a
/// short serial gather concatenates the slices in chunk order. Not API.
#pragma once

#include <gradcomp/backend/host.hpp>

#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

class host_slices {
 public:
  explicit host_slices(std::size_t n) : n_(n), indices_(n), counts_(chunk_count(n)) {}

  /// Start of the slice of chunk `c` (room for the chunk's length).
  std::uint32_t* slice(std::size_t c) noexcept { return indices_.data() + c * host_chunk; }
  const std::uint32_t* slice(std::size_t c) const noexcept { return indices_.data() + c * host_chunk; }
  void set_count(std::size_t c, std::size_t count) noexcept { counts_[c] = static_cast<std::uint32_t>(count); }
  [[nodiscard]] std::uint32_t count(std::size_t c) const noexcept { return counts_[c]; }
  [[nodiscard]] std::size_t chunks() const noexcept { return counts_.size(); }

  /// Keeps, for chunk `c` = [begin, end), the indices i with keep(i), in order.
  template <class Keep>
  void keep_chunk(std::size_t c, std::size_t begin, std::size_t end, Keep&& keep) noexcept {
    std::uint32_t* out = slice(c);
    std::size_t kept = 0;
    for (std::size_t i = begin; i < end; ++i) {
      out[kept] = static_cast<std::uint32_t>(i);
      kept += keep(i) ? 1 : 0;
    }
    set_count(c, kept);
  }

  /// Runs keep_chunk over every chunk in parallel.
  template <class Keep>
  void keep(int threads, Keep&& keep) {
    for_each_chunk(threads, n_, [&](int, std::size_t c, std::size_t begin, std::size_t end) { keep_chunk(c, begin, end, keep); });
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

 private:
  std::size_t n_;
  std::vector<std::uint32_t> indices_;
  std::vector<std::uint32_t> counts_;
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
