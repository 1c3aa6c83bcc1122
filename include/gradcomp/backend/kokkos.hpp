/// \file backend/kokkos.hpp
/// Runs gradcomp on any Kokkos execution space (Kokkos 3.4 and later).
///
/// Needs Kokkos headers (CMake: link gradcomp::kokkos). Every policy runs with Kokkos
/// parallel patterns and gives results identical to backend::host. Gradients, dense
/// outputs and compressor state live in the execution space's memory; messages are
/// written to and read from host memory, where the communication layer wants them.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/detail/core/expansion.hpp>
#include <gradcomp/detail/core/fixed_order_sum.hpp>
#include <gradcomp/detail/kokkos/primitives.hpp>
#include <gradcomp/detail/core/radix_select.hpp>
#include <gradcomp/error.hpp>
#include <gradcomp/memory.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>

GRADCOMP_NAMESPACE_BEGIN
namespace backend {

/// gradcomp on a Kokkos execution space instance (its stream, on Kokkos::Cuda).
template <class ExecSpace = Kokkos::DefaultExecutionSpace>
struct kokkos {
  using execution_space = ExecSpace;                      ///< where kernels run
  using memory_space = typename ExecSpace::memory_space;  ///< where state and workspace live

  ExecSpace space{};  ///< the instance every kernel runs on

  /// Owning, contiguous storage in the space's memory.
  template <class T>
  using buffer = Kokkos::View<T*, memory_space>;

  /// Allocates `count` zero-initialised elements.
  template <class T>
  [[nodiscard]] buffer<T> allocate(std::size_t count) const {
    buffer<T> b(Kokkos::view_alloc(std::string("gradcomp"), space), count);
    space.fence();
    return b;
  }
  /// Allocates `count` elements for a step to write before it reads them
  /// (detail::allocate_scratch): not initialised, nothing waited for.
  template <class T>
  [[nodiscard]] buffer<T> allocate_scratch(std::size_t count) const {
    return buffer<T>(Kokkos::view_alloc(std::string("gradcomp scratch"), space, Kokkos::WithoutInitializing), count);
  }

  /// Calls `body(i)` for every i in [0, n) on the instance, then waits for it. `body`
  /// must be callable in the space (GRADCOMP_HOST_DEVICE) and must not throw.
  template <class Body>
  void for_each(std::size_t n, const Body& body) const {
    Kokkos::parallel_for("gradcomp::for_each", range(n), index_body<Body>{body});
    space.fence();
  }

  /// Calls `body(i)` -> std::uint32_t for every i in [0, n) and ORs the results into
  /// `*bits` (space memory, never cleared here); returns when done.
  template <class Body>
  void reduce_or(std::size_t n, const Body& body, std::uint32_t* bits) const {
    // A reduction (which vectorises; a conditional atomic in the loop does not), then
    // one read-modify-write of *bits when something was seen.
    std::uint32_t seen = 0;
    Kokkos::parallel_reduce("gradcomp::reduce_or", range(n), or_body<Body>{body}, Kokkos::BOr<std::uint32_t>(seen));
    if (seen != 0) {
      const std::uint32_t now = read(bits) | seen;
      to_device(&now, 1, bits);
    }
  }

  /// Calls `body(i)` -> std::uint32_t for every i in [0, n) and raises `*word` (space
  /// memory, never lowered here) to the largest result; returns when done.
  template <class Body>
  void reduce_max(std::size_t n, const Body& body, std::uint32_t* word) const {
    std::uint32_t largest = 0;
    Kokkos::parallel_reduce("gradcomp::reduce_max", range(n), max_body<Body>{body},
                            Kokkos::Max<std::uint32_t>(largest));
    if (largest > read(word)) to_device(&largest, 1, word);
  }

