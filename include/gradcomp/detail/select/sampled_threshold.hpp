/// \file detail/select/sampled_threshold.hpp
/// select::sampled_threshold's algorithm (DGC's hierarchical selection, docs/algorithms.md)
/// over the backend primitives, every step of it queued: nothing is read back during a
/// step, so on backend::cuda a step of the dgc preset reads only the step's status.
///
/// The search lives in the backend's memory (`threshold_search`) and every queued item
/// reads it and writes nothing once it says the item's phase is over:
/// 1. with reuse_threshold, a compaction at the carried threshold, kept if its count is
///    within [lower k, upper k];
/// 2. else the strided sample's ceil(m density)-th largest key t0, by a radix select of
///    three histogram levels, and a compaction at t0;
/// 3. where |C| < lower k, the refinement loop's thresholds t_i = t_{i-1} * lower are
///    all known from t0, so one histogram over acc counts the entries between each
///    two of them and one item replays the loop on those counts, followed by one
///    compaction at the threshold it settles on (the loop's reads are gone, and so is
///    one pass over acc per refinement);
/// 4. where C must be cut to k, a radix select of the k-th largest candidate key, a
///    second one of the highest index among the ties kept (ties go to the lower index),
///    and one compaction of the kept candidates into `out`.
/// Where the sample would be all of acc, the backend's exact_topk engine selects and a
/// reduction finds its smallest key. The carried threshold is double-buffered in the
/// backend's memory; accept() flips which copy is committed.
///
/// On backends whose memory the host may read (backend::host, Kokkos on host memory),
/// reading the search costs nothing, so phases that the search says are over are not
/// queued and passes run over the count rather than the capacity; the results are the
/// same, since every item is guarded (tests/test_conformance.cpp runs the algorithm on a
/// host backend that declares its memory unreadable too). backend::host's own engine
/// (detail/host/select_sampled_threshold.hpp) samples ahead of and collects in the corrector's
/// pass, a fast path the tests prove equal to this. Not API.
#pragma once

#include <gradcomp/concepts.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/detail/core/bits.hpp>
#include <gradcomp/detail/core/fixed_order_sum.hpp>
#include <gradcomp/detail/core/radix_select.hpp>
#include <gradcomp/detail/select/sampled_threshold_steps.hpp>
#include <gradcomp/detail/core/selector_work.hpp>
#include <gradcomp/detail/core/step_input.hpp>
#include <gradcomp/select/exact_topk.hpp>
#include <gradcomp/select/sampled_threshold.hpp>
#include <gradcomp/held_memory.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

/// The state of one step's search, in the backend's memory.
struct threshold_search {
  std::uint32_t key;         ///< the threshold tried now; the final one at the end
  std::uint32_t count;       ///< |C| = |{i : key_i >= key}|
  std::uint32_t searching;   ///< 1 until the threshold is settled by a count in bounds
  std::uint32_t refining;    ///< 1 when the refinement's counts settle the threshold
  std::uint32_t cutting;     ///< 1 when C is cut to its top k
  std::uint32_t stopped;     ///< 1 when the sample met a NaN or infinity (count 0)
  std::uint32_t prefix;      ///< radix select: the digits found so far,
  std::uint32_t known;       ///< their mask,
  std::uint32_t rank;        ///< and the rank sought among the keys that share them
  std::uint32_t kth;         ///< the k-th largest candidate key (cutting)
  std::uint32_t last_tie;    ///< the highest index among the ties kept (cutting)
  std::uint32_t carried[2];  ///< the carried threshold: committed and proposed copies
  std::uint32_t finished;    ///< a histogram's blocks done, for the one-item pass after it (histogram_then)
};

/// Where the histograms of the search `s` count their blocks done (histogram_then's
/// finished_blocks()), computed without reading the backend's memory.
inline std::uint32_t* finished_blocks_of(threshold_search* s) noexcept {
  return reinterpret_cast<std::uint32_t*>(reinterpret_cast<char*>(s) + offsetof(threshold_search, finished));
}

