/// \file detail/correct/elementwise.hpp
/// The algorithm of every corrector defined element by element (error_feedback,
/// momentum, clip_norm, low_pass, chain), written once over the backend primitives of
/// concepts.hpp: it is what backend::kokkos and backend::cuda run, and backend::host's
/// fused engine (detail/host/correct_elementwise.hpp) is a fast path proved
/// bit-identical to it by the tests. The policy supplies `update(state, g) -> acc` and
/// `commit(state, old_state, acc, sent)` for one element; this file supplies the passes
/// and the double-buffered state, so a rejected step leaves the committed state as it
/// was. Not API.
#pragma once

#include <gradcomp/concepts.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/detail/core/fixed_order_sum.hpp>
#include <gradcomp/detail/core/radix_select.hpp>
#include <gradcomp/detail/core/step_input.hpp>
#include <gradcomp/float16.hpp>
#include <gradcomp/held_memory.hpp>

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
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

/// Whether the policy scales the gradient by a factor of its norm (clip_norm).
template <class P>
constexpr bool scales_gradient() {
  if constexpr (requires { P::scales_gradient; }) {
    return P::scales_gradient;
  } else {
    return false;
  }
}

// The per-element work, as functors a device can run. Loops over the state arrays test
// `a != Arrays`: nvcc warns that `a < Arrays` is pointless for the stateless correctors.
namespace elementwise {

/// Addresses of a corrector's state arrays (one spare slot keeps the array non-empty
/// for the stateless correctors).
template <std::size_t Arrays>
struct arrays {
  float* at[Arrays + 1];
  /// Entry i of array a: how the passes read the committed state (a compact state
  /// reads its own way: detail/correct/compact.hpp).
  GRADCOMP_HOST_DEVICE float value(std::size_t a, std::size_t i) const { return at[a][i]; }
};

/// The policy's gradient factor from the squared norm, by one thread: computed where
/// the norm is, so that nothing is read back.
template <class Policy>
struct scale_from_norm {
  Policy policy;
  const double* sum_of_squares;
  float* scale;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t) const { *scale = policy.gradient_scale(*sum_of_squares); }
};

/// The new state and acc at i from the committed state (read through `Old`) and g_i
/// (float32, or 16-bit read as its float value) times the factor (none: 1): written by
/// written_acc(i), which returns acc_i (a selector's first pass over acc may run it:
/// correction::update_pass, or its two halves, read(i) and then written_acc(i, read),
/// so that a thread can have several entries' reads in flight before it writes any);
/// the call returns 1 if acc is a NaN or an infinity.
template <class Policy, std::size_t Arrays, bool OwnAcc, class Old = arrays<Arrays>, gradient_element G = float>
struct update {
  Policy policy;
  Old old;
  arrays<Arrays> next;
  float* acc;
  const G* g;
  const float* scale;
  /// What the update of entry i reads: the committed state, and g_i times the factor.
  struct inputs {
    float s[Arrays + 1];
    float g;
  };
  GRADCOMP_HOST_DEVICE inputs read(std::size_t i) const {
    inputs in{};
    for (std::size_t a = 0; a != Arrays; ++a) in.s[a] = old.value(a, i);
    const float g_i = to_float(g[i]);
    in.g = scale != nullptr ? mul_rn(g_i, *scale) : g_i;
    return in;
  }
  GRADCOMP_HOST_DEVICE float written_acc(std::size_t i, inputs in) const {
    const float value = policy.update(in.s, in.g);
    for (std::size_t a = 0; a != Arrays; ++a) next.at[a][i] = in.s[a];
    if constexpr (OwnAcc) acc[i] = value;
    return value;
  }
  GRADCOMP_HOST_DEVICE float written_acc(std::size_t i) const { return written_acc(i, read(i)); }
  GRADCOMP_HOST_DEVICE std::uint32_t operator()(std::size_t i) const {
    return magnitude_key(written_acc(i)) >= non_finite_key ? 1u : 0u;
  }
};

/// The policy's commit of the j-th sent entry. Entries past the status's count, entries
/// marked not_kept, and every entry of a step that met a NaN, are left alone.
template <class Policy, std::size_t Arrays, class Old = arrays<Arrays>>
struct commit {
  Policy policy;
  Old old;
  arrays<Arrays> next;
  const float* acc;
  const std::uint32_t* index;
  const float* sent;
  const step_status* status;
  GRADCOMP_HOST_DEVICE std::size_t live_items() const noexcept { return status->non_finite != 0 ? 0 : status->count; }
  GRADCOMP_HOST_DEVICE void operator()(std::size_t j) const {
    if (status->non_finite != 0 || j >= status->count) return;
    const std::uint32_t i = index[j];
    if (i == not_kept) return;
    float s[Arrays + 1], before[Arrays + 1];
    for (std::size_t a = 0; a != Arrays; ++a) {
      s[a] = next.at[a][i];
      before[a] = old.value(a, i);
    }
    policy.commit(s, before, acc[i], sent[j]);
    for (std::size_t a = 0; a != Arrays; ++a) next.at[a][i] = s[a];
  }
};

