/// \file detail/kokkos/correctors.hpp
/// Corrector engines on backend::kokkos: one parallel_reduce computes the new state,
/// acc and a non-finite flag; commit is a parallel_for over the sent entries. State is
/// double-buffered as on the host (a rejected step leaves it untouched). Not API.
#pragma once

#include <gradcomp/backend/kokkos.hpp>
#include <gradcomp/correct/none.hpp>
#include <gradcomp/detail/host/elementwise_corrector.hpp>
#include <gradcomp/detail/kokkos/primitives.hpp>
#include <gradcomp/detail/step_input.hpp>

#include <array>
#include <utility>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

template <class Space>
class engine<correct::none, backend::kokkos<Space>> {
 public:
  engine(const backend::kokkos<Space>& be, const correct::none&, std::size_t) : space_(be.space) {}

  template <class Visit, class BeforePass = ignore_before_pass>
  bool update(const correct::none&, std::span<const float> g, Visit&&, BeforePass&& = {}) {
    return kk::all_finite(space_, kk::wrap<Space>(g));
  }
  std::span<const float> acc(std::span<const float> g) const noexcept { return g; }
  /// acc (= g) copied to `out`; false if it is not all finite.
  bool preview(const correct::none&, std::span<const float> g, std::span<float> out) {
    Kokkos::deep_copy(space_, kk::wrap<Space>(out), kk::wrap<Space>(g));
    return kk::all_finite(space_, kk::wrap<Space>(g));
  }
  void commit(const correct::none&, std::span<const std::uint32_t>, std::span<const float>) noexcept {}
  void accept() noexcept {}
  std::span<const float> committed(std::size_t) const noexcept { return {}; }
  void load_committed(std::size_t, std::span<const float>) noexcept {}

 private:
  Space space_;
};

// Loops over the state arrays test `a != arrays`: nvcc warns that `a < arrays` is
// pointless for the stateless correctors (arrays = 0).
template <elementwise_corrector Policy, class Space>
class engine<Policy, backend::kokkos<Space>> {
  static constexpr std::size_t arrays = Policy::state_arrays;
  static constexpr bool own_acc = Policy::acc_state < 0;
  using state_view = Kokkos::View<float*, kk::memory<Space>>;

 public:
  engine(const backend::kokkos<Space>& be, const Policy&, std::size_t n)
      : space_(be.space), n_(n), partial_("gradcomp::partial", chunk_count(n)), partial_host_(chunk_count(n)),
        staging_(kk::host_accessible<Space> ? 0 : n) {
    for (std::size_t a = 0; a != arrays; ++a) {
      committed_[a] = be.template allocate<float>(n);
      next_[a] = be.template allocate<float>(n);
    }
    if constexpr (own_acc) acc_ = be.template allocate<float>(n);
  }

  /// The new state and acc for every element; false if acc is not all finite. The
  /// gradient's norm, when a clip needs it, is summed per host chunk with eight lanes,
  /// then in chunk order, exactly as backend::host does, so the scale is identical.
  template <class Visit, class BeforePass = ignore_before_pass>
  bool update(const Policy& policy, std::span<const float> grad, Visit&&, BeforePass&& = {}) {
    const auto g = kk::wrap<Space>(grad);
    float scale = 1.0f;
    if constexpr (scales_gradient<Policy>()) {
      if (policy.needs_norm()) scale = policy.gradient_scale(sum_of_squares(g));
    }
    std::array<state_view, arrays + 1> old{}, next{};
    for (std::size_t a = 0; a != arrays; ++a) {
      old[a] = committed_[a];
      next[a] = next_[a];
    }
    const state_view acc = own_acc ? acc_ : next[static_cast<std::size_t>(own_acc ? 0 : Policy::acc_state)];
    int bad = 0;
    Kokkos::parallel_reduce(
        "gradcomp::correct", kk::range(space_, n_),
        KOKKOS_LAMBDA(const std::size_t i, int& b) {
          float s[arrays + 1];
          for (std::size_t a = 0; a != arrays; ++a) s[a] = old[a](i);
          const float value = policy.update(s, g(i) * scale);
          for (std::size_t a = 0; a != arrays; ++a) next[a](i) = s[a];
          if constexpr (own_acc) acc(i) = value;
          b |= magnitude_key(value) >= non_finite_key ? 1 : 0;
        },
        Kokkos::BOr<int>(bad));
    return bad == 0;
  }