namespace sampled {

/// Which items of a radix select take part, and while which phase.
struct while_searching {  // the sample's items, until the threshold is settled
  GRADCOMP_HOST_DEVICE static bool on(const threshold_search& s) { return s.searching != 0; }
  GRADCOMP_HOST_DEVICE static std::size_t live(const threshold_search& s) { return on(s) ? ~std::size_t{0} : 0; }
  GRADCOMP_HOST_DEVICE bool operator()(const threshold_search& s, std::size_t) const { return on(s); }
};
struct among_candidates {  // the candidates, while cutting
  GRADCOMP_HOST_DEVICE static bool on(const threshold_search& s) { return s.cutting != 0; }
  GRADCOMP_HOST_DEVICE static std::size_t live(const threshold_search& s) { return on(s) ? s.count : 0; }
  GRADCOMP_HOST_DEVICE bool operator()(const threshold_search& s, std::size_t j) const { return on(s) && j < s.count; }
};
struct among_ties {  // the candidates whose key is the k-th largest, while cutting
  const std::uint32_t* keys;
  GRADCOMP_HOST_DEVICE static bool on(const threshold_search& s) { return s.cutting != 0; }
  GRADCOMP_HOST_DEVICE static std::size_t live(const threshold_search& s) { return on(s) ? s.count : 0; }
  GRADCOMP_HOST_DEVICE bool operator()(const threshold_search& s, std::size_t j) const {
    return on(s) && j < s.count && keys[j] == s.kth;
  }
};

/// The strided sample (gather_strided), while the threshold is being searched for: a
/// reused threshold whose count was in bounds reads no sample.
struct sample_while_searching {
  gather_strided gather;
  const threshold_search* s;
  GRADCOMP_HOST_DEVICE std::size_t live_items() const { return while_searching::live(*s); }
  GRADCOMP_HOST_DEVICE void operator()(std::size_t j) const {
    if (while_searching::on(*s)) gather(j);
  }
};

/// The keys a radix select ranks.
struct sample_key {  // a sampled magnitude
  const float* sample;
  GRADCOMP_HOST_DEVICE std::uint32_t operator()(std::size_t j) const { return magnitude_key(sample[j]); }
};
struct listed_key {  // a candidate's magnitude, gathered
  const std::uint32_t* keys;
  GRADCOMP_HOST_DEVICE std::uint32_t operator()(std::size_t j) const { return keys[j]; }
};
struct lower_index_first {  // a candidate's index, complemented: the largest is the lowest index
  const std::uint32_t* list;
  GRADCOMP_HOST_DEVICE std::uint32_t operator()(std::size_t j) const { return ~list[j]; }
};

/// The digits of a 32-bit key, most significant first (magnitude keys have 31 bits:
/// radix_select.hpp's magnitude_digits).
inline constexpr std::array<radix_digit, 3> index_digits{{{21, 11}, {10, 11}, {0, 10}}};

/// Starts a radix select for the rank-th largest key (rank 0: the rank the search holds),
/// while `Taking` says the select takes part.
template <class Taking>
struct start_select {
  threshold_search* s;
  std::uint32_t rank;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t) const {
    if (!Taking::on(*s)) return;
    s->prefix = 0;
    s->known = 0;
    if (rank != 0) s->rank = rank;
  }
};

/// A radix select level's bin: the digit of item j's key where it shares the digits
/// found so far and takes part, else none.
template <class Key, class Taking>
struct digit_bin {
  Key key;
  Taking taking;
  const threshold_search* s;
  radix_digit digit;
  GRADCOMP_HOST_DEVICE std::size_t bins() const { return std::size_t{1} << digit.bits; }
  GRADCOMP_HOST_DEVICE std::size_t live_items() const { return Taking::live(*s); }
  GRADCOMP_HOST_DEVICE std::size_t operator()(std::size_t j) const {
    if (!taking(*s, j)) return no_bin;
    const std::uint32_t k = key(j);
    if ((k & s->known) != s->prefix) return no_bin;
    return (k >> digit.shift) & ((1u << digit.bits) - 1u);
  }
};