/// to[i] = from[i].
struct copy {
  const float* from;
  float* to;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t i) const { to[i] = from[i]; }
};

}  // namespace elementwise

/// The committed state as float32 arrays, double-buffered: a step writes the next copy
/// and accept() swaps them, so a rejected step leaves the committed one as it was.
template <class Backend, std::size_t Arrays>
class float_state {
  using buffer = typename Backend::template buffer<float>;
  using pointers = elementwise::arrays<Arrays>;

 public:
  float_state(const Backend& be, std::size_t n) : backend_(be), n_(n) {
    for (std::size_t a = 0; a != Arrays; ++a) {
      committed_[a] = be.template allocate<float>(n);
      next_[a] = be.template allocate<float>(n);
    }
  }

  /// How the passes read the committed state.
  [[nodiscard]] pointers reader() const { return addresses(committed_); }
  /// Where the step's passes write its state (allocated again after release_workspace).
  [[nodiscard]] pointers next(const Backend& be) {
    for (std::size_t a = 0; a != Arrays; ++a) {
      if (static_cast<std::size_t>(next_[a].size()) != n_) next_[a] = be.template allocate<float>(n_);
    }
    return addresses(next_);
  }
  /// Gives the next copy back (between steps: the next step writes it whole).
  void release_workspace() noexcept {
    for (auto& b : next_) b = buffer{};
    staging_ = std::vector<float>{};
  }
  /// After the step's commit: the next copy already holds the state.
  void store(const Backend&, const step_status*) {}
  /// Makes the step's state the committed one.
  void accept() noexcept { std::swap(committed_, next_); }

  /// Committed array `a`, readable on the host (a copy, where the host cannot read the
  /// backend's memory).
  std::span<const float> committed(std::size_t a) const {
    if constexpr (Backend::host_accessible) {
      return {committed_[a].data(), n_};
    } else {
      staging_.resize(n_);  // host memory, only once a checkpoint asks
      backend_.to_host(committed_[a].data(), n_, staging_.data());
      return staging_;
    }
  }
  /// Replaces committed array `a` by `values` (host memory, n of them).
  void load(std::size_t a, std::span<const float> values) {
    backend_.to_device(values.data(), n_, committed_[a].data());
  }

  /// The committed arrays are state; the step's arrays, workspace.
  void add_held(held_memory& use) const {
    for (std::size_t a = 0; a != Arrays; ++a) {
      use.state += bytes_held(committed_[a]);
      use.workspace += bytes_held(next_[a]);
    }
    use.workspace += bytes_held(staging_);
  }

 private:
  static pointers addresses(const std::array<buffer, Arrays + 1>& buffers) {
    pointers p{};
    for (std::size_t a = 0; a != Arrays; ++a) p.at[a] = const_cast<float*>(buffers[a].data());
    return p;
  }

  Backend backend_;
  std::size_t n_;
  std::array<buffer, Arrays + 1> committed_{};
  std::array<buffer, Arrays + 1> next_{};
  mutable std::vector<float> staging_;
};

/// The algorithm of an element-wise corrector on any backend, each stage queued with the
/// step's status, over a committed `State` (float_state, or compact_state of
/// detail/correct/compact.hpp) that says how the committed state is read and stored.
template <elementwise_corrector Policy, class Backend, class State>
class correction {
  static constexpr std::size_t arrays = Policy::state_arrays;
  static constexpr bool own_acc = Policy::acc_state < 0;
  using buffer = typename Backend::template buffer<float>;

 public:
  correction(const Backend& be, std::size_t n, State state)
      : n_(n),
        state_(std::move(state)),
        acc_(be.template allocate<float>(own_acc ? n : 0)),
        tile_sums_(be.template allocate<double>(scales_gradient<Policy>() ? tile_count(n) : 0)),
        sum_of_squares_(be.template allocate<double>(scales_gradient<Policy>() ? 1 : 0)),
        scale_(be.template allocate<float>(scales_gradient<Policy>() ? 1 : 0)) {}

  /// Queues the new state and acc of every element from g (float32, or 16-bit read as it
  /// is: no float32 copy of it); a NaN or infinity in acc raises the status's flag. A
  /// clip's factor is computed on the backend (no read-back).
  template <gradient_element G>
  void update(const Backend& be, const Policy& policy, std::span<const G> g, step_status* status) {
    be.reduce_or(n_, update_pass(be, policy, g), &status->non_finite);
  }