  /// Adds 1 to counts[bin_of(i)] for every i in [0, n) whose bin is not detail::no_bin
  /// (atomic increments); `counts` is space memory, never cleared here. Waits.
  template <class BinOf>
  void histogram(std::size_t n, const BinOf& bin_of, std::uint32_t* counts) const {
    Kokkos::parallel_for("gradcomp::histogram", range(n), histogram_body<BinOf>{bin_of, counts});
    space.fence();
  }

  /// Writes to `*total` (space memory) the sum of `term(i)` (a double) over [0, n) in
  /// the order of detail/core/fixed_order_sum.hpp; `tile` is workspace of tile_count(n)
  /// doubles in space memory. Waits.
  template <class Term>
  void sum(std::size_t n, const Term& term, double* tile, double* total) const {
    const std::size_t tiles = detail::tile_count(n);
    Kokkos::parallel_for("gradcomp::tile_sums", range(tiles), tile_sum_body<Term>{term, n, tile});
    Kokkos::parallel_for("gradcomp::sum_of_tiles", range(1), tiles_total{tile, tiles, total});
    space.fence();
  }

  /// Bytes of workspace that compact() needs: none (Kokkos scans without it).
  template <class Keep>
  [[nodiscard]] std::size_t compact_workspace(std::size_t) const {
    return 0;
  }
  /// Writes the indices i < n with keep(i), ascending, to `out` (room for every kept
  /// index) and their number to `*count` (space memory), by one parallel_scan. Waits.
  template <class Keep>
  void compact(std::size_t n, const Keep& keep, std::uint32_t* out, std::span<std::byte>, std::uint32_t* count) const {
    if (n == 0) return clear(count, 1);
    if constexpr (detail::kk::has_fast_compaction<Keep>::value) {  // e.g. a SIMD-masked threshold (bench_kokkos)
      const std::uint32_t kept = detail::kk::fast_compaction(space, n, keep, out);
      to_device(&kept, 1, count);
    } else {
      expand(n, detail::kept_index<Keep>{keep}, out, {}, count);
    }
  }

  /// Bytes of workspace that expand() needs: none (Kokkos scans without it).
  [[nodiscard]] std::size_t expand_workspace(std::size_t) const { return 0; }
  /// Ordered expansion: item b < m makes body(b, at) -> std::size_t outputs, written
  /// from `at` on, or only counted when `at` is null; the outputs land in `out` in item
  /// order and their number in `*count` (space memory), by one parallel_scan. Waits.
  template <class Body>
  void expand(std::size_t m, const Body& body, std::uint32_t* out, std::span<std::byte>, std::uint32_t* count) const {
    if (m == 0) return clear(count, 1);
    Kokkos::parallel_scan("gradcomp::expand", range(m), expand_body<Body>{body, out, count, m});
    space.fence();
  }

  /// Whether the host may read and write the space's memory directly.
  static constexpr bool host_accessible = Kokkos::SpaceAccessibility<Kokkos::HostSpace, memory_space>::accessible;
  /// Gradients, state and dense tensors: std::span where the host may touch the space's
  /// memory, device_span where it may not (Kokkos::Cuda's).
  using memory = std::conditional_t<host_accessible, host_memory, device_memory>;
  /// Messages are written to and read from host memory, where the communication layer
  /// wants them (std::span, gradcomp::message).
  using message_memory = host_memory;

  /// Sets `count` elements at `p` (space memory) to zero, then waits.
  template <class T>
  void clear(T* p, std::size_t count) const {
    Kokkos::parallel_for("gradcomp::clear", range(count), clear_body<T>{p});
    space.fence();
  }
  /// Waits for the instance and returns the value at `p` (space memory).
  template <class T>
  [[nodiscard]] T read(const T* p) const {
    T value{};
    to_host(p, 1, &value);
    return value;
  }
  /// Copies `count` elements at `from` (space memory) to host memory at `to`.
  template <class T>
  void to_host(const T* from, std::size_t count, T* to) const {
    Kokkos::deep_copy(space, host_view<T>(to, count), space_view<const T>(from, count));
    space.fence();
  }
  /// Copies `count` elements of host memory at `from` to space memory at `to`.
  template <class T>
  void to_device(const T* from, std::size_t count, T* to) const {
    Kokkos::deep_copy(space, space_view<T>(to, count), host_view<const T>(from, count));
    space.fence();
  }

