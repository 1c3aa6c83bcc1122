/// \file detail/kokkos/selectors.hpp
/// The selector engine backend::kokkos has of its own, chunk_local: one parallel_scan
/// over the bins (the other selectors run the algorithms written once over the
/// backend primitives, detail/select_<name>.hpp). Not API.
#pragma once

#include <gradcomp/backend/kokkos.hpp>
#include <gradcomp/detail/host/chunk_local.hpp>
#include <gradcomp/detail/kokkos/primitives.hpp>
#include <gradcomp/detail/step_input.hpp>
#include <gradcomp/select/chunk_local.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

/// The indices of one chunk_local bin (acc and g point at it): written from `out` on
/// (up to out_end) and counted, or only counted when `out` is null. On the host this is
/// backend::host's SIMD kernel.
GRADCOMP_HOST_DEVICE inline std::size_t chunk_local_bin(const float* acc, const float* g, std::size_t len,
                                                        std::size_t first, std::uint32_t* out,
                                                        std::uint32_t* out_end) noexcept {
#if !defined(__CUDA_ARCH__) && !defined(__HIP_DEVICE_COMPILE__)
  if (out != nullptr) {
    bool non_finite = false;  // acc was checked by the corrector
    return static_cast<std::size_t>(select_bin(acc, g, len, first, out, out_end, non_finite) - out);
  }
#endif
  float largest = 0.0f;
  for (std::size_t j = 0; j < len; ++j) largest = fabsf(acc[j]) > largest ? fabsf(acc[j]) : largest;
  std::size_t count = 0;
  for (std::size_t j = 0; j < len; ++j) {
    if (fabsf(acc[j] + g[j]) >= largest) {
      if (out != nullptr && out + count < out_end) out[count] = static_cast<std::uint32_t>(first + j);
      ++count;
    }
  }
  return count;
}

template <class Space>
class engine<select::chunk_local, backend::kokkos<Space>> {
 public:
  engine(const backend::kokkos<Space>& be, const select::chunk_local&, std::size_t) : space_(be.space) {}

  /// Nothing to do during the corrector's pass.
  void begin_observe(const select::chunk_local&, std::uint64_t) noexcept {}
  void observe(int, std::size_t, std::span<const float>, std::span<const float>) noexcept {}

  // One parallel_scan over the bins: each computes its maximum and its hits.
  selection select(const select::chunk_local& policy, const select_input& in, std::span<std::uint32_t> out) {
    const auto acc = kk::wrap<Space>(in.acc);
    const auto g = kk::wrap<Space>(in.grad);
    const auto dest = kk::wrap<Space>(out);
    const std::size_t n = in.acc.size();
    const std::size_t bin = policy.bin_for(n);
    std::size_t total = 0;
    Kokkos::parallel_scan(
        "gradcomp::chunk_local", kk::range(space_, (n + bin - 1) / bin),
        KOKKOS_LAMBDA(const std::size_t b, std::size_t& at, const bool final) {
          const std::size_t first = b * bin;
          const std::size_t len = first + bin < n ? bin : n - first;
          at += chunk_local_bin(acc.data() + first, g.data() + first, len, first,
                                final ? dest.data() + at : nullptr, dest.data() + dest.extent(0));
        },
        total);
    space_.fence();
    return {total};
  }
  void accept() noexcept {}

 private:
  Space space_;
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