/// One work item: the bin that holds the rank-th largest key (find_bin_from_top),
/// appended to the digits found.
template <class Taking>
struct pick_digit {
  const std::uint32_t* bins;
  threshold_search* s;
  radix_digit digit;
  std::uint32_t* finished_blocks() const noexcept { return finished_blocks_of(s); }
  GRADCOMP_HOST_DEVICE void operator()(std::size_t) const {
    if (!Taking::on(*s)) return;
    const std::uint32_t mask = (1u << digit.bits) - 1u;
    const auto [b, rank] = find_bin_from_top(std::span<const std::uint32_t>(bins, std::size_t{mask} + 1), s->rank);
    s->prefix |= b << digit.shift;
    s->known |= mask << digit.shift;
    s->rank = static_cast<std::uint32_t>(rank);
  }
};

/// Steps of the search that follow one another, as one item: `first`, then `next` (a
/// launch fewer on a device for each step folded in). Where `first` is a histogram's
/// one-item pass (a digit's pick), so is the whole, run by its last block.
template <class First, class Next>
struct in_order {
  First first;
  Next next;
  std::uint32_t* finished_blocks() const noexcept
    requires requires(const First& f) { f.finished_blocks(); }
  {
    return first.finished_blocks();
  }
  GRADCOMP_HOST_DEVICE void operator()(std::size_t i) const {
    first(i);
    next(i);
  }
};
template <class First, class Next>
in_order(First, Next) -> in_order<First, Next>;

/// Every step starts here: searching from the carried threshold (reused) or from none,
/// the sample's radix select begun (start_select's work: nothing between here and the
/// select touches its digits).
struct begin_search {
  threshold_search* s;
  std::uint32_t slot;  // the committed copy of the carried threshold
  bool reused;
  std::uint32_t sample_rank;  // the rank the sample's select seeks
  GRADCOMP_HOST_DEVICE void operator()(std::size_t) const {
    s->prefix = 0;
    s->known = 0;
    s->rank = sample_rank;
    s->key = reused ? s->carried[slot] : 0;
    s->count = 0;
    s->searching = 1;
    s->refining = 0;
    s->cutting = 0;
    s->stopped = 0;
    s->finished = 0;  // zero already (each pass leaves it so): a step also repairs it
  }
};

/// Whether |acc_i| >= the search's threshold, while `Phase` says the search is at it.
template <class Phase>
struct at_search_key {
  const float* acc;
  const threshold_search* s;
  GRADCOMP_HOST_DEVICE bool operator()(std::size_t i) const { return Phase::on(*s) && magnitude_key(acc[i]) >= s->key; }
};
struct refining_phase {
  GRADCOMP_HOST_DEVICE static bool on(const threshold_search& s) { return s.refining != 0; }
};

/// The reused threshold's count: settled if within bounds.
struct take_reused_count {
  threshold_search* s;
  const std::uint32_t* found;
  select::sampled_threshold policy;
  std::size_t k;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t) const {
    s->count = *found;
    if (within_bounds(policy, k, s->count)) s->searching = 0;
  }
};

/// The sample's threshold: stops the search at a NaN or infinity.
struct settle_sample {
  threshold_search* s;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t) const {
    if (!s->searching) return;
    s->key = s->prefix;
    if (s->key >= non_finite_key) {
      s->stopped = 1;
      s->searching = 0;
      s->count = 0;
    }
  }
};

/// The count at the sample's threshold: settled if at least low (a count above
/// upper k is too, and cut later), else refined.
struct take_sample_count {
  threshold_search* s;
  const std::uint32_t* found;
  double low;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t) const {
    if (!s->searching) return;
    s->count = *found;
    s->searching = 0;
    s->refining = static_cast<double>(s->count) >= low ? 0 : 1;
  }
};

/// The refinement's thresholds t_0 = key, t_i = t_{i-1} * lower (non-increasing).
struct refinement_thresholds {
  const threshold_search* s;
  select::sampled_threshold policy;
  std::uint32_t* steps;
  std::size_t count;  // max_iters + 1
  GRADCOMP_HOST_DEVICE void operator()(std::size_t) const {
    if (!s->refining) return;
    steps[0] = s->key;
    for (std::size_t i = 1; i < count; ++i) steps[i] = lowered_threshold(policy, steps[i - 1]);
  }
};

