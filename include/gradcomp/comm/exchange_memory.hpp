/// \file comm/exchange_memory.hpp
/// The memory work of an exchange (comm::cyclic_topk, comm::sparse_allreduce) in the
/// memory of the compressor it serves, keyed on that memory space: reading a message's
/// indices and values, and adding sums into a dense tensor. Host memory here; device
/// memory in detail/cuda/exchange_memory.cuh (included by comm/nccl.cuh and by the
/// PyTorch binding's CUDA units). The spans are raw views of that memory. Not API.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/memory.hpp>
#include <gradcomp/message.hpp>
#include <gradcomp/held_memory.hpp>

#include <cstddef>
#include <cstdint>
#include <span>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

/// An exchange's memory work in `Memory` (host_memory below; device_memory: complete
/// where detail/cuda/exchange_memory.cuh is included).
template <class Memory>
class exchange_memory;

/// Host memory: the messages are read and the sums added on the calling thread (the
/// entries are few).
template <>
class exchange_memory<host_memory> {
 public:
  template <class Backend>
  explicit exchange_memory(const Backend& /*compressor's backend*/) noexcept {}

  /// The first out.size() indices of the message at `bytes`.
  void indices_of(std::span<const std::byte> bytes, std::span<std::uint32_t> out) const {
    std::size_t j = 0;
    message_reader(bytes).visit([&](std::uint32_t i, float) {
      if (j < out.size()) out[j++] = i;
    });
  }
  /// The first out.size() values of the message at `bytes` (of a tensor of n
  /// elements), as the receiver decodes them.
  void values_of(std::span<const std::byte> bytes, std::size_t /*n*/, std::span<float> out) const {
    std::size_t j = 0;
    message_reader(bytes).visit([&](std::uint32_t, float v) {
      if (j < out.size()) out[j++] = v;
    });
  }
  /// `index` readable on the host.
  std::span<const std::uint32_t> on_host(std::span<const std::uint32_t> index) const noexcept { return index; }
  /// dense[index[j]] += scale * sums[j].
  void add(std::span<const std::uint32_t> index, std::span<const float> sums, std::span<float> dense,
           float scale) const noexcept {
    for (std::size_t j = 0; j < index.size(); ++j) dense[index[j]] += scale * sums[j];
  }
  [[nodiscard]] static std::size_t held_bytes() noexcept { return 0; }
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
