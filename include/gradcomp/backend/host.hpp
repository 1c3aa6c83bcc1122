/// \file backend/host.hpp
/// The default backend: host memory, OpenMP threads when the program is built with
/// OpenMP, a plain loop otherwise.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/error.hpp>

#include <algorithm>
#include <cstddef>
#include <vector>

#if GRADCOMP_HAS_OPENMP
#include <omp.h>
#endif

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

/// Elements per work unit of the host backend. Sized so that the arrays a corrector
/// touches for one chunk (old state, gradient, new state) stay in a 512 KiB L2 and the
/// selector's first pass re-reads the chunk from cache (see compressor::compress).
inline constexpr std::size_t host_chunk = std::size_t{1} << 15;

inline std::size_t chunk_count(std::size_t n) noexcept { return (n + host_chunk - 1) / host_chunk; }

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

/// Calls `body(thread, chunk, begin, end)` for every chunk of [0, n), chunks spread
/// statically over `threads` threads. `body` must not throw.
template <class Body>
void for_each_chunk(int threads, std::size_t n, Body&& body) {
  const auto chunks = static_cast<std::ptrdiff_t>(chunk_count(n));
#if GRADCOMP_HAS_OPENMP
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && chunks > 1)
#endif
  for (std::ptrdiff_t c = 0; c < chunks; ++c) {
#if GRADCOMP_HAS_OPENMP
    const int thread = omp_get_thread_num();
#else
    const int thread = 0;
#endif
    const std::size_t begin = static_cast<std::size_t>(c) * host_chunk;
    body(thread, static_cast<std::size_t>(c), begin, std::min(n, begin + host_chunk));
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

/// Runs gradcomp on the CPU. Work is cut into fixed chunks that do not depend on the
/// number of threads, and every reduction combines chunks in index order, so results
/// are bit-identical whatever `threads` is.
struct host {
  /// Worker threads; 0 means OpenMP's default (`omp_get_max_threads()`), and builds
  /// without OpenMP always use one.
  int threads = 0;

  /// Owning, contiguous host storage for compressor state and workspace.
  template <class T>
  using buffer = std::vector<T>;

  /// Allocates `count` value-initialised elements.
  template <class T>
  [[nodiscard]] buffer<T> allocate(std::size_t count) const {
    return buffer<T>(count);
  }

  /// Calls `body(i)` for every i in [0, n), over the backend's threads in fixed chunks.
  /// `body` must not throw.
  template <class Body>
  void for_each(std::size_t n, const Body& body) const {
    detail::for_each_chunk(concurrency(), n, [&](int, std::size_t, std::size_t begin, std::size_t end) {
      for (std::size_t i = begin; i < end; ++i) body(i);
    });
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
