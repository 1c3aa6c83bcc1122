/// \file backend/device_allocator.hpp
/// Where backend::cuda takes its device memory: cudaMalloc by default, or the pool of
/// the framework it runs in (PyTorch's caching allocator, RMM), as RMM's current
/// device resource does. Plain C++: a host translation unit can install one.
#pragma once

#include <gradcomp/config.hpp>

#include <cstddef>
#include <memory>
#include <mutex>

GRADCOMP_NAMESPACE_BEGIN
namespace backend {

/// Allocates device memory for backend::cuda's state and workspace (the compressor's
/// constructor, and the workspace of accumulate and the NCCL collectives), and, where
/// it is stream-ordered, a step's scratch. Memory is allocated on the current CUDA
/// device.
class device_allocator {
 public:
  virtual ~device_allocator() = default;
  /// `bytes` (> 0) of device memory; throws if it cannot.
  virtual void* allocate(std::size_t bytes) = 0;
  /// Returns memory from allocate() (or from allocate_on(): see deallocate_on()); no
  /// work on it may still be queued.
  virtual void deallocate(void* p, std::size_t bytes) noexcept = 0;

  /// Whether allocate_on(bytes, `stream`) and deallocate_on() are stream-ordered for work
  /// on `stream` (a cudaStream_t), as the pools of PyTorch and RMM are for a stream whose
  /// memory they pool: a step's scratch (the float32 arrays of compressed memory) then
  /// comes from them and goes back with nothing waited for. Otherwise it comes from
  /// allocate() and goes back once backend::cuda has waited for its work.
  [[nodiscard]] virtual bool stream_ordered(void* /*stream*/) const noexcept { return false; }
  /// `bytes` (> 0) for work queued on `stream` from now on: the work of its previous
  /// owner may still be queued before it on that stream. Called only where
  /// stream_ordered(`stream`).
  virtual void* allocate_on(std::size_t bytes, void* /*stream*/) { return allocate(bytes); }
  /// Returns memory from allocate_on() once the work queued so far on `last` is done,
  /// without waiting for it: `last` is the stream of its last work, queued after all its
  /// earlier work (on `last`, or on other streams that `last` waits for), and it may be
  /// another than the one it was allocated for (PyTorch: recordStream). Where no work on
  /// it is queued (backend::cuda has waited for the device), memory from allocate_on()
  /// goes back through deallocate() instead.
  virtual void deallocate_on(void* p, std::size_t bytes, void* /*last*/) noexcept { deallocate(p, bytes); }
};

namespace detail_allocator {
inline std::shared_ptr<device_allocator>& slot() {
  static std::shared_ptr<device_allocator> current;
  return current;
}
inline std::mutex& lock() {
  static std::mutex m;
  return m;
}
}  // namespace detail_allocator

/// Makes `allocator` (nullptr: cudaMalloc) the one every later device allocation of
/// gradcomp uses. Buffers already allocated keep the allocator they came from.
inline void set_device_allocator(std::shared_ptr<device_allocator> allocator) {
  const std::lock_guard<std::mutex> guard(detail_allocator::lock());
  detail_allocator::slot() = std::move(allocator);
}

/// The allocator set_device_allocator installed (nullptr: cudaMalloc).
inline std::shared_ptr<device_allocator> current_device_allocator() {
  const std::lock_guard<std::mutex> guard(detail_allocator::lock());
  return detail_allocator::slot();
}

}  // namespace backend
GRADCOMP_NAMESPACE_END
