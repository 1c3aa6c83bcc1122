/// \file detail/comm/global_topk.hpp
/// The local work of comm::sparse_allreduce::step's global selection over the backend
/// primitives, so that it runs where the compressor's memory is and the host reads
/// nothing until the step's end (docs/algorithms.md, "Global top-k", step 4): the
/// region's sums listed, the k-th largest magnitude found digit by digit with each
/// digit's histogram summed over the ranks and the digit picked where the histogram is,
/// the ties at it split in rank order, and each rank's part of the selection gathered
/// in parts of a capacity the ranks agreed before the step and assembled in rank order;
/// where a part outgrows the capacity nothing is added, and the exchange runs again
/// with room for it once the host has read the parts' sizes (a queued step's parts and
/// blocks carry what fits instead, and each rank lists the selected entries it carried).
/// Not API.
#pragma once

#include <gradcomp/comm/agreement.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/detail/comm/region_sums.hpp>
#include <gradcomp/detail/core/bits.hpp>
#include <gradcomp/detail/core/fixed_order_sum.hpp>
#include <gradcomp/detail/core/radix_select.hpp>
#include <gradcomp/detail/core/sorted_search.hpp>
#include <gradcomp/message.hpp>

#include <cstddef>
#include <cstdint>
#include <span>

GRADCOMP_NAMESPACE_BEGIN
namespace detail::global_topk {

/// Where the selection stands, in the compressor's memory: written by the passes below,
/// read by the host once, at the step's end.
struct selection {
  std::uint32_t sums;       ///< this rank's sums: the distinct indices its region received
  std::uint32_t take;       ///< the global selection's size, min(k, the sums of every rank)
  std::uint32_t prefix;     ///< the k-th largest key's digits found so far (then the key)
  std::uint32_t known;      ///< the mask of those digits
  std::uint32_t rank;       ///< its rank among the keys sharing them (then: the ties to take)
  std::uint32_t ties;       ///< the ties at the k-th key this rank's region takes
  std::uint32_t tie_count;  ///< the listed sums at the k-th key (the compaction's count)
  std::uint32_t tie_limit;  ///< list positions below this may take a tie (the last taken + 1)
  std::uint32_t chosen;     ///< the listed sums this rank's region contributes
  std::uint32_t refused;  ///< a region was corrupt, overflowed or outgrew its blocks, or a frame refused: nothing added
  std::uint32_t outgrown;  ///< a rank's part outgrew the gather's capacity: the exchange runs again
  std::uint32_t broken;    ///< the assembled selection is not ascending below n (a broken transport)
};
static_assert(sizeof(selection) == 48);

/// Whether the region's sum i was sent by a rank (region_sums::unsent otherwise).
struct is_sent {
  const float* sums;
  GRADCOMP_HOST_DEVICE bool operator()(std::size_t i) const { return bits_of(sums[i]) != region_sums::unsent; }
};

/// The key of the region's j-th listed sum.
GRADCOMP_HOST_DEVICE inline std::uint32_t key_of(const float* sums, const std::uint32_t* list, std::size_t j) {
  return magnitude_key(sums[list[j]]);
}

/// Bins of the listed sums by one digit of their key, of those whose key shares the
/// digits found so far (the others: no_bin).
struct digit_bin {
  const float* sums;
  const std::uint32_t* list;
  const selection* at;
  int shift, bits;
  GRADCOMP_HOST_DEVICE std::size_t bins() const { return std::size_t{1} << bits; }
  GRADCOMP_HOST_DEVICE std::size_t operator()(std::size_t j) const {
    if (j >= at->sums) return no_bin;
    const std::uint32_t key = key_of(sums, list, j);
    if ((key & at->known) != at->prefix) return no_bin;
    return (key >> shift) & ((1u << bits) - 1u);
  }
};

/// bins[at] = this rank's sums: the first digit's histogram carries the count, so that
/// its sum over the ranks gives every rank the total too.
struct count_in_bin {
  const selection* at;
  std::uint32_t* bin;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t) const { *bin = at->sums; }
};

