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
#include <cstring>
#include <utility>
#include <vector>

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
template <bool SameArrays = false>
inline std::uint32_t* select_bin(const float* acc, const float* g, std::size_t len, std::size_t first,
                                 std::uint32_t* out, std::uint32_t* out_end, bool& non_finite) noexcept {
#if defined(__SSE2__)
  if (len >= 4 && out + len + 4 <= out_end) {
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
    // and advances by their count: no branch on hits, which are too frequent to predict
    // (there is room for four more, checked above). A NaN makes its H NaN and so the
    // running sum of H: one add per vector, and the bin is scanned exactly only then.
    __m128 sum = _mm_setzero_ps();
    __m128i index = _mm_set1_epi32(static_cast<std::int32_t>(first));
    auto hits = [&](std::size_t at) {
      const __m128 a = _mm_loadu_ps(acc + at);
      const __m128 h = _mm_and_ps(_mm_add_ps(a, SameArrays ? a : _mm_loadu_ps(g + at)), magnitude);
      sum = _mm_add_ps(sum, h);
      return static_cast<unsigned>(_mm_movemask_ps(_mm_cmpge_ps(h, bound)));
    };
    auto store = [&](unsigned mask) {
      const __m128i offsets = _mm_load_si128(reinterpret_cast<const __m128i*>(packed_lanes[mask]));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm_add_epi32(offsets, index));
      out += packed_count[mask];  // not std::popcount: baseline x86-64 has no popcnt instruction
    };
    for (j = 0; j + 4 <= len; j += 4) {
      store(hits(j));
      index = _mm_add_epi32(index, _mm_set1_epi32(4));
    }
    if (j < len) {  // the last vector overlaps: only the lanes not yet seen
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
    *out = static_cast<std::uint32_t>(first + j);
    out += std::fabs(acc[j] + g[j]) >= largest ? 1 : 0;
  }
  return out;
}

template <>
class engine<select::chunk_local, backend::host> {
 public:
  static constexpr bool checks_finite = true;  // every bin's maximum is computed

  engine(const backend::host& be, const select::chunk_local&, std::size_t n)
      : threads_(be.concurrency()), n_(n), slices_(n), block_counts_(static_cast<std::size_t>(threads_)) {}

  void begin_observe(const select::chunk_local& policy, std::uint64_t) noexcept {
    bin_ = policy.bin_for(n_);
    observed_ = true;
    observe_bad_ = {};
  }
  // acc and g are the chunk's; bins are aligned to multiples of bin_ in the tensor.
  void observe(int, std::size_t begin, std::span<const float> acc, std::span<const float> g) noexcept {
    bool chunk_bad = false;
    observe_chunk(begin, acc, g, chunk_bad);
    if (chunk_bad) observe_bad_.raise();
  }

  selection select(const select::chunk_local& policy, const select_input& in, std::span<std::uint32_t> out) {
    if (!std::exchange(observed_, false)) return select_in_place(policy.bin_for(n_), in, out);
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
    return {static_cast<std::size_t>(w - out.data()), 1.0f, !observe_bad_.raised() && !straddle_bad};
  }
  void accept() noexcept {}

 private:
  // Standalone (no corrector pass to ride on): every thread takes a contiguous run of
  // bins and writes its hits straight into `out`, from the index of its first bin on
  // (a bin never yields more hits than it has entries, so runs cannot collide); then
  // the runs after the first move down. AdaComp keeps a large share of the entries, so
  // this saves writing them to scratch and copying them all over again.
  selection select_in_place(std::size_t bin, const select_input& in, std::span<std::uint32_t> out) {
    const std::size_t bins = (n_ + bin - 1) / bin;
    const int blocks = static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(threads_), bins));
    shared_flag bad;
    for_each_block(blocks, bins, [&](int block, block_range r) {
      const std::size_t stop = std::min(n_, r.last * bin);
      std::uint32_t* const first = out.data() + r.first * bin;
      std::uint32_t* w = first;
      bool block_bad = false;
      auto run = [&]<bool same>() {
        for (std::size_t b = r.first * bin; b < stop; b += bin) {
          w = select_bin<same>(in.acc.data() + b, in.grad.data() + b, std::min(b + bin, n_) - b, b, w,
                               out.data() + stop, block_bad);
        }
      };
      if (in.acc.data() == in.grad.data()) {
        run.template operator()<true>();
      } else {
        run.template operator()<false>();
      }
      block_counts_[static_cast<std::size_t>(block)] = static_cast<std::size_t>(w - first);
      if (block_bad) bad.raise();
    });
    std::size_t count = block_counts_[0];
    for (int block = 1; block < blocks; ++block) {
      const auto moved = block_counts_[static_cast<std::size_t>(block)];
      std::memmove(out.data() + count, out.data() + block_range(block, blocks, bins).first * bin,
                   moved * sizeof(std::uint32_t));
      count += moved;
    }
    return {count, 1.0f, !bad.raised()};
  }

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
  std::vector<std::size_t> block_counts_;  // hits of each thread's run (select_in_place)
  std::size_t bin_ = 1;
  bool observed_ = false;
  shared_flag observe_bad_;
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
