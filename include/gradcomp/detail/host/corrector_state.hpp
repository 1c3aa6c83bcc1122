/// \file detail/host/corrector_state.hpp
/// What the corrector engines of backend::host share.
///
/// State is double-buffered: update() writes the new state next to the committed one,
/// so a step rejected after the update (a NaN found in the same pass) leaves the
/// committed state untouched; accept() swaps. A step that cannot be rejected (its
/// gradient checked and its result bounded beforehand) may update in place instead,
/// which saves the read for ownership of the second copy.
#pragma once

#include <gradcomp/detail/host/backend.hpp>
#include <gradcomp/concepts.hpp>
#include <gradcomp/detail/core/radix_select.hpp>
#include <gradcomp/held_memory.hpp>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

/// True when every element of `x` is finite; a branch-free OR the compiler vectorises.
inline bool all_finite(std::span<const float> x) noexcept {
  const auto* bits = reinterpret_cast<const std::int32_t*>(x.data());
  int bad = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    bad |= (bits[i] & 0x7FFFFFFF) >= static_cast<std::int32_t>(non_finite_key);
  }
  return bad == 0;
}

/// Largest |x_i| of an array, as a bound: exact for finite x; a NaN may be missed (the
/// corrector engines reject a step whose acc is not finite, and the states that use
/// this bound make acc NaN whenever they hold one).
inline float max_magnitude(const float* x, std::size_t len) noexcept {
  std::size_t i = 0;
  float top = 0.0f;
#if defined(__SSE2__)
  // Four independent chains of max instructions: one would be latency-bound.
  const __m128 magnitude = _mm_castsi128_ps(_mm_set1_epi32(0x7FFFFFFF));
  __m128 m0 = _mm_setzero_ps(), m1 = m0, m2 = m0, m3 = m0;
  for (; i + 16 <= len; i += 16) {
    m0 = _mm_max_ps(m0, _mm_and_ps(_mm_loadu_ps(x + i), magnitude));
    m1 = _mm_max_ps(m1, _mm_and_ps(_mm_loadu_ps(x + i + 4), magnitude));
    m2 = _mm_max_ps(m2, _mm_and_ps(_mm_loadu_ps(x + i + 8), magnitude));
    m3 = _mm_max_ps(m3, _mm_and_ps(_mm_loadu_ps(x + i + 12), magnitude));
  }
  alignas(16) float lanes[4];
  _mm_store_ps(lanes, _mm_max_ps(_mm_max_ps(m0, m1), _mm_max_ps(m2, m3)));
  top = std::max(std::max(lanes[0], lanes[1]), std::max(lanes[2], lanes[3]));
#endif
  for (; i < len; ++i) top = std::max(top, std::fabs(x[i]));
  return top;
}

/// Committed and next copies of a corrector's `Arrays` state arrays of n floats; or,
/// for a step begun in place, one copy that is both. The next copy can be given back
/// between steps (release_workspace); the next step not in place allocates it again.
template <std::size_t Arrays>
class host_state {
 public:
  explicit host_state(std::size_t n) : n_(n) {
    for (auto& a : committed_) a.assign(n, 0.0f);
    for (auto& a : next_) a.assign(n, 0.0f);
  }
  std::span<float> committed(std::size_t a) noexcept { return committed_[a]; }
  std::span<const float> committed(std::size_t a) const noexcept { return committed_[a]; }
  std::span<float> next(std::size_t a) noexcept { return in_place_ ? committed_[a] : next_[a]; }
  /// Whether the step being computed writes over the committed state.
  void begin_step(bool in_place) {
    in_place_ = in_place;
    if (in_place) return;
    for (auto& a : next_) {
      if (a.size() != n_) a.assign(n_, 0.0f);
    }
  }
  /// Gives the next copy back (between steps: it holds nothing the next step reads).
  void release_workspace() noexcept {
    for (auto& a : next_) a = std::vector<float>{};
  }
  void accept() noexcept {
    if (!in_place_) std::swap(committed_, next_);
  }
  /// The committed copy is state; the next one, workspace.
  void add_held(held_memory& use) const {
    for (std::size_t a = 0; a != Arrays; ++a) {
      use.state += bytes_held(committed_[a]);
      use.workspace += bytes_held(next_[a]);
    }
  }

 private:
  std::size_t n_;
  std::array<std::vector<float>, Arrays> committed_;
  std::array<std::vector<float>, Arrays> next_;
  bool in_place_ = false;
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
