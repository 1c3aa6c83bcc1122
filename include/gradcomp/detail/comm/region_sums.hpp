/// \file detail/comm/region_sums.hpp
/// The local work of comm::sparse_allreduce's collectives (step and reduce_scatter) over
/// the backend primitives, so that it runs where the compressor's memory is: where each
/// region's entries start in a rank's selection, the entries packed for the wire in
/// blocks of a size the ranks agreed before (so that no rank learns what the others send
/// before it is sent), and the owner's checks and sums of what the ranks sent into its
/// region, in rank order (docs/algorithms.md, "Global top-k", steps 2-3). The bodies are
/// templated on the wire's entry type (an index and a float value). Not API.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/detail/core/bits.hpp>
#include <gradcomp/detail/core/radix_select.hpp>
#include <gradcomp/detail/core/sorted_search.hpp>
#include <gradcomp/detail/core/step_input.hpp>

#include <cstddef>
#include <cstdint>

GRADCOMP_NAMESPACE_BEGIN
namespace detail::region_sums {

/// What a part of the received entries may be flagged with (a fault word's bits).
inline constexpr std::uint32_t corrupt = 1u;   ///< an index outside the region or out of order, or a value not finite
inline constexpr std::uint32_t overflow = 2u;  ///< a sum not finite
/// A rank had more entries for the region than a block holds: not an error, the
/// exchange runs again with blocks that hold them.
inline constexpr std::uint32_t outgrown = 4u;

/// bounds[j] = j·n/W for j <= W: equal regions (reduce_scatter's shards, and
/// sparse_allreduce's first regions).
struct equal_regions {
  std::uint64_t n, ranks;
  std::uint32_t* bounds;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t j) const {
    bounds[j] = static_cast<std::uint32_t>(static_cast<std::uint64_t>(j) * n / ranks);  // j·n < 2^63
  }
};

/// first[j] = the position of the first selected index at or above region j's start,
/// bounds[j], for j <= W (first[W] = the count: bounds[W] = n, above every index). The
/// selection ascends; its count is the step's status's (where that met a NaN, nothing
/// is sent: pack_blocks).
struct region_starts {
  const std::uint32_t* index;
  const step_status* status;
  const std::uint32_t* bounds;
  std::uint64_t* first;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t j) const {
    first[j] = status->non_finite != 0 ? 0 : first_not_below(index, status->count, bounds[j]);
  }
};

/// One item: sent[0] = the entries this rank's step has for all regions, first[W];
/// sent[1] = those that blocks of `room` carry, min(first[j + 1] - first[j], room)
/// summed over the regions.
struct entries_sent {
  const std::uint64_t* first;
  std::uint64_t ranks, room;
  std::uint32_t* sent;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t) const {
    std::uint64_t carried = 0;
    for (std::uint64_t j = 0; j < ranks; ++j) {
      const std::uint64_t count = first[j + 1] - first[j];
      carried += count < room ? count : room;
    }
    sent[0] = static_cast<std::uint32_t>(first[ranks]);  // <= the selection's count < 2^32
    sent[1] = static_cast<std::uint32_t>(carried);
  }
};

/// One item: at[j] (j <= W) = the entries that blocks of `room` carry of the regions
/// before j, min(first[i + 1] - first[i], room) summed over i < j: where region j's
/// entries start among those a rank sent (at[W]: how many it sent), when a region has
/// more than its block holds and only the first `room` travel.
struct kept_starts {
  const std::uint64_t* first;
  std::uint64_t ranks, room;
  std::uint32_t* at;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t) const {
    std::uint64_t total = 0;
    for (std::uint64_t j = 0; j < ranks; ++j) {
      at[j] = static_cast<std::uint32_t>(total);  // <= the selection's count < 2^32
      const std::uint64_t count = first[j + 1] - first[j];
      total += count < room ? count : room;
    }
    at[ranks] = static_cast<std::uint32_t>(total);
  }
};

/// Item p < first[W] of the selection: its index copied to kept[at[j] + p - first[j]]
/// where its block carried it (p - first[j] < room; j its region, of `length` indices
/// each: reduce_scatter's equal shards), so that `kept` lists, ascending, what the rank
/// sent (kept_starts wrote `at`).
struct keep_sent {
  const std::uint32_t* index;
  const std::uint64_t* first;
  const std::uint32_t* at;
  std::uint64_t length, room;
  std::uint32_t* kept;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t p) const {
    const std::uint64_t j = index[p] / length;
    if (p - first[j] < room) kept[at[j] + (p - first[j])] = index[p];
  }
};

