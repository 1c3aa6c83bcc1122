/// \file detail/host/select_chunk_local.hpp
/// select::chunk_local on backend::host, inside the corrector's pass: each tile
/// handles the bins that lie wholly in it; the few bins that straddle two tiles are
/// handled in select() as their lists are concatenated.
#pragma once

#include <gradcomp/detail/host/backend.hpp>
#include <gradcomp/concepts.hpp>
#include <gradcomp/detail/select/chunk_local_bin.hpp>
#include <gradcomp/detail/host/slices.hpp>
#include <gradcomp/detail/core/radix_select.hpp>
#include <gradcomp/detail/core/step_input.hpp>
#include <gradcomp/select/chunk_local.hpp>
#include <gradcomp/held_memory.hpp>

#include <algorithm>
#include <utility>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

template <>
struct has_fast_path<select::chunk_local, backend::host> : std::true_type {};

template <>
class fast_engine<select::chunk_local, backend::host> {
 public:
  static constexpr bool checks_finite = true;  // every bin's maximum is computed

  fast_engine(const backend::host& be, const select::chunk_local&, std::size_t n)
      : threads_(be.concurrency()), n_(n), slices_(n), block_counts_(static_cast<std::size_t>(threads_)) {}

  void begin_observe(const backend::host&, const select::chunk_local& policy, std::uint64_t) noexcept {
    bin_ = policy.bin_for(n_);
    observed_ = true;
    observe_bad_ = {};
  }
  // acc and g are the tile's; bins are aligned to multiples of bin_ in the tensor.
  void observe(int, std::size_t begin, std::span<const float> acc, std::span<const float> g) noexcept {
    bool tile_bad = false;
    observe_tile(begin, acc, g, tile_bad);
    if (tile_bad) observe_bad_.raise();
  }

  /// Selects at once (the pass, or what observe() collected in the corrector's): the
  /// indices into out, their count and NaN verdict into the status (host memory).
  queued_selection select(const backend::host& be, const select::chunk_local& policy, const select_input& in,
                          std::span<std::uint32_t> out, step_status* status) {
    threads_ = be.concurrency();  // the call's context: at most the constructor's (block_counts_)
    return record_selection(select_now(policy, in, out), status);
  }
  void accept() noexcept {}
  void add_held(held_memory& use) const { use.workspace += slices_.held_bytes() + bytes_held(block_counts_); }

 private:
  selection select_now(const select::chunk_local& policy, const select_input& in, std::span<std::uint32_t> out) {
    if (!std::exchange(observed_, false)) return select_in_place(policy.bin_for(n_), in, out);
    bool straddle_bad = false;
    std::uint32_t* w = out.data();
    for (std::size_t c = 0; c < slices_.tiles(); ++c) {
      std::copy_n(slices_.slice(c), slices_.count(c), w);
      w += slices_.count(c);
      // The bin that starts in this tile and ends in a later one.
      const std::size_t tile_end = std::min(n_, (c + 1) * host_tile);
      const std::size_t b = (tile_end - 1) / bin_ * bin_;
      if (b >= c * host_tile && std::min(b + bin_, n_) > tile_end) {
        w = select_bin(in.acc.data() + b, in.grad.data() + b, std::min(b + bin_, n_) - b, b, w, out.data() + out.size(),
                       straddle_bad);
      }
    }
    return {static_cast<std::size_t>(w - out.data()), 1.0f, !observe_bad_.raised() && !straddle_bad};
  }

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

  // The bins that lie wholly inside the tile starting at `begin`.
  void observe_tile(std::size_t begin, std::span<const float> acc, std::span<const float> g, bool& bad) noexcept {
    const std::size_t end = begin + acc.size();
    std::uint32_t* out = slices_.slice(begin / host_tile);
    std::uint32_t* const first = out;
    for (std::size_t b = (begin + bin_ - 1) / bin_ * bin_; b < end; b += bin_) {
      const std::size_t stop = std::min(b + bin_, n_);
      if (stop > end) break;  // straddles into the next tile: select() does it
      out = select_bin(acc.data() + (b - begin), g.data() + (b - begin), stop - b, b, out, first + acc.size(), bad);
    }
    slices_.set_count(begin / host_tile, static_cast<std::size_t>(out - first));
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
