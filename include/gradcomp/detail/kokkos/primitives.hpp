/// \file detail/kokkos/primitives.hpp
/// backend::kokkos::compact's fast path for a magnitude threshold: the SIMD-masked
/// compaction. (The general ordered compaction is backend::kokkos::expand.) Not API.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/detail/host/simd.hpp>
#include <gradcomp/detail/radix_select.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>

GRADCOMP_NAMESPACE_BEGIN
namespace detail::kk {

template <class Space>
using memory = typename Space::memory_space;

/// A span in the space's memory as an unmanaged View.
template <class T, class Space>
using view = Kokkos::View<T*, memory<Space>, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

template <class Space>
Kokkos::RangePolicy<Space> range(const Space& space, std::size_t n) {
  return Kokkos::RangePolicy<Space>(space, 0, n);
}

/// Writes, ascending, every i with magnitude_key(x(i)) >= low to out (up to its
/// extent) and returns how many there are (possibly more than out holds). Sixteen
/// entries per work item with the SIMD mask of detail/host/simd.hpp: groups without a
/// hit cost one compare.
template <class Space>
std::size_t compact_at_least(const Space& space, const view<const float, Space>& x, std::uint32_t low,
                             const view<std::uint32_t, Space>& out) {
  const std::size_t n = x.extent(0);
  const std::size_t groups = (n + mask_group - 1) / mask_group;
  const std::size_t capacity = out.extent(0);
  std::size_t total = 0;
  Kokkos::parallel_scan(
      "gradcomp::compact_at_least", range(space, groups),
      KOKKOS_LAMBDA(const std::size_t b, std::size_t& at, const bool final) {
        const std::size_t first = b * mask_group;
        const std::uint32_t mask = at_least_mask(x.data() + first, n - first, low);
        if (final) {
          std::size_t w = at;
          for (std::uint32_t m = mask; m != 0; m &= m - 1) {
            if (w < capacity) out(w) = static_cast<std::uint32_t>(first + static_cast<std::size_t>(lowest_bit(m)));
            ++w;
          }
        }
        at += popcount16(mask);
      },
      total);
  space.fence();
  return total;
}

}  // namespace detail::kk
GRADCOMP_NAMESPACE_END
