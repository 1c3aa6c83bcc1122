/// \file detail/host/select_exact_topk.hpp
/// exact_topk on backend::host: one pass over acc in the common case.
///
/// 1. A strided sample (every 512th entry; gathered during the corrector's pass when
///    there is one) brackets the k-th largest key between two sample order statistics
///    lo and hi, with a margin of several standard deviations.
/// 2. One pass: entries with key > hi are certainly sent, entries in [lo, hi] are
///    candidates; groups of 16 below lo are skipped with one SIMD compare. Each tile
///    writes both lists into its own slice of a scratch array.
/// 3. If the bracket holds the k-th key (certain < k <= certain + candidates), the
///    candidates are ranked by radix select on their keys and merged with the certain
///    entries. Otherwise (rare: a bad sample, heavy ties) a radix histogram of the top
///    11 key bits gives an exact bracket and step 2 runs once more.
/// The result is exact and identical either way; only the work differs.
///
/// Inside a compressor with a stateful corrector, the bracket of the previous step's
/// k-th key (x0.9 .. x1.1) is tried first, and step 2 runs on each tile as the
/// corrector finishes it (observe), from cache: when the bracket still holds, which is
/// the common case for slowly changing residuals, acc is never read again.
#pragma once

#include <gradcomp/detail/host/backend.hpp>
#include <gradcomp/concepts.hpp>
#include <gradcomp/detail/core/simd.hpp>
#include <gradcomp/detail/core/radix_select.hpp>
#include <gradcomp/detail/core/step_input.hpp>
#include <gradcomp/select/exact_topk.hpp>
#include <gradcomp/held_memory.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <numeric>
#include <span>
#include <tuple>
#include <utility>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

/// Ranks entries of `acc` by magnitude and writes the ascending indices of the k
/// largest. Shared by the selectors that end in an exact top-k over the whole tensor.
class host_topk {
 public:
  static constexpr std::size_t sample_stride = topk_sample_stride;
  static constexpr std::size_t min_sampled_n = topk_min_sampled_n;

  host_topk(const backend::host& be, std::size_t n)
      : threads_(be.concurrency()), max_threads_(threads_), n_(n), tile_counts_(2 * tile_count(n)) {
    hold_workspace();
  }

  /// Gives back the lists of the size of n and the per-thread histograms (between
  /// steps); the next step allocates them again. The hint stays.
  void release_workspace() noexcept {
    scratch_ = std::vector<std::uint32_t>{};
    sample_ = std::vector<float>{};
    keys_ = std::vector<std::uint32_t>{};
    bins_ = std::vector<std::uint32_t>{};
  }

  /// The threads of the call's context (at most the constructor's: bins_ holds theirs).
  void use_threads(int threads) noexcept { threads_ = threads; }

  /// Starts a pass in which observe() sees every tile of acc.
  void begin_observe() {
    hold_workspace();
    observed_ = true;
    hinted_ = hint_key_ != 0;
    if (hinted_) {
      const float t = std::bit_cast<float>(hint_key_);
      hint_lo_ = magnitude_key(t * 0.9f);
      hint_hi_ = magnitude_key(t * 1.1f);
    }
  }

  /// Gathers the sample entries of one tile of acc (starting at element `begin`) and,
  /// with a hint, splits the tile around it.
  void observe(int /*thread*/, std::size_t begin, std::span<const float> acc_tile) noexcept {
    const std::size_t end = std::min(begin + acc_tile.size(), sample_.size() * sample_stride);
    for (std::size_t i = (begin + sample_stride - 1) / sample_stride * sample_stride; i < end; i += sample_stride) {
      sample_[i / sample_stride] = acc_tile[i - begin];
    }
    if (hinted_) (void)split_tile(begin / host_tile, begin, acc_tile, hint_lo_, hint_hi_);
  }

