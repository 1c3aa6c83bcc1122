/// \file detail/cuda/exchange_memory.cuh
/// An exchange's memory work (comm/exchange_memory.hpp) in device memory: for
/// backend::cuda compressors, over comm::nccl or torch.distributed on CUDA tensors. Not
/// API.
#pragma once

#include <gradcomp/backend/cuda.cuh>
#include <gradcomp/comm/exchange_memory.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/detail/cuda/device_buffer.cuh>
#include <gradcomp/detail/cuda/launch.cuh>
#include <gradcomp/detail/codec/decode.hpp>
#include <gradcomp/message.hpp>
#include <gradcomp/held_memory.hpp>

#include <cuda_runtime.h>

#include <cstdint>
#include <span>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

/// The memory work on device buffers, queued on the backend's stream.
template <>
class exchange_memory<device_memory> {
 public:
  explicit exchange_memory(const backend::cuda& be) : backend_(be), decoder_(be) {}

  /// The first out.size() indices of the leader's message at `bytes`, which is raw32
  /// coded: its index section is that array, stored little-endian as the GPU reads it.
  void indices_of(std::span<const std::byte> bytes, std::span<std::uint32_t> out) const {
    cuda_check(cudaMemcpyAsync(out.data(), bytes.data() + message_header::size, out.size_bytes(),
                               cudaMemcpyDeviceToDevice, backend_.stream),
               "cudaMemcpyAsync (leader's indices)");
  }
  /// The first out.size() values of the message at `bytes` (of a tensor of n elements),
  /// as the receiver decodes them.
  void values_of(std::span<const std::byte> bytes, std::size_t n, std::span<float> out) {
    decoder_.values(backend_, decoder_.check(backend_, bytes, n, "cyclic_topk"), out);
  }
  /// A host copy of `index`.
  std::span<const std::uint32_t> on_host(std::span<const std::uint32_t> index) {
    index_host_.resize(index.size());
    backend_.to_host(index.data(), index.size(), index_host_.data());
    return index_host_;
  }
  /// dense[index[j]] += scale * sums[j].
  void add(std::span<const std::uint32_t> index, std::span<const float> sums, std::span<float> dense,
           float scale) const {
    backend_.for_each(index.size(), scatter_add{index.data(), sums.data(), scale, dense.data()});
  }
  [[nodiscard]] std::size_t held_bytes() const noexcept { return decoder_.held_bytes() + bytes_held(index_host_); }

 private:
  backend::cuda backend_;
  message_decoder<backend::cuda> decoder_;
  std::vector<std::uint32_t> index_host_;
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