/// The refinement bin of acc_i: the first i >= 1 with key >= t_i, for keys below t_0
/// (those at or above are counted already); none below the last threshold.
struct refinement_bin {
  const float* acc;
  const threshold_search* s;
  const std::uint32_t* steps;
  std::size_t count;
  GRADCOMP_HOST_DEVICE std::size_t bins() const { return count; }
  GRADCOMP_HOST_DEVICE std::size_t live_items() const { return s->refining ? ~std::size_t{0} : 0; }
  GRADCOMP_HOST_DEVICE std::size_t operator()(std::size_t i) const {
    if (!s->refining) return no_bin;
    const std::uint32_t k = magnitude_key(acc[i]);
    if (k >= steps[0] || k < steps[count - 1]) return no_bin;
    std::size_t lo = 1;  // steps[lo] <= k for the answer; steps[hi] <= k
    std::size_t hi = count - 1;
    while (lo < hi) {
      const std::size_t mid = lo + (hi - lo) / 2;
      if (steps[mid] <= k) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    return lo;
  }
};

/// Replays the refinement loop (sampled_threshold_steps.hpp's refine_threshold) on the
/// counts: lower the threshold while |C| < low, at most max_iters times.
struct settle_refinement {
  threshold_search* s;
  const std::uint32_t* steps;
  const std::uint32_t* between;  // entries in [t_i, t_{i-1})
  std::size_t max_iters;
  double low;
  std::uint32_t* finished_blocks() const noexcept { return finished_blocks_of(s); }
  GRADCOMP_HOST_DEVICE void operator()(std::size_t) const {
    if (!s->refining) return;
    std::size_t i = 0;
    std::uint32_t count = s->count;
    while (i < max_iters && static_cast<double>(count) < low) count += between[++i];
    s->key = steps[i];
    s->count = count;
  }
};

/// The count of the compaction at the refined threshold (the same count, now with C).
struct take_refined_count {
  threshold_search* s;
  const std::uint32_t* found;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t) const {
    if (s->refining) s->count = *found;
  }
};

/// Whether C is cut to its top k.
struct decide_cut {
  threshold_search* s;
  select::sampled_threshold policy;
  std::size_t k;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t) const {
    s->cutting = !s->stopped && needs_top_k(policy, k, s->count) ? 1 : 0;
  }
};

/// The magnitude key of candidate j, gathered from acc and kept in keys[j] for the
/// passes after (the cut's first digit: its histogram reads each candidate once).
struct gathered_key {
  const float* acc;
  const std::uint32_t* list;
  std::uint32_t* keys;
  GRADCOMP_HOST_DEVICE std::uint32_t operator()(std::size_t j) const {
    const std::uint32_t key = magnitude_key(acc[list[j]]);
    keys[j] = key;
    return key;
  }
};

/// The k-th largest candidate key, once found; the ties' select then looks for the
/// highest index among the ties kept (the rank left is the ties kept).
struct take_kth {
  threshold_search* s;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t) const {
    if (s->cutting) s->kth = s->prefix;
  }
};
struct take_last_tie {
  threshold_search* s;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t) const {
    if (s->cutting) s->last_tie = ~s->prefix;
  }
};

/// Whether candidate j is among the top k (keep_top_keys' rule): the cut compacts the
/// candidates' positions by it.
struct kept_candidate {
  const std::uint32_t* list;
  const std::uint32_t* keys;
  const threshold_search* s;
  GRADCOMP_HOST_DEVICE bool operator()(std::size_t j) const {
    return among_candidates{}(*s, j) && (keys[j] > s->kth || (keys[j] == s->kth && list[j] <= s->last_tie));
  }
};

/// The selection's entry j: where C was cut, the index of the candidate at the kept
/// position out[j] (each item reads and writes its own entry); else candidate j.
struct place_selection {
  const std::uint32_t* list;
  std::uint32_t* out;
  const threshold_search* s;
  const std::uint32_t* kept;  // how many the cut kept
  GRADCOMP_HOST_DEVICE std::size_t live_items() const { return s->cutting ? *kept : s->count; }
  GRADCOMP_HOST_DEVICE void operator()(std::size_t j) const {
    if (s->cutting) {
      if (j < *kept) out[j] = list[out[j]];
    } else if (j < s->count) {
      out[j] = list[j];
    }
  }
};

