// gradcomp.torch's decode and accumulate on torch tensors: the message checked whole
// before anything is written, on CPU or on the message's CUDA device (there on torch's
// current stream, one accumulator's workspace per device kept from call to call).
#pragma once

#include <torch/extension.h>

#include <gradcomp/encode/index_value.hpp>

#include <cstddef>
#include <span>

namespace gradcomp_py {

/// The bytes of a 1-D uint8 tensor (its memory, host or device).
inline std::span<const std::byte> bytes_of(const torch::Tensor& t) {
  return {reinterpret_cast<const std::byte*>(t.data_ptr<std::uint8_t>()), static_cast<std::size_t>(t.numel())};
}
/// bytes_of(), to be written.
inline std::span<std::byte> writable(const torch::Tensor& t) {
  return {reinterpret_cast<std::byte*>(t.data_ptr<std::uint8_t>()), static_cast<std::size_t>(t.numel())};
}

/// gradcomp.torch.decode: (indices int64, values float32, n) on the message's device.
pybind11::tuple decode(const torch::Tensor& message);

/// gradcomp.torch.accumulate: dense += scale * the message's entries, checked first;
/// dense is written as an in-place op is (tensors.hpp) and its version counter bumped.
void accumulate(const torch::Tensor& message, torch::Tensor& dense, double scale);

/// accumulate()'s work on checked tensors of one device, with the GIL released by the
/// caller (the DDP hook's exchange adds every rank's message with it).
void add_message(const torch::Tensor& message, torch::Tensor& dense, float scale);

/// add_message() of the message in a frame (a rank's verdict, then its message, as the
/// DDP hook's all-gather sends it), with nothing read back: the message's header is read
/// where it is, its checks' faults are ORed into `*fault` (in the frame's memory) and
/// `dense` is added to only where there were none; a verdict's error or a message that
/// outgrew the frame leaves both untouched (detail::message_decoder::queue_framed_add).
void queue_framed_add(const gradcomp::encode::index_value& format, const torch::Tensor& frame, torch::Tensor& dense,
                      float scale, std::uint32_t* fault);

}  // namespace gradcomp_py
