/// \file detail/kokkos/primitives.hpp
/// backend::kokkos's fast paths, chosen by one trait each: a compaction that a functor
/// admits faster than the general ordered one (backend::kokkos::expand), the
/// SIMD-masked compaction of a magnitude threshold. Not API.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/detail/core/simd.hpp>
#include <gradcomp/detail/core/radix_select.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <type_traits>

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
/// entries per work item with the SIMD mask of detail/core/simd.hpp: groups without a
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

/// Whether backend::kokkos::compact has a faster way for the keep functor `Keep` than
/// the ordered expansion: false unless specialised beside its fast_compaction (the
/// primitives' counterpart of detail::has_fast_path).
template <class Keep>
struct has_fast_compaction : std::false_type {};

/// A threshold on magnitudes (threshold's selection, sampled_threshold's collection).
template <>
struct has_fast_compaction<magnitude_at_least> : std::true_type {};
/// compact() of a magnitude threshold over n entries: compact_at_least.
template <class Space>
std::uint32_t fast_compaction(const Space& space, std::size_t n, const magnitude_at_least& keep, std::uint32_t* out) {
  return static_cast<std::uint32_t>(
      compact_at_least(space, view<const float, Space>(keep.acc, n), keep.key, view<std::uint32_t, Space>(out, n)));
}

}  // namespace detail::kk
GRADCOMP_NAMESPACE_END
