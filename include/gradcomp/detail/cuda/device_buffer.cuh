/// \file detail/cuda/device_buffer.cuh
/// Device memory that backend::cuda allocates for compressor state and workspace, and
/// the translation of CUDA runtime errors into gradcomp::error. Not API.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/error.hpp>

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

GRADCOMP_NAMESPACE_BEGIN
namespace detail {

/// Throws gradcomp::error (errc::device) naming the call that failed and CUDA's reason.
inline void cuda_check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    fail(errc::device, what, " failed: ", cudaGetErrorName(status), " (", cudaGetErrorString(status), ")");
  }
}

/// Owning array of `count` T in device memory, zero-filled; movable, not copyable. The
/// compressor allocates these once, in its constructor (compress never allocates).
template <class T>
class device_buffer {
 public:
  device_buffer() = default;
  explicit device_buffer(std::size_t count) : size_(count) {
    if (count == 0) return;
    cuda_check(cudaMalloc(reinterpret_cast<void**>(&data_), count * sizeof(T)), "cudaMalloc");
    const cudaError_t zeroed = cudaMemset(data_, 0, count * sizeof(T));
    if (zeroed != cudaSuccess) {
      cudaFree(data_);
      cuda_check(zeroed, "cudaMemset");
    }
  }
  device_buffer(device_buffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  device_buffer& operator=(device_buffer&& other) noexcept {
    if (this != &other) {
      release();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
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
    if (data_ != nullptr) cudaFree(data_);  // nothing to report from a destructor
    data_ = nullptr;
  }

  T* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
