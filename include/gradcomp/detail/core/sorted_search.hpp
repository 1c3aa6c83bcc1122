/// \file detail/core/sorted_search.hpp
/// std::lower_bound over an ascending array, in host and device code alike (a work
/// item's search in a pass: where a shard's entries start, whether an index was kept).
/// Not API.
#pragma once

#include <gradcomp/config.hpp>

#include <cstddef>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

/// The first position j < count with sorted[j] >= value, or count.
template <class T, class V>
GRADCOMP_HOST_DEVICE std::size_t first_not_below(const T* sorted, std::size_t count, V value) noexcept {
  std::size_t lo = 0;
  std::size_t hi = count;
  while (lo < hi) {
    const std::size_t mid = lo + (hi - lo) / 2;
    if (sorted[mid] < value) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

}  // namespace detail
GRADCOMP_NAMESPACE_END
