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

/// Where the buffers of one step are given back after (device_buffer::release_after):
/// `last`, the stream of their last work, and what has been done so far to order their
/// release after it, shared by the buffers.
struct after_stream {
  explicit after_stream(cudaStream_t stream) noexcept : last(stream) {}
  after_stream(const after_stream&) = delete;
  after_stream& operator=(const after_stream&) = delete;
  ~after_stream() {
    if (reached != nullptr) cudaEventDestroy(reached);  // its waits stand
  }
  /// Makes `other` wait on the device for the work queued on `last` so far.
  bool order(cudaStream_t other) noexcept {
    if (reached == nullptr) {
      if (cudaEventCreateWithFlags(&reached, cudaEventDisableTiming) != cudaSuccess) {
        reached = nullptr;
        return cleared();
      }
      if (cudaEventRecord(reached, last) != cudaSuccess) return cleared();
    }
    return cudaStreamWaitEvent(other, reached, 0) == cudaSuccess || cleared();
  }
  /// The host waits for the work queued on `last` so far (once).
  bool wait() noexcept {
    if (!waited) waited = cudaStreamSynchronize(last) == cudaSuccess || cleared();
    return waited;
  }

  cudaStream_t last;
  bool waited = false;            // the host has waited for `last`
  cudaEvent_t reached = nullptr;  // recorded on `last`, where another stream waits for it

 private:
  // A failure reported by nothing here: false, and the runtime's last error cleared, so
  // that a later check does not see it.
  static bool cleared() noexcept {
    (void)cudaGetLastError();
    return false;
  }
};

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
    b.stream_ = stream;
    return b;
  }
  device_buffer(device_buffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)),
        size_(std::exchange(other.size_, 0)),
        allocator_(std::move(other.allocator_)),
        ordered_(std::exchange(other.ordered_, false)),
        stream_(other.stream_),
        device_(other.device_) {}
  device_buffer& operator=(device_buffer&& other) noexcept {
    if (this != &other) {
      release();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
      allocator_ = std::move(other.allocator_);
      ordered_ = std::exchange(other.ordered_, false);
      stream_ = other.stream_;
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

  /// Gives the memory back once the work queued so far on `after.last`, where its last
  /// user ran, is done, waiting for nothing where it is stream-ordered: the pool's
  /// (cudaMallocAsync) freed on that stream; an allocator's given back to the stream it
  /// was allocated for, which first waits on the device for `after.last` where that is
  /// another. Any other memory once the host has waited for `after.last`. False, the
  /// memory kept, where waiting fails.
  bool release_after(after_stream& after) noexcept {
    if (data_ == nullptr) return true;
    if (ordered_ && !allocator_) {
      if (cudaFreeAsync(data_, after.last) != cudaSuccess) {
        (void)cudaGetLastError();  // reported by nothing here: a later check must not see it
        return false;
      }
    } else if (ordered_) {
      if (after.last != stream_ && !after.order(stream_) && !after.wait()) return false;
      allocator_->deallocate_on(data_, size_ * sizeof(T), stream_);
    } else {
      if (!after.wait()) return false;
      free_done(after.last);
    }
    data_ = nullptr;
    size_ = 0;
    ordered_ = false;
    return true;
  }

 private:
  // Whether `device` allocates from a stream-ordered pool (cudaMallocAsync).
  static bool has_memory_pools(int device) {
    int supported = 0;
    cuda_check(cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, device), "cudaDeviceGetAttribute");
    return supported != 0;
  }
  // Frees memory whose work is done (`done`: a stream that has none queued on it).
  void free_done(cudaStream_t done) noexcept {
    if (ordered_ && allocator_) {
      allocator_->deallocate_on(data_, size_ * sizeof(T), stream_);
    } else if (allocator_) {
      allocator_->deallocate(data_, size_ * sizeof(T));
    } else if ((ordered_ ? cudaFreeAsync(data_, done) : cudaFree(data_)) != cudaSuccess) {
      (void)cudaGetLastError();  // nothing to report from here, nor for a later check to see
    }
  }
  // Where the last user is unknown (a destructor, a buffer replaced), stream-ordered
  // memory waits for its whole device first: its last work may be queued on any stream
  // (the stream it was allocated for may be gone), so it goes back on the legacy stream.
  void release() noexcept {
    if (data_ != nullptr) {
      if (ordered_) {
        int current = 0;
        (void)cudaGetDevice(&current);
        (void)cudaSetDevice(device_);
        (void)cudaDeviceSynchronize();
        free_done(nullptr);
        (void)cudaSetDevice(current);
      } else {
        free_done(nullptr);
      }
    }
    data_ = nullptr;
  }

  T* data_ = nullptr;
  std::size_t size_ = 0;
  std::shared_ptr<backend::device_allocator> allocator_;  // null: cudaMalloc (cudaMallocAsync where ordered_)
  bool ordered_ = false;                                  // for_stream(), stream-ordered on stream_
  cudaStream_t stream_ = nullptr;                         // the stream it was then allocated for
  int device_ = 0;                                        // and the device
};

}  // namespace detail
GRADCOMP_NAMESPACE_END
