/// \file detail/select/given_indices.hpp
/// select::given_indices's algorithm, on every backend: the set lives in the backend's
/// memory, put there by set_indices after the host has checked it, or by
/// set_indices_queued from the backend's memory and checked there, and each step copies
/// it into the index workspace. Not API.
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

/// Whether indices[j] of a set is not below n or does not exceed indices[j - 1]
/// (set_indices_queued's check, where the set is).
struct given_index_fault {
  const std::uint32_t* indices;
  std::size_t n;
  GRADCOMP_HOST_DEVICE std::uint32_t operator()(std::size_t j) const {
    return indices[j] >= n || (j > 0 && indices[j - 1] >= indices[j]) ? 1u : 0u;
  }
};

/// out[j] = set[j] where the set passed its check (*fault == 0), else j: a set that
/// failed it is replaced by the first indices, so that the step stays well formed.
struct copy_given_set {
  const std::uint32_t* set;
  const std::uint32_t* fault;
  std::uint32_t* out;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t j) const {
    out[j] = *fault == 0 ? set[j] : static_cast<std::uint32_t>(j);
  }
};

/// The word at `at` (an OR of it into another: reduce_or over one item).
struct word_of {
  const std::uint32_t* at;
  GRADCOMP_HOST_DEVICE std::uint32_t operator()(std::size_t) const { return *at; }
};

/// select::given_indices on any backend.
template <class Backend>
class given_indices_selection {
 public:
  given_indices_selection(const Backend& be, const select::given_indices& policy, std::size_t n)
      : backend_(be),
        n_(n),
        given_(be.template allocate<std::uint32_t>(policy.max_selected(n))),
        fault_(be.template allocate<std::uint32_t>(1)) {}

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
    if (fault_now_) backend_.clear(fault_.data(), 1);
    fault_now_ = false;
    count_ = indices.size();
  }
  /// Replaces the index set by one in the backend's memory, checked there on `on` (its
  /// fault ORed into `*fault` too): a set that fails is replaced by the first indices.
  void set_indices_queued(const Backend& on, const select::given_indices& policy,
                          std::span<const std::uint32_t> indices, std::uint32_t* fault) {
    const std::size_t capacity = policy.max_selected(n_);
    require(indices.size() <= capacity, errc::invalid_argument, "set_indices_queued: ", indices.size(),
            " indices exceed the selector's capacity of ", capacity);
    on.clear(fault_.data(), 1);
    on.reduce_or(indices.size(), given_index_fault{indices.data(), n_}, fault_.data());
    on.for_each(indices.size(), copy_elements<std::uint32_t>{indices.data(), given_.data()});
    on.reduce_or(1, word_of{fault_.data()}, fault);
    fault_now_ = true;
    count_ = indices.size();
  }

  /// Queues the copy of the set into out and its count.
  queued_selection select(const Backend& be, const select::given_indices&, const select_input&,
                          std::span<std::uint32_t> out, step_status* status) {
    be.for_each(count_, copy_given_set{given_.data(), fault_.data(), out.data()});
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
  typename Backend::template buffer<std::uint32_t>
      fault_;               // the set's check: 0 where it passed, or was checked on the host
  bool fault_now_ = false;  // whether fault_ may be set (a set checked where it is)
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
