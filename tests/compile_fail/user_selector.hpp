// A selector written outside gradcomp, with its host engine, for the compile-fail tests of
// the engine contract (concepts.hpp). Each test leaves out one piece: USER_SELECTOR_NO_RESERVE,
// USER_SELECTOR_NO_SELECT, USER_SELECTOR_NO_OBSERVE, USER_SELECTOR_NO_RESTORE. With none left out it compiles
// (control_complete_policies.cpp).
#pragma once

#include <gradcomp/gradcomp.hpp>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

/// Sends the first ceil(density * n) entries.
struct first_entries {
  double density = 0.5;
  std::string name() const { return "first_entries"; }
  void validate(std::size_t) const {}
  std::size_t max_selected(std::size_t n) const { return n; }
};

/// What the user's engine carries between steps: the steps it has selected in.
struct first_entries_state {
  std::uint64_t steps = 0;
  template <class Field>
  void fields(Field&& f) {
    f(steps);
  }
  bool valid() const { return true; }
};

GRADCOMP_NAMESPACE_BEGIN
namespace detail {
template <>
class engine<first_entries, backend::host> {
 public:
  engine(const backend::host&, const first_entries&, std::size_t) {}
#ifndef USER_SELECTOR_NO_RESERVE
  void reserve(const first_entries&) noexcept {}
#endif
  void begin_observe(const backend::host&, const first_entries&, std::uint64_t) noexcept {}
#ifndef USER_SELECTOR_NO_OBSERVE
  void observe(int, std::size_t, std::span<const float>, std::span<const float>) noexcept {}
#endif
#ifndef USER_SELECTOR_NO_SELECT
  // backend::host's memory is host memory: the count goes straight into the status.
  queued_selection select(const backend::host&, const first_entries& policy, const select_input& in,
                          std::span<std::uint32_t> out, step_status* status) {
    const auto count = static_cast<std::size_t>(policy.density * static_cast<double>(in.acc.size()));
    for (std::size_t i = 0; i < count; ++i) out[i] = static_cast<std::uint32_t>(i);
    status->count = static_cast<std::uint32_t>(count);
    return {};
  }
#endif
  void accept() noexcept { ++state_.steps; }
  [[nodiscard]] first_entries_state saved_state() const { return state_; }
#ifndef USER_SELECTOR_NO_RESTORE
  void restore_state(const first_entries_state& saved) noexcept { state_ = saved; }
#endif

 private:
  first_entries_state state_;
};
}  // namespace detail
GRADCOMP_NAMESPACE_END