/// The count and threshold after the cut.
struct take_cut_count {
  threshold_search* s;
  const std::uint32_t* found;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t) const {
    if (!s->cutting) return;
    s->count = *found;
    s->key = s->kth;
  }
};

/// The step's count into its status, and the threshold proposed for the next step.
struct finish_search {
  threshold_search* s;
  step_status* status;
  std::uint32_t next;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t) const {
    status->count = s->stopped ? 0 : s->count;
    s->carried[next] = s->key;
  }
};

/// The exact fallback: the complement of each selected key (its maximum is the
/// complement of the smallest), then that smallest key proposed.
struct complemented_key {
  const float* acc;
  const std::uint32_t* list;
  GRADCOMP_HOST_DEVICE std::uint32_t operator()(std::size_t j) const { return ~magnitude_key(acc[list[j]]); }
};
struct propose_smallest {
  threshold_search* s;
  const std::uint32_t* complement;
  std::uint32_t next;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t) const { s->carried[next] = ~*complement; }
};

}  // namespace sampled

/// select::sampled_threshold on any backend. A NaN or infinity is the corrector's to
/// flag; meeting one in the sample only ends the selection early (count 0).
template <class Backend>
class sampled_threshold_selection {
  // Compaction slots: at the reused threshold, at the sample's, at the refined one,
  // the cut's compaction, and the exact fallback's smallest key.
  enum slot : std::size_t { reused_slot, sample_slot, refined_slot, cut_slot, smallest_slot, slots };

 public:
  sampled_threshold_selection(const Backend& be, const select::sampled_threshold& policy, std::size_t n)
      : backend_(be),
        n_(n),
        topk_(be, select::exact_topk{.count = policy.k(n)}, n),
        candidates_(be.template allocate<std::uint32_t>(n)),
        keys_(be.template allocate<std::uint32_t>(n)),
        found_(be.template allocate<std::uint32_t>(slots)),
        bins_(be.template allocate<std::uint32_t>(top_digit_bins)),
        steps_(be.template allocate<std::uint32_t>(static_cast<std::size_t>(policy.max_iters) + 1)),
        between_(be.template allocate<std::uint32_t>(static_cast<std::size_t>(policy.max_iters) + 1)),
        search_(be.template allocate<threshold_search>(1)),
        workspace_(be.template allocate<std::byte>(workspace_size(be, n))) {
    reserve(policy);
  }

  /// Sizes the sample and the exact fallback for the policy's density (constructor and
  /// set_density only). Growing either early is harmless if the other throws.
  void reserve(const select::sampled_threshold& policy) {
    topk_.reserve(select::exact_topk{.count = policy.k(n_)});
    const std::size_t m = policy.sample_size(n_);
    if (m < n_ && m > static_cast<std::size_t>(sample_.size())) sample_ = backend_.template allocate<float>(m);
  }