  /// The element-wise pass of update() (what its reduction runs per element), for a
  /// selector whose first pass over acc writes acc as it reads it (written_acc(i)) and
  /// flags a NaN or an infinity in it itself, so that acc is read once less: queues what
  /// must come before the pass (a clip's factor) and makes the step's arrays ready.
  template <gradient_element G>
  auto update_pass(const Backend& be, const Policy& policy, std::span<const G> g) {
    const float* scale = nullptr;
    if constexpr (scales_gradient<Policy>()) {
      if (policy.needs_norm()) {
        be.sum(n_, square_of<G>{g.data()}, tile_sums_.data(), sum_of_squares_.data());
        be.for_each(1, elementwise::scale_from_norm<Policy>{policy, sum_of_squares_.data(), scale_.data()});
        scale = scale_.data();
      }
    }
    if (own_acc && static_cast<std::size_t>(acc_.size()) != n_) acc_ = be.template allocate<float>(n_);
    next_ = state_.next(be);
    return elementwise::update<Policy, arrays, own_acc, decltype(state_.reader()), G>{
        policy, state_.reader(), next_, acc_.data(), g.data(), scale};
  }

  /// acc of the step in progress.
  std::span<const float> acc(std::span<const float>) const noexcept {
    if constexpr (own_acc) {
      return {acc_.data(), n_};
    } else {
      return {next_.at[static_cast<std::size_t>(Policy::acc_state)], n_};
    }
  }

  /// Queues into `out` the acc that update() would compute now, and its finiteness
  /// into the status. The committed state is untouched (update() writes only the next
  /// copy, which the next step rewrites whole).
  template <gradient_element G>
  void preview(const Backend& be, const Policy& policy, std::span<const G> g, std::span<float> out,
               step_status* status) {
    update(be, policy, g, status);
    be.for_each(n_, elementwise::copy{acc({}).data(), out.data()});
  }

  /// Queues the commit of the sent entries: index and sent span the workspace and the
  /// count is the status's; nothing is written if the step met a NaN. Then the state
  /// stores the step's (a compact state encodes it, likewise predicated on the status).
  void commit(const Backend& be, const Policy& policy, std::span<const std::uint32_t> index,
              std::span<const float> sent, const step_status* status) {
    be.for_each(index.size(), elementwise::commit<Policy, arrays, decltype(state_.reader())>{
                                  policy, state_.reader(), next_, acc({}).data(), index.data(), sent.data(), status});
    state_.store(be, status);
  }

  /// Makes the step's state the committed one.
  void accept() noexcept {
    state_.accept();
    next_ = {};
  }

  /// Gives back the arrays of n floats that only a step uses (the state's next copy,
  /// acc); the committed state stays.
  void release_workspace() noexcept {
    state_.release_workspace();
    acc_ = buffer{};
    next_ = {};
  }

  /// Committed array `a`, readable on the host.
  std::span<const float> committed(std::size_t a) const { return state_.committed(a); }

  /// What the state and the pass's buffers hold.
  void add_held(held_memory& use) const {
    state_.add_held(use);
    use.workspace += bytes_held(acc_, tile_sums_, sum_of_squares_, scale_);
  }
  /// Replaces committed array `a` by `values` (host memory, n of them).
  void load_committed(std::size_t a, std::span<const float> values) { state_.load(a, values); }

 private:
  std::size_t n_;
  State state_;
  elementwise::arrays<arrays> next_{};  // where the step in progress writes its state
  buffer acc_;
  typename Backend::template buffer<double> tile_sums_;
  typename Backend::template buffer<double> sum_of_squares_;
  buffer scale_;
};

/// An element-wise corrector with its state in float32 (what every backend runs unless it
/// has a fast path).
template <elementwise_corrector Policy, class Backend>
class elementwise_correction : public correction<Policy, Backend, float_state<Backend, Policy::state_arrays>> {
  using base = correction<Policy, Backend, float_state<Backend, Policy::state_arrays>>;

 public:
  elementwise_correction(const Backend& be, const Policy&, std::size_t n)
      : base(be, n, float_state<Backend, Policy::state_arrays>(be, n)) {}
};

/// Every backend runs the element-wise correctors with the algorithm above, unless it has
/// a fast path for them (a detail::fast_engine: backend::host's fused pass).
template <elementwise_corrector Policy, class Backend>
class engine<Policy, Backend> : public elementwise_correction<Policy, Backend> {
 public:
  using elementwise_correction<Policy, Backend>::elementwise_correction;
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
