/// \file detail/cuda/device_buffer.cuh
/// Device memory that backend::cuda allocates for compressor state and workspace (from
/// the allocator installed with backend::set_device_allocator, or cudaMalloc), and the
/// translation of CUDA runtime errors into gradcomp::error. Not API.
#pragma once

#include <gradcomp/backend/device_allocator.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/error.hpp>

#include <cuda_runtime.h>

#include <cstddef>
#include <memory>
#include <utility>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

/// Throws gradcomp::error (errc::device) naming the call that failed and CUDA's reason.
inline void cuda_check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    fail(errc::device, what, " failed: ", cudaGetErrorName(status), " (", cudaGetErrorString(status), ")");
  }
}

/// Owning array of `count` T in device memory, zero-filled (or, for a step's scratch,
/// left as it is); movable, not copyable. The compressor allocates these in its
/// constructor (compress allocates only what release_workspace() gave back, and the
/// scratch arrays of a step).
template <class T>
class device_buffer {
 public:
  device_buffer() = default;
  /// From `allocator`, or where it is null from the one set_device_allocator installed
  /// (itself null: cudaMalloc), zeroed on `stream` and waited for: the buffer is then
  /// ready for work on any stream (a non-blocking stream does not wait for the legacy
  /// default stream, where cudaMemset would queue the zeroing). Without `zeroed`, no
  /// work is queued on it and nothing is waited for.
  explicit device_buffer(std::size_t count, std::shared_ptr<backend::device_allocator> allocator = nullptr,
                         cudaStream_t stream = nullptr, bool zeroed = true)
      : size_(count) {
    if (count == 0) return;
    const std::size_t bytes = count * sizeof(T);
    allocator_ = allocator ? std::move(allocator) : backend::current_device_allocator();
    if (allocator_) {
      data_ = static_cast<T*>(allocator_->allocate(bytes));
    } else {
      cuda_check(cudaMalloc(reinterpret_cast<void**>(&data_), bytes), "cudaMalloc");
    }
    if (!zeroed) return;
    cudaError_t zeroed_status = cudaMemsetAsync(data_, 0, bytes, stream);
    if (zeroed_status == cudaSuccess) zeroed_status = cudaStreamSynchronize(stream);
    if (zeroed_status != cudaSuccess) {
      release();
      cuda_check(zeroed_status, "zeroing a new buffer (cudaMemsetAsync, cudaStreamSynchronize)");
    }
  }
  device_buffer(device_buffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)),
        size_(std::exchange(other.size_, 0)),
        allocator_(std::move(other.allocator_)) {}
  device_buffer& operator=(device_buffer&& other) noexcept {
    if (this != &other) {
      release();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
      allocator_ = std::move(other.allocator_);
    }
    return *this;
  }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  ~device_buffer() { release(); }

  [[nodiscard]] T* data() noexcept { return data_; }
  [[nodiscard]] const T* data() const noexcept { return data_; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }

 private:
  void release() noexcept {
    if (data_ != nullptr) {
      if (allocator_) {
        allocator_->deallocate(data_, size_ * sizeof(T));
      } else {
        cudaFree(data_);  // nothing to report from a destructor
      }
    }
    data_ = nullptr;
  }

  T* data_ = nullptr;
  std::size_t size_ = 0;
  std::shared_ptr<backend::device_allocator> allocator_;  // null: cudaMalloc
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
