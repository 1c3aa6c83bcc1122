/// \file detail/cuda/radix_topk.cuh
/// Top-r by a 32-bit key on the GPU: a radix select in the style of AIR top-k, never a
/// sort of the input. Not API.
///
/// The key is cut into three digits (bits 31..21, 20..10, 9..0). Level 0 counts the top
/// digit of every candidate in a histogram, and the last block of the pass to finish
/// finds the bin holding the r-th largest key (so no launch of its own picks a digit).
/// Each further level reads only the candidates: those whose digits so far are above
/// the r-th key's are certainly in the top r and go to `sure`; those equal to them go to
/// the next candidate list, and their next digit to the next histogram, whose bin the
/// pass's last block finds likewise. After three levels the r-th key K is exact, with
/// `rank` = how many entries equal to K belong to the top r. The input is read twice
/// (level 0 and the first split); the lists after that hold only entries that share the
/// r-th key's top digit. Each thread loads several keys before it uses any (memory needs
/// loads in flight), and each block gathers the entries it takes in shared memory and
/// writes them out in runs, one atomic on a list's count per run.
///
/// Everything is stream-ordered: counts, ranks and list sizes stay in device memory,
/// so no step waits for the host.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/detail/cuda/device_buffer.cuh>
#include <gradcomp/detail/cuda/launch.cuh>
#include <gradcomp/detail/core/step_input.hpp>

#include <cooperative_groups.h>
#include <cub/block/block_scan.cuh>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