  /// Writes the ascending indices of the k entries of largest |acc| to out[0, k).
  /// Returns false, leaving `out` unspecified, if acc holds a NaN or infinity.
  bool select(std::span<const float> acc, std::size_t k, std::span<std::uint32_t> out) {
    hold_workspace();
    const bool observed = std::exchange(observed_, false);
    const bool hinted = observed && std::exchange(hinted_, false);
    if (k == n_) {
      std::iota(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(n_), 0u);
      return all_finite_keys(acc);
    }
    if (hinted) {  // observe() split every tile around last step's k-th key
      const auto [certain, candidates] = totals();
      if (certain < k && k <= certain + candidates) {
        finish(acc, k, certain, candidates, 0, 0, out);
        return true;
      }
    }
    if (!sample_.empty()) {
      if (!observed) {
        for (std::size_t j = 0; j < sample_.size(); ++j) sample_[j] = acc[j * sample_stride];
      }
      const auto [lo, hi] = sample_bracket(sample_, n_, k);
      bool bad = false;
      const auto [certain, candidates] = split(acc, lo, hi, bad);
      if (bad) return false;
      if (certain < k && k <= certain + candidates) {
        finish(acc, k, certain, candidates, 0, 0, out);
        return true;
      }
    }
    // Exact bracket from a histogram of the top 11 key bits.
    std::fill(bins_.begin(), bins_.end(), 0u);
    for_each_tile(threads_, n_, [&](int thread, std::size_t, std::size_t begin, std::size_t end) {
      std::uint32_t* bins = bins_.data() + static_cast<std::size_t>(thread) * top_digit_bins;
      for (std::size_t i = begin; i < end; ++i) ++bins[magnitude_key(acc[i]) >> magnitude_digits[0].shift];
    });
    for (int t = 1; t < threads_; ++t) {
      const std::uint32_t* bins = bins_.data() + static_cast<std::size_t>(t) * top_digit_bins;
      for (std::size_t b = 0; b < top_digit_bins; ++b) bins_[b] += bins[b];
    }
    for (std::size_t b = non_finite_key >> magnitude_digits[0].shift; b < top_digit_bins; ++b) {
      if (bins_[b] != 0) return false;
    }
    const std::uint32_t bin = find_bin_from_top(std::span(bins_).first(top_digit_bins), k).first;
    const std::uint32_t lo = bin << magnitude_digits[0].shift;
    bool bad = false;
    const auto [certain, candidates] = split(acc, lo, lo | ((1u << magnitude_digits[0].shift) - 1u), bad);
    finish(acc, k, certain, candidates, 1, lo, out);
    return true;
  }

  [[nodiscard]] std::size_t held_bytes() const noexcept {
    return bytes_held(bins_, scratch_, tile_counts_, sample_, keys_);
  }

 private:
  // The lists of the size of n, allocated by the constructor and again after
  // release_workspace().
  void hold_workspace() {
    if (scratch_.size() == n_) return;
    bins_.resize(static_cast<std::size_t>(max_threads_) * top_digit_bins);
    scratch_.resize(n_);
    sample_.resize(n_ >= min_sampled_n ? n_ / sample_stride : 0);
    keys_.resize(n_ / 8 + 4096);
  }

  // For tile c (values x, starting at tensor index begin): indices with key > hi to
  // the front of the tile's slice of scratch_, indices with lo <= key <= hi to its
  // back (reversed). Returns whether a NaN or infinity was met.
  bool split_tile(std::size_t c, std::size_t begin, std::span<const float> x, std::uint32_t lo,
                  std::uint32_t hi) noexcept {
    std::uint32_t* const slice = scratch_.data() + begin;
    std::uint32_t* front = slice;
    std::uint32_t* back = slice + x.size();
    bool bad = false;
    auto classify = [&](std::size_t j) {
      const std::uint32_t key = magnitude_key(x[j]);
      bad |= key >= non_finite_key;
      if (key > hi) *front++ = static_cast<std::uint32_t>(begin + j);
      if (key >= lo && key <= hi) *--back = static_cast<std::uint32_t>(begin + j);
    };
    std::size_t j = 0;
    for (; j + mask_group <= x.size(); j += mask_group) {
      for (std::uint32_t mask = at_least_mask16(x.data() + j, lo); mask != 0; mask &= mask - 1) {
        classify(j + static_cast<std::size_t>(std::countr_zero(mask)));
      }
    }
    for (; j < x.size(); ++j) classify(j);
    tile_counts_[2 * c] = static_cast<std::uint32_t>(front - slice);
    tile_counts_[2 * c + 1] = static_cast<std::uint32_t>(slice + x.size() - back);
    return bad;
  }

  // split_tile over every tile. Returns the totals of certain entries and candidates.
  std::pair<std::size_t, std::size_t> split(std::span<const float> acc, std::uint32_t lo, std::uint32_t hi, bool& bad) {
    shared_flag any_bad;
    for_each_tile(threads_, n_, [&](int, std::size_t c, std::size_t begin, std::size_t end) {
      if (split_tile(c, begin, acc.subspan(begin, end - begin), lo, hi)) any_bad.raise();
    });
    bad = any_bad.raised();
    return totals();
  }

  std::pair<std::size_t, std::size_t> totals() const noexcept {
    std::size_t certain = 0;
    std::size_t candidates = 0;
    for (std::size_t c = 0; c < tile_count(n_); ++c) {
      certain += tile_counts_[2 * c];
      candidates += tile_counts_[2 * c + 1];
    }
    return {certain, candidates};
  }

