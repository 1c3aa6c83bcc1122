/// \file device_messages.cuh
/// Decoding and accumulating messages that live in device memory (backend::cuda): the
/// counterparts of message.hpp's decode() and accumulate(), which check the whole
/// message on the device before anything is written.
#pragma once

#include <gradcomp/backend/cuda.cuh>
#include <gradcomp/config.hpp>
#include <gradcomp/detail/cuda/index_value.cuh>
#include <gradcomp/error.hpp>
#include <gradcomp/message.hpp>

#include <cmath>
#include <cstddef>
#include <span>

GRADCOMP_NAMESPACE_BEGIN

/// accumulate() for messages and tensors in device memory, keeping its device
/// workspace from call to call: the form to call every step (the free accumulate()
/// allocates that workspace each time).
class device_accumulator {
 public:
  /// \throws gradcomp::error (errc::device) if the workspace cannot be allocated.
  explicit device_accumulator(const backend::cuda& be) : decoder_(be) {}

  /// `dense[i] += scale * value` for every entry of the message at `bytes`, queued on
  /// the backend's stream. The whole message is checked first (this waits for the
  /// stream); on error `dense` is unchanged.
  /// \throws gradcomp::error if the message is corrupt, `dense.size()` differs from the
  ///         message's n, or `scale` is not finite.
  void operator()(std::span<const std::byte> bytes, std::span<float> dense, float scale) {
    detail::require(std::isfinite(scale), errc::invalid_argument, "accumulate: scale must be finite, got ", scale);
    decoder_.add(decoder_.check(bytes, dense.size(), "accumulate"), dense, scale);
  }

 private:
  detail::device_decoder decoder_;
};

/// `dense[i] += scale * value` for every entry of a message in device memory, into a
/// dense tensor in device memory (see device_accumulator, which does the same without
/// allocating every call).
inline void accumulate(const backend::cuda& be, std::span<const std::byte> bytes, std::span<float> dense,
                       float scale) {
  device_accumulator{be}(bytes, dense, scale);
}

/// Reads a message in device memory into host vectors (see decode()).
/// \throws gradcomp::error (corrupt_message) if anything in it is inconsistent.
inline sparse_vector decode(const backend::cuda& be, std::span<const std::byte> bytes) {
  return decode(be.to_host(bytes));
}

GRADCOMP_NAMESPACE_END
