// The extension's CUDA glue: backend::cuda's memory from torch's caching allocator, and
// the order of a CUDA compressor's (or accumulator's) calls across torch's streams by the
// library's backend::stream_order: compress, stage, preview and accumulate run on torch's
// current stream, their execution context, so that they follow the work that wrote their
// inputs and precede the work that reads their outputs with no handoff; the calls that take
// no context run on the compressor's own stream (backend/stream_order.cuh says how the two
// are ordered).
#pragma once

#if defined(GRADCOMP_PY_CUDA)
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <gradcomp/backend/device_allocator.hpp>
#include <gradcomp/backend/stream_order.cuh>
#include <gradcomp/error.hpp>

#include <mutex>
#include <unordered_map>

namespace gradcomp_py {

namespace gc = gradcomp;

/// backend::cuda's device memory from torch's caching allocator. A block comes free for
/// torch's current stream only (work of its last owner may still be queued there), and
/// gradcomp uses its state on other streams too, so that stream is waited for: such
/// allocations are made when a compressor is (and on the first 16-bit gradient or
/// preview), not per step. A step's scratch (compressed memory's float32 arrays) on
/// torch's current stream is stream-ordered, as torch's own tensors are: a block of that
/// stream, and where its last work ran on another (a commit at the end of backward),
/// torch is told so (recordStream) and reuses it once that work is done. Nothing is
/// waited for by the host.
class torch_allocator final : public gc::backend::device_allocator {
 public:
  /// Torch pools a block for the stream it was allocated for: stream-ordered for its
  /// current stream, whose blocks its own tensors share. (A block allocated for another
  /// stream, gradcomp's own, would stay in that stream's pool, out of torch's reach.)
  [[nodiscard]] bool stream_ordered(void* stream) const noexcept override {
    try {
      return stream == static_cast<void*>(at::cuda::getCurrentCUDAStream().stream());
    } catch (...) {
      return false;  // then allocated as the state is
    }
  }
  /// A block of torch's current stream (`stream`, as stream_ordered() said), its DataPtr
  /// kept for recordStream.
  void* allocate_on(std::size_t bytes, void*) override {
    c10::DataPtr block = c10::cuda::CUDACachingAllocator::get()->allocate(bytes);
    void* p = block.get();
    const std::lock_guard<std::mutex> guard(lock_);
    ordered_.emplace(p, std::move(block));
    return p;
  }
  void deallocate_on(void* p, std::size_t, void* last) noexcept override {
    try {
      const c10::DataPtr block = take(p);
      c10::cuda::CUDACachingAllocator::recordStream(
          block, c10::cuda::getStreamFromExternal(static_cast<cudaStream_t>(last), block.device().index()));
    } catch (...) {  // nothing to report from here: the block goes back as it is
    }
  }
  void* allocate(std::size_t bytes) override {
    void* p = c10::cuda::CUDACachingAllocator::raw_alloc(bytes);
    const cudaError_t synced = cudaStreamSynchronize(at::cuda::getCurrentCUDAStream().stream());
    if (synced != cudaSuccess) {
      c10::cuda::CUDACachingAllocator::raw_delete(p);
      gc::detail::fail(gc::errc::device, "cudaStreamSynchronize failed: ", cudaGetErrorString(synced));
    }
    return p;
  }
  void deallocate(void* p, std::size_t) noexcept override {
    try {
      if (take(p).get() == nullptr) c10::cuda::CUDACachingAllocator::raw_delete(p);
    } catch (...) {  // nothing to report from a destructor
    }
  }

 private:
  // The DataPtr of a block from allocate_on(), no longer recorded (empty if `p` is not one).
  c10::DataPtr take(void* p) {
    const std::lock_guard<std::mutex> guard(lock_);
    const auto at = ordered_.find(p);
    if (at == ordered_.end()) return {};
    c10::DataPtr block = std::move(at->second);
    ordered_.erase(at);
    return block;
  }

  std::mutex lock_;
  std::unordered_map<void*, c10::DataPtr> ordered_;  // allocate_on()'s blocks, freed with their DataPtr
};

/// torch's current stream on CUDA device `device`.
inline cudaStream_t current_stream(int device) {
  return at::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
}

/// Runs `work(stream)`, which queues its work on `stream`, torch's current stream, in `order`.
template <class Work>
void on_current_stream(gc::backend::stream_order& order, Work&& work) {
  const cudaStream_t current = current_stream(order.device());
  order.run(current, current, [&](cudaStream_t stream) { work(static_cast<void*>(stream)); });
}

/// Runs `work()`, which queues its work on `stream` (not torch's current one), in `order`.
template <class Work>
void on_stream(gc::backend::stream_order& order, cudaStream_t stream, Work&& work) {
  order.run(stream, current_stream(order.device()), [&](cudaStream_t) { work(); });
}

}  // namespace gradcomp_py
#endif
