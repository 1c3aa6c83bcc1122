/// \file detail/correct/none.hpp
/// correct::none's algorithm over the backend primitives: acc is the gradient itself,
/// checked for NaN and infinity. What backend::kokkos and backend::cuda run;
/// backend::host's engine (detail/host/correct_none.hpp) also hands each checked tile to the
/// selector while it is in cache. Not API.
#pragma once

#include <gradcomp/concepts.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/correct/none.hpp>
#include <gradcomp/detail/core/radix_select.hpp>
#include <gradcomp/detail/core/step_input.hpp>
#include <gradcomp/held_memory.hpp>

#include <cstddef>
#include <cstdint>
#include <span>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

namespace no_correction_work {
/// 1 if g[i] is a NaN or an infinity; copies it to `out` when there is one.
struct check {
  const float* g;
  float* out;
  GRADCOMP_HOST_DEVICE std::uint32_t operator()(std::size_t i) const {
    if (out != nullptr) out[i] = g[i];
    return magnitude_key(g[i]) >= non_finite_key ? 1u : 0u;
  }
};
}  // namespace no_correction_work

/// correct::none on any backend.
template <class Backend>
class no_correction {
 public:
  no_correction(const Backend&, const correct::none&, std::size_t) {}

  /// Queues the finiteness check of g.
  void update(const Backend& be, const correct::none&, std::span<const float> g, step_status* status) {
    be.reduce_or(g.size(), no_correction_work::check{g.data(), nullptr}, &status->non_finite);
  }
  std::span<const float> acc(std::span<const float> g) const noexcept { return g; }

  /// Queues the copy of acc (= g) into `out` and its finiteness check.
  void preview(const Backend& be, const correct::none&, std::span<const float> g, std::span<float> out,
               step_status* status) {
    be.reduce_or(g.size(), no_correction_work::check{g.data(), out.data()}, &status->non_finite);
  }

  void commit(const Backend&, const correct::none&, std::span<const std::uint32_t>, std::span<const float>,
              const step_status*) noexcept {}
  void accept() noexcept {}
  std::span<const float> committed(std::size_t) const noexcept { return {}; }
  void load_committed(std::size_t, std::span<const float>) noexcept {}
  void add_held(held_memory&) const noexcept {}
  void release_workspace() noexcept {}  // nothing held
};

/// Every backend without an engine of its own for correct::none runs the one above.
template <class Backend>
class engine<correct::none, Backend> : public no_correction<Backend> {
 public:
  using no_correction<Backend>::no_correction;
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
