// What compressor_of on CUDA adds to compressors.hpp: backend::cuda's context on a stream, its
// copies, and its own stream and waiting for it.
#pragma once

#include "../compressors.hpp"

#include <gradcomp/backend/cuda.cuh>
#include <gradcomp/device_messages.cuh>

#include <cuda_runtime.h>

namespace gradcomp_py {

template <>
struct backend_ops<gc::backend::cuda> {
  /// The compressor's backend with its work queued on `stream` (a call's context).
  static gc::backend::cuda on(const gc::backend::cuda& be, void* stream) {
    gc::backend::cuda context = be;
    context.stream = static_cast<cudaStream_t>(stream);
    return context;
  }
  static void copy(const gc::backend::cuda& be, const void* from, void* to, std::size_t bytes) {
    if (bytes == 0) return;
    gc::detail::cuda_check(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, be.stream), "cudaMemcpyAsync");
  }
  static void* stream(const gc::backend::cuda& be) noexcept { return be.stream; }
  static void wait(const gc::backend::cuda& be) noexcept { cudaStreamSynchronize(be.stream); }
};

}  // namespace gradcomp_py
