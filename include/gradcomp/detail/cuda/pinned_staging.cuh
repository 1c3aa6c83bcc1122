/// \file detail/cuda/pinned_staging.cuh
/// backend::cuda's staging (backend::cuda::staging): page-locked host memory that the
/// host fills each step and the device copies from in stream order, so that the host
/// waits for nothing (a copy from pageable memory may wait for the stream: every kernel
/// queued before it, the backward pass's among them). Not API.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/detail/cuda/device_buffer.cuh>

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

/// `size()` T of pinned host memory and the event of its last queued copy: writable()
/// waits for that copy (long done, as a rule: it was queued a step ago, and a caller
/// that leads the device by more than a step of one compressor is rare: the DDP hook
/// reads every step's outcome), then the host writes; queue_copy() queues the next.
/// Movable, not copyable.
template <class T>
class pinned_staging {
 public:
  pinned_staging() = default;
  pinned_staging(pinned_staging&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)),
        size_(std::exchange(other.size_, 0)),
        copied_(std::exchange(other.copied_, nullptr)) {}
  pinned_staging& operator=(pinned_staging&& other) noexcept {
    if (this != &other) {
      release();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
      copied_ = std::exchange(other.copied_, nullptr);
    }
    return *this;
  }
  pinned_staging(const pinned_staging&) = delete;
  pinned_staging& operator=(const pinned_staging&) = delete;
  ~pinned_staging() { release(); }

  /// Room for `count` T, its contents not kept (allocated with the current device
  /// current, whose streams then copy from it).
  /// \throws gradcomp::error (errc::device) if the allocation fails; it then holds nothing.
  void resize(std::size_t count) {
    if (count == size_) return;
    release();
    if (count == 0) return;
    cuda_check(cudaEventCreateWithFlags(&copied_, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    const cudaError_t allocated = cudaMallocHost(reinterpret_cast<void**>(&data_), count * sizeof(T));
    if (allocated != cudaSuccess) {
      data_ = nullptr;
      release();
      cuda_check(allocated, "cudaMallocHost");
    }
    size_ = count;
  }

  /// The memory, for the host to write once the last copy from it is done (waited for
  /// here where it is not: a query first, which never blocks).
  [[nodiscard]] T* writable() {
    if (copied_ != nullptr) {
      const cudaError_t state = cudaEventQuery(copied_);
      if (state == cudaErrorNotReady) {
        (void)cudaGetLastError();  // not an error, but the runtime keeps it as the last one
        cuda_check(cudaEventSynchronize(copied_), "cudaEventSynchronize");
      } else {
        cuda_check(state, "cudaEventQuery");
      }
    }
    return data_;
  }
  /// Queues the copy of the first `count` T to device address `to` on `stream`.
  void queue_copy(std::size_t count, T* to, cudaStream_t stream) {
    if (count == 0) return;
    cuda_check(cudaMemcpyAsync(to, data_, count * sizeof(T), cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync");
    cuda_check(cudaEventRecord(copied_, stream), "cudaEventRecord");
  }

  [[nodiscard]] const T* data() const noexcept { return data_; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }

 private:
  void release() noexcept {
    bool failed = false;
    if (copied_ != nullptr) {
      failed |= cudaEventSynchronize(copied_) != cudaSuccess;  // the copy reads the memory until it is done
      failed |= cudaEventDestroy(copied_) != cudaSuccess;
    }
    if (data_ != nullptr) failed |= cudaFreeHost(data_) != cudaSuccess;
    if (failed) (void)cudaGetLastError();  // nothing to report from a destructor, nor for a later check to see
    data_ = nullptr;
    size_ = 0;
    copied_ = nullptr;
  }

  T* data_ = nullptr;
  std::size_t size_ = 0;
  cudaEvent_t copied_ = nullptr;  // recorded after the last queued copy
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
