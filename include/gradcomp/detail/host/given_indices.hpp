/// \file detail/host/given_indices.hpp
/// select::given_indices on backend::host.
#pragma once

#include <gradcomp/backend/host.hpp>
#include <gradcomp/concepts.hpp>
#include <gradcomp/detail/step_input.hpp>
#include <gradcomp/select/given_indices.hpp>

#include <algorithm>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

/// Throws unless `indices` ascend strictly, are below n and number at most max_count.
inline void check_given_indices(std::span<const std::uint32_t> indices, std::size_t n, std::size_t max_count) {
  require(indices.size() <= max_count, errc::invalid_argument, "set_indices: ", indices.size(),
          " indices exceed max_count = ", max_count);
  for (std::size_t j = 0; j < indices.size(); ++j) {
    require(indices[j] < n, errc::invalid_argument, "set_indices: indices[", j, "] = ", indices[j],
            " is not below n = ", n);
    require(j == 0 || indices[j] > indices[j - 1], errc::invalid_argument, "set_indices: indices[", j, "] = ",
            indices[j], " does not exceed indices[", j - 1, "] = ", indices[j - 1]);
  }
}

template <>
class engine<select::given_indices, backend::host> {
 public:
  engine(const backend::host&, const select::given_indices& policy, std::size_t n) : n_(n) {
    given_.reserve(policy.max_count);
  }

  /// Replaces the index set (checked first; on error nothing changes).
  void set_indices(const select::given_indices& policy, std::span<const std::uint32_t> indices) {
    check_given_indices(indices, n_, policy.max_count);
    given_.assign(indices.begin(), indices.end());
  }

  void begin_observe(const select::given_indices&, std::uint64_t) noexcept {}
  void observe(int, std::size_t, std::span<const float>, std::span<const float>) noexcept {}
  selection select(const select::given_indices&, const select_input&, std::span<std::uint32_t> out) {
    std::copy(given_.begin(), given_.end(), out.begin());
    return {given_.size()};
  }
  void accept() noexcept {}

 private:
  std::size_t n_;
  std::vector<std::uint32_t> given_;
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
