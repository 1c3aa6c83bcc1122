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
#include <optional>
#include <string>
#include <unordered_map>

namespace gradcomp_py {

namespace gc = gradcomp;

/// backend::cuda's device memory from torch's caching allocator. A block comes free for
/// torch's current stream only (work of its last owner may still be queued there), and
/// gradcomp uses its state on other streams too, so that stream is waited for: such
/// allocations are made when a compressor is (and on the first 16-bit gradient or
/// preview), not per step. A step's scratch (compressed memory's float32 arrays) is
/// stream-ordered, as torch's own tensors are: a block of the stream the step runs on,
/// and where its last work ran on another (a commit at the end of backward), torch is
/// told so (recordStream) and reuses it once that work is done. Nothing is waited for by
/// the host.
class torch_allocator final : public gc::backend::device_allocator {
 public:
  /// Stream-ordered on any stream where torch's allocator honours recordStream (its own
  /// or its cudaMallocAsync backend; a pluggable one, RMM's, may ignore it). Torch pools
  /// a block for the stream it was allocated for: on its current stream (the DDP hook's
  /// steps) the pool its own tensors share; on the compressor's own stream (FSDP's
  /// reduce-scatter, the exchanges) that stream's, which the next step's arrays reuse and
  /// torch empties with its other cached blocks when an allocation would fail. Where not
  /// stream-ordered, each step's arrays cost two host waits (allocate() and the release).
  [[nodiscard]] bool stream_ordered(void*) const noexcept override {
#if TORCH_VERSION_MAJOR >= 2
    try {
      const std::string backend = c10::cuda::CUDACachingAllocator::get()->name();
      return backend == "native" || backend == "cudaMallocAsync";
    } catch (...) {
      return false;  // then allocated as the state is
    }
#else
    return true;  // torch 1.x has its own allocator alone
#endif
  }
  /// A block of `stream` (the current device's), its DataPtr kept for recordStream.
  void* allocate_on(std::size_t bytes, void* stream) override {
    const auto on = static_cast<cudaStream_t>(stream);
    std::optional<c10::cuda::CUDAStreamGuard> for_stream;  // torch allocates for its current stream
    if (on != at::cuda::getCurrentCUDAStream().stream()) {
      for_stream.emplace(c10::cuda::getStreamFromExternal(on, c10::cuda::current_device()));
    }
    c10::DataPtr block = c10::cuda::CUDACachingAllocator::get()->allocate(bytes);
    for_stream.reset();
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
