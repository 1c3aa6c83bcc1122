/// \file detail/kokkos/selectors.hpp
/// Selector engines on backend::kokkos. Full passes over acc are parallel_scan (ordered
/// compaction), parallel_reduce or parallel_for kernels on the space; the small steps
/// that follow (ranking a sample or a candidate list, Floyd's draws) run on the host
/// with the code backend::host uses, so both give identical selections. Not API.
#pragma once

#include <gradcomp/backend/kokkos.hpp>
#include <gradcomp/detail/host/chunk_local.hpp>
#include <gradcomp/detail/host/given_indices.hpp>
#include <gradcomp/detail/host/random_k.hpp>
#include <gradcomp/detail/kokkos/primitives.hpp>
#include <gradcomp/detail/sampled_threshold_steps.hpp>
#include <gradcomp/detail/step_input.hpp>
#include <gradcomp/select/chunk_local.hpp>
#include <gradcomp/select/exact_topk.hpp>
#include <gradcomp/select/given_indices.hpp>
#include <gradcomp/select/random_k.hpp>
#include <gradcomp/select/sampled_threshold.hpp>
#include <gradcomp/select/threshold.hpp>

#include <algorithm>
#include <cmath>
#include <tuple>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

/// Selectors here do no work in the corrector's pass.
struct kokkos_no_observe {
  template <class Policy>
  void begin_observe(const Policy&, std::uint64_t) noexcept {}
  void observe(int, std::size_t, std::span<const float>, std::span<const float>) noexcept {}
};

/// Exact top-k on a Kokkos space: sample bracket (as on the host), one parallel_scan
/// splitting acc into certain entries and candidates, candidates ranked on the host;
/// a histogram (atomic increments) gives the exact bracket when the sample's misses.
template <class Space>
class kokkos_topk {
  static constexpr std::size_t sample_stride = 512;
  static constexpr std::size_t min_sampled_n = std::size_t{1} << 16;

 public:
  kokkos_topk(const backend::kokkos<Space>& be, std::size_t n)
      : space_(be.space),
        n_(n),
        candidates_(be.template allocate<std::uint32_t>(n)),
        keys_(be.template allocate<std::uint32_t>(n)),
        sample_(be.template allocate<float>(n >= min_sampled_n ? n / sample_stride : 0)),
        bins_(be.template allocate<std::uint32_t>(top_digit_bins)),
        staging_index_(kk::host_accessible<Space> ? 0 : n),
        staging_keys_(kk::host_accessible<Space> ? 0 : n),
        staging_out_(kk::host_accessible<Space> ? 0 : n),
        staging_sample_(kk::host_accessible<Space> ? 0 : sample_.extent(0)),
        staging_bins_(kk::host_accessible<Space> ? 0 : top_digit_bins) {}

  /// Writes the ascending indices of the k entries of largest |acc| to out[0, k).
  /// Returns the k-th largest key.
  std::uint32_t select(std::span<const float> acc_span, std::size_t k, std::span<std::uint32_t> out_span) {
    const auto acc = kk::wrap<Space>(acc_span);
    const auto out = kk::wrap<Space>(out_span);
    if (k == n_) {
      Kokkos::parallel_for(
          "gradcomp::iota", kk::range(space_, n_), KOKKOS_LAMBDA(const std::size_t i) { out(i) = static_cast<std::uint32_t>(i); });
      space_.fence();
      return min_key(acc, out, k);
    }
    if (sample_.extent(0) > 0) {
      const auto sample = sample_;
      Kokkos::parallel_for(
          "gradcomp::sample", kk::range(space_, sample_.extent(0)),
          KOKKOS_LAMBDA(const std::size_t j) { sample(j) = acc(j * sample_stride); });
      space_.fence();
      const float* s = kk::read_on_host<Space>(std::span<const float>(sample_.data(), sample_.extent(0)), staging_sample_);
      const auto [lo, hi] = sample_bracket({s, sample_.extent(0)}, n_, k);
      const auto [certain, candidates] = split(acc, out, k, lo, hi);
      if (certain < k && k <= certain + candidates) return finish(acc, out_span, k, certain, candidates, 0, 0);
    }
    const auto bins = bins_;
    Kokkos::deep_copy(space_, bins, 0u);
    Kokkos::parallel_for(
        "gradcomp::histogram", kk::range(space_, n_), KOKKOS_LAMBDA(const std::size_t i) {
          Kokkos::atomic_increment(&bins(magnitude_key(acc(i)) >> magnitude_digits[0].shift));
        });
    space_.fence();
    const std::uint32_t* b = kk::read_on_host<Space>(std::span<const std::uint32_t>(bins_.data(), top_digit_bins), staging_bins_);
    const std::uint32_t bin = find_bin_from_top({b, top_digit_bins}, k).first;
    const std::uint32_t lo = bin << magnitude_digits[0].shift;
    const auto [certain, candidates] = split(acc, out, k, lo, lo | ((1u << magnitude_digits[0].shift) - 1u));
    return finish(acc, out_span, k, certain, candidates, 1, lo);
  }

