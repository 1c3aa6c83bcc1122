/// \file detail/host/exact_topk.hpp
/// exact_topk on backend::host: a radix select in the style of AIR top-k.
///
/// 1. (fused into the corrector's pass, see observe) histogram of the top 11 key bits;
///    the bin holding the k-th largest key is b.
/// 2. One pass over acc: entries in bins above b are certainly sent and go to the output
///    directly; entries in bin b are candidates. Each chunk writes both lists into its
///    own slice of a scratch array, so threads never coordinate.
/// 3. The candidates (typically well under 1% of n) are ranked on the remaining 20 bits.
/// 4. The certain entries and the chosen candidates, both ascending, are merged.
/// So the gradient is read twice, once from cache, whatever k is.
#pragma once

#include <gradcomp/backend/host.hpp>
#include <gradcomp/concepts.hpp>
#include <gradcomp/detail/radix_select.hpp>
#include <gradcomp/detail/step_input.hpp>
#include <gradcomp/select/exact_topk.hpp>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <span>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

/// Ranks entries of `acc` by magnitude and writes the ascending indices of the k
/// largest. Reusable by selectors that end with an exact top-k over the whole tensor.
class host_topk {
 public:
  host_topk(const backend::host& be, std::size_t n)
      : threads_(be.concurrency()),
        n_(n),
        bins_(static_cast<std::size_t>(threads_) * top_digit_bins),
        scratch_(n),
        chunk_counts_(2 * chunk_count(n)) {}

  /// Starts a new first pass; observe() may then be called for every chunk.
  void begin_observe() {
    std::fill(bins_.begin(), bins_.end(), 0u);
    observed_ = true;
  }

  /// First pass over one chunk of acc (starting at element `begin`), from thread `thread`.
  void observe(int thread, std::size_t /*begin*/, std::span<const float> acc_chunk) noexcept {
    std::uint32_t* bins = bins_.data() + static_cast<std::size_t>(thread) * top_digit_bins;
    for (const float x : acc_chunk) ++bins[magnitude_key(x) >> magnitude_digits[0].shift];
  }

  /// Writes the ascending indices of the k entries of largest |acc| to out[0, k).
  void select(std::span<const float> acc, std::size_t k, std::span<std::uint32_t> out) {
    if (k == n_) {
      std::iota(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(n_), 0u);
      observed_ = false;
      return;
    }
    if (!observed_) {
      begin_observe();
      for_each_chunk(threads_, n_, [&](int thread, std::size_t, std::size_t begin, std::size_t end) {
        observe(thread, begin, acc.subspan(begin, end - begin));
      });
    }
    observed_ = false;
    for (int t = 1; t < threads_; ++t) {
      const std::uint32_t* bins = bins_.data() + static_cast<std::size_t>(t) * top_digit_bins;
      for (std::size_t b = 0; b < top_digit_bins; ++b) bins_[b] += bins[b];
    }
    const auto [bin, r] = find_bin_from_top(std::span(bins_).first(top_digit_bins), k);
    const std::size_t above = k - r;
    const std::size_t candidates = split_by_bin(acc, bin);
    gather(out.data(), above, candidates);

    std::span<std::uint32_t> list(scratch_.data(), candidates);
    std::size_t chosen = candidates;
    if (r < candidates) {
      const kth_key kth = kth_largest_in_list(acc, list, r, 1, bin << magnitude_digits[0].shift);
      chosen = keep_top_in_list(acc, list, kth);
    }
    merge_backwards(out.data(), above, list.data(), chosen);
  }

