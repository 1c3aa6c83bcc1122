/// \file detail/select/chunk_local_bin.hpp
/// chunk_local's kernel for one bin on the host (SSE2 where available): backend::host's
/// engine runs it inside the corrector's pass, and the generic algorithm
/// (detail/select/chunk_local.hpp) writes each bin's hits with it on the host. Not API.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/detail/core/simd.hpp>
#include <gradcomp/detail/core/radix_select.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

#if defined(__SSE2__)
/// For each 4-bit mask, the positions of its set bits, packed to the front.
alignas(16) inline constexpr std::int32_t packed_lanes[16][4] = {
    {0, 0, 0, 0}, {0, 0, 0, 0}, {1, 0, 0, 0}, {0, 1, 0, 0}, {2, 0, 0, 0}, {0, 2, 0, 0}, {1, 2, 0, 0}, {0, 1, 2, 0},
    {3, 0, 0, 0}, {0, 3, 0, 0}, {1, 3, 0, 0}, {0, 1, 3, 0}, {2, 3, 0, 0}, {0, 2, 3, 0}, {1, 2, 3, 0}, {0, 1, 2, 3}};
inline constexpr std::uint8_t packed_count[16] = {0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4};
#endif

/// For one bin of `len` entries starting at tensor index `first` (acc and g point at
/// the bin), appends to `out` the indices with |acc_i + g_i| >= max |acc| of the bin;
/// returns the new end of `out`; nothing is written at or after `out_end`. Sets
/// `non_finite` if the bin's acc or g holds a NaN or infinity that could change the
/// selection. `SameArrays`: acc and g are one array (no corrector), loaded once.
/// `ExactWrites`: nothing is written past the bin's own hits, for a writer whose bins
/// run in any order or side by side (the generic algorithm's expansion: Kokkos's
/// parallel scan); otherwise each store may write up to four slots past them, which
/// the next bin's hits overwrite where bins are written in order (no branch on hits,
/// which are too frequent to predict).
template <bool SameArrays = false, bool ExactWrites = false>
inline std::uint32_t* select_bin(const float* acc, const float* g, std::size_t len, std::size_t first,
                                 std::uint32_t* out, std::uint32_t* out_end, bool& non_finite) noexcept {
#if defined(__SSE2__)
  if (len >= 4 && (ExactWrites || out + len + 4 <= out_end)) {
    const __m128 magnitude = _mm_castsi128_ps(_mm_set1_epi32(0x7FFFFFFF));
    // Maximum: the last load overlaps the previous ones, which max does not mind. Four
    // independent running maxima: the hit pass waits for the result, and one chain of
    // dependent max instructions would be the bin's critical path.
    auto mag = [&](std::size_t at) { return _mm_and_ps(_mm_loadu_ps(acc + at), magnitude); };
    __m128 m0 = mag(len - 4), m1 = m0, m2 = m0, m3 = m0;
    std::size_t j = 0;
    for (; j + 16 <= len; j += 16) {
      m0 = _mm_max_ps(m0, mag(j));
      m1 = _mm_max_ps(m1, mag(j + 4));
      m2 = _mm_max_ps(m2, mag(j + 8));
      m3 = _mm_max_ps(m3, mag(j + 12));
    }
    for (; j + 4 <= len; j += 4) m0 = _mm_max_ps(m0, mag(j));
    __m128 top = _mm_max_ps(_mm_max_ps(m0, m1), _mm_max_ps(m2, m3));
    top = _mm_max_ps(top, _mm_shuffle_ps(top, top, _MM_SHUFFLE(1, 0, 3, 2)));
    top = _mm_max_ps(top, _mm_shuffle_ps(top, top, _MM_SHUFFLE(2, 3, 0, 1)));
    const float largest = _mm_cvtss_f32(top);
    non_finite |= std::isinf(largest);
    const __m128 bound = _mm_set1_ps(largest);
    // Each vector stores its hit lanes' indices in one go, packed by a 16-entry table,
    // and advances by their count (there is room for four more, checked above), or with
    // ExactWrites stores only the hits' lanes. A NaN makes its H NaN and so the
    // running sum of H: one add per vector, and the bin is scanned exactly only then.
    __m128 sum = _mm_setzero_ps();
    std::size_t base = first;  // the index of the vector's lane 0
    __m128i index = _mm_set1_epi32(static_cast<std::int32_t>(first));
    auto hits = [&](std::size_t at) {
      const __m128 a = _mm_loadu_ps(acc + at);
      const __m128 h = _mm_and_ps(_mm_add_ps(a, SameArrays ? a : _mm_loadu_ps(g + at)), magnitude);
      sum = _mm_add_ps(sum, h);
      return static_cast<unsigned>(_mm_movemask_ps(_mm_cmpge_ps(h, bound)));
    };
    auto store = [&](unsigned mask) {
      if constexpr (ExactWrites) {
        for (unsigned l = 0; l < packed_count[mask]; ++l) {
          out[l] = static_cast<std::uint32_t>(base + static_cast<std::size_t>(packed_lanes[mask][l]));
        }
      } else {
        const __m128i offsets = _mm_load_si128(reinterpret_cast<const __m128i*>(packed_lanes[mask]));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm_add_epi32(offsets, index));
      }
      out += packed_count[mask];  // not std::popcount: baseline x86-64 has no popcnt instruction
    };
    for (j = 0; j + 4 <= len; j += 4) {
      store(hits(j));
      base += 4;
      index = _mm_add_epi32(index, _mm_set1_epi32(4));
    }
    if (j < len) {  // the last vector overlaps: only the lanes not yet seen
      base = first + len - 4;
      index = _mm_set1_epi32(static_cast<std::int32_t>(first + len - 4));
      store(hits(len - 4) & ((0xFu << (4 - (len - j))) & 0xFu));
    }
    alignas(16) float lanes[4];
    _mm_store_ps(lanes, sum);
    if (!std::isfinite(lanes[0] + lanes[1] + lanes[2] + lanes[3])) {  // a NaN, an infinity, or just overflow
      for (std::size_t i = 0; i < len; ++i) non_finite |= !std::isfinite(acc[i]) || !std::isfinite(g[i]);
    }
    return out;
  }
#endif
  float largest = 0.0f;
  for (std::size_t j = 0; j < len; ++j) {
    non_finite |= !std::isfinite(acc[j]) || !std::isfinite(g[j]);
    largest = std::max(largest, std::fabs(acc[j]));
  }
  for (std::size_t j = 0; j < len; ++j) {
    const bool hit = std::fabs(acc[j] + g[j]) >= largest;
    if (ExactWrites && !hit) continue;
    *out = static_cast<std::uint32_t>(first + j);
    out += hit ? 1 : 0;
  }
  return out;
}

}  // namespace detail
GRADCOMP_NAMESPACE_END