/// One item: the digit of the summed histogram `bins` that holds the rank-th largest
/// key (find_bin_from_top), added to the prefix. The first digit's also settles the
/// selection's size, from the total its extra bin carries.
struct pick_digit {
  const std::uint32_t* bins;
  int shift, bits;
  bool first;
  std::uint64_t k;
  selection* at;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t) const {
    const std::size_t count = std::size_t{1} << bits;
    if (first) {
      const std::uint64_t total = bins[count];
      at->take = static_cast<std::uint32_t>(total < k ? total : k);
      at->rank = at->take;
      at->prefix = 0;
      at->known = 0;
    }
    if (at->rank == 0) return;  // nothing to select
    const auto found = find_bin_from_top(std::span<const std::uint32_t>(bins, count), at->rank);
    at->prefix |= found.first << shift;
    at->known |= ((1u << bits) - 1u) << shift;
    at->rank = static_cast<std::uint32_t>(found.second);
  }
};

/// The listed sums' place against the k-th key: 0 below, 1 a tie, 2 above (none when
/// nothing is selected).
struct key_class {
  const float* sums;
  const std::uint32_t* list;
  const selection* at;
  GRADCOMP_HOST_DEVICE static constexpr std::size_t bins() { return 3; }
  GRADCOMP_HOST_DEVICE std::size_t operator()(std::size_t j) const {
    if (j >= at->sums || at->take == 0) return no_bin;
    const std::uint32_t key = key_of(sums, list, j);
    return key > at->prefix ? 2 : key == at->prefix ? 1 : 0;
  }
};

/// What each rank tells the others of its region (uint32 words, all-gathered).
struct record {
  std::uint32_t above;    ///< sums above the k-th key
  std::uint32_t ties;     ///< sums at it
  std::uint32_t fault;    ///< region_sums' bits: corrupt, overflow, outgrown
  std::uint32_t largest;  ///< the most entries a rank had for the region (the room the blocks need)
};
static_assert(sizeof(record) == 16);

/// One item: this rank's record, from the class histogram and the region's fault words.
struct record_of {
  const std::uint32_t* classes;
  const std::uint32_t* faults;  ///< {the blocks' checks, the sums' check, the largest header count}
  record* out;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t) const {
    *out = record{classes[2], classes[1], faults[0] | faults[1], faults[2]};
  }
};

/// One item: the ties at the k-th key go to the lowest ranks' regions first (which hold
/// the lower indices); where each rank's part starts in the selection (starts[0..W],
/// starts[W] = take where the records are sound), this rank's share of the ties, and
/// whether the selection is refused: a rank's record holds a fault among `stops` (its
/// region failed its checks, or outgrew its blocks where blocks do not carry what fits),
/// or a rank's frame says an error or other settings than `digest`, this rank's.
struct split_ties {
  const record* all;
  std::size_t ranks, me;
  const std::byte* frames;  ///< every rank's detail::sized_frame, in rank order
  std::uint64_t digest;
  std::uint32_t stops;
  selection* at;
  std::uint32_t* starts;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t) const {
    std::uint32_t left = at->take == 0 ? 0 : at->rank;
    std::uint32_t start = 0, refused = 0;
    for (std::size_t r = 0; r < ranks; ++r) {
      const std::uint32_t taken = at->take == 0 ? 0 : all[r].ties < left ? all[r].ties : left;
      left -= taken;
      starts[r] = start;
      start += at->take == 0 ? 0 : all[r].above + taken;
      if (r == me) at->ties = taken;
      refused |= all[r].fault & stops;
    }
    starts[ranks] = start;
    at->refused = refused | (frames_alike(frames, ranks, digest) ? 0u : 8u);
    if (start != at->take) at->broken = 1;  // parts that do not add up to the selection: records a transport broke
  }
};

/// One item: reduce_scatter's verdict, on which its shard's write waits (*refused: the
/// bits of `stops` among any rank's record's faults, or 8 where a rank's frame says an
/// error or other settings than `digest`, this rank's).
struct scatter_verdict {
  const record* all;
  std::size_t ranks;
  const std::byte* frames;  ///< every rank's detail::sized_frame, in rank order
  std::uint64_t digest;
  std::uint32_t stops;
  std::uint32_t* refused;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t) const {
    std::uint32_t faults = 0;
    for (std::size_t r = 0; r < ranks; ++r) faults |= all[r].fault;
    *refused = (faults & stops) | (frames_alike(frames, ranks, digest) ? 0u : 8u);
  }
};

