/// \file detail/cuda/select_exact_topk.cuh
/// select::exact_topk on backend::cuda: a radix select of the k-th largest magnitude
/// (detail/cuda/radix_topk.cuh), a second radix select among the entries equal to it
/// that keeps the lowest indices, then a radix sort of the k chosen indices so that they
/// ascend (by one block where they fit in it, else by CUB's device sort). The same
/// indices as backend::host. Not API.
#pragma once

#include <gradcomp/detail/cuda/backend.cuh>
#include <gradcomp/concepts.hpp>
#include <gradcomp/detail/cuda/device_buffer.cuh>
#include <gradcomp/detail/cuda/launch.cuh>
#include <gradcomp/detail/cuda/radix_topk.cuh>
#include <gradcomp/detail/core/radix_select.hpp>
#include <gradcomp/detail/core/step_input.hpp>
#include <gradcomp/select/exact_topk.hpp>
#include <gradcomp/held_memory.hpp>

#include <cub/block/block_radix_sort.cuh>
#include <cub/device/device_radix_sort.cuh>
#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {
namespace cuda_radix {

/// One block of block_sort_threads sorts up to block_sort_keys keys. Below that a
/// step's k (6,500 in a 25 MB bucket at density 0.001) is sorted in one launch, where
/// CUB's device sort takes five (about 8 us each for 6,500 keys on the H200, 2026-11-27).
inline constexpr int block_sort_threads = 512;
inline constexpr int block_sort_items = 16;
inline constexpr std::uint32_t block_sort_keys = block_sort_threads * block_sort_items;

/// Sorts the `count` (at most block_sort_keys) distinct keys of `in`, each below 2^bits,
/// ascending into `out`, in one block.
template <class = void>
__global__ void __launch_bounds__(block_sort_threads)
    sort_in_one_block(const std::uint32_t* in, std::uint32_t count, int bits, std::uint32_t* out) {
  using sorter = cub::BlockRadixSort<std::uint32_t, block_sort_threads, block_sort_items>;
  __shared__ typename sorter::TempStorage scratch;
  std::uint32_t keys[block_sort_items];
  // A sort takes its keys in any arrangement: each thread loads every
  // block_sort_threads-th one (coalesced). The padding, ~0, sorts after every key once
  // one bit more than the keys have is compared.
#pragma unroll
  for (int q = 0; q < block_sort_items; ++q) {
    const std::uint32_t j = static_cast<std::uint32_t>(q * block_sort_threads) + threadIdx.x;
    keys[q] = j < count ? in[j] : ~0u;
  }
  sorter(scratch).SortBlockedToStriped(keys, 0, bits < 32 ? bits + 1 : 32);
#pragma unroll
  for (int q = 0; q < block_sort_items; ++q) {
    const std::uint32_t j = static_cast<std::uint32_t>(q * block_sort_threads) + threadIdx.x;
    if (j < count) out[j] = keys[q];
  }
}

}  // namespace cuda_radix

template <>
struct has_fast_path<select::exact_topk, backend::cuda> : std::true_type {};

template <>
class fast_engine<select::exact_topk, backend::cuda> {
 public:
  static constexpr bool checks_finite = true;     // the top digit's histogram counts NaN and infinity keys
  static constexpr bool runs_update_pass = true;  // select(..., pass) computes acc in its counting pass

  fast_engine(const backend::cuda& be, const select::exact_topk& policy, std::size_t n)
      : allocate_from_(be),
        n_(static_cast<std::uint32_t>(n)),
        grid_(cuda_launch::grid_for(n)),
        histogram_(be.template allocate<std::uint32_t>(cuda_radix::top_bins)),
        states_(be.template allocate<cuda_radix::select_state>(2)),
        list_a_(be.template allocate<std::uint32_t>(n)),
        list_b_(be.template allocate<std::uint32_t>(n)) {
    reserve(policy);
  }