 private:
  // One parallel_scan: keys above hi to out (up to k of them), keys in [lo, hi] to the
  // candidates, both ascending. The two running counts share one 64-bit scan value.
  std::pair<std::size_t, std::size_t> split(const kk::view<const float, Space>& acc, const kk::view<std::uint32_t, Space>& out,
                                            std::size_t k, std::uint32_t lo, std::uint32_t hi) {
    const auto candidates = candidates_;
    const std::size_t n = n_;
    const std::size_t groups = (n + mask_group - 1) / mask_group;
    std::uint64_t total = 0;
    Kokkos::parallel_scan(
        "gradcomp::split", kk::range(space_, groups),
        KOKKOS_LAMBDA(const std::size_t b, std::uint64_t& at, const bool final) {
          const std::size_t first = b * mask_group;
          for (std::uint32_t mask = at_least_mask(acc.data() + first, n - first, lo); mask != 0; mask &= mask - 1) {
            const std::size_t i = first + lowest_bit(mask);
            const std::uint32_t key = magnitude_key(acc(i));
            if (key > hi) {
              if (final && (at >> 32) < k) out(at >> 32) = static_cast<std::uint32_t>(i);
              at += std::uint64_t{1} << 32;
            } else {
              if (final) candidates(at & 0xFFFFFFFFu) = static_cast<std::uint32_t>(i);
              at += 1;
            }
          }
        },
        total);
    space_.fence();
    return {static_cast<std::size_t>(total >> 32), static_cast<std::size_t>(total & 0xFFFFFFFFu)};
  }

  // Ranks the candidates on the host (keys gathered on the space) and merges them with
  // the certain entries. Returns the k-th largest key.
  std::uint32_t finish(const kk::view<const float, Space>& acc, std::span<std::uint32_t> out_span, std::size_t k,
                       std::size_t certain, std::size_t candidates, std::size_t first_digit, std::uint32_t prefix) {
    const auto list = candidates_;
    const auto keys = keys_;
    Kokkos::parallel_for(
        "gradcomp::candidate_keys", kk::range(space_, candidates),
        KOKKOS_LAMBDA(const std::size_t j) { keys(j) = magnitude_key(acc(list(j))); });
    space_.fence();
    std::uint32_t* list_host = mirror(std::span<std::uint32_t>(candidates_.data(), candidates), staging_index_);
    const std::uint32_t* keys_host =
        kk::read_on_host<Space>(std::span<const std::uint32_t>(keys_.data(), candidates), staging_keys_);
    std::uint32_t* out_host = mirror(out_span.first(certain), staging_out_);
    std::size_t chosen = candidates;
    std::uint32_t kth = ~0u;
    const std::size_t r = k - certain;
    if (r < candidates) {
      std::tie(chosen, kth) = keep_top_keys({list_host, candidates}, {keys_host, candidates}, r, first_digit, prefix);
    } else {
      for (std::size_t j = 0; j < candidates; ++j) kth = std::min(kth, keys_host[j]);
    }
    merge_backwards(out_host, certain, list_host, chosen);
    kk::write_back<Space>(out_host, out_span.first(k));
    return kth;
  }

  std::uint32_t min_key(const kk::view<const float, Space>& acc, const kk::view<std::uint32_t, Space>& out, std::size_t k) {
    std::uint32_t smallest = ~0u;
    Kokkos::parallel_reduce(
        "gradcomp::min_key", kk::range(space_, k),
        KOKKOS_LAMBDA(const std::size_t j, std::uint32_t& m) {
          const std::uint32_t key = magnitude_key(acc(out(j)));
          m = key < m ? key : m;
        },
        Kokkos::Min<std::uint32_t>(smallest));
    return smallest;
  }

  // Host memory holding a writable copy of `device` (the memory itself when host-accessible).
  template <class T>
  T* mirror(std::span<T> device, std::vector<T>& staging) {
    T* host = kk::write_on_host<Space>(device, staging);
    if constexpr (!kk::host_accessible<Space>) kk::to_host<Space>(std::span<const T>(device), host);
    return host;
  }

  Space space_;
  std::size_t n_;
  Kokkos::View<std::uint32_t*, kk::memory<Space>> candidates_, keys_;
  Kokkos::View<float*, kk::memory<Space>> sample_;
  Kokkos::View<std::uint32_t*, kk::memory<Space>> bins_;
  std::vector<std::uint32_t> staging_index_, staging_keys_, staging_out_;
  std::vector<float> staging_sample_;
  std::vector<std::uint32_t> staging_bins_;
};

