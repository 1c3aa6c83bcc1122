/// \file detail/host/backend.hpp
/// backend::host and its primitives, without its fast paths: what the fast paths of
/// detail/host/ build on. Include backend/host.hpp, which adds them.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/detail/core/expansion.hpp>
#include <gradcomp/detail/core/fixed_order_sum.hpp>
#include <gradcomp/error.hpp>
#include <gradcomp/memory.hpp>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#if GRADCOMP_HAS_OPENMP
#include <omp.h>
#endif

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

/// A flag any thread of a parallel region may raise (a NaN seen, say).
class shared_flag {
 public:
  void raise() noexcept {
#if GRADCOMP_HAS_OPENMP
#pragma omp atomic write
#endif
    value_ = 1;
  }
  [[nodiscard]] bool raised() const noexcept { return value_ != 0; }

 private:
  int value_ = 0;
};

/// Calls `body(thread, tile, begin, end)` for every tile of [0, n), tiles spread
/// statically over `threads` threads. `body` must not throw.
template <class Body>
void for_each_tile(int threads, std::size_t n, Body&& body) {
  const auto tiles = static_cast<std::ptrdiff_t>(tile_count(n));
#if GRADCOMP_HAS_OPENMP
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && tiles > 1)
#endif
  for (std::ptrdiff_t c = 0; c < tiles; ++c) {
#if GRADCOMP_HAS_OPENMP
    const int thread = omp_get_thread_num();
#else
    const int thread = 0;
#endif
    const std::size_t begin = static_cast<std::size_t>(c) * host_tile;
    body(thread, static_cast<std::size_t>(c), begin, std::min(n, begin + host_tile));
  }
  (void)threads;
}

/// The `block`-th of `blocks` contiguous, near-equal parts of [0, count).
struct block_range {
  std::size_t first, last;
  block_range(int block, int blocks, std::size_t count) noexcept
      : first(count * static_cast<std::size_t>(block) / static_cast<std::size_t>(blocks)),
        last(count * static_cast<std::size_t>(block + 1) / static_cast<std::size_t>(blocks)) {}
};

/// Calls `body(block, range)` for `blocks` contiguous parts of [0, count), one thread
/// each: for work whose output position depends on everything before it, so that each
/// thread writes one contiguous run. `body` must not throw.
template <class Body>
void for_each_block(int blocks, std::size_t count, Body&& body) {
#if GRADCOMP_HAS_OPENMP
#pragma omp parallel for schedule(static, 1) num_threads(blocks) if (blocks > 1)
#endif
  for (int b = 0; b < blocks; ++b) body(b, block_range(b, blocks, count));
}

}  // namespace detail

namespace backend {

/// Runs gradcomp on the CPU. Work is cut into fixed tiles that do not depend on the
/// number of threads, and every reduction combines tiles in index order, so results
/// are bit-identical whatever `threads` is.
struct host {
  /// Worker threads; 0 means OpenMP's default (`omp_get_max_threads()` when a compressor
  /// is made: resolved()), and builds without OpenMP always use one.
  int threads = 0;

  /// Owning, contiguous host storage for compressor state and workspace.
  template <class T>
  using buffer = std::vector<T>;

  /// Allocates `count` value-initialised elements.
  template <class T>
  [[nodiscard]] buffer<T> allocate(std::size_t count) const {
    return buffer<T>(count);
  }

  /// Calls `body(i)` for every i in [0, n), over the backend's threads in fixed tiles.
  /// `body` must not throw.
  template <class Body>
  void for_each(std::size_t n, const Body& body) const {
    detail::for_each_tile(concurrency(), n, [&](int, std::size_t, std::size_t begin, std::size_t end) {
      // A copy that the body's stores cannot alias (a store through a std::byte* may
      // reach any object whose address escaped): its members stay in registers.
      const Body local = body;
      for (std::size_t i = begin; i < end; ++i) local(i);
    });
  }

  /// Calls `body(i)` -> std::uint32_t for every i in [0, n) and ORs the results into
  /// `*bits` (which it never clears): a pass that also raises a flag, a NaN seen, say.
  template <class Body>
  void reduce_or(std::size_t n, const Body& body, std::uint32_t* bits) const {
    detail::for_each_tile(concurrency(), n, [&](int, std::size_t, std::size_t begin, std::size_t end) {
      std::uint32_t seen = 0;
      for (std::size_t i = begin; i < end; ++i) seen |= body(i);
      if (seen != 0) {
#if GRADCOMP_HAS_OPENMP
#pragma omp atomic
#endif
        *bits |= seen;
      }
    });
  }

  /// Calls `body(i)` -> std::uint32_t for every i in [0, n) and raises `*word` (which it
  /// never lowers) to the largest result.
  template <class Body>
  void reduce_max(std::size_t n, const Body& body, std::uint32_t* word) const {
    detail::for_each_tile(concurrency(), n, [&](int, std::size_t, std::size_t begin, std::size_t end) {
      std::uint32_t largest = 0;
      for (std::size_t i = begin; i < end; ++i) largest = std::max(largest, body(i));
      std::atomic_ref<std::uint32_t> shared(*word);
      for (std::uint32_t seen = shared.load(); seen < largest && !shared.compare_exchange_weak(seen, largest);) {
      }
    });
  }

  /// Adds 1 to counts[bin_of(i)] for every i in [0, n) whose bin is not detail::no_bin;
  /// `counts` is never cleared here.
  template <class BinOf>
  void histogram(std::size_t n, const BinOf& bin_of, std::uint32_t* counts) const {
    detail::for_each_tile(concurrency(), n, [&](int, std::size_t, std::size_t begin, std::size_t end) {
      for (std::size_t i = begin; i < end; ++i) {
        const std::size_t bin = bin_of(i);
        if (bin == detail::no_bin) continue;
#if GRADCOMP_HAS_OPENMP
#pragma omp atomic
#endif
        ++counts[bin];
      }
    });
  }

