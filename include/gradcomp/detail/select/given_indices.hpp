/// \file detail/select/given_indices.hpp
/// select::given_indices's algorithm, on every backend: the set lives in the backend's
/// memory, put there by set_indices after the host has checked it, and each step
/// copies it into the index workspace. Not API.
#pragma once

#include <gradcomp/concepts.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/detail/core/selector_work.hpp>
#include <gradcomp/detail/core/step_input.hpp>
#include <gradcomp/error.hpp>
#include <gradcomp/select/given_indices.hpp>
#include <gradcomp/held_memory.hpp>

#include <cstddef>
#include <cstdint>
#include <span>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

/// Throws unless `indices` ascend strictly, are below n and number at most `capacity`.
inline void check_given_indices(std::span<const std::uint32_t> indices, std::size_t n, std::size_t capacity) {
  require(indices.size() <= capacity, errc::invalid_argument, "set_indices: ", indices.size(),
          " indices exceed the selector's capacity of ", capacity);
  for (std::size_t j = 0; j < indices.size(); ++j) {
    require(indices[j] < n, errc::invalid_argument, "set_indices: indices[", j, "] = ", indices[j],
            " is not below n = ", n);
    require(j == 0 || indices[j] > indices[j - 1], errc::invalid_argument, "set_indices: indices[", j,
            "] = ", indices[j], " does not exceed indices[", j - 1, "] = ", indices[j - 1]);
  }
}

/// select::given_indices on any backend.
template <class Backend>
class given_indices_selection {
 public:
  given_indices_selection(const Backend& be, const select::given_indices& policy, std::size_t n)
      : backend_(be), n_(n), given_(be.template allocate<std::uint32_t>(policy.max_selected(n))) {}

  /// Room for the set `policy` takes (a new density); a set that no longer fits is
  /// dropped, so that no step sends more than the workspace holds.
  void reserve(const select::given_indices& policy) {
    const std::size_t capacity = policy.max_selected(n_);
    if (capacity > static_cast<std::size_t>(given_.size())) {
      auto grown = backend_.template allocate<std::uint32_t>(capacity);
      backend_.for_each(count_, copy_elements<std::uint32_t>{given_.data(), grown.data()});
      given_ = std::move(grown);
    }
    if (count_ > capacity) count_ = 0;
  }

  /// Replaces the index set (checked on the host first; on error nothing changes).
  void set_indices(const select::given_indices& policy, std::span<const std::uint32_t> indices) {
    check_given_indices(indices, n_, policy.max_selected(n_));
    backend_.to_device(indices.data(), indices.size(), given_.data());
    count_ = indices.size();
  }

  /// Queues the copy of the set into out and its count.
  queued_selection select(const Backend& be, const select::given_indices&, const select_input&,
                          std::span<std::uint32_t> out, step_status* status) {
    be.for_each(count_, copy_elements<std::uint32_t>{given_.data(), out.data()});
    queue_count(be, status, count_);
    return {};
  }
  void accept() noexcept {}
  /// The index set is workspace by held_memory's account (no checkpoint holds it: the
  /// caller sets it, ScaleCom's leader at every step).
  void add_held(held_memory& use) const { use.workspace += bytes_held(given_); }
  /// The index set is all this engine holds, and it stays (set_indices set it).
  void release_workspace() noexcept {}

 private:
  Backend backend_;
  std::size_t n_;
  typename Backend::template buffer<std::uint32_t> given_;
  std::size_t count_ = 0;
};

/// Every backend runs the one above.
template <class Backend>
class engine<select::given_indices, Backend> : public given_indices_selection<Backend> {
 public:
  using given_indices_selection<Backend>::given_indices_selection;
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
