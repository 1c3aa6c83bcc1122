/// \file detail/core/fixed_order_sum.hpp
/// The one order in which every backend adds a sum of doubles (a gradient's squared
/// norm), so that the sum, and all that depends on it, is identical whatever the thread
/// count and on every backend. Not API.
///
/// The order: [0, n) is cut into tiles of host_tile elements; within a tile, lane l
/// (l < 8) adds the terms at offsets l, l + 8, l + 16, ... in turn, the lanes are
/// combined as ((0 + 1) + (2 + 3)) + ((4 + 5) + (6 + 7)), and the tiles' sums are added
/// in tile order. (Eight independent lanes let the host loop vectorise and keep it
/// from waiting on one accumulator; the GPU gives each lane a thread.)
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/float16.hpp>

#include <cstddef>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

/// What a histogram's bin_of returns for an item that counts in no bin (the backends
/// skip it): selections over part of their items need no discard bin, and so no
/// contended counter on a device.
inline constexpr std::size_t no_bin = ~std::size_t{0};

/// Elements per work unit of the host backend, and per tile of the fixed-order sum.
/// Sized so that the arrays a corrector touches for one tile (old state, gradient, new
/// state) stay in a 512 KiB L2 and the selector's first pass re-reads the tile from
/// cache (see compressor::compress).
inline constexpr std::size_t host_tile = std::size_t{1} << 15;

GRADCOMP_HOST_DEVICE inline std::size_t tile_count(std::size_t n) noexcept { return (n + host_tile - 1) / host_tile; }

/// a + b and a * b rounded once each, never contracted into a fused multiply-add by
/// nvcc (which would change the last bit against the host).
GRADCOMP_HOST_DEVICE inline double add_rn(double a, double b) noexcept {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
GRADCOMP_HOST_DEVICE inline double mul_rn(double a, double b) noexcept {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
GRADCOMP_HOST_DEVICE inline float mul_rn(float a, float b) noexcept {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

/// The eight lanes of one tile combined in the fixed order.
GRADCOMP_HOST_DEVICE inline double combine_lanes(const double (&lane)[8]) noexcept {
  return add_rn(add_rn(add_rn(lane[0], lane[1]), add_rn(lane[2], lane[3])),
                add_rn(add_rn(lane[4], lane[5]), add_rn(lane[6], lane[7])));
}

/// The sum of term(i) over [begin, end) (at most one tile), in the fixed order.
template <class Term>
GRADCOMP_HOST_DEVICE double tile_sum(const Term& term, std::size_t begin, std::size_t end) noexcept {
  double lane[8] = {};
  std::size_t i = begin;
  for (; i + 8 <= end; i += 8) {
    for (std::size_t l = 0; l < 8; ++l) lane[l] = add_rn(lane[l], term(i + l));
  }
  for (std::size_t l = 0; i < end; ++i, ++l) lane[l] = add_rn(lane[l], term(i));
  return combine_lanes(lane);
}

/// term(i) = x[i]^2 in double, x float32 or 16-bit (read as its float value): the terms
/// of a squared norm (a float squared cannot overflow a double, so the sum is finite
/// exactly when every x[i] is).
template <gradient_element T = float>
struct square_of {
  const T* x;
  GRADCOMP_HOST_DEVICE double operator()(std::size_t i) const noexcept {
    const double v = to_float(x[i]);
    return mul_rn(v, v);
  }
};

/// tile_sum(square_of<T>{x}, 0, len), written out for backend::host's corrector fast
/// path: GCC 12 runs this loop 13% faster than the generic one (same order, same bits;
/// the tests compare the two).
template <gradient_element T>
double sum_of_squares(const T* x, std::size_t len) noexcept {
  double lane[8] = {};
  std::size_t i = 0;
  const auto square = [](T v) {
    const double d = to_float(v);
    return d * d;
  };
  for (; i + 8 <= len; i += 8) {
    for (std::size_t l = 0; l < 8; ++l) lane[l] += square(x[i + l]);
  }
  for (std::size_t l = 0; i < len; ++i, ++l) lane[l] += square(x[i]);
  return combine_lanes(lane);
}

/// The tiles' sums added in tile order.
GRADCOMP_HOST_DEVICE inline double sum_of_tiles(const double* tile, std::size_t tiles) noexcept {
  double total = 0.0;
  for (std::size_t c = 0; c < tiles; ++c) total = add_rn(total, tile[c]);
  return total;
}

}  // namespace detail
GRADCOMP_NAMESPACE_END