  /// Writes to `*total` the sum of `term(i)` (a double) over [0, n), added in the order
  /// of detail/core/fixed_order_sum.hpp that every backend shares. `tile` is workspace of
  /// tile_count(n) doubles.
  template <class Term>
  void sum(std::size_t n, const Term& term, double* tile, double* total) const {
    detail::for_each_tile(concurrency(), n, [&](int, std::size_t c, std::size_t begin, std::size_t end) {
      tile[c] = detail::tile_sum(term, begin, end);
    });
    *total = detail::sum_of_tiles(tile, detail::tile_count(n));
  }

  /// Bytes of workspace that expand() needs for m items.
  [[nodiscard]] std::size_t expand_workspace(std::size_t m) const {
    return detail::tile_count(m) * sizeof(std::size_t);
  }
  /// Ordered expansion: item b < m makes body(b, at) -> std::size_t outputs, written
  /// from `at` on, or only counted when `at` is null; the outputs land in `out` in item
  /// order and their number in `*count`. Each tile of items counts, an exclusive scan
  /// of the counts gives each tile where it writes, each tile writes. `workspace`
  /// holds expand_workspace(m) bytes.
  template <class Body>
  void expand(std::size_t m, const Body& body, std::uint32_t* out, std::span<std::byte> workspace,
              std::uint32_t* count) const {
    auto* at = reinterpret_cast<std::size_t*>(workspace.data());  // allocation-aligned bytes, reused as counts
    const int workers = concurrency();
    detail::for_each_tile(workers, m, [&](int, std::size_t c, std::size_t begin, std::size_t end) {
      std::size_t made = 0;
      for (std::size_t b = begin; b < end; ++b) made += body(b, nullptr);
      at[c] = made;
    });
    std::size_t total = 0;
    for (std::size_t c = 0; c < detail::tile_count(m); ++c) total += std::exchange(at[c], total);
    detail::for_each_tile(workers, m, [&](int, std::size_t c, std::size_t begin, std::size_t end) {
      std::size_t w = at[c];
      for (std::size_t b = begin; b < end; ++b) w += body(b, out + w);
    });
    *count = static_cast<std::uint32_t>(total);
  }

  /// Bytes of workspace that compact() needs for n indices.
  template <class Keep>
  [[nodiscard]] std::size_t compact_workspace(std::size_t n) const {
    return expand_workspace(n);
  }
  /// Writes the indices i < n with keep(i), ascending, to `out` (room for every kept
  /// index) and their number to `*count`: the expansion in which index i makes itself
  /// if kept. `workspace` holds compact_workspace<Keep>(n) bytes.
  template <class Keep>
  void compact(std::size_t n, const Keep& keep, std::uint32_t* out, std::span<std::byte> workspace,
               std::uint32_t* count) const {
    expand(n, detail::kept_index<Keep>{keep}, out, workspace, count);
  }

  /// Memory of this backend is host memory: read() and the copies are plain accesses.
  static constexpr bool host_accessible = true;
  /// Gradients, state and dense tensors are host memory (std::span).
  using memory = host_memory;
  /// Messages are host memory (std::span, gradcomp::message).
  using message_memory = host_memory;

  /// Sets `count` elements at `p` to zero.
  template <class T>
  void clear(T* p, std::size_t count) const {
    std::fill(p, p + count, T{});
  }
  /// The value at `p`.
  template <class T>
  [[nodiscard]] T read(const T* p) const {
    return *p;
  }
  /// Copies `count` elements of this backend's memory at `from` to host memory at `to`.
  template <class T>
  void to_host(const T* from, std::size_t count, T* to) const {
    std::copy(from, from + count, to);
  }
  /// Copies `count` elements of host memory at `from` to this backend's memory at `to`.
  template <class T>
  void to_device(const T* from, std::size_t count, T* to) const {
    std::copy(from, from + count, to);
  }

  /// This backend with its threads settled for a compressor made now: `threads` 0
  /// becomes OpenMP's default at this moment, which sizes the compressor's per-thread
  /// workspace, and stays its count whatever omp_set_num_threads does later (a call with
  /// more threads than that would index past the workspace).
  [[nodiscard]] host resolved(const char* /*who*/) const { return host{.threads = concurrency()}; }

  /// `context` checked as the execution context of one call of a compressor made with
  /// this backend (resolved): it may use at most this backend's threads, for which the
  /// compressor sized its per-thread workspace. A context of `threads` 0 takes OpenMP's
  /// default of the calling thread, at most that many.
  /// \throws gradcomp::error (invalid_argument) naming both if the context names more.
  [[nodiscard]] host context_for(const char* who, const host& context) const {
    const int mine = concurrency();
    if (context.threads == 0) return host{.threads = std::min(mine, context.concurrency())};
    const int theirs = context.concurrency();
    detail::require(theirs <= mine, errc::invalid_argument, who, ": the context's threads = ", context.threads, " (",
                    theirs, " threads) exceed the ", mine, " the compressor was made with, which sized its workspace");
    return context;
  }

  /// Threads that a parallel region of this backend uses.
  [[nodiscard]] int concurrency() const {
    detail::require(threads >= 0, errc::invalid_argument, "backend::host::threads must be >= 0, got ", threads);
#if GRADCOMP_HAS_OPENMP
    return threads == 0 ? omp_get_max_threads() : threads;
#else
    return 1;
#endif
  }
};

}  // namespace backend
GRADCOMP_NAMESPACE_END
