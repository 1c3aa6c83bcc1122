/// \file backend/cuda.cuh
/// Runs gradcomp on an NVIDIA GPU with CUB from the CUDA toolkit (CCCL 3.0 or later).
///
/// Needs nvcc (CMake: link gradcomp::gradcomp from a CUDA target). Every operation is
/// queued on `stream`, in order; state and workspace are device memory allocated once,
/// by the compressor's constructor. Gradients and outputs are raw device pointers
/// (std::span over device memory): a thrust::device_vector's data or a PyTorch CUDA
/// tensor's data_ptr work without copies.
///
/// Status: the exact_topk engine (multi-pass radix select) is implemented; the other
/// policies and the compressor's device pipeline are not yet (docs/design.md).
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/detail/cuda/device_buffer.cuh>

#include <cuda_runtime.h>

#include <cstddef>

GRADCOMP_NAMESPACE_BEGIN
namespace backend {

/// Runs gradcomp on the current CUDA device, ordered on one stream.
struct cuda {
  /// The stream every kernel and copy is queued on (0: the legacy default stream).
  cudaStream_t stream = nullptr;

  /// Owning device storage for compressor state and workspace.
  template <class T>
  using buffer = detail::device_buffer<T>;

  /// Allocates `count` zero-filled elements of device memory.
  /// \throws gradcomp::error (errc::device) if the allocation fails.
  template <class T>
  [[nodiscard]] buffer<T> allocate(std::size_t count) const {
    return buffer<T>(count);
  }
};

}  // namespace backend
GRADCOMP_NAMESPACE_END

#include <gradcomp/detail/cuda/exact_topk.cuh>
