// What the CUDA models add to compressors.hpp: backend::cuda's copies, stream and wait,
// and cyclic_topk's device memory work over a torch.distributed transport.
#pragma once

#include "../compressors.hpp"

#include <gradcomp/backend/cuda.cuh>
#include <gradcomp/device_messages.cuh>
#include <gradcomp/detail/cuda/exchange_memory.cuh>

#include <cuda_runtime.h>

namespace gradcomp_py {

template <>
struct backend_ops<gc::backend::cuda> {
  static void copy(const gc::backend::cuda& be, const void* from, void* to, std::size_t bytes) {
    if (bytes == 0) return;
    gc::detail::cuda_check(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, be.stream), "cudaMemcpyAsync");
  }
  static void* stream(const gc::backend::cuda& be) noexcept { return be.stream; }
  static void wait(const gc::backend::cuda& be) noexcept { cudaStreamSynchronize(be.stream); }
};

}  // namespace gradcomp_py

GRADCOMP_NAMESPACE_BEGIN
namespace detail {
/// cyclic_topk over torch.distributed on CUDA tensors: device memory work.
template <>
class exchange_memory<gradcomp_py::transport_comm<backend::cuda>> : public device_exchange_memory {
 public:
  explicit exchange_memory(const gradcomp_py::transport_comm<backend::cuda>& comm)
      : device_exchange_memory(comm.backend()) {}
};
}  // namespace detail
GRADCOMP_NAMESPACE_END