 private:
  template <class T>
  using space_view = Kokkos::View<T*, memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  template <class T>
  using host_view = Kokkos::View<T*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

  Kokkos::RangePolicy<ExecSpace> range(std::size_t n) const { return Kokkos::RangePolicy<ExecSpace>(space, 0, n); }

  // Kokkos hands a range policy's body a signed index.
  template <class Body>
  struct index_body {
    Body body;
    KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const { body(static_cast<std::size_t>(i)); }
  };
  template <class Body>
  struct or_body {
    Body body;
    KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i, std::uint32_t& seen) const {
      seen |= body(static_cast<std::size_t>(i));
    }
  };
  template <class Body>
  struct max_body {
    Body body;
    KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i, std::uint32_t& largest) const {
      const std::uint32_t v = body(static_cast<std::size_t>(i));
      if (v > largest) largest = v;
    }
  };
  template <class BinOf>
  struct histogram_body {
    BinOf bin_of;
    std::uint32_t* counts;
    KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const {
      const std::size_t bin = bin_of(static_cast<std::size_t>(i));
      if (bin != detail::no_bin) Kokkos::atomic_increment(counts + bin);
    }
  };
  template <class Term>
  struct tile_sum_body {
    Term term;
    std::size_t n;
    double* tile;
    KOKKOS_INLINE_FUNCTION void operator()(std::int64_t c) const {
      const std::size_t begin = static_cast<std::size_t>(c) * detail::host_tile;
      const std::size_t end = begin + detail::host_tile < n ? begin + detail::host_tile : n;
      tile[c] = detail::tile_sum(term, begin, end);
    }
  };
  template <class Body>
  struct expand_body {
    using value_type = std::size_t;
    Body body;
    std::uint32_t* out;
    std::uint32_t* count;
    std::size_t m;
    KOKKOS_INLINE_FUNCTION void operator()(std::int64_t b, std::size_t& at, bool final) const {
      at += body(static_cast<std::size_t>(b), final ? out + at : nullptr);
      if (final && static_cast<std::size_t>(b) + 1 == m)
        *count = static_cast<std::uint32_t>(at);  // the last item knows the total
    }
  };
  struct tiles_total {
    const double* tile;
    std::size_t tiles;
    double* total;
    KOKKOS_INLINE_FUNCTION void operator()(std::int64_t) const { *total = detail::sum_of_tiles(tile, tiles); }
  };
  template <class T>
  struct clear_body {
    T* p;
    KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const { p[i] = T{}; }
  };
};

}  // namespace backend

/// The contiguous memory of a rank-1 View as a view that says where it lives: a std::span
/// where the host may touch the View's memory, else a device_span.
/// \throws gradcomp::error if the View is not contiguous (e.g. a strided subview).
template <class View>
auto as_span(const View& v) {
  static_assert(Kokkos::is_view<View>::value, "gradcomp::as_span: the argument must be a Kokkos::View");
  static_assert(View::rank == 1, "gradcomp::as_span: only rank-1 Views hold a gradient or a dense tensor");
  detail::require(v.span_is_contiguous(), errc::invalid_argument, "as_span: View \"", v.label(),
                  "\" is not contiguous (a strided layout or subview); copy it into a contiguous View first");
  using memory_space = typename View::memory_space;
  using where = std::conditional_t<Kokkos::SpaceAccessibility<Kokkos::HostSpace, memory_space>::accessible, host_memory,
                                   device_memory>;
  return span_in<where, typename View::value_type>(v.data(), v.extent(0));
}

GRADCOMP_NAMESPACE_END
