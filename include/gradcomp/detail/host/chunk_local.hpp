/// \file detail/host/chunk_local.hpp
/// select::chunk_local on backend::host, inside the corrector's pass: each chunk
/// handles the bins that lie wholly in it; the few bins that straddle two chunks are
/// handled in select() as their lists are concatenated.
#pragma once

#include <gradcomp/backend/host.hpp>
#include <gradcomp/concepts.hpp>
#include <gradcomp/detail/host/simd.hpp>
#include <gradcomp/detail/host/slices.hpp>
#include <gradcomp/detail/radix_select.hpp>
#include <gradcomp/detail/step_input.hpp>
#include <gradcomp/select/chunk_local.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <utility>

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
/// `non_finite` if the bin's acc holds a NaN or infinity.
inline std::uint32_t* select_bin(const float* acc, const float* g, std::size_t len, std::size_t first,
                                 std::uint32_t* out, std::uint32_t* out_end, bool& non_finite) noexcept {
#if defined(__SSE2__)
  if (len >= 4) {
    const __m128 magnitude = _mm_castsi128_ps(_mm_set1_epi32(0x7FFFFFFF));
    // Maximum: the last load overlaps the previous ones, which max does not mind.
    __m128 top = _mm_and_ps(_mm_loadu_ps(acc + len - 4), magnitude);
    for (std::size_t j = 0; j + 4 <= len; j += 4) top = _mm_max_ps(top, _mm_and_ps(_mm_loadu_ps(acc + j), magnitude));
    top = _mm_max_ps(top, _mm_shuffle_ps(top, top, _MM_SHUFFLE(1, 0, 3, 2)));
    top = _mm_max_ps(top, _mm_shuffle_ps(top, top, _MM_SHUFFLE(2, 3, 0, 1)));
    const float largest = _mm_cvtss_f32(top);
    non_finite |= std::isinf(largest);
    const __m128 bound = _mm_set1_ps(largest);
    // Each vector stores its hit lanes' indices in one go, packed by a 16-entry table,
    // and advances by their count (no branch on hits: they are too frequent to
    // predict). When `out` might not hold four more, scalar stores.
    __m128 unordered = _mm_setzero_ps();  // a NaN H means a NaN acc in the bin
    __m128i index = _mm_set1_epi32(static_cast<std::int32_t>(first));
    const __m128i four = _mm_set1_epi32(4);
    const bool roomy = out + len + 4 <= out_end;
    auto hits = [&](std::size_t j) {
      const __m128 h = _mm_and_ps(_mm_add_ps(_mm_loadu_ps(acc + j), _mm_loadu_ps(g + j)), magnitude);
      unordered = _mm_or_ps(unordered, _mm_cmpunord_ps(h, h));
      return static_cast<unsigned>(_mm_movemask_ps(_mm_cmpge_ps(h, bound)));
    };
    auto store = [&](std::size_t j, unsigned mask) {
      if (roomy) {
        const __m128i offsets = _mm_load_si128(reinterpret_cast<const __m128i*>(packed_lanes[mask]));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm_add_epi32(offsets, index));
        out += packed_count[mask];  // not std::popcount: baseline x86-64 has no popcnt instruction
      } else {
        for (unsigned lane = 0; lane < 4; ++lane) {
          if ((mask >> lane) & 1u) *out++ = static_cast<std::uint32_t>(first + j + lane);
        }
      }
    };
    std::size_t j = 0;
    for (; j + 4 <= len; j += 4) {
      store(j, hits(j));
      index = _mm_add_epi32(index, four);
    }
    if (j < len) {  // the last vector overlaps: only the lanes not yet seen
      index = _mm_set1_epi32(static_cast<std::int32_t>(first + len - 4));
      store(len - 4, hits(len - 4) & ((0xFu << (4 - (len - j))) & 0xFu));
    }
    non_finite |= _mm_movemask_ps(unordered) != 0;  // an infinite acc is the maximum, caught above
    return out;
  }
#endif
  float largest = 0.0f;
  for (std::size_t j = 0; j < len; ++j) {
    non_finite |= !std::isfinite(acc[j]);
    largest = std::max(largest, std::fabs(acc[j]));
  }
  for (std::size_t j = 0; j < len; ++j) {
    *out = static_cast<std::uint32_t>(first + j);
    out += std::fabs(acc[j] + g[j]) >= largest ? 1 : 0;
  }
  return out;
}

template <>
class engine<select::chunk_local, backend::host> {
 public:
  static constexpr bool checks_finite = true;  // every bin's maximum is computed

  engine(const backend::host& be, const select::chunk_local&, std::size_t n) : threads_(be.concurrency()), n_(n), slices_(n) {}

  void begin_observe(const select::chunk_local& policy, std::uint64_t) noexcept {
    bin_ = policy.bin;
    observed_ = true;
  }
  // acc and g are the chunk's; bins are aligned to multiples of bin_ in the tensor.
  void observe(int, std::size_t begin, std::span<const float> acc, std::span<const float> g) noexcept {
    bool chunk_bad = false;
    observe_chunk(begin, acc, g, chunk_bad);
  }

  selection select(const select::chunk_local& policy, const select_input& in, std::span<std::uint32_t> out) {
    shared_flag bad;
    if (!std::exchange(observed_, false)) {
      bin_ = policy.bin;
      for_each_chunk(threads_, n_, [&](int, std::size_t, std::size_t begin, std::size_t end) {
        bool chunk_bad = false;
        observe_chunk(begin, in.acc.subspan(begin, end - begin), in.grad.subspan(begin, end - begin), chunk_bad);
        if (chunk_bad) bad.raise();
      });
    }
    bool straddle_bad = false;
    std::uint32_t* w = out.data();
    for (std::size_t c = 0; c < slices_.chunks(); ++c) {
      std::copy_n(slices_.slice(c), slices_.count(c), w);
      w += slices_.count(c);
      // The bin that starts in this chunk and ends in a later one.
      const std::size_t chunk_end = std::min(n_, (c + 1) * host_chunk);
      const std::size_t b = (chunk_end - 1) / bin_ * bin_;
      if (b >= c * host_chunk && std::min(b + bin_, n_) > chunk_end) {
        w = select_bin(in.acc.data() + b, in.grad.data() + b, std::min(b + bin_, n_) - b, b, w, out.data() + out.size(),
                       straddle_bad);
      }
    }
    return {static_cast<std::size_t>(w - out.data()), 1.0f, !bad.raised() && !straddle_bad};
  }
  void accept() noexcept {}

 private:
  // The bins that lie wholly inside the chunk starting at `begin`.
  void observe_chunk(std::size_t begin, std::span<const float> acc, std::span<const float> g, bool& bad) noexcept {
    const std::size_t end = begin + acc.size();
    std::uint32_t* out = slices_.slice(begin / host_chunk);
    std::uint32_t* const first = out;
    for (std::size_t b = (begin + bin_ - 1) / bin_ * bin_; b < end; b += bin_) {
      const std::size_t stop = std::min(b + bin_, n_);
      if (stop > end) break;  // straddles into the next chunk: select() does it
      out = select_bin(acc.data() + (b - begin), g.data() + (b - begin), stop - b, b, out, first + acc.size(), bad);
    }
    slices_.set_count(begin / host_chunk, static_cast<std::size_t>(out - first));
  }

  int threads_;
  std::size_t n_;
  host_slices slices_;
  std::size_t bin_ = 1;
  bool observed_ = false;
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