 private:
  // Pass 2: per chunk, indices in bins above `bin` go to the front of the chunk's slice
  // of scratch_, candidates (bin == `bin`) to its back. Returns the number of candidates.
  std::size_t split_by_bin(std::span<const float> acc, std::uint32_t bin) {
    const std::uint32_t low_key = bin << magnitude_digits[0].shift;  // first key of `bin`
    for_each_chunk(threads_, n_, [&](int, std::size_t c, std::size_t begin, std::size_t end) {
      std::uint32_t* front = scratch_.data() + begin;
      std::uint32_t* back = scratch_.data() + end;
      const auto* bits = reinterpret_cast<const std::int32_t*>(acc.data());
      std::size_t i = begin;
      // Most entries lie below `bin`: test eight at a time with a branch-free reduction
      // the compiler vectorises, and classify only the rare groups that hit.
      for (; i + 8 <= end; i += 8) {
        int hit = 0;
        for (std::size_t j = 0; j < 8; ++j) hit |= (bits[i + j] & 0x7FFFFFFF) >= static_cast<std::int32_t>(low_key);
        if (!hit) continue;
        for (std::size_t j = i; j < i + 8; ++j) classify(acc[j], j, bin, front, back);
      }
      for (; i < end; ++i) classify(acc[i], i, bin, front, back);
      chunk_counts_[2 * c] = static_cast<std::uint32_t>(front - (scratch_.data() + begin));
      chunk_counts_[2 * c + 1] = static_cast<std::uint32_t>((scratch_.data() + end) - back);
    });
    std::size_t candidates = 0;
    for (std::size_t c = 0; c < chunk_count(n_); ++c) candidates += chunk_counts_[2 * c + 1];
    return candidates;
  }

  static void classify(float x, std::size_t i, std::uint32_t bin, std::uint32_t*& front, std::uint32_t*& back) {
    const std::uint32_t b = magnitude_key(x) >> magnitude_digits[0].shift;
    if (b > bin) *front++ = static_cast<std::uint32_t>(i);
    if (b == bin) *--back = static_cast<std::uint32_t>(i);
  }

  // Concatenates the per-chunk lists: certain entries to out[0, above), candidates
  // (stored reversed at each slice's back) to scratch_[0, candidates). Each destination
  // lies at or before its source slice, so copying left in chunk order is safe.
  void gather(std::uint32_t* out, [[maybe_unused]] std::size_t above, [[maybe_unused]] std::size_t candidates) {
    std::size_t certain = 0;
    std::size_t cand = 0;
    for (std::size_t c = 0; c < chunk_count(n_); ++c) {
      const std::size_t begin = c * host_chunk;
      const std::size_t end = std::min(n_, begin + host_chunk);
      const std::uint32_t a = chunk_counts_[2 * c];
      const std::uint32_t b = chunk_counts_[2 * c + 1];
      std::memcpy(out + certain, scratch_.data() + begin, a * sizeof(std::uint32_t));
      certain += a;
      std::reverse(scratch_.data() + end - b, scratch_.data() + end);
      std::memmove(scratch_.data() + cand, scratch_.data() + end - b, b * sizeof(std::uint32_t));
      cand += b;
    }
  }

  // Merges ascending a[0, na) (already in out) with ascending b[0, nb) into out[0, na + nb),
  // from the back so no extra buffer is needed.
  static void merge_backwards(std::uint32_t* out, std::size_t na, const std::uint32_t* b, std::size_t nb) {
    std::size_t w = na + nb;
    while (nb > 0) {
      if (na > 0 && out[na - 1] > b[nb - 1]) {
        out[--w] = out[--na];
      } else {
        out[--w] = b[--nb];
      }
    }
  }

  int threads_;
  std::size_t n_;
  std::vector<std::uint32_t> bins_;          // per thread, top-digit histogram
  std::vector<std::uint32_t> scratch_;       // n: per-chunk lists, then candidates
  std::vector<std::uint32_t> chunk_counts_;  // per chunk: certain, candidates
  bool observed_ = false;
};

template <>
class engine<select::exact_topk, backend::host> {
 public:
  engine(const backend::host& be, const select::exact_topk&, std::size_t n) : topk_(be, n) {}

  void begin_observe(const select::exact_topk&, std::uint64_t /*step*/) { topk_.begin_observe(); }
  void observe(int thread, std::size_t begin, std::span<const float> acc_chunk, std::span<const float>) noexcept {
    topk_.observe(thread, begin, acc_chunk);
  }
  selection select(const select::exact_topk& policy, const select_input& in, std::span<std::uint32_t> out) {
    const std::size_t k = policy.k(in.acc.size());
    topk_.select(in.acc, k, out);
    return {k};
  }
  void accept() noexcept {}

 private:
  host_topk topk_;
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