  // Certain entries to out, candidates ranked (digits from `first_digit` on, below
  // `prefix`), the k - certain best kept, and the two ascending lists merged.
  void finish(std::span<const float> acc, std::size_t k, std::size_t certain, std::size_t candidates,
              std::size_t first_digit, std::uint32_t prefix, std::span<std::uint32_t> out) {
    gather(out.data());
    const std::span<std::uint32_t> list(scratch_.data(), candidates);
    std::size_t chosen = candidates;
    const std::size_t r = k - certain;
    if (r < candidates && candidates <= keys_.size()) {
      // Gather the candidates' keys once: the radix passes then read a dense array
      // instead of gathering from acc (in DRAM) on every pass.
      for (std::size_t j = 0; j < candidates; ++j) keys_[j] = magnitude_key(acc[list[j]]);
      std::tie(chosen, hint_key_) =
          keep_top_keys(list, std::span<const std::uint32_t>(keys_).first(candidates), r, first_digit, prefix);
    } else if (r < candidates) {
      const kth_key kth = kth_largest_in_list(acc, list, r, first_digit, prefix);
      chosen = keep_top_in_list(acc, list, kth);
      hint_key_ = kth.key;
    } else {
      hint_key_ = ~0u;
      for (const std::uint32_t i : list) hint_key_ = std::min(hint_key_, magnitude_key(acc[i]));
    }
    merge_backwards(out.data(), certain, list.data(), chosen);
  }

  // Concatenates the per-tile lists: certain entries to out, candidates (stored
  // reversed at each slice's back) to the front of scratch_. Each destination lies at
  // or before its source slice, so moving left in tile order is safe.
  void gather(std::uint32_t* out) {
    std::size_t certain = 0;
    std::size_t cand = 0;
    for (std::size_t c = 0; c < tile_count(n_); ++c) {
      const std::size_t begin = c * host_tile;
      const std::size_t end = std::min(n_, begin + host_tile);
      const std::uint32_t a = tile_counts_[2 * c];
      const std::uint32_t b = tile_counts_[2 * c + 1];
      std::memcpy(out + certain, scratch_.data() + begin, a * sizeof(std::uint32_t));
      certain += a;
      std::reverse(scratch_.data() + end - b, scratch_.data() + end);
      std::memmove(scratch_.data() + cand, scratch_.data() + end - b, b * sizeof(std::uint32_t));
      cand += b;
    }
  }

  bool all_finite_keys(std::span<const float> acc) const {
    shared_flag bad;
    for_each_tile(threads_, n_, [&](int, std::size_t, std::size_t begin, std::size_t end) {
      std::size_t i = begin;
      bool tile_bad = false;
      for (; i + mask_group <= end; i += mask_group) tile_bad |= at_least_mask16(acc.data() + i, non_finite_key) != 0;
      for (; i < end; ++i) tile_bad |= magnitude_key(acc[i]) >= non_finite_key;
      if (tile_bad) bad.raise();
    });
    return !bad.raised();
  }

  int threads_;
  int max_threads_;  // the constructor's: what bins_ is sized for
  std::size_t n_;
  std::vector<std::uint32_t> bins_;         // per thread, top-digit histogram (fallback)
  std::vector<std::uint32_t> scratch_;      // n: per-tile lists, then candidates
  std::vector<std::uint32_t> tile_counts_;  // per tile: certain, candidates
  std::vector<float> sample_;               // acc[j * sample_stride]
  std::vector<std::uint32_t> keys_;         // candidates' keys, when they fit
  bool observed_ = false;
  // The last k-th key: a guess of where this step's lies. Changes work, never results.
  std::uint32_t hint_key_ = 0;
  bool hinted_ = false;
  std::uint32_t hint_lo_ = 0;
  std::uint32_t hint_hi_ = 0;
};

template <>
struct has_fast_path<select::exact_topk, backend::host> : std::true_type {};

template <>
class fast_engine<select::exact_topk, backend::host> {
 public:
  static constexpr bool checks_finite = true;  // select() reads every entry

  fast_engine(const backend::host& be, const select::exact_topk&, std::size_t n) : topk_(be, n) {}

  void reserve(const select::exact_topk&) noexcept {}  // the workspace is sized by n, not k
  void begin_observe(const backend::host&, const select::exact_topk&, std::uint64_t /*step*/) { topk_.begin_observe(); }
  void observe(int thread, std::size_t begin, std::span<const float> acc_tile, std::span<const float>) noexcept {
    topk_.observe(thread, begin, acc_tile);
  }
  /// Selects at once (the pass, or what observe() collected in the corrector's): the
  /// indices into out, their count and NaN verdict into the status (host memory).
  queued_selection select(const backend::host& be, const select::exact_topk& policy, const select_input& in,
                          std::span<std::uint32_t> out, step_status* status) {
    topk_.use_threads(be.concurrency());
    return record_selection(select_now(policy, in, out), status);
  }
  void accept() noexcept {}
  void add_held(held_memory& use) const { use.workspace += topk_.held_bytes(); }
  /// Gives back the selection's lists; the last step's k-th key stays, as the next
  /// step's first guess.
  void release_workspace() noexcept { topk_.release_workspace(); }

 private:
  selection select_now(const select::exact_topk& policy, const select_input& in, std::span<std::uint32_t> out) {
    const std::size_t k = policy.k(in.acc.size());
    const bool finite = topk_.select(in.acc, k, out);
    return {k, 1.0f, finite};
  }

  host_topk topk_;
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