/// The all-to-all's W blocks of `room` + 1 entries each, block j for rank j: a header
/// whose index is how many entries this rank has for region j (also where that is more
/// than the block holds, or 0 after a step that met a NaN), then the first min(count,
/// room) of them, then zeros. first[0..W] are the regions' starts in the selection
/// (region_starts).
template <class Entry>
struct pack_blocks {
  const std::uint32_t* index;
  const float* values;
  const std::uint64_t* first;
  const step_status* status;
  std::uint64_t room;
  Entry* out;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t t) const {
    const std::uint64_t j = t / (room + 1), i = t % (room + 1);
    const std::uint64_t count = status->non_finite != 0 ? 0 : first[j + 1] - first[j];
    if (i == 0) {
      out[t] = Entry{static_cast<std::uint32_t>(count), 0.0f};  // count <= n < 2^32
    } else if (i <= count) {
      const std::uint64_t at = first[j] + i - 1;
      out[t] = Entry{index[at], values[at]};
    } else {
      out[t] = Entry{0, 0.0f};
    }
  }
};

/// The entries received block t / (room + 1) holds: its header's count, or the room
/// where that is more (the block is outgrown).
template <class Entry>
GRADCOMP_HOST_DEVICE std::uint64_t entries_in(const Entry* block, std::uint64_t room) {
  const std::uint64_t count = block[0].index;
  return count < room ? count : room;
}

/// A fault of item t of the received blocks: a header saying more entries than the
/// region has indices, or an entry outside [begin, end), not above the entry before it
/// in its block, or with a value that is not finite (corrupt); a header saying more
/// entries than the block holds (outgrown).
template <class Entry>
struct block_faults {
  const Entry* received;
  std::uint64_t room;
  std::uint32_t begin, end;
  GRADCOMP_HOST_DEVICE std::uint32_t operator()(std::size_t t) const {
    const std::uint64_t i = t % (room + 1);
    const Entry* block = received + (t - i);
    if (i == 0) return block[0].index > end - begin ? corrupt : block[0].index > room ? outgrown : 0u;
    if (i > entries_in(block, room)) return 0u;
    const Entry e = block[i];
    const bool ordered = i == 1 || block[i - 1].index < e.index;
    const bool finite = magnitude_key(e.value) < non_finite_key;
    return e.index < begin || e.index >= end || !ordered || !finite ? corrupt : 0u;
  }
};

/// The count in block r's header (what reduce_max finds the largest of: the room the
/// blocks need).
template <class Entry>
struct header_count {
  const Entry* received;
  std::uint64_t room;
  GRADCOMP_HOST_DEVICE std::uint32_t operator()(std::size_t r) const { return received[r * (room + 1)].index; }
};

/// What a sum holds before any rank sent its index: a quiet NaN whose payload no sum
/// can take (the entries are finite, and arithmetic on finite values makes only the
/// default NaN), so that one float per index says both whether it was sent and its sum.
inline constexpr std::uint32_t unsent = 0x7FC0BAD5u;

/// sums[i] = unsent.
struct mark_unsent {
  float* sums;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t i) const { sums[i] = float_of(unsent); }
};

/// Adds entry i of one rank's block to the region's sums, once every block's checks
/// found none of the faults in `stops` (the word is final: the checks ran before on the
/// same stream; where `stops` leaves out `outgrown`, an outgrown block's first `room`
/// entries are added). The
/// first value an index receives is its sum as it is (so that -0 stays -0, as in a
/// sum that starts from the first term), each later one is added: with the blocks
/// added rank after rank, each index's values are summed in rank order. Within a sound
/// block the indices differ, so no two items touch one sum.
template <class Entry>
struct add_block {
  const Entry* block;
  std::uint64_t room;
  std::uint32_t begin;
  const std::uint32_t* fault;
  std::uint32_t stops;
  float* sums;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t i) const {
    if ((*fault & stops) != 0 || i >= entries_in(block, room)) return;
    const Entry e = block[1 + i];
    float& sum = sums[e.index - begin];
    sum = bits_of(sum) == unsent ? e.value : sum + e.value;
  }
};

/// An overflow: the sum of the index of item t of the received blocks is not finite
/// (looked at from every entry that went into it, so that only the entries, not the
/// region, are read; nothing once a block was found at one of the faults in `stops`,
/// whose entries were not added).
template <class Entry>
struct sum_faults {
  const Entry* received;
  std::uint64_t room;
  std::uint32_t begin;
  const std::uint32_t* fault;
  std::uint32_t stops;
  const float* sums;
  GRADCOMP_HOST_DEVICE std::uint32_t operator()(std::size_t t) const {
    const std::uint64_t i = t % (room + 1);
    if ((*fault & stops) != 0 || i == 0 || i > entries_in(received + (t - i), room)) return 0u;
    return magnitude_key(sums[received[t].index - begin]) >= non_finite_key ? overflow : 0u;
  }
};

/// shard[i] = scale · the sum of index begin + i, or 0 where no rank sent it; 0
/// everywhere where the ranks refused the step (*refused != 0: the word is final,
/// written before on the same stream), so that a refused step adds nothing where the
/// shard is added to a gradient.
struct write_shard {
  const float* sums;
  float scale;
  const std::uint32_t* refused;
  float* shard;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t i) const {
    if (*refused != 0) {
      shard[i] = 0.0f;
      return;
    }
    const float sum = sums[i];
    shard[i] = bits_of(sum) == unsent ? 0.0f : scale * sum;
  }
};

}  // namespace detail::region_sums
GRADCOMP_NAMESPACE_END
