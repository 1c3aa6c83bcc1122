/// \file detail/kokkos/primitives.hpp
/// The data-parallel pieces the Kokkos engines share: unmanaged views of spans, the
/// SIMD-masked compaction by a magnitude threshold, host staging. (The general ordered
/// compaction is backend::kokkos::compact.) Not API.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/error.hpp>
#include <gradcomp/detail/host/simd.hpp>
#include <gradcomp/detail/radix_select.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <span>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN
namespace detail::kk {

template <class Space>
using memory = typename Space::memory_space;

/// A span in the space's memory as an unmanaged View.
template <class T, class Space>
using view = Kokkos::View<T*, memory<Space>, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

template <class Space, class T>
view<T, Space> wrap(std::span<T> s) {
  return view<T, Space>(s.data(), s.size());
}

template <class Space>
inline constexpr bool host_accessible = Kokkos::SpaceAccessibility<Kokkos::HostSpace, memory<Space>>::accessible;

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

/// Copies between a span in the space's memory and host memory; nothing to do when
/// the space's memory is host memory and both spans are the same.
template <class Space, class T>
void to_host(std::span<const T> device, T* host) {
  if (static_cast<const void*>(device.data()) == static_cast<const void*>(host) || device.empty()) return;
  Kokkos::deep_copy(Kokkos::View<T*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(host, device.size()),
                    view<const T, Space>(device.data(), device.size()));
}
template <class Space, class T>
void from_host(const T* host, std::span<T> device) {
  if (static_cast<const void*>(device.data()) == static_cast<const void*>(host) || device.empty()) return;
  Kokkos::deep_copy(view<T, Space>(device.data(), device.size()),
                    Kokkos::View<const T*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(host, device.size()));
}

/// The contents of `device` readable on the host: the memory itself when the host can
/// read the space's memory, else a copy in `staging` (sized at construction).
template <class Space, class T>
const T* read_on_host(std::span<const T> device, std::vector<T>& staging) {
  if constexpr (host_accessible<Space>) {
    return device.data();
  } else {
    to_host<Space>(device, staging.data());
    return staging.data();
  }
}

/// Host memory to build what goes to `device`: the memory itself when host-accessible,
/// else `staging`; write_back then copies it over.
template <class Space, class T>
T* write_on_host(std::span<T> device, std::vector<T>& staging) {
  if constexpr (host_accessible<Space>) {
    return device.data();
  } else {
    return staging.data();
  }
}
template <class Space, class T>
void write_back(const T* host, std::span<T> device) {
  from_host<Space>(host, device);
}

}  // namespace detail::kk
GRADCOMP_NAMESPACE_END
