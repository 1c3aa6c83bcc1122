/// \file detail/host/elementwise_corrector.hpp
/// One engine on backend::host for every corrector defined element by element
/// (error_feedback, momentum, clip_norm, low_pass, chain): the policy supplies
/// `update(state, g) -> acc` and `commit(state, old_state, acc, sent)` for one element;
/// this engine supplies the passes, the threads and the double-buffered state.
#pragma once

#include <gradcomp/backend/host.hpp>
#include <gradcomp/concepts.hpp>
#include <gradcomp/detail/host/corrector_state.hpp>

#include <array>
#include <cstdint>
#include <span>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

/// What a corrector must offer to run element by element.
template <class P>
concept elementwise_corrector = requires(const P& p, float* s, const float* old, float x) {
  { P::acc_state } -> std::convertible_to<int>;
  { p.update(s, x) } -> std::same_as<float>;
  p.commit(s, old, x, x);
};

template <class P>
constexpr bool scales_gradient() {
  if constexpr (requires { P::scales_gradient; }) {
    return P::scales_gradient;
  } else {
    return false;
  }
}

/// Sum of g_i^2 in double, per chunk then in chunk order: identical for any thread count.
inline double sum_of_squares(int threads, std::span<const float> g, std::vector<double>& partial) {
  for_each_chunk(threads, g.size(), [&](int, std::size_t c, std::size_t begin, std::size_t end) {
    double s = 0.0;
    for (std::size_t i = begin; i < end; ++i) s += static_cast<double>(g[i]) * static_cast<double>(g[i]);
    partial[c] = s;
  });
  double total = 0.0;
  for (const double s : partial) total += s;
  return total;
}

template <elementwise_corrector Policy>
class engine<Policy, backend::host> {
  static constexpr std::size_t arrays = Policy::state_arrays;
  static constexpr bool own_acc = Policy::acc_state < 0;

 public:
  engine(const backend::host& be, const Policy&, std::size_t n)
      : threads_(be.concurrency()), state_(n), acc_(own_acc ? n : 0), partial_(chunk_count(n)) {}

  /// Computes the new state and acc for every element, handing each finished chunk of
  /// acc to `visit(thread, begin, acc_chunk)`. Returns false if acc is not all finite.
  template <class Visit>
  bool update(const Policy& policy, std::span<const float> g, Visit&& visit) {
    float scale = 1.0f;
    if constexpr (scales_gradient<Policy>()) {
      if (policy.needs_norm()) scale = policy.gradient_scale(sum_of_squares(threads_, g, partial_));
    }
    int bad = 0;
    std::array<const float*, arrays + 1> old{};
    std::array<float*, arrays + 1> next{};
    for (std::size_t a = 0; a < arrays; ++a) {
      old[a] = state_.committed(a).data();
      next[a] = state_.next(a).data();
    }
    float* acc = own_acc ? acc_.data() : next[static_cast<std::size_t>(Policy::acc_state)];
    for_each_chunk(threads_, g.size(), [&](int thread, std::size_t, std::size_t begin, std::size_t end) {
      for (std::size_t i = begin; i < end; ++i) {
        std::array<float, arrays + 1> s;
        for (std::size_t a = 0; a < arrays; ++a) s[a] = old[a][i];
        const float value = policy.update(s.data(), g[i] * scale);
        for (std::size_t a = 0; a < arrays; ++a) next[a][i] = s[a];
        if constexpr (own_acc) acc[i] = value;
      }
      const std::span<const float> chunk(acc + begin, end - begin);
      if (!all_finite(chunk)) {
#if GRADCOMP_HAS_OPENMP
#pragma omp atomic write
#endif
        bad = 1;
      }
      visit(thread, begin, chunk);
    });
    return bad == 0;
  }

  /// acc of the step in progress.
  std::span<const float> acc(std::span<const float>) noexcept {
    if constexpr (own_acc) {
      return acc_;
    } else {
      return state_.next(static_cast<std::size_t>(Policy::acc_state));
    }
  }

  /// Applies the policy's commit to every sent element.
  void commit(const Policy& policy, std::span<const std::uint32_t> index, std::span<const float> sent) {
    const std::span<const float> values = acc({});
    for (std::size_t j = 0; j < index.size(); ++j) {
      const std::uint32_t i = index[j];
      std::array<float, arrays + 1> s;
      std::array<float, arrays + 1> before;
      for (std::size_t a = 0; a < arrays; ++a) {
        s[a] = state_.next(a)[i];
        before[a] = state_.committed(a)[i];
      }
      policy.commit(s.data(), before.data(), values[i], sent[j]);
      for (std::size_t a = 0; a < arrays; ++a) state_.next(a)[i] = s[a];
    }
  }

  void accept() noexcept { state_.accept(); }
  std::span<float> committed(std::size_t a) noexcept { return state_.committed(a); }
  std::span<const float> committed(std::size_t a) const noexcept { return state_.committed(a); }

 private:
  int threads_;
  host_state<arrays> state_;
  std::vector<float> acc_;
  std::vector<double> partial_;
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