/// One item: whether a rank's part (starts[r + 1] - starts[r]) outgrows `capacity`.
struct parts_fit {
  const std::uint32_t* starts;
  std::size_t ranks;
  std::uint64_t capacity;
  selection* at;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t) const {
    std::uint32_t outgrown = 0;
    for (std::size_t r = 0; r < ranks; ++r) outgrown |= starts[r + 1] - starts[r] > capacity ? 1u : 0u;
    at->outgrown = outgrown;
  }
};

/// One item, where the gather's parts carry what fits (a queued step): fitted[r] =
/// where rank r's part starts among the entries the gather carries (min(its part,
/// `capacity`) each: the lowest indices of its region's selection), fitted[W] their
/// number, which becomes the selection's size; no part outgrows the capacity then.
struct fit_parts {
  const std::uint32_t* starts;  ///< the parts' starts (split_ties)
  std::size_t ranks;
  std::uint64_t capacity;
  selection* at;
  std::uint32_t* fitted;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t) const {
    std::uint32_t total = 0;
    for (std::size_t r = 0; r < ranks; ++r) {
      fitted[r] = total;
      const std::uint32_t part = starts[r + 1] - starts[r];
      total += part < capacity ? part : static_cast<std::uint32_t>(capacity);
    }
    fitted[ranks] = total;
    at->take = total;
    at->outgrown = 0;
  }
};

/// Whether listed sum j ties at the k-th key.
struct is_tie {
  const float* sums;
  const std::uint32_t* list;
  const selection* at;
  GRADCOMP_HOST_DEVICE bool operator()(std::size_t j) const {
    return j < at->sums && at->take != 0 && key_of(sums, list, j) == at->prefix;
  }
};

/// One item: the list position after the last tie this rank takes (ties: the positions
/// of the listed ties, ascending).
struct last_tie {
  const std::uint32_t* ties;
  selection* at;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t) const {
    const std::uint32_t taken = at->ties < at->tie_count ? at->ties : at->tie_count;  // as many as a sound record says
    at->tie_limit = taken == 0 ? 0 : ties[taken - 1] + 1;
  }
};

/// Whether listed sum j is selected: above the k-th key, or one of the ties this rank takes.
struct is_selected {
  const float* sums;
  const std::uint32_t* list;
  const selection* at;
  GRADCOMP_HOST_DEVICE bool operator()(std::size_t j) const {
    if (j >= at->sums || at->take == 0) return false;
    const std::uint32_t key = key_of(sums, list, j);
    return key > at->prefix || (key == at->prefix && j < at->tie_limit);
  }
};

/// This rank's j-th selected sum, as the gather's entry j, for j below `k`: what the part
/// holds (the capacity, at most k; a sound part has at most k, and one that outgrows the
/// capacity is flagged by parts_fit).
template <class Entry>
struct place {
  const std::uint32_t* chosen;  ///< list positions, ascending
  const std::uint32_t* chosen_count;
  const std::uint32_t* list;
  const float* sums;
  std::uint32_t begin;  ///< the region's first index
  std::uint64_t k;
  Entry* part;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t j) const {
    if (j >= *chosen_count || j >= k) return;  // beyond k only with histograms a transport broke
    const std::uint32_t i = list[chosen[j]];
    part[j] = Entry{begin + i, sums[i]};
  }
};

/// Gathered entry j (rank j / capacity's i-th) in the selection's slot starts[r] + i:
/// its index in the first k slots, its sum in `values`; nothing where the parts
/// outgrew the capacity (the exchange runs again) or past the rank's part.
template <class Entry>
struct assemble {
  const Entry* gathered;
  std::uint64_t capacity, k;
  const std::uint32_t* starts;
  const selection* at;
  std::uint32_t* slots;
  float* values;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t j) const {
    if (at->outgrown != 0) return;
    const std::size_t r = j / capacity, i = j % capacity;
    if (i >= starts[r + 1] - starts[r]) return;
    const std::uint64_t slot = std::uint64_t{starts[r]} + i;
    if (slot >= k) return;  // only with records that a broken transport delivered
    slots[slot] = gathered[j].index;
    values[slot] = gathered[j].value;
  }
};

