/// \file detail/step_record.hpp
/// A step_status in a backend's memory, so that an engine written to the queued step
/// protocol (every stage takes the step's status) also answers at once, as the
/// compressor's host-memory path asks. Not API.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/detail/step_input.hpp>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

template <class Backend>
class step_record {
 public:
  explicit step_record(const Backend& be) : backend_(be), status_(be.template allocate<step_status>(1)) {}

  /// Clears the record, runs `queue(status)` and returns the status the work it queued
  /// left (one read of the record).
  template <class Queue>
  step_status run_now(Queue&& queue) {
    backend_.clear(status_.data(), 1);
    queue(status_.data());
    return backend_.read(static_cast<const step_status*>(status_.data()));
  }
  /// run_now(queue): whether the work met no NaN or infinity.
  template <class Queue>
  bool finite_now(Queue&& queue) {
    return run_now(static_cast<Queue&&>(queue)).non_finite == 0;
  }

 private:
  Backend backend_;
  typename Backend::template buffer<step_status> status_;
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
