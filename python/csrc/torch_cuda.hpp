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
#include <torch/version.h>

#include <mutex>
#include <string>
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
  /// current stream, whose blocks its own tensors share (a block allocated for another
  /// stream, gradcomp's own, would stay in that stream's pool, out of torch's reach), and
  /// only where torch's allocator honours recordStream (its own or its cudaMallocAsync
  /// backend; a pluggable one, RMM's, may ignore it).
  [[nodiscard]] bool stream_ordered(void* stream) const noexcept override {
    try {
#if TORCH_VERSION_MAJOR >= 2
      const std::string backend = c10::cuda::CUDACachingAllocator::get()->name();
      if (backend != "native" && backend != "cudaMallocAsync") return false;
#endif
      return stream == static_cast<void*>(at::cuda::getCurrentCUDAStream().stream());
    } catch (...) {
      return false;  // then allocated as the state is
    }
  }
  /// A block of torch's current stream (`stream`, as stream_ordered() said), its DataPtr
  /// kept for recordStream.
  void* allocate_on(std::size_t bytes, void* stream) override {
    c10::DataPtr block = c10::cuda::CUDACachingAllocator::get()->allocate(bytes);
    void* p = block.get();
    const std::lock_guard<std::mutex> guard(lock_);
    ordered_.emplace(p, ordered_block{std::move(block), stream});
    return p;
  }
  /// Where the block's last work ran on another stream than its own, torch is told
  /// (recordStream: it reuses the block once that work is done); where telling fails,
  /// that work is waited for.
  void deallocate_on(void* p, std::size_t, void* last) noexcept override {
    ordered_block b = take(p);
    if (b.stream != last) {
      try {
        c10::cuda::CUDACachingAllocator::recordStream(
            b.block, c10::cuda::getStreamFromExternal(static_cast<cudaStream_t>(last), b.block.device().index()));
      } catch (...) {
        if (cudaStreamSynchronize(static_cast<cudaStream_t>(last)) != cudaSuccess) (void)cudaGetLastError();
      }
    }
    free(b.block);
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
    ordered_block b = take(p);
    if (b.block.get() != nullptr) return free(b.block);
    try {
      c10::cuda::CUDACachingAllocator::raw_delete(p);
    } catch (...) {  // nothing to report from a destructor
    }
  }

 private:
  struct ordered_block {
    c10::DataPtr block;
    void* stream = nullptr;  // the one it was allocated for
  };
  // The record of a block from allocate_on(), no longer kept (an empty one if `p` is not).
  ordered_block take(void* p) noexcept {
    const std::lock_guard<std::mutex> guard(lock_);
    const auto at = ordered_.find(p);
    if (at == ordered_.end()) return {};
    ordered_block b = std::move(at->second);
    ordered_.erase(at);
    return b;
  }
  // Frees `block` here, where what torch throws is caught (a DataPtr's destructor, which
  // frees too, may not throw).
  static void free(c10::DataPtr& block) noexcept {
    const c10::DeleterFnPtr deleter = block.get_deleter();
    void* context = block.release_context();
    if (context == nullptr || deleter == nullptr) return;
    try {
      deleter(context);
    } catch (...) {  // nothing to report from here
    }
  }

  std::mutex lock_;
  std::unordered_map<void*, ordered_block> ordered_;  // allocate_on()'s blocks
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
