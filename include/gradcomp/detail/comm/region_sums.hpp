/// \file detail/comm/region_sums.hpp
/// The local work of comm::sparse_allreduce's collectives (step and reduce_scatter) over
/// the backend primitives, so that it runs where the compressor's memory is: where each
/// region's entries start in a rank's selection, the entries packed for the wire, and
/// the owner's checks and sums of what the ranks sent into its region, in rank order
/// (docs/algorithms.md, "Global top-k", steps 2-3). The bodies are templated on the wire's entry type (an
/// index and a float value). Not API.
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

/// The bytes each rank's verdict carries in the first exchange of the collectives
/// (its count of entries for each of the `ranks` regions): also what a rank without an
/// exchange sends there (zeros) to tell the others its error (a DDP hook's).
constexpr std::size_t counts_bytes(std::size_t ranks) noexcept { return sizeof(std::uint64_t) * ranks; }

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
/// bounds[j], for j <= W (first[W] = the count: bounds[W] = n, above every index), and
/// first[W + 1] the status's non_finite (read back with them). The selection ascends;
/// its count is the step's status's.
struct region_starts {
  const std::uint32_t* index;
  const step_status* status;
  const std::uint32_t* bounds;
  std::uint64_t ranks;
  std::uint64_t* first;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t j) const {
    first[j] = j > ranks ? status->non_finite : first_not_below(index, status->count, bounds[j]);
  }
};

/// out[j] = {index[j], values[j]}.
template <class Entry>
struct pack {
  const std::uint32_t* index;
  const float* values;
  Entry* out;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t j) const { out[j] = Entry{index[j], values[j]}; }
};

/// A fault of entry j of one rank's part: outside [begin, end), not above the entry
/// before it, or a value that is not finite.
template <class Entry>
struct part_faults {
  const Entry* part;
  std::uint32_t begin, end;
  GRADCOMP_HOST_DEVICE std::uint32_t operator()(std::size_t j) const {
    const Entry e = part[j];
    const bool ordered = j == 0 || part[j - 1].index < e.index;
    const bool finite = magnitude_key(e.value) < non_finite_key;
    return e.index < begin || e.index >= end || !ordered || !finite ? corrupt : 0u;
  }
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

/// Adds entry j of one rank's part to the region's sums, once every part's checks
/// found no fault (the word is final: the checks ran before on the same stream). The
/// first value an index receives is its sum as it is (so that -0 stays -0, as in a
/// sum that starts from the first term), each later one is added: with the parts
/// added rank after rank, each index's values are summed in rank order. Within a sound
/// part the indices differ, so no two items touch one sum.
template <class Entry>
struct add_part {
  const Entry* part;
  std::uint32_t begin;
  const std::uint32_t* fault;
  float* sums;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t j) const {
    if (*fault != 0) return;
    const Entry e = part[j];
    float& sum = sums[e.index - begin];
    sum = bits_of(sum) == unsent ? e.value : sum + e.value;
  }
};

/// An overflow: the sum of received entry j's index is not finite (looked at from
/// every entry that went into it, so that only the entries, not the region, are read;
/// nothing once a part was found corrupt, whose entries were not added).
template <class Entry>
struct sum_faults {
  const Entry* received;
  std::uint32_t begin;
  const std::uint32_t* fault;
  const float* sums;
  GRADCOMP_HOST_DEVICE std::uint32_t operator()(std::size_t j) const {
    if (*fault != 0) return 0u;
    return magnitude_key(sums[received[j].index - begin]) >= non_finite_key ? overflow : 0u;
  }
};

/// shard[i] = scale · the sum of index begin + i, or 0 where no rank sent it.
struct write_shard {
  const float* sums;
  float scale;
  float* shard;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t i) const {
    const float sum = sums[i];
    shard[i] = bits_of(sum) == unsent ? 0.0f : scale * sum;
  }
};

}  // namespace detail::region_sums
GRADCOMP_NAMESPACE_END
