/// \file detail/host/correct_none.hpp
/// correct::none on backend::host.
#pragma once

#include <gradcomp/detail/host/backend.hpp>
#include <gradcomp/concepts.hpp>
#include <gradcomp/correct/none.hpp>
#include <gradcomp/detail/host/corrector_state.hpp>
#include <gradcomp/detail/core/step_input.hpp>

#include <algorithm>
#include <cstddef>
#include <span>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

template <>
struct has_fast_path<correct::none, backend::host> : std::true_type {};

template <>
class fast_engine<correct::none, backend::host> {
 public:
  fast_engine(const backend::host&, const correct::none&, std::size_t) {}

  /// Checks g and hands each tile to `visit(thread, begin, acc_tile)`; a NaN or
  /// infinity in g sets the status's verdict (host memory).
  template <class Visit, class BeforePass = ignore_before_pass>
  void update(const backend::host& be, const correct::none&, std::span<const float> g, step_status* status,
              Visit&& visit, BeforePass&& = {}) {
    shared_flag bad;
    for_each_tile(be.concurrency(), g.size(), [&](int thread, std::size_t, std::size_t begin, std::size_t end) {
      const auto tile = g.subspan(begin, end - begin);
      if (!all_finite(tile)) bad.raise();
      visit(thread, begin, tile);
    });
    if (bad.raised()) status->non_finite = 1;
  }
  /// update() with no selector watching the pass.
  void update(const backend::host& be, const correct::none& policy, std::span<const float> g, step_status* status) {
    update(be, policy, g, status, ignore_tile{});
  }
  std::span<const float> acc(std::span<const float> g) const noexcept { return g; }
  /// acc (= g) copied to `out`, its NaN verdict to the status.
  void preview(const backend::host& be, const correct::none&, std::span<const float> g, std::span<float> out,
               step_status* status) {
    shared_flag bad;
    for_each_tile(be.concurrency(), g.size(), [&](int, std::size_t, std::size_t begin, std::size_t end) {
      const auto tile = g.subspan(begin, end - begin);
      if (!all_finite(tile)) bad.raise();
      std::copy(tile.begin(), tile.end(), out.begin() + static_cast<std::ptrdiff_t>(begin));
    });
    if (bad.raised()) status->non_finite = 1;
  }
  void commit(const backend::host&, const correct::none&, std::span<const std::uint32_t>, std::span<const float>,
              const step_status*) noexcept {}
  void accept() noexcept {}
  std::span<const float> committed(std::size_t) const noexcept { return {}; }
  void load_committed(std::size_t, std::span<const float>) noexcept {}
  void add_held(held_memory&) const noexcept {}
  void release_workspace() noexcept {}  // nothing held
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
