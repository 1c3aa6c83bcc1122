/// \file detail/select/chunk_local.hpp
/// select::chunk_local's algorithm (AdaComp) over the backend primitives: one ordered
/// expansion over the bins, in which each bin finds its largest |acc| and makes the
/// indices with |acc_i + g_i| >= it, its count going straight into the step's status.
/// What backend::kokkos runs; backend::host's engine (detail/host/select_chunk_local.hpp,
/// inside the corrector's pass) and backend::cuda's (a tiled pass that marks the hits,
/// then one compaction, detail/cuda/select_chunk_local.cuh) are fast paths, the first proved
/// equal to this by the tests. Not API.
#pragma once

#include <gradcomp/concepts.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/detail/select/chunk_local_bin.hpp>
#include <gradcomp/detail/core/selector_work.hpp>
#include <gradcomp/detail/core/step_input.hpp>
#include <gradcomp/select/chunk_local.hpp>
#include <gradcomp/held_memory.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

/// The indices of one chunk_local bin (acc and g point at it) by two plain loops: the
/// largest |acc|, then the hits, written from `out` on (up to out_end; none when `out`
/// is null) and counted. What a device runs; the host counts with it.
GRADCOMP_HOST_DEVICE inline std::size_t chunk_local_bin_loops(const float* acc, const float* g, std::size_t len,
                                                              std::size_t first, std::uint32_t* out,
                                                              std::uint32_t* out_end) noexcept {
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

/// The indices of one chunk_local bin: written from `out` on (up to out_end; nothing
/// past the bin's own hits, since an expansion's items may write side by side) and
/// counted, or only counted when `out` is null. On the host the writing is
/// backend::host's SIMD kernel, which selects the same entries, inlined: this runs once
/// per bin (AdaComp's bins hold 50 entries), where a call costs as much as the bin's
/// work, and GCC does not always inline it by itself (bench_kokkos kokkos/2: 14.7 ms with
/// the call, 12.0 ms without, 2026-11-23).
#if !defined(__CUDACC__) && !defined(__HIPCC__)
[[gnu::flatten]]
#endif
GRADCOMP_HOST_DEVICE inline std::size_t
chunk_local_bin(const float* acc, const float* g, std::size_t len, std::size_t first, std::uint32_t* out,
                std::uint32_t* out_end) noexcept {
#if !defined(__CUDA_ARCH__) && !defined(__HIP_DEVICE_COMPILE__)
  if (out != nullptr) {
    bool non_finite = false;  // acc was checked by the corrector
    return static_cast<std::size_t>(select_bin<false, true>(acc, g, len, first, out, out_end, non_finite) - out);
  }
#endif
  return chunk_local_bin_loops(acc, g, len, first, out, out_end);
}

/// The expansion body: bin b of `bin` entries (the last one shorter) makes its hits.
struct chunk_local_bins {
  const float* acc;
  const float* g;
  std::size_t n, bin;
  std::uint32_t* out_end;
  GRADCOMP_HOST_DEVICE std::size_t operator()(std::size_t b, std::uint32_t* out) const {
    const std::size_t first = b * bin;
    const std::size_t len = first + bin < n ? bin : n - first;
    return chunk_local_bin(acc + first, g + first, len, first, out, out_end);
  }
};

/// select::chunk_local on any backend.
/// A NaN or infinity is the corrector's to flag.
template <class Backend>
class chunk_local_selection {
 public:
  chunk_local_selection(const Backend& be, const select::chunk_local& policy, std::size_t n)
      : n_(n),
        bins_((n + policy.bin_for(n) - 1) / policy.bin_for(n)),
        workspace_(be.template allocate<std::byte>(be.expand_workspace(bins_))) {}

  /// Queues the expansion over the bins: ascending indices in out, their count in the
  /// status.
  queued_selection select(const Backend& be, const select::chunk_local& policy, const select_input& in,
                          std::span<std::uint32_t> out, step_status* status) {
    be.expand(bins_, chunk_local_bins{in.acc.data(), in.grad.data(), n_, policy.bin_for(n_), out.data() + out.size()},
              out.data(), workspace_bytes(workspace_), &status->count);
    return {};
  }
  void accept() noexcept {}
  void add_held(held_memory& use) const { use.workspace += bytes_held(workspace_); }

 private:
  std::size_t n_;
  std::size_t bins_;
  typename Backend::template buffer<std::byte> workspace_;
};

/// Every backend without an engine of its own for select::chunk_local runs the one above.
template <class Backend>
class engine<select::chunk_local, Backend> : public chunk_local_selection<Backend> {
 public:
  using chunk_local_selection<Backend>::chunk_local_selection;
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
