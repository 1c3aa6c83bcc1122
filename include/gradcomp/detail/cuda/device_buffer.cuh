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
  /// A step's scratch for work queued on `stream` from now on (or ordered after it):
  /// `count` T, nothing zeroed and nothing waited for, stream-ordered where its source
  /// allows: an allocator that is stream_ordered(`stream`), else, with no allocator, the
  /// device's pool (cudaMallocAsync). Otherwise as the constructor gives it.
  [[nodiscard]] static device_buffer for_stream(std::size_t count, std::shared_ptr<backend::device_allocator> allocator,
                                                cudaStream_t stream) {
    if (!allocator) allocator = backend::current_device_allocator();
    device_buffer b;
    if (count == 0) return b;
    cuda_check(cudaGetDevice(&b.device_), "cudaGetDevice");
    const bool ordered = allocator ? allocator->stream_ordered(stream) : has_memory_pools(b.device_);
    if (!ordered) return device_buffer(count, std::move(allocator), stream, /*zeroed=*/false);
    const std::size_t bytes = count * sizeof(T);
    if (allocator) {
      b.data_ = static_cast<T*>(allocator->allocate_on(bytes, stream));
    } else {
      cuda_check(cudaMallocAsync(reinterpret_cast<void**>(&b.data_), bytes, stream), "cudaMallocAsync");
    }
    b.size_ = count;
    b.allocator_ = std::move(allocator);
    b.ordered_ = true;
    return b;
  }
  device_buffer(device_buffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)),
        size_(std::exchange(other.size_, 0)),
        allocator_(std::move(other.allocator_)),
        ordered_(std::exchange(other.ordered_, false)),
        device_(other.device_) {}
  device_buffer& operator=(device_buffer&& other) noexcept {
    if (this != &other) {
      release();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
      allocator_ = std::move(other.allocator_);
      ordered_ = std::exchange(other.ordered_, false);
      device_ = other.device_;
    }
    return *this;
  }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  ~device_buffer() { release(); }

  [[nodiscard]] T* data() noexcept { return data_; }
  [[nodiscard]] const T* data() const noexcept { return data_; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }

  /// Gives the memory back once the work queued so far on `last` is done (`last`: the
  /// stream of its last work, queued after all its earlier work), waiting for nothing
  /// where it is stream-ordered: the pool's freed on `last` (cudaFreeAsync), an
  /// allocator's through deallocate_on(`last`). Any other memory once the host has
  /// waited for `last`, unless `waited` says the caller has already (it is set then).
  /// False, the memory kept, where waiting fails.
  bool release_after(cudaStream_t last, bool& waited) noexcept {
    if (data_ == nullptr) return true;
    if (ordered_ && allocator_) {
      allocator_->deallocate_on(data_, size_ * sizeof(T), last);
    } else if (ordered_) {
      if (cudaFreeAsync(data_, last) != cudaSuccess) return cleared();
    } else {
      if (!waited && cudaStreamSynchronize(last) != cudaSuccess) return cleared();
      waited = true;
      free_done();
    }
    data_ = nullptr;
    size_ = 0;
    ordered_ = false;
    return true;
  }

 private:
  // A failure reported by nothing here: false, and the runtime's last error cleared, so
  // that a later check does not see it.
  static bool cleared() noexcept {
    (void)cudaGetLastError();
    return false;
  }
  // Whether `device` allocates from a stream-ordered pool (cudaMallocAsync). (Its
  // default pool gives unused memory back at each synchronization, so that a step's
  // allocation may map memory afresh: time, never a wait.)
  static bool has_memory_pools(int device) {
    int supported = 0;
    cuda_check(cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, device), "cudaDeviceGetAttribute");
    return supported != 0;
  }
  // Frees memory on which no work is queued.
  void free_done() noexcept {
    if (allocator_) {
      allocator_->deallocate(data_, size_ * sizeof(T));
    } else if ((ordered_ ? cudaFreeAsync(data_, nullptr) : cudaFree(data_)) != cudaSuccess) {
      (void)cleared();  // nothing to report from here
    }
  }
  // Where the last user is unknown (a destructor, a buffer replaced), stream-ordered
  // memory waits for its whole device first: its last work may be queued on any stream
  // (the stream it was allocated for may be gone), so none is named to free it.
  void release() noexcept {
    if (data_ != nullptr) {
      if (ordered_) {
        int current = 0;
        (void)cudaGetDevice(&current);
        const bool synced = cudaSetDevice(device_) == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess;
        if (!synced) (void)cleared();  // a fault of the device's, reported by its next checked call
        free_done();
        (void)cudaSetDevice(current);
      } else {
        free_done();
      }
    }
    data_ = nullptr;
  }

  T* data_ = nullptr;
  std::size_t size_ = 0;
  std::shared_ptr<backend::device_allocator> allocator_;  // null: cudaMalloc (cudaMallocAsync where ordered_)
  bool ordered_ = false;                                  // for_stream(), stream-ordered
  int device_ = 0;                                        // its device
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
