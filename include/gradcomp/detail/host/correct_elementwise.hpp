/// \file detail/host/correct_elementwise.hpp
/// backend::host's fast path for the element-wise correctors (error_feedback, momentum,
/// clip_norm, low_pass, chain): the algorithm of detail/correct/elementwise.hpp fused
/// with the selector's first pass (each tile of acc is handed over while in cache),
/// with an optimistic clipping order and in-place updates when a step cannot be
/// rejected. The conformance tests prove it bit-identical to the generic algorithm on
/// backend::host; bench_kokkos measures what it gains.
#pragma once

#include <gradcomp/detail/host/backend.hpp>
#include <gradcomp/concepts.hpp>
#include <gradcomp/detail/correct/elementwise.hpp>
#include <gradcomp/detail/core/fixed_order_sum.hpp>
#include <gradcomp/detail/host/corrector_state.hpp>
#include <gradcomp/detail/core/step_input.hpp>
#include <gradcomp/float16.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

/// A corrector whose update can be bounded: `magnitude_bound(state_max, g_max)` is an
/// upper bound of every |new state| and |acc| given bounds of |state| and |g|, and its
/// commit moves a state entry by at most |sent|.
template <class P>
concept bounded_update = requires(const P& p, const double* state_max, double g_max) {
  { p.magnitude_bound(state_max, g_max) } -> std::convertible_to<double>;
};

// Loops over the state arrays test `a != arrays`: nvcc warns that `a < arrays` is
// pointless for the stateless correctors (arrays = 0).
template <elementwise_corrector Policy>
struct has_fast_path<Policy, backend::host> : std::true_type {};

template <elementwise_corrector Policy>
class fast_engine<Policy, backend::host> {
  static constexpr std::size_t arrays = Policy::state_arrays;
  static constexpr bool own_acc = Policy::acc_state < 0;
  // In place only where the gradient is read before the update anyway (the clipping
  // norm), so checking it there is free: DGC's step.
  static constexpr bool in_place_capable = arrays > 0 && bounded_update<Policy>&& scales_gradient<Policy>();

 public:
  fast_engine(const backend::host& be, const Policy&, std::size_t n)
      : threads_(be.concurrency()),
        state_(n),
        acc_(own_acc ? n : 0),
        partial_(tile_count(n)),
        tile_max_(in_place_capable ? tile_count(n) : 0) {}

  /// Computes the new state and acc for every element, handing each finished tile of
  /// acc to `visit(thread, begin, acc_tile)`; a NaN or infinity in acc sets the
  /// status's verdict (host memory). Before each pass, `before_pass(acc_at)` may look ahead: `acc_at(i)` is the value
  /// that pass is about to produce at i (a selector samples acc with it, so that it
  /// can collect candidates during the pass instead of reading acc again after it).
  ///
  /// A clipping corrector needs ||g|| before it can scale g. When the last step did not
  /// clip, the pass runs optimistically unscaled and sums g_i^2 tile by tile on the
  /// side (from cache); only if the norm then calls for clipping does it run again,
  /// scaled, from the committed state, which the first run left untouched. When the
  /// last step clipped, the norm is taken first. Either way the result is the same and
  /// g is read once or twice, never three times.
  ///
  /// When the norm is taken first, it also tells whether g is finite (a float squared
  /// cannot overflow a double, so the sum is finite exactly when g is) and bounds every
  /// |g_i|. If the policy's bound then shows that the update cannot overflow from the
  /// committed state (whose bound is tracked step by step), the step cannot be
  /// rejected, and the new state overwrites the committed one: no second copy to write.
  ///
  /// g is float32, or 16-bit read as it is (each value widened as it is read: no float32
  /// copy of it).
  template <gradient_element G, class Visit, class BeforePass = ignore_before_pass>
  void update(const backend::host& be, const Policy& policy, std::span<const G> g, step_status* status, Visit&& visit,
              BeforePass&& before_pass = {}) {
    threads_ = be.concurrency();  // the call's context
    if (!updated(policy, g, visit, before_pass)) status->non_finite = 1;
  }
  /// update() with no selector watching the pass.
  template <gradient_element G>
  void update(const backend::host& be, const Policy& policy, std::span<const G> g, step_status* status) {
    update(be, policy, g, status, ignore_tile{});
  }

  /// acc of the step in progress.
  std::span<const float> acc(std::span<const float>) noexcept {
    if constexpr (own_acc) {
      return acc_;
    } else {
      return state_.next(static_cast<std::size_t>(Policy::acc_state));
    }
  }

