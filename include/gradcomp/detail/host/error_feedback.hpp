/// \file detail/host/error_feedback.hpp
/// correct::error_feedback on backend::host.
#pragma once

#include <gradcomp/correct/error_feedback.hpp>
#include <gradcomp/detail/host/corrector_state.hpp>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

template <>
class engine<correct::error_feedback, backend::host> {
 public:
  engine(const backend::host& be, const correct::error_feedback&, std::size_t n)
      : threads_(be.concurrency()), state_(n) {}

  template <class Visit>
  bool update(const correct::error_feedback& policy, std::span<const float> g, Visit&& visit) {
    int bad = 0;
    const std::span<const float> e = state_.committed(0);
    const std::span<float> next = state_.next(0);
    for_each_chunk(threads_, g.size(), [&](int thread, std::size_t, std::size_t begin, std::size_t end) {
      for (std::size_t i = begin; i < end; ++i) next[i] = policy.update(e[i], g[i]);
      const auto chunk = std::span<const float>(next).subspan(begin, end - begin);
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
  std::span<const float> acc(std::span<const float>) noexcept { return state_.next(0); }
  void commit(const correct::error_feedback&, std::span<const std::uint32_t> idx, std::span<const float> sent) {
    const std::span<float> e = state_.next(0);
    for (std::size_t j = 0; j < idx.size(); ++j) e[idx[j]] -= sent[j];
  }
  void accept() noexcept { state_.accept(); }
  std::span<float> committed(std::size_t a) noexcept { return state_.committed(a); }
  std::span<const float> committed(std::size_t a) const noexcept { return state_.committed(a); }

 private:
  int threads_;
  host_state<1> state_;
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
