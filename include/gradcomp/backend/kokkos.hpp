/// \file backend/kokkos.hpp
/// Runs gradcomp on any Kokkos execution space (Kokkos 3.4 and later).
///
/// Needs Kokkos headers (CMake: link gradcomp::kokkos). Every policy runs with Kokkos
/// parallel patterns and gives results identical to backend::host. Gradients, dense
/// outputs and compressor state live in the execution space's memory; messages are
/// written to and read from host memory, where the communication layer wants them.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/error.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

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

  /// Calls `body(i)` for every i in [0, n) on the instance, then waits for it. `body`
  /// must be callable in the space (GRADCOMP_HOST_DEVICE) and must not throw.
  template <class Body>
  void for_each(std::size_t n, const Body& body) const {
    Kokkos::parallel_for("gradcomp::for_each", Kokkos::RangePolicy<ExecSpace>(space, 0, n), index_body<Body>{body});
    space.fence();
  }

 private:
  // Kokkos hands a range policy's body a signed index.
  template <class Body>
  struct index_body {
    Body body;
    KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const { body(static_cast<std::size_t>(i)); }
  };
};

}  // namespace backend

/// The contiguous memory of a rank-1 View as a span (in the View's memory space).
/// \throws gradcomp::error if the View is not contiguous (e.g. a strided subview).
template <class View>
auto as_span(const View& v) {
  static_assert(Kokkos::is_view<View>::value, "gradcomp::as_span: the argument must be a Kokkos::View");
  static_assert(View::rank == 1, "gradcomp::as_span: only rank-1 Views hold a gradient or a dense tensor");
  detail::require(v.span_is_contiguous(), errc::invalid_argument, "as_span: View \"", v.label(),
                  "\" is not contiguous (a strided layout or subview); copy it into a contiguous View first");
  return std::span<typename View::value_type>(v.data(), v.extent(0));
}

GRADCOMP_NAMESPACE_END


// The engines, after the backend type they specialise for (they include this header too).
#include <gradcomp/detail/kokkos/correctors.hpp>
#include <gradcomp/detail/kokkos/index_value.hpp>
#include <gradcomp/detail/kokkos/selectors.hpp>
