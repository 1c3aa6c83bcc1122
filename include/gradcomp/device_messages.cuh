/// \file device_messages.cuh
/// Decoding and accumulating messages that live in device memory (backend::cuda): the
/// counterparts of message.hpp's decode() and accumulate(), which check the whole
/// message on the device before anything is written. Their views are device_spans
/// (memory.hpp): a host message is refused at compile time, and a host pointer wrapped
/// in a device_span with an error naming it.
#pragma once

#include <gradcomp/backend/cuda.cuh>
#include <gradcomp/config.hpp>
#include <gradcomp/detail/codec/decode.hpp>
#include <gradcomp/error.hpp>
#include <gradcomp/memory.hpp>
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
  /// Workspace from `be`'s allocator, on its device; calls without a context of their
  /// own are queued on its stream.
  /// \throws gradcomp::error (errc::device) if the workspace cannot be allocated.
  explicit device_accumulator(const backend::cuda& be)
      : backend_(be.resolved("device_accumulator")), decoder_(backend_) {}

  /// `dense[i] += scale * value` for every entry of the message at `bytes`, queued on
  /// `context`'s stream (on the accumulator's device). The whole message is checked
  /// first (this waits for the stream); on error `dense` is unchanged. Calls on
  /// different streams share the workspace, so the caller orders them (an event).
  /// \throws gradcomp::error if the message is corrupt, `dense.size()` differs from the
  ///         message's n, `scale` is not finite, a view is host memory, `dense` shares
  ///         memory with the message, some dense[i] + scale * value would not be finite,
  ///         or the context or the current device is not the accumulator's.
  void operator()(const backend::cuda& context, device_span<const std::byte> bytes, device_span<float> dense,
                  float scale) {
    const backend::cuda on = backend_.context_for("accumulate", context);
    backend_.require_current_device("accumulate");
    detail::require(std::isfinite(scale), errc::invalid_argument, "accumulate: scale must be finite, got ", scale);
    on.require_device_pointer("accumulate", "bytes", bytes.data());
    on.require_device_pointer("accumulate", "dense", dense.data());
    detail::require_apart("accumulate", bytes.data(), bytes.size(), dense.data(), dense.size());
    decoder_.add(on, decoder_.check(on, detail::raw(bytes), dense.size(), "accumulate", {dense.data(), scale}),
                 detail::raw(dense), scale);
  }
  /// The same on the accumulator's own stream.
  void operator()(device_span<const std::byte> bytes, device_span<float> dense, float scale) {
    (*this)(backend_, bytes, dense, scale);
  }

  /// operator() of the message in a frame, with nothing read back, for a caller that
  /// reads many messages' outcomes at once (the DDP hook's all-gather): `frame` is a
  /// rank's verdict (its error code at byte 0, its message's size at byte 8, 24 bytes)
  /// and then up to frame.size() - 24 bytes of its message, in device memory; `format`
  /// is the encoder the ranks agreed on. The message's header is read on the device, its
  /// checks OR their faults into `*fault` (device memory, cleared by the caller), and
  /// `dense` is added to, on `context`'s stream, only where none was found. A nonzero
  /// `*fault` afterwards means operator() raises for this message, or that it is not
  /// written as `format` says, and that `dense` went unchanged: call operator() on the
  /// message to learn the error. A verdict's error, or a message larger than the frame,
  /// leaves both untouched (the caller reads the verdicts).
  /// \throws gradcomp::error (invalid_argument) as operator() does for its arguments, or
  ///         for a frame shorter than its verdict; nothing is queued then.
  void queue_framed_add(const backend::cuda& context, const encode::index_value& format,
                        device_span<const std::byte> frame, device_span<float> dense, float scale,
                        device_span<std::uint32_t> fault) {
    const backend::cuda on = backend_.context_for("accumulate", context);
    backend_.require_current_device("accumulate");
    detail::require(std::isfinite(scale), errc::invalid_argument, "accumulate: scale must be finite, got ", scale);
    detail::require(!fault.empty(), errc::invalid_argument, "accumulate: the fault word is empty");
    on.require_device_pointer("accumulate", "frame", frame.data());
    on.require_device_pointer("accumulate", "dense", dense.data());
    on.require_device_pointer("accumulate", "fault", fault.data());
    detail::require_apart("accumulate", frame.data(), frame.size(), dense.data(), dense.size());
    decoder_.queue_framed_add(on, format, detail::raw(frame), detail::raw(dense), scale, fault.data());
  }

 private:
  backend::cuda backend_;
  detail::message_decoder<backend::cuda> decoder_;
};

/// `dense[i] += scale * value` for every entry of a message in device memory, into a
/// dense tensor in device memory, queued on `context`'s stream (see device_accumulator,
/// which does the same without allocating every call).
inline void accumulate(const backend::cuda& context, device_span<const std::byte> bytes, device_span<float> dense,
                       float scale) {
  device_accumulator{context}(bytes, dense, scale);
}

/// A message in host memory is not what backend::cuda accumulates: refused at compile
/// time, naming what to do instead.
template <class Byte, class Dense>
void accumulate(const backend::cuda& /*context*/, std::span<Byte> /*bytes*/, Dense&& /*dense*/, float /*scale*/) {
  static_assert(detail::never<Byte>,
                "gradcomp::accumulate(backend::cuda, ...) reads a message in device memory (a device_span), and "
                "these bytes are a std::span (host memory): copy the message to the device, or accumulate it "
                "with backend::host");
}

/// Reads a message in device memory into host vectors (see decode()), copying it on
/// `context`'s stream.
/// \throws gradcomp::error (corrupt_message) if anything in it is inconsistent, or
///         (invalid_argument) if `bytes` is host memory.
inline sparse_vector decode(const backend::cuda& context, device_span<const std::byte> bytes) {
  context.require_device_pointer("decode", "bytes", bytes.data());
  return decode(context.to_host(detail::raw(bytes)));
}

GRADCOMP_NAMESPACE_END