  /// Applies the policy's commit to every sent element (the first status->count of
  /// index); nothing if the step met a NaN or infinity.
  void commit(const backend::host&, const Policy& policy, std::span<const std::uint32_t> index,
              std::span<const float> sent, const step_status* status) {
    if (status->non_finite != 0) return;
    index = index.first(std::min<std::size_t>(index.size(), status->count));
    sent = sent.first(index.size());
    const std::span<const float> values = acc({});
    if constexpr (in_place_capable) {
      const float largest = max_magnitude(sent.data(), sent.size());
      for (std::size_t a = 0; a != arrays; ++a) next_max_[a] += largest;
    }
    for (std::size_t j = 0; j < index.size(); ++j) {
      const std::uint32_t i = index[j];
      std::array<float, arrays + 1> s;
      std::array<float, arrays + 1> before;
      for (std::size_t a = 0; a != arrays; ++a) {
        s[a] = state_.next(a)[i];
        before[a] = state_.committed(a)[i];
      }
      policy.commit(s.data(), before.data(), values[i], sent[j]);
      for (std::size_t a = 0; a != arrays; ++a) state_.next(a)[i] = s[a];
    }
  }

  /// Writes to `out` the acc that update() would compute now from the committed state
  /// (clipping included) and changes nothing else; the status gets the NaN verdict.
  template <gradient_element G>
  void preview(const backend::host& be, const Policy& policy, std::span<const G> g, std::span<float> out,
               step_status* status) {
    threads_ = be.concurrency();  // the call's context
    if (!previewed(policy, g, out)) status->non_finite = 1;
  }

  void accept() noexcept {
    state_.accept();
    committed_max_ = next_max_;
  }
  /// Whether a step that cannot be rejected may update the committed state in place
  /// (not when the caller may still drop the step: compressor::stage).
  void allow_in_place(bool allowed) noexcept { allow_in_place_ = allowed; }
  std::span<const float> committed(std::size_t a) const noexcept { return state_.committed(a); }
  void load_committed(std::size_t a, std::span<const float> values) noexcept {
    std::copy(values.begin(), values.end(), state_.committed(a).begin());
    if constexpr (in_place_capable) committed_max_[a] = max_magnitude(values.data(), values.size());
  }
  void add_held(held_memory& use) const {
    state_.add_held(use);
    use.workspace += bytes_held(acc_, partial_, tile_max_);
  }
  /// Gives back the arrays of n floats that only a step uses (the next copy of the
  /// state, acc); the per-tile sums are a few bytes and stay.
  void release_workspace() noexcept {
    state_.release_workspace();
    acc_ = std::vector<float>{};
  }

 private:
  // update()'s passes; false if acc is not all finite.
  template <class G, class Visit, class BeforePass>
  bool updated(const Policy& policy, std::span<const G> g, Visit&& visit, BeforePass&& before_pass) {
    if (own_acc && acc_.size() != g.size()) acc_.assign(g.size(), 0.0f);
    if constexpr (scales_gradient<Policy>()) {
      if (policy.needs_norm()) {
        if (last_clipped_) {
          for_each_tile(threads_, g.size(), [&](int, std::size_t c, std::size_t begin, std::size_t end) {
            partial_[c] = sum_of_squares(g.data() + begin, end - begin);
          });
          const float scale = policy.gradient_scale(total_of_partials());
          last_clipped_ = scale != 1.0f;
          bool in_place = false;
          if constexpr (in_place_capable) {
            in_place = allow_in_place_ && cannot_overflow(policy, scale, total_of_partials());
          }
          state_.begin_step(in_place);
          return run(policy, g, scale, false, visit, before_pass);
        }
        state_.begin_step(false);
        const bool finite = run(policy, g, 1.0f, true, visit, before_pass);
        const float scale = policy.gradient_scale(total_of_partials());
        last_clipped_ = scale != 1.0f;
        return scale == 1.0f ? finite : run(policy, g, scale, false, visit, before_pass);
      }
    }
    state_.begin_step(false);
    return run(policy, g, 1.0f, false, visit, before_pass);
  }

  // preview()'s passes; false if the value is not all finite.
  template <class G>
  bool previewed(const Policy& policy, std::span<const G> g, std::span<float> out) {
    float scale = 1.0f;
    if constexpr (scales_gradient<Policy>()) {
      if (policy.needs_norm()) {
        for_each_tile(threads_, g.size(), [&](int, std::size_t c, std::size_t begin, std::size_t end) {
          partial_[c] = sum_of_squares(g.data() + begin, end - begin);
        });
        scale = policy.gradient_scale(total_of_partials());
      }
    }
    std::array<const float*, arrays + 1> old{};
    for (std::size_t a = 0; a != arrays; ++a) old[a] = state_.committed(a).data();
    shared_flag bad;
    for_each_tile(threads_, g.size(), [&](int, std::size_t, std::size_t begin, std::size_t end) {
      std::uint32_t top = 0;
      for (std::size_t i = begin; i < end; ++i) {
        out[i] = acc_from(policy, old, i, to_float(g[i]) * scale);
        top = std::max(top, magnitude_key(out[i]));
      }
      if (top >= non_finite_key) bad.raise();
    });
    return !bad.raised();
  }