GRADCOMP_NAMESPACE_BEGIN
namespace detail::cuda_radix {

inline constexpr int block_threads = cuda_launch::block_threads;
inline constexpr int top_bins = 2048;  // the widest digit: 11 bits

/// Where a radix select stands; lives in device memory.
struct select_state {
  std::uint32_t prefix;      ///< the r-th largest key's digits found so far
  std::uint32_t rank;        ///< its rank among the current candidates (1 = largest)
  std::uint32_t non_finite;  ///< set when a magnitude key of a NaN or infinity was counted
  std::uint32_t counts[4];   ///< sizes of the candidate lists, one counter per list written
  std::uint32_t finished;    ///< blocks of the running pass that are done (its last resets it)
};

/// Addresses of a device-resident state's fields, computed on the host without
/// dereferencing the device pointer.
inline std::uint32_t* counts_of(select_state* state) noexcept {
  return reinterpret_cast<std::uint32_t*>(reinterpret_cast<char*>(state) + offsetof(select_state, counts));
}
inline const std::uint32_t* non_finite_of(const select_state* state) noexcept {
  return reinterpret_cast<const std::uint32_t*>(reinterpret_cast<const char*>(state) +
                                                offsetof(select_state, non_finite));
}

/// Every index of [0, n).
struct all_of {
  std::uint32_t n;
  __device__ std::uint32_t size() const { return n; }
  __device__ std::uint32_t at(std::uint32_t j) const { return j; }
};

/// The indices a previous pass appended to `items`; their number is in device memory.
struct list_of {
  const std::uint32_t* items;
  const std::uint32_t* count;
  __device__ std::uint32_t size() const { return *count; }
  __device__ std::uint32_t at(std::uint32_t j) const { return items[j]; }
};

/// The 31-bit magnitude key of acc[i] (detail::magnitude_key on the host).
struct magnitude_key_of {
  const float* acc;
  __device__ std::uint32_t operator()(std::uint32_t i) const { return __float_as_uint(acc[i]) & 0x7FFFFFFFu; }
};

/// The magnitude key of acc[i] as the corrector's pass writes it (cuda_launch::updated_acc):
/// a counting pass that computes acc as it reads it, its reads (read) apart from its
/// writes (written), which for_each_keyed issues for all of a thread's items first.
template <class Update>
struct written_magnitude_key {
  cuda_launch::updated_acc<Update> acc;
  using inputs = typename Update::inputs;
  __device__ inputs read(std::uint32_t i) const { return acc.read(i); }
  __device__ std::uint32_t written(std::uint32_t i, const inputs& in) const {
    return __float_as_uint(acc.written(i, in)) & 0x7FFFFFFFu;
  }
};

/// Larger for lower indices: the top r by this key are the r lowest indices (ties at
/// the r-th magnitude go to the lower index).
struct lower_index_first {
  __device__ std::uint32_t operator()(std::uint32_t i) const { return ~i; }
};

/// Items each thread takes per round of a pass, their keys all loaded before any is
/// used: one load in flight per thread left the counting pass over 10^8 keys at 1.75
/// times the read of them (H200, 2026-11-27), where the memory needs several.
inline constexpr int items_per_thread = 4;
/// The items a block takes per round.
inline constexpr std::uint32_t block_tile = block_threads * items_per_thread;

/// Appends `value` to `list` for every thread of the warp that takes it, with one
/// atomic per warp (warp-aggregated); entries at or beyond `capacity` are dropped.
__device__ inline void append(std::uint32_t value, std::uint32_t* list, std::uint32_t* count, std::uint32_t capacity) {
  namespace cg = cooperative_groups;
  const cg::coalesced_group group = cg::coalesced_threads();
  std::uint32_t base = 0;
  if (group.thread_rank() == 0) base = atomicAdd(count, group.size());
  base = group.shfl(base, 0);
  const std::uint32_t at = base + group.thread_rank();
  if (at < capacity) list[at] = value;
}

/// A pass over a source, grid-stride by tiles: in each round a block takes a tile of
/// block_tile items (item q of a thread at q * block_threads + its index, so that every
/// load is coalesced), loads the items and then their keys, then calls
/// `body(item, key)` for each of its items, then `end_round()` with every thread of the
/// block. Every block runs the same number of rounds, so end_round may synchronize the
/// block.
template <class Source, class Key, class Body, class EndRound>
__device__ void for_each_keyed(const Source& source, const Key& key, Body&& body, EndRound&& end_round) {
  const std::uint64_t size = source.size();
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * block_tile;
  const std::uint64_t rounds = (size + stride - 1) / stride;
  std::uint64_t first = static_cast<std::uint64_t>(blockIdx.x) * block_tile + threadIdx.x;
  for (std::uint64_t round = 0; round < rounds; ++round, first += stride) {
    std::uint32_t item[items_per_thread];
    std::uint32_t item_key[items_per_thread] = {};
#pragma unroll
    for (int q = 0; q < items_per_thread; ++q) {
      const std::uint64_t j = first + static_cast<std::uint64_t>(q) * block_threads;
      item[q] = j < size ? source.at(static_cast<std::uint32_t>(j)) : 0u;
    }
    if constexpr (requires { key.read(0u); }) {
      // A key computed from reads and then written (written_magnitude_key): every read
      // of the thread's items in flight before the first write.
      typename Key::inputs in[items_per_thread] = {};
#pragma unroll
      for (int q = 0; q < items_per_thread; ++q) {
        if (first + static_cast<std::uint64_t>(q) * block_threads < size) in[q] = key.read(item[q]);
      }
#pragma unroll
      for (int q = 0; q < items_per_thread; ++q) {
        if (first + static_cast<std::uint64_t>(q) * block_threads < size) item_key[q] = key.written(item[q], in[q]);
      }
    } else {
#pragma unroll
      for (int q = 0; q < items_per_thread; ++q) {
        if (first + static_cast<std::uint64_t>(q) * block_threads < size) item_key[q] = key(item[q]);
      }
    }
#pragma unroll
    for (int q = 0; q < items_per_thread; ++q) {
      if (first + static_cast<std::uint64_t>(q) * block_threads < size) body(item[q], item_key[q]);
    }
    end_round();
  }
}

/// Room for the entries a block gathers for one list: two rounds' worth, so that what a
/// round adds always fits beside what the last write left (at most one round's).
inline constexpr std::uint32_t stage_room = 2 * block_tile;

/// The entries a block has taken for one list, gathered in shared memory (appended
/// warp by warp) and written to the list in runs, one atomic on the list's count per
/// run. A warp's atomic per taken entry on the one count serializes across the device:
/// a select of 10^6 of 10^8 entries takes nearly that many warps' atomics on the chosen
/// list's count.
struct block_stage {
  std::uint32_t items[stage_room];
  std::uint32_t count;
  std::uint32_t base;
};

/// Writes the first `staged` entries of `stage` to `list` from an atomic's base (those
/// at or beyond `capacity` dropped, as append drops them) and empties the stage. Every
/// thread of the block calls it with the same `staged`, read between two barriers (so
/// that none still reads the stage's count when it is reset).
__device__ inline void write_staged(block_stage& stage, std::uint32_t staged, std::uint32_t* list, std::uint32_t* count,
                                    std::uint32_t capacity) {
  if (threadIdx.x == 0) {
    stage.base = atomicAdd(count, staged);
    stage.count = 0;
  }
  __syncthreads();
  const std::uint32_t base = stage.base;
  for (std::uint32_t t = threadIdx.x; t < staged; t += blockDim.x) {
    if (base + t < capacity) list[base + t] = stage.items[t];
  }
  __syncthreads();  // every entry is read before the next round appends over it
}

/// The digit a pass's histogram is counted for: its width, and the bin from which keys
/// are NaN or infinity (~0u: none can be).
struct next_digit {
  int bits;
  std::uint32_t non_finite_bin;
};

/// One block (block_threads threads): finds the bin of the histogram (2^bits bins,
/// highest first) that holds the rank-th largest key, appends its digit to the prefix,
/// makes the rank relative to that bin, and zeroes the histogram for the next level.
/// Any count in a bin at or above the digit's non_finite_bin is flagged.
__device__ inline void pick_digit(std::uint32_t* histogram, select_state* state, next_digit digit) {
  constexpr int per_thread = top_bins / block_threads;
  using scan = cub::BlockScan<std::uint32_t, block_threads>;
  __shared__ typename scan::TempStorage scratch;

  const int bins = 1 << digit.bits;
  const int mine = bins / block_threads;  // this digit's bins per thread (<= per_thread)
  // Written by other blocks' atomics: read where they landed, past this SM's cache.
  const volatile std::uint32_t* counted = histogram;
  const std::uint32_t rank = state->rank;
  std::uint32_t count[per_thread];
  std::uint32_t sum = 0;
  bool non_finite = false;
  for (int q = 0; q < mine; ++q) {
    const int bin = bins - 1 - (static_cast<int>(threadIdx.x) * mine + q);  // thread 0: the top bins
    count[q] = counted[bin];
    sum += count[q];
    non_finite |= static_cast<std::uint32_t>(bin) >= digit.non_finite_bin && count[q] != 0;
  }
  std::uint32_t above = 0;  // entries in higher bins than this thread's
  scan(scratch).ExclusiveSum(sum, above);
  __syncthreads();  // every thread has read the rank before it changes
  for (int q = 0; q < mine; ++q) {
    const int bin = bins - 1 - (static_cast<int>(threadIdx.x) * mine + q);
    if (above < rank && rank <= above + count[q]) {
      state->prefix = (state->prefix << digit.bits) | static_cast<std::uint32_t>(bin);
      state->rank = rank - above;
    }
    above += count[q];
    histogram[bin] = 0;
  }
  if (non_finite) state->non_finite = 1;
}

/// The end of a pass that counted a digit into `histogram`: this block's counts added,
/// and the last block of the grid to get here picks the digit (the threadFenceReduction
/// pattern: every block's adds are visible before its ticket is taken).
__device__ inline void count_then_pick(const std::uint32_t* local, std::uint32_t* histogram, select_state* state,
                                       next_digit digit) {
  for (int b = threadIdx.x; b < top_bins; b += blockDim.x) {
    if (local[b] != 0) atomicAdd(&histogram[b], local[b]);
  }
  if (cuda_launch::last_block_to_finish(&state->finished)) pick_digit(histogram, state, digit);
}

/// Level 0: histogram of the top digit (bits 31..21) of every item's key, and its bin.
template <class Source, class Key>
__global__ void __launch_bounds__(block_threads)
    count_top_digit(Source source, Key key, std::uint32_t* histogram, select_state* state, next_digit digit) {
  __shared__ std::uint32_t local[top_bins];
  for (int b = threadIdx.x; b < top_bins; b += blockDim.x) local[b] = 0;
  __syncthreads();
  for_each_keyed(
      source, key, [&](std::uint32_t, std::uint32_t k) { atomicAdd(&local[k >> 21], 1u); }, [] {});
  __syncthreads();
  count_then_pick(local, histogram, state, digit);
}

/// Levels 1 and 2, and the last split: an item whose key, shifted right by `shift`,
/// is above the prefix is in the top r (appended to `sure`); one equal to it goes to
/// `next`, and the digit of its key at `next_shift` (masked by `next_mask`) to the
/// histogram, whose bin the pass's last block picks. With `equal_is_sure` equal items go
/// to `sure` too (the last split of a select whose keys are unique).
struct split_target {
  std::uint32_t* next;
  std::uint32_t* next_count;
  std::uint32_t* histogram;  // null: no next level
  int next_shift;
  std::uint32_t next_mask;
  std::uint32_t* sure;
  std::uint32_t* sure_count;
  std::uint32_t capacity;  // of `next` (n) and of `sure` (r)
  std::uint32_t sure_capacity;
  bool equal_is_sure;
};

template <class Source, class Key>
__global__ void __launch_bounds__(block_threads)
    split(Source source, Key key, select_state* state, int shift, split_target to) {
  __shared__ std::uint32_t local[top_bins];
  __shared__ block_stage sure;
  __shared__ block_stage next;
  if (to.histogram != nullptr) {
    for (int b = threadIdx.x; b < top_bins; b += blockDim.x) local[b] = 0;
  }
  if (threadIdx.x == 0) sure.count = next.count = 0;
  __syncthreads();
  const std::uint32_t prefix = state->prefix;
  // Writes out each stage whose free room is less than `room_left`: after a round,
  // block_tile (what the next round may add); at the end, stage_room (anything left).
  const auto write_out = [&](std::uint32_t room_left) {
    __syncthreads();  // the round's entries are staged
    const std::uint32_t sure_staged = sure.count;
    const std::uint32_t next_staged = next.count;
    __syncthreads();  // every thread has read both counts
    if (sure_staged > stage_room - room_left) write_staged(sure, sure_staged, to.sure, to.sure_count, to.sure_capacity);
    if (next_staged > stage_room - room_left) write_staged(next, next_staged, to.next, to.next_count, to.capacity);
  };
  for_each_keyed(
      source, key,
      [&](std::uint32_t i, std::uint32_t k) {
        const std::uint32_t high = k >> shift;
        if (high > prefix || (to.equal_is_sure && high == prefix)) {
          append(i, sure.items, &sure.count, stage_room);
        } else if (high == prefix) {
          append(i, next.items, &next.count, stage_room);
          if (to.histogram != nullptr) atomicAdd(&local[(k >> to.next_shift) & to.next_mask], 1u);
        }
      },
      [&] { write_out(block_tile); });
  write_out(stage_room);  // the rest (write_out synchronizes, so local is complete too)
  if (to.histogram != nullptr) count_then_pick(local, to.histogram, state, {__popc(to.next_mask), ~0u});
}

/// Starts a select of the top `rank` (from host) or of as many as another select's
/// rank says (its ties: `from` not null). (A template so that a header can define it:
/// see detail/cuda/launch.cuh.)
template <class = void>
__global__ void begin_select(select_state* state, std::uint32_t rank, const select_state* from) {
  state->prefix = 0;
  state->rank = from != nullptr ? from->rank : rank;
  state->non_finite = 0;
  for (auto& c : state->counts) c = 0;
  state->finished = 0;
}

/// Ends a select of the top `k`: its count and its non-finite flag into the step's
/// status.
template <class = void>
__global__ void finish_select(const select_state* state, std::uint32_t k, step_status* status) {
  status->count = k;
  if (state->non_finite != 0) status->non_finite = 1;
}

}  // namespace detail::cuda_radix
GRADCOMP_NAMESPACE_END