/// A fault of the assembled selection's slot j < take: an index not above the one
/// before it or not below n, or a value not finite. Every rank holds the same slots, so
/// every rank finds the same.
struct selection_faults {
  const std::uint32_t* slots;
  const float* values;
  std::uint64_t n;
  const selection* at;
  GRADCOMP_HOST_DEVICE std::uint32_t operator()(std::size_t j) const {
    if (j >= at->take || at->outgrown != 0) return 0u;
    const std::uint32_t i = slots[j];
    const bool ordered = j == 0 || slots[j - 1] < i;
    return i < n && ordered && magnitude_key(values[j]) < non_finite_key ? 0u : 1u;
  }
};

/// Whether the selection may be used: no rank refused, every part gathered, sound.
GRADCOMP_HOST_DEVICE inline bool usable(const selection* at) {
  return at->refused == 0 && at->outgrown == 0 && at->broken == 0;
}

/// dense[i] += scale · sum for slot j < take, once the selection is usable (the words
/// are final: written before on the same stream).
struct add_selection {
  const std::uint32_t* slots;
  const float* values;
  const selection* at;
  float scale;
  float* dense;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t j) const {
    if (j >= at->take || !usable(at)) return;
    const std::uint32_t i = slots[j];
    dense[i] = added(dense[i], scale, values[j]);
  }
};

/// The next step's regions (bounds[0..W]), where this step's selection is usable and
/// not empty: cut at its quantiles, so that each region holds about take / W of the
/// indices likely to come again.
struct next_regions {
  const std::uint32_t* slots;
  std::size_t ranks;
  std::uint64_t n;
  const selection* at;
  std::uint32_t* bounds;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t j) const {
    if (at->take == 0 || !usable(at)) return;
    if (j == 0) {
      bounds[0] = 0;
    } else if (j == ranks) {
      bounds[j] = static_cast<std::uint32_t>(n);
    } else {
      bounds[j] = slots[j * at->take / ranks];
    }
  }
};

/// One item, where blocks carry what fits (a queued step): kept[r] = where part r's
/// slots that this rank carried start among them, kept[W] their number (none where the
/// selection is not usable). Part r's slots are region r's, ascending; this rank's block
/// to region r carried its entries there below the one at first[r] + room of its
/// selection (all of them where the block held them), so it carried the part's slots
/// below that index.
struct kept_parts {
  const std::uint32_t* index;  ///< this rank's selection, ascending
  const std::uint64_t* first;  ///< where each region's entries start in it (region_sums::region_starts)
  std::uint64_t room;
  const std::uint32_t* slots;   ///< the assembled selection
  const std::uint32_t* fitted;  ///< where each part starts in it (fit_parts)
  std::size_t ranks;
  const selection* at;
  std::uint32_t* kept;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t) const {
    std::uint32_t total = 0;
    for (std::size_t r = 0; r < ranks; ++r) {
      kept[r] = total;
      std::uint32_t carried = usable(at) ? fitted[r + 1] - fitted[r] : 0u;
      if (first[r + 1] - first[r] > room) {
        carried = static_cast<std::uint32_t>(first_not_below(slots + fitted[r], carried, index[first[r] + room]));
      }
      total += carried;
    }
    kept[ranks] = total;
  }
};

/// Item j of the gather's W parts of `capacity` (rank j / capacity's i-th): its slot
/// copied to kept_slots[kept[r] + i] where this rank carried it (kept_parts), so that
/// `kept_slots` lists, ascending, the selected indices this rank may commit.
struct keep_carried {
  const std::uint32_t* slots;
  const std::uint32_t* fitted;
  const std::uint32_t* kept;
  std::uint64_t capacity;
  std::uint32_t* kept_slots;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t j) const {
    const std::size_t r = j / capacity, i = j % capacity;
    if (i < kept[r + 1] - kept[r]) kept_slots[kept[r] + i] = slots[fitted[r] + i];
  }
};

}  // namespace detail::global_topk
GRADCOMP_NAMESPACE_END