  /// Sizes the chosen list and the sort's scratch for the policy's k (constructor and
  /// set_density only: select never allocates).
  void reserve(const select::exact_topk& policy) {
    const std::size_t k = policy.k(n_);
    if (k <= chosen_.size()) return;
    std::size_t bytes = 0;  // CUB's device sort's scratch, where one block cannot sort k
    if (k > cuda_radix::block_sort_keys) {
      cuda_check(
          cub::DeviceRadixSort::SortKeys(nullptr, bytes, static_cast<const std::uint32_t*>(nullptr),
                                         static_cast<std::uint32_t*>(nullptr), static_cast<int>(k), 0, index_bits()),
          "cub::DeviceRadixSort::SortKeys (scratch size)");
    }
    auto chosen = allocate_from_.template allocate<std::uint32_t>(k);
    auto sort_scratch = allocate_from_.template allocate<std::byte>(std::max<std::size_t>(bytes, 1));
    chosen_ = std::move(chosen);
    sort_scratch_ = std::move(sort_scratch);
  }

  /// Queues the selection of the k entries of largest |acc| on the stream: their
  /// indices, ascending, in out[0, k) (device memory); k into the status, and its
  /// non-finite flag if acc held a NaN or infinity. Waits for nothing.
  queued_selection select(const backend::cuda& be, const select::exact_topk& policy, const select_input& in,
                          std::span<std::uint32_t> out, step_status* status) {
    return select_counting(be, policy, out, status, cuda_radix::magnitude_key_of{in.acc.data()}, in.acc.data());
  }
  /// The same, with acc written by the corrector's pass `update` (its written_acc(i)
  /// writes the step's state and acc at i and returns acc_i: correction::update_pass) in
  /// the first pass over acc, which counts each magnitude as it computes it: the
  /// corrector's own pass would write acc and this one read it again. A NaN or infinity in
  /// acc raises the status's flag, as the corrector's pass would.
  template <class Update>
  queued_selection select(const backend::cuda& be, const select::exact_topk& policy, const select_input& in,
                          std::span<std::uint32_t> out, step_status* status, const Update& update) {
    return select_counting(be, policy, out, status, cuda_radix::written_magnitude_key<Update>{{update}}, in.acc.data());
  }

  /// The number of entries every step selects (compress_async needs it on the host).
  [[nodiscard]] std::size_t fixed_count(const select::exact_topk& policy) const noexcept { return policy.k(n_); }

  void accept() noexcept {}
  void add_held(held_memory& use) const {
    use.workspace += bytes_held(histogram_, states_, list_a_, list_b_, chosen_, sort_scratch_);
  }

 private:
  // select()'s work, the magnitudes counted first by `count_key` (acc's, or acc's as the
  // corrector writes it) and read from `acc` after.
  template <class CountKey>
  queued_selection select_counting(const backend::cuda& be, const select::exact_topk& policy,
                                   std::span<std::uint32_t> out, step_status* status, CountKey count_key,
                                   const float* acc) {
    using namespace cuda_radix;
    const cudaStream_t stream = be.stream;
    const auto k = static_cast<std::uint32_t>(policy.k(n_));
    select_state* magnitude = states_.data();
    select_state* ties = states_.data() + 1;
    std::uint32_t* chosen_count = counts_of(magnitude) + 3;
    // The k-th largest magnitude K: the entries above it go to chosen_, those equal to
    // it to list_a_. Bins from 0x7F800000 >> 21 up hold NaN and infinity keys.
    cuda_launch::launch("exact_topk's begin_select (launch)", begin_select<>, 1, 1, 0, stream, magnitude, k,
                        static_cast<const select_state*>(nullptr));
    radix_select(stream, all_of{n_}, count_key, magnitude_key_of{acc}, magnitude, non_finite_key >> 21, list_a_.data(),
                 list_b_.data(), chosen_count, k, false);
    // Of the entries equal to K, the `rank` lowest indices: the same select on ~index
    // (unique keys), appending to chosen_, which then holds exactly k.
    cuda_launch::launch("exact_topk's begin_select (launch)", begin_select<>, 1, 1, 0, stream, ties, 0u,
                        static_cast<const select_state*>(magnitude));
    radix_select(stream, list_of{list_a_.data(), counts_of(magnitude) + 2}, lower_index_first{}, lower_index_first{},
                 ties, ~0u, list_b_.data(), list_a_.data(), chosen_count, k, true);
    cuda_launch::launch("exact_topk's finish_select (launch)", finish_select<>, 1, 1, 0, stream,
                        static_cast<const select_state*>(magnitude), k, status);

    // The k chosen indices, in the order they were appended: sort them ascending, by the
    // bits an index below n can have set (a pass of CUB's fewer where n < 2^24).
    if (k <= block_sort_keys) {
      cuda_launch::launch("exact_topk's sort (launch)", sort_in_one_block<>, 1, block_sort_threads, 0, stream,
                          static_cast<const std::uint32_t*>(chosen_.data()), k, index_bits(), out.data());
      return {};
    }
    std::size_t bytes = sort_scratch_.size();
    cuda_check(cub::DeviceRadixSort::SortKeys(sort_scratch_.data(), bytes, chosen_.data(), out.data(),
                                              static_cast<int>(k), 0, index_bits(), stream),
               "cub::DeviceRadixSort::SortKeys");
    return {};
  }