template <class Space>
class engine<select::exact_topk, backend::kokkos<Space>> : public kokkos_no_observe {
 public:
  engine(const backend::kokkos<Space>& be, const select::exact_topk&, std::size_t n) : topk_(be, n) {}
  void reserve(const select::exact_topk&) noexcept {}  // the workspace is sized by n, not k
  selection select(const select::exact_topk& policy, const select_input& in, std::span<std::uint32_t> out) {
    const std::size_t k = policy.k(in.acc.size());
    topk_.select(in.acc, k, out);
    return {k};
  }
  void accept() noexcept {}

 private:
  kokkos_topk<Space> topk_;
};

/// The indices of one chunk_local bin (acc and g point at it): written from `out` on
/// (up to out_end) and counted, or only counted when `out` is null. On the host this is
/// backend::host's SIMD kernel.
GRADCOMP_HOST_DEVICE inline std::size_t chunk_local_bin(const float* acc, const float* g, std::size_t len,
                                                        std::size_t first, std::uint32_t* out,
                                                        std::uint32_t* out_end) noexcept {
#if !defined(__CUDA_ARCH__) && !defined(__HIP_DEVICE_COMPILE__)
  if (out != nullptr) {
    bool non_finite = false;  // acc was checked by the corrector
    return static_cast<std::size_t>(select_bin(acc, g, len, first, out, out_end, non_finite) - out);
  }
#endif
  float largest = 0.0f;
  for (std::size_t j = 0; j < len; ++j) largest = fabsf(acc[j]) > largest ? fabsf(acc[j]) : largest;
  std::size_t count = 0;
  for (std::size_t j = 0; j < len; ++j) {
    if (fabsf(acc[j] + g[j]) >= largest) {
      if (out != nullptr && out + count < out_end) out[count] = static_cast<std::uint32_t>(first + j);
      ++count;
    }
  }
  return count;
}

template <class Space>
class engine<select::chunk_local, backend::kokkos<Space>> : public kokkos_no_observe {
 public:
  engine(const backend::kokkos<Space>& be, const select::chunk_local&, std::size_t) : space_(be.space) {}

  // One parallel_scan over the bins: each computes its maximum and its hits.
  selection select(const select::chunk_local& policy, const select_input& in, std::span<std::uint32_t> out) {
    const auto acc = kk::wrap<Space>(in.acc);
    const auto g = kk::wrap<Space>(in.grad);
    const auto dest = kk::wrap<Space>(out);
    const std::size_t n = in.acc.size();
    const std::size_t bin = policy.bin_for(n);
    std::size_t total = 0;
    Kokkos::parallel_scan(
        "gradcomp::chunk_local", kk::range(space_, (n + bin - 1) / bin),
        KOKKOS_LAMBDA(const std::size_t b, std::size_t& at, const bool final) {
          const std::size_t first = b * bin;
          const std::size_t len = first + bin < n ? bin : n - first;
          at += chunk_local_bin(acc.data() + first, g.data() + first, len, first,
                                final ? dest.data() + at : nullptr, dest.data() + dest.extent(0));
        },
        total);
    space_.fence();
    return {total};
  }
  void accept() noexcept {}

 private:
  Space space_;
};

template <class Space>
class engine<select::random_k, backend::kokkos<Space>> : public kokkos_no_observe {
 public:
  engine(const backend::kokkos<Space>& be, const select::random_k& policy, std::size_t n)
      : n_(n), taken_((n + 63) / 64), staging_(kk::host_accessible<Space> ? 0 : policy.k(n)) {
    (void)be;
  }
  void reserve(const select::random_k& policy) {
    if constexpr (!kk::host_accessible<Space>) staging_.resize(std::max(staging_.size(), policy.k(n_)));
  }
  selection select(const select::random_k& policy, const select_input& in, std::span<std::uint32_t> out) {
    const std::size_t k = policy.k(n_);
    std::uint32_t* host = kk::write_on_host<Space>(out.first(k), staging_);
    random_k_indices(policy.seed, in.step, n_, k, taken_.data(), host);  // the draws are the host's own
    kk::write_back<Space>(host, out.first(k));
    return {k, policy.value_scale(n_)};
  }
  void accept() noexcept {}

 private:
  std::size_t n_;
  std::vector<std::uint64_t> taken_;
  std::vector<std::uint32_t> staging_;
};