  /// Queues the selection: ascending indices in out, their count in the status.
  queued_selection select(const Backend& be, const select::sampled_threshold& policy, const select_input& in,
                          std::span<std::uint32_t> out, step_status* status) {
    using namespace sampled;
    const std::size_t k = policy.k(n_);
    const sample_plan plan = sample_plan::make(policy, n_, in.step);
    threshold_search* s = search_.data();
    const auto next = static_cast<std::uint32_t>(committed_ ^ 1u);
    if (plan.exact) return select_exact(be, k, in, out, status, next);
    const float* acc = in.acc.data();
    const double low = static_cast<double>(policy.lower) * static_cast<double>(k);

    // Each step that only moves the search along (the one-item passes) is folded into the
    // pass before it or after it (in_order, begin_search): every one guards itself by the
    // phase it belongs to, so it may run where its phase is over.
    const bool reused = policy.reuse_threshold && carried_;
    const std::size_t m = plan.size;
    const auto r = static_cast<std::uint32_t>(entries_at_density(policy.density, m));
    be.for_each(1, begin_search{s, committed_, reused, r});
    if (reused) {
      collect<while_searching>(be, acc, reused_slot);
      be.for_each(1, take_reused_count{s, found(reused_slot), policy, k});
    }
    const std::size_t thresholds = static_cast<std::size_t>(policy.max_iters) + 1;
    if (still(be, &threshold_search::searching)) {
      be.for_each(m, sample_while_searching{{acc, plan.offset, plan.stride, sample_.data()}, s});
      const sample_key sampled{sample_.data()};
      radix_select(be, m, sampled, sampled, while_searching{}, magnitude_digits, settle_sample{s});
      collect<while_searching>(be, acc, sample_slot);
      be.for_each(1, in_order{take_sample_count{s, found(sample_slot), low},
                              refinement_thresholds{s, policy, steps_.data(), thresholds}});
    }
    if (still(be, &threshold_search::refining)) {
      histogram_then(be, n_, refinement_bin{acc, s, steps_.data(), thresholds}, between_.data(),
                     settle_refinement{s, steps_.data(), between_.data(), thresholds - 1, low});
      collect<refining_phase>(be, acc, refined_slot);
    }
    be.for_each(1, in_order{in_order{take_refined_count{s, found(refined_slot)}, decide_cut{s, policy, k}},
                            start_select<among_candidates>{s, static_cast<std::uint32_t>(k)}});
    const std::size_t listed = candidates_listed(be);
    if (still(be, &threshold_search::cutting)) {
      radix_select(be, listed, gathered_key{acc, candidates_.data(), keys_.data()}, listed_key{keys_.data()},
                   among_candidates{}, magnitude_digits, in_order{take_kth{s}, start_select<among_ties>{s, 0}});
      const lower_index_first tie_key{candidates_.data()};
      radix_select(be, listed, tie_key, tie_key, among_ties{keys_.data()}, index_digits, take_last_tie{s});
      // The kept candidates' positions, ascending (so their indices are too), then their
      // indices: one compaction, where an ordered expansion over the capacity would
      // count, scan and write it (n items on a device) to emit the same.
      be.compact(listed, kept_candidate{candidates_.data(), keys_.data(), s}, out.data(), workspace_bytes(workspace_),
                 found_.data() + cut_slot);
    }
    be.for_each(listed, place_selection{candidates_.data(), out.data(), s, found(cut_slot)});
    be.for_each(1, in_order{take_cut_count{s, found(cut_slot)}, finish_search{s, status, next}});
    return {};
  }

  /// The step was accepted: its threshold is the one carried.
  void accept() noexcept {
    committed_ ^= 1u;
    carried_ = true;
  }
  /// The carried threshold, as checkpoints record it (a read of the backend's memory).
  [[nodiscard]] threshold_record saved_state() const {
    if (!carried_) return {};
    const threshold_search s = backend_.read(static_cast<const threshold_search*>(search_.data()));
    return {1, s.carried[committed_]};
  }
  /// Carries `saved` from the next step on.
  void restore_state(const threshold_record& saved) {
    carried_ = saved.has != 0;
    if (!carried_) return;
    threshold_search s = backend_.read(static_cast<const threshold_search*>(search_.data()));
    s.carried[committed_] = saved.key;
    backend_.to_device(&s, 1, search_.data());
  }
  void add_held(held_memory& use) const {
    topk_.add_held(use);
    use.workspace += bytes_held(candidates_, keys_, found_, bins_, steps_, between_, search_, workspace_, sample_);
  }

 private:
  static std::size_t workspace_size(const Backend& be, std::size_t n) {
    using namespace sampled;
    return std::max({be.template compact_workspace<at_search_key<while_searching>>(n),
                     be.template compact_workspace<at_search_key<refining_phase>>(n),
                     be.template compact_workspace<magnitude_at_least>(n),
                     be.template compact_workspace<kept_candidate>(n)});
  }

  const std::uint32_t* found(slot at) const { return found_.data() + at; }

  // C = {i : key_i >= the search's threshold} into the candidates, its count into slot
  // `at`, while `Phase` is on. Where the host may read the search, the threshold is a
  // constant of the predicate (magnitude_at_least, which backends may scan with SIMD:
  // Kokkos does) and nothing is queued once the phase is over; elsewhere the
  // predicate reads both from the backend's memory.
  template <class Phase>
  void collect(const Backend& be, const float* acc, slot at) {
    std::byte* const work = workspace_.data();
    const std::span<std::byte> workspace(work, static_cast<std::size_t>(workspace_.size()));
    if constexpr (Backend::host_accessible) {
      const threshold_search now = be.read(search_.data());
      if (Phase::on(now)) {
        be.compact(n_, magnitude_at_least{acc, now.key}, candidates_.data(), workspace, found_.data() + at);
      }
    } else {
      be.compact(n_, sampled::at_search_key<Phase>{acc, search_.data()}, candidates_.data(), workspace,
                 found_.data() + at);
    }
  }

