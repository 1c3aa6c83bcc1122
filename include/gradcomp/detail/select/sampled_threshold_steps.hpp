/// \file detail/select/sampled_threshold_steps.hpp
/// The backend-independent steps of select::sampled_threshold (docs/algorithms.md): where
/// the sample lies, its threshold, and the refinement loop. Templates on the policy so
/// that this header needs not include it (the policy header includes the host engine,
/// which includes this). Not API.
#pragma once

#include <gradcomp/detail/core/bits.hpp>
#include <gradcomp/detail/core/density.hpp>
#include <gradcomp/detail/core/radix_select.hpp>
#include <gradcomp/detail/core/random.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

/// Where the sample of one step lies: offset + j * stride for j < size.
struct sample_plan {
  std::size_t size = 0;
  std::size_t stride = 1;
  std::size_t offset = 0;
  bool exact = false;  ///< m >= n: fall back to exact top-k

  template <class Policy>
  static sample_plan make(const Policy& p, std::size_t n, std::uint64_t step) {
    sample_plan plan;
    plan.size = p.sample_size(n);
    plan.exact = plan.size >= n;
    if (plan.exact) return plan;
    plan.stride = n / plan.size;
    plan.offset = random_below(p.seed, step, 0, static_cast<std::uint32_t>(plan.stride));
    return plan;
  }
};

/// Step 2's threshold: the key of the r-th largest sampled magnitude, r the entries the
/// density names of the m sampled (entries_at_density).
template <class Policy>
std::uint32_t sampled_threshold_key(const Policy& p, std::span<const float> sample) {
  const std::size_t m = sample.size();
  const std::size_t r = entries_at_density(p.density, m);
  return kth_largest([&](std::size_t j) { return magnitude_key(sample[j]); }, m, r, 0, 0).key;
}

/// The threshold one refinement lowers `key` to: t * lower.
template <class Policy>
GRADCOMP_HOST_DEVICE std::uint32_t lowered_threshold(const Policy& p, std::uint32_t key) noexcept {
  return magnitude_key(float_of(key) * p.lower);
}

/// Step 3 from threshold `key`, whose C = {i : key_i >= key} is gathered already and
/// has `count` members: `collect(t)` gathers C for a lowered threshold t and returns |C|
/// (or stops the loop by returning k after flagging an error). Returns the final
/// {|C|, key}.
template <class Policy, class Collect>
std::pair<std::size_t, std::uint32_t> refine_threshold(const Policy& p, std::size_t k, std::uint32_t key,
                                                       std::size_t count, Collect&& collect) {
  const double low = static_cast<double>(p.lower) * static_cast<double>(k);
  const double high = static_cast<double>(p.upper) * static_cast<double>(k);
  for (int it = 0; it < p.max_iters; ++it) {
    if (static_cast<double>(count) > high || static_cast<double>(count) >= low) break;
    key = lowered_threshold(p, key);
    count = collect(key);
  }
  return {count, key};
}

/// Whether a count needs cutting to the top k (step 3's first case, or truncate).
template <class Policy>
GRADCOMP_HOST_DEVICE bool needs_top_k(const Policy& p, std::size_t k, std::size_t count) {
  return static_cast<double>(count) > static_cast<double>(p.upper) * static_cast<double>(k) ||
         (p.truncate && count > k);
}

/// Whether a reused threshold's count is acceptable as it is.
template <class Policy>
GRADCOMP_HOST_DEVICE bool within_bounds(const Policy& p, std::size_t k, std::size_t count) {
  const double c = static_cast<double>(count);
  return c >= static_cast<double>(p.lower) * static_cast<double>(k) &&
         c <= static_cast<double>(p.upper) * static_cast<double>(k);
}

/// What sampled_threshold carries from step to step (reuse_threshold), as checkpoints
/// write it (a state_record of concepts.hpp).
struct threshold_record {
  std::uint32_t has = 0;  ///< 1 once a step was accepted
  std::uint32_t key = 0;  ///< the final threshold key of the last accepted step
  template <class Field>
  void fields(Field&& f) {
    f(has);
    f(key);
  }
  [[nodiscard]] bool valid() const noexcept { return has <= 1 && key < non_finite_key; }
  friend bool operator==(const threshold_record&, const threshold_record&) = default;
};

/// The carried threshold: every backend's engine keeps one, and checkpoints save it.
class threshold_memory {
 public:
  [[nodiscard]] bool has() const noexcept { return record_.has != 0; }
  [[nodiscard]] std::uint32_t key() const noexcept { return record_.key; }
  void propose(std::uint32_t key) noexcept { next_ = key; }  // this step's, if it succeeds
  void accept() noexcept { record_ = {1, next_}; }
  [[nodiscard]] threshold_record saved_state() const noexcept { return record_; }
  void restore_state(const threshold_record& saved) noexcept { record_ = saved; }

 private:
  threshold_record record_;
  std::uint32_t next_ = 0;
};

/// The part of every backend's sampled_threshold engine that the compressor sees for
/// the carried threshold: accept() and the checkpoint hooks.
class carries_threshold {
 public:
  void accept() noexcept { memory_.accept(); }
  [[nodiscard]] threshold_record saved_state() const noexcept { return memory_.saved_state(); }
  void restore_state(const threshold_record& saved) noexcept { memory_.restore_state(saved); }

 protected:
  threshold_memory memory_;
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