template <class Space>
class engine<select::given_indices, backend::kokkos<Space>> : public kokkos_no_observe {
 public:
  engine(const backend::kokkos<Space>&, const select::given_indices& policy, std::size_t n) : n_(n) {
    given_.reserve(policy.max_count);
  }
  void set_indices(const select::given_indices& policy, std::span<const std::uint32_t> indices) {
    check_given_indices(indices, n_, policy.max_count);
    given_.assign(indices.begin(), indices.end());
  }
  selection select(const select::given_indices&, const select_input&, std::span<std::uint32_t> out) {
    kk::write_back<Space>(given_.data(), out.first(given_.size()));
    return {given_.size()};
  }
  void accept() noexcept {}

 private:
  std::size_t n_;
  std::vector<std::uint32_t> given_;
};

template <class Space>
class engine<select::sampled_threshold, backend::kokkos<Space>> : public kokkos_no_observe, public carries_threshold {
 public:
  engine(const backend::kokkos<Space>& be, const select::sampled_threshold& policy, std::size_t n)
      : be_(be), n_(n), topk_(be, n), candidates_(be.template allocate<std::uint32_t>(n)),
        keys_(be.template allocate<std::uint32_t>(n)), staging_index_(kk::host_accessible<Space> ? 0 : n),
        staging_keys_(kk::host_accessible<Space> ? 0 : n) {
    reserve(policy);
  }
  void reserve(const select::sampled_threshold& policy) {
    const std::size_t m = policy.sample_size(n_);
    if (m < n_ && m > sample_.extent(0)) {
      sample_ = be_.template allocate<float>(m);
      staging_sample_.resize(kk::host_accessible<Space> ? 0 : m);
    }
  }

  selection select(const select::sampled_threshold& policy, const select_input& in, std::span<std::uint32_t> out) {
    const std::size_t k = policy.k(n_);
    const sample_plan plan = sample_plan::make(policy, n_, in.step);
    if (plan.exact) {
      memory_.propose(topk_.select(in.acc, k, out));
      return {k};
    }
    const auto acc = kk::wrap<Space>(in.acc);
    const auto candidates = kk::wrap<Space>(std::span<std::uint32_t>(candidates_.data(), n_));
    auto collect = [&](std::uint32_t key) { return kk::compact_at_least(be_.space, acc, key, candidates); };
    std::uint32_t key = memory_.key();
    const bool reusing = policy.reuse_threshold && memory_.has();
    std::size_t count = reusing ? collect(key) : 0;
    if (!reusing || !within_bounds(policy, k, count)) {
      const auto sample = sample_;
      const std::size_t offset = plan.offset, stride = plan.stride;
      Kokkos::parallel_for(
          "gradcomp::sample", kk::range(be_.space, plan.size),
          KOKKOS_LAMBDA(const std::size_t j) { sample(j) = acc(offset + j * stride); });
      be_.space.fence();
      const float* s = kk::read_on_host<Space>(std::span<const float>(sample_.data(), plan.size), staging_sample_);
      key = sampled_threshold_key(policy, {s, plan.size});
      std::tie(count, key) = refine_threshold(policy, k, key, collect(key), collect);
    }
    if (needs_top_k(policy, k, count)) {
      const auto list = candidates_;
      const auto keys = keys_;
      Kokkos::parallel_for(
          "gradcomp::candidate_keys", kk::range(be_.space, count),
          KOKKOS_LAMBDA(const std::size_t j) { keys(j) = magnitude_key(acc(list(j))); });
      be_.space.fence();
      std::uint32_t* list_host = kk::write_on_host<Space>(std::span<std::uint32_t>(candidates_.data(), count), staging_index_);
      if constexpr (!kk::host_accessible<Space>) {
        kk::to_host<Space>(std::span<const std::uint32_t>(candidates_.data(), count), list_host);
      }
      const std::uint32_t* keys_host =
          kk::read_on_host<Space>(std::span<const std::uint32_t>(keys_.data(), count), staging_keys_);
      std::tie(count, key) = keep_top_keys({list_host, count}, {keys_host, count}, k, 0, 0);
      kk::write_back<Space>(list_host, std::span<std::uint32_t>(candidates_.data(), count));
    }
    Kokkos::deep_copy(be_.space, Kokkos::subview(kk::wrap<Space>(out), std::make_pair(std::size_t{0}, count)),
                      Kokkos::subview(candidates_, std::make_pair(std::size_t{0}, count)));
    be_.space.fence();
    memory_.propose(key);
    return {count};
  }

 private:
  backend::kokkos<Space> be_;
  std::size_t n_;
  kokkos_topk<Space> topk_;
  Kokkos::View<std::uint32_t*, kk::memory<Space>> candidates_, keys_;
  Kokkos::View<float*, kk::memory<Space>> sample_;
  std::vector<std::uint32_t> staging_index_, staging_keys_;
  std::vector<float> staging_sample_;
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