  // Whether a phase of the search may still be on: where the host may read the search
  // it asks it, so that over phases queue nothing; elsewhere it must assume so (the
  // items are guarded by the same flag).
  bool still(const Backend& be, std::uint32_t threshold_search::*phase) const {
    if constexpr (Backend::host_accessible) {
      return be.read(search_.data()).*phase != 0;
    } else {
      return true;
    }
  }
  // How many candidates the passes over C visit: |C| where the host may read it, the
  // capacity otherwise (each item beyond |C| does nothing).
  std::size_t candidates_listed(const Backend& be) const {
    if constexpr (Backend::host_accessible) {
      return std::min<std::size_t>(n_, be.read(search_.data()).count);
    } else {
      return n_;
    }
  }

  // The key of the rank the search holds among `size` items into the search's prefix,
  // the rank left among its ties into its rank (a select begun by start_select's work,
  // folded into the step before); then `after(0)`, the step that reads them, in the
  // same item as the last digit's pick. The first digit's pass takes the keys from
  // `first_key` (which may gather them for the others), the others from `key`.
  template <class FirstKey, class Key, class Taking, std::size_t Digits, class After>
  void radix_select(const Backend& be, std::size_t size, FirstKey first_key, Key key, Taking taking,
                    const std::array<radix_digit, Digits>& digits, const After& after) {
    using namespace sampled;
    static_assert(Digits > 1);
    threshold_search* s = search_.data();
    histogram_then(be, size, digit_bin<FirstKey, Taking>{first_key, taking, s, digits[0]}, bins_.data(),
                   pick_digit<Taking>{bins_.data(), s, digits[0]});
    for (std::size_t d = 1; d < Digits; ++d) {
      const digit_bin<Key, Taking> bin{key, taking, s, digits[d]};
      const pick_digit<Taking> pick{bins_.data(), s, digits[d]};
      if (d + 1 < Digits) {
        histogram_then(be, size, bin, bins_.data(), pick);
      } else {
        histogram_then(be, size, bin, bins_.data(), in_order<pick_digit<Taking>, After>{pick, after});
      }
    }
  }

  // The sample would be all of acc: the backend's exact top k, whose smallest key is
  // the threshold carried to the next step.
  queued_selection select_exact(const Backend& be, std::size_t k, const select_input& in, std::span<std::uint32_t> out,
                                step_status* status, std::uint32_t next) {
    using namespace sampled;
    topk_.select(be, select::exact_topk{.count = k}, in, out, status);
    std::uint32_t* complement = found_.data() + smallest_slot;
    be.clear(complement, 1);
    be.reduce_max(k, complemented_key{in.acc.data(), out.data()}, complement);
    be.for_each(1, propose_smallest{search_.data(), complement, next});
    return {};
  }

  Backend backend_;
  std::size_t n_;
  engine_for<select::exact_topk, Backend> topk_;  // where the sample would be all of acc
  // bins_ and between_ hold histograms' counts: zero when allocated, and left zero by
  // each histogram_then, so no step clears them.
  typename Backend::template buffer<std::uint32_t> candidates_, keys_, found_, bins_, steps_, between_;
  typename Backend::template buffer<threshold_search> search_;
  typename Backend::template buffer<std::byte> workspace_;
  typename Backend::template buffer<float> sample_;
  std::uint32_t committed_ = 0;  // which copy of search_.carried is the committed one
  bool carried_ = false;         // whether a step was accepted (or restored) with a threshold
};

/// Every backend without an engine of its own for select::sampled_threshold runs the
/// one above.
template <class Backend>
class engine<select::sampled_threshold, Backend> : public sampled_threshold_selection<Backend> {
 public:
  using sampled_threshold_selection<Backend>::sampled_threshold_selection;
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