  // acc at i from the state arrays `old` and the (scaled) gradient value g_i.
  static float acc_from(const Policy& policy, const std::array<const float*, arrays + 1>& old, std::size_t i,
                        float g_i) noexcept {
    std::array<float, arrays + 1> s;
    for (std::size_t a = 0; a != arrays; ++a) s[a] = old[a][i];
    return policy.update(s.data(), g_i);
  }

  double total_of_partials() const noexcept {
    double total = 0.0;
    for (const double s : partial_) total += s;  // tile order: the same for any thread count
    return total;
  }

  // Whether an update from the committed state with g * scale stays far below
  // overflow, given sum of g_i^2 (which bounds every |g_i| by its root).
  bool cannot_overflow(const Policy& policy, float scale, double sum_squares) const noexcept {
    if (!std::isfinite(sum_squares)) return false;  // a NaN or infinity: the checked, double-buffered run rejects it
    std::array<double, arrays> state_max{};
    for (std::size_t a = 0; a != arrays; ++a) state_max[a] = committed_max_[a];
    const double bound = policy.magnitude_bound(state_max.data(), std::sqrt(sum_squares) * scale);
    return bound < static_cast<double>(std::numeric_limits<float>::max()) / 16;  // margin for rounding
  }

  template <class G, class Visit, class BeforePass>
  bool run(const Policy& policy, std::span<const G> g, float scale, bool sum_squares, Visit&& visit,
           BeforePass&& before_pass) {
    shared_flag bad;
    std::array<const float*, arrays + 1> old{};
    std::array<float*, arrays + 1> next{};
    for (std::size_t a = 0; a != arrays; ++a) {
      old[a] = state_.committed(a).data();
      next[a] = state_.next(a).data();
    }
    float* acc = own_acc ? acc_.data() : next[static_cast<std::size_t>(Policy::acc_state)];
    const bool in_place = arrays > 0 && old[0] == next[0];
    // Nothing is written yet, so old holds the committed state even in place.
    before_pass([&](std::size_t i) { return acc_from(policy, old, i, to_float(g[i]) * scale); });
    for_each_tile(threads_, g.size(), [&](int thread, std::size_t c, std::size_t begin, std::size_t end) {
      // The largest magnitude key of each state array and of acc, kept in the loop (an
      // integer maximum vectorises; a float one does not without -ffast-math): bounds
      // for the next step's in-place check, and a key at or above non_finite_key flags
      // a NaN or infinity. The policy is copied so that no store can alias it.
      const Policy p = policy;
      std::array<std::int32_t, arrays + 1> top{};
      // In place, each array is read and written through the one pointer, so the
      // compiler need not prove that two pointers do not overlap before it vectorises.
      auto elements = [&]<bool InPlace>() {
        for (std::size_t i = begin; i < end; ++i) {
          std::array<float, arrays + 1> s;
          for (std::size_t a = 0; a != arrays; ++a) s[a] = InPlace ? next[a][i] : old[a][i];
          const float value = p.update(s.data(), to_float(g[i]) * scale);
          for (std::size_t a = 0; a != arrays; ++a) {
            next[a][i] = s[a];
            top[a] = std::max(top[a], static_cast<std::int32_t>(magnitude_key(s[a])));
          }
          if constexpr (own_acc) {
            acc[i] = value;
            top[arrays] = std::max(top[arrays], static_cast<std::int32_t>(magnitude_key(value)));
          }
        }
      };
      if (in_place) {
        elements.template operator()<true>();
      } else {
        elements.template operator()<false>();
      }
      if (sum_squares) partial_[c] = sum_of_squares(g.data() + begin, end - begin);
      if constexpr (in_place_capable) {
        for (std::size_t a = 0; a != arrays; ++a) tile_max_[c][a] = std::bit_cast<float>(top[a]);
      }
      const std::size_t acc_top = own_acc ? arrays : static_cast<std::size_t>(Policy::acc_state);
      if (static_cast<std::uint32_t>(top[acc_top]) >= non_finite_key) bad.raise();
      visit(thread, begin, std::span<const float>(acc + begin, end - begin));
    });
    if constexpr (in_place_capable) {  // a bound of the new state, for the next step's check
      next_max_ = {};
      for (const auto& m : tile_max_) {
        for (std::size_t a = 0; a != arrays; ++a) next_max_[a] = std::max(next_max_[a], m[a]);
      }
    }
    return !bad.raised();
  }

  int threads_;
  host_state<arrays> state_;
  std::vector<float> acc_;
  std::vector<double> partial_;
  // Per tile: max |new state| of each array.
  std::vector<std::array<float, arrays>> tile_max_;
  std::array<float, arrays> committed_max_{};  // bounds of |committed state|: 0 at the start
  std::array<float, arrays> next_max_{};       // the same for the step in progress
  bool allow_in_place_ = true;
  bool last_clipped_ = false;  // a guess of which order of passes is cheaper; never changes results
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
