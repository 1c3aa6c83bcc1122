// A selector written outside gradcomp, with its host engine, for the compile-fail tests of
// the engine contract (concepts.hpp). Each test leaves out one piece: USER_SELECTOR_NO_RESERVE,
// USER_SELECTOR_NO_SELECT, USER_SELECTOR_NO_RESTORE. With none left out it compiles
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

GRADCOMP_NAMESPACE_BEGIN
namespace detail {
template <>
class engine<first_entries, backend::host> {
 public:
  engine(const backend::host&, const first_entries&, std::size_t) {}
#ifndef USER_SELECTOR_NO_RESERVE
  void reserve(const first_entries&) noexcept {}
#endif
  void begin_observe(const first_entries&, std::uint64_t) noexcept {}
  void observe(int, std::size_t, std::span<const float>, std::span<const float>) noexcept {}
#ifndef USER_SELECTOR_NO_SELECT
  selection select(const first_entries& policy, const select_input& in, std::span<std::uint32_t> out) {
    const auto count = static_cast<std::size_t>(policy.density * static_cast<double>(in.acc.size()));
    for (std::size_t i = 0; i < count; ++i) out[i] = static_cast<std::uint32_t>(i);
    return {count};
  }
#endif
  void accept() noexcept {}
  [[nodiscard]] std::vector<double> saved_state() const { return {}; }
#ifndef USER_SELECTOR_NO_RESTORE
  static bool valid_state(std::span<const double> saved) { return saved.empty(); }
  void restore_state(std::span<const double>) noexcept {}
#endif
};
}  // namespace detail
GRADCOMP_NAMESPACE_END