  std::span<const float> acc(std::span<const float>) const noexcept {
    const state_view& a = own_acc ? acc_ : next_[static_cast<std::size_t>(own_acc ? 0 : Policy::acc_state)];
    return {a.data(), n_};
  }

  /// Writes to `out` the acc that update() would compute now; false if it is not all
  /// finite. The committed state is untouched (update() writes only the next copy).
  bool preview(const Policy& policy, std::span<const float> grad, std::span<float> out) {
    const bool finite = update(policy, grad, [](auto&&...) {});
    Kokkos::deep_copy(space_, kk::wrap<Space>(out), kk::wrap<Space>(acc({})));
    space_.fence();
    return finite;
  }

  void commit(const Policy& policy, std::span<const std::uint32_t> index, std::span<const float> sent) {
    const auto idx = kk::wrap<Space>(index);
    const auto values = kk::wrap<Space>(sent);
    const auto acc_values = kk::wrap<Space>(acc({}));
    std::array<state_view, arrays + 1> old{}, next{};
    for (std::size_t a = 0; a != arrays; ++a) {
      old[a] = committed_[a];
      next[a] = next_[a];
    }
    Kokkos::parallel_for(
        "gradcomp::commit", kk::range(space_, index.size()), KOKKOS_LAMBDA(const std::size_t j) {
          const std::uint32_t i = idx(j);
          float s[arrays + 1], before[arrays + 1];
          for (std::size_t a = 0; a != arrays; ++a) {
            s[a] = next[a](i);
            before[a] = old[a](i);
          }
          policy.commit(s, before, acc_values(i), values(j));
          for (std::size_t a = 0; a != arrays; ++a) next[a](i) = s[a];
        });
    space_.fence();
  }

  void accept() noexcept { std::swap(committed_, next_); }

  /// Committed array `a`, readable on the host (copied there for device memory).
  std::span<const float> committed(std::size_t a) const {
    if constexpr (kk::host_accessible<Space>) {
      return {committed_[a].data(), n_};
    } else {
      kk::to_host<Space>(std::span<const float>(committed_[a].data(), n_), staging_.data());
      return staging_;
    }
  }
  void load_committed(std::size_t a, std::span<const float> values) {
    kk::from_host<Space>(values.data(), std::span<float>(committed_[a].data(), n_));
  }

 private:
  double sum_of_squares(const kk::view<const float, Space>& g) {
    const auto partial = partial_;
    const std::size_t n = n_;
    Kokkos::parallel_for(
        "gradcomp::sum_of_squares", kk::range(space_, chunk_count(n_)), KOKKOS_LAMBDA(const std::size_t c) {
          const std::size_t begin = c * host_chunk;
          const std::size_t end = begin + host_chunk < n ? begin + host_chunk : n;
          partial(c) = detail::sum_of_squares(g.data() + begin, end - begin);
        });
    Kokkos::deep_copy(space_, Kokkos::View<double*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
                                  partial_host_.data(), partial_host_.size()),
                      partial_);
    space_.fence();
    double total = 0.0;
    for (const double s : partial_host_) total += s;
    return total;
  }

  Space space_;
  std::size_t n_;
  std::array<state_view, arrays + 1> committed_{};
  std::array<state_view, arrays + 1> next_{};
  state_view acc_;
  Kokkos::View<double*, kk::memory<Space>> partial_;
  std::vector<double> partial_host_;
  mutable std::vector<float> staging_;
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