  // The three levels of a radix select begun on `state`, over the items of `first` by
  // `key` (counted by `count_key`, which gives the same keys): items above the r-th key
  // are appended to chosen_; the candidates of level 1 go to `level1`, of level 2 to
  // `level2`, and those equal to the r-th key to `level1` again (counts[2] of the state),
  // or to chosen_ with `equal_is_sure`.
  template <class Source, class CountKey, class Key>
  void radix_select(cudaStream_t stream, Source first, CountKey count_key, Key key, cuda_radix::select_state* state,
                    std::uint32_t non_finite_bin, std::uint32_t* level1, std::uint32_t* level2,
                    std::uint32_t* chosen_count, std::uint32_t k, bool equal_is_sure) {
    using namespace cuda_radix;
    std::uint32_t* histogram = histogram_.data();
    std::uint32_t* counts = counts_of(state);
    auto to = [&](std::uint32_t* next, std::uint32_t* next_count, bool last, int next_shift, std::uint32_t mask) {
      return split_target{next, next_count, last ? nullptr : histogram, next_shift, mask, chosen(), chosen_count,
                          n_,   k,          last && equal_is_sure};
    };
    // Each counting pass's last block picks its digit (radix_topk.cuh): four launches.
    const auto run = [&](auto kernel, const auto&... args) {
      cuda_launch::launch("exact_topk's radix select (launch)", kernel, grid_, block_threads, 0, stream, args...);
    };
    run(count_top_digit<Source, CountKey>, first, count_key, histogram, state, next_digit{11, non_finite_bin});
    run(split<Source, Key>, first, key, state, 21, to(level1, counts + 0, false, 10, 0x7FFu));
    run(split<list_of, Key>, list_of{level1, counts + 0}, key, state, 10, to(level2, counts + 1, false, 0, 0x3FFu));
    run(split<list_of, Key>, list_of{level2, counts + 1}, key, state, 0, to(level1, counts + 2, true, 0, 0u));
  }

  std::uint32_t* chosen() noexcept { return chosen_.data(); }
  // The low bits that hold every index below n (at least one).
  [[nodiscard]] int index_bits() const noexcept { return std::max(1, static_cast<int>(std::bit_width(n_ - 1))); }

  backend::cuda allocate_from_;  // the compressor's backend: where reserve() allocates
  std::uint32_t n_;
  unsigned grid_;
  device_buffer<std::uint32_t> histogram_;
  device_buffer<cuda_radix::select_state> states_;
  device_buffer<std::uint32_t> list_a_;
  device_buffer<std::uint32_t> list_b_;
  device_buffer<std::uint32_t> chosen_;
  device_buffer<std::byte> sort_scratch_;
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
