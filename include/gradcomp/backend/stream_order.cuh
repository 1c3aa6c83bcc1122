/// \file backend/stream_order.cuh
/// The order of one backend::cuda compressor's calls across CUDA streams. The compressor
/// leaves it to its caller (compressor.hpp: a call runs on its context's stream, and the
/// state one call writes the next reads); a caller whose stream changes from call to call
/// (PyTorch's current stream) orders them with this. Host code only: a file compiled by
/// the host compiler against the CUDA runtime may include it.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/error.hpp>

#include <cuda_runtime_api.h>

GRADCOMP_NAMESPACE_BEGIN
namespace backend {

/// Runs one compressor's calls in order across streams, one call at a time (the caller
/// serialises them). A call's work follows the previous call's work wherever that ran
/// (an event recorded after each call). A call queued on the caller's own stream needs
/// nothing more. A call queued on another stream (the compressor's own, for the calls
/// that take no context) follows the caller's stream and precedes its later work, and
/// starts once every earlier call has finished: those calls may free memory, which a
/// caching allocator hands out again at once on the caller's stream.
class stream_order {
 public:
  /// Events on CUDA device `device`.
  /// \throws gradcomp::error (device) if the CUDA runtime fails.
  explicit stream_order(int device) : device_(device) {
    const device_scope scope(device_);
    ok(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    ok(cudaEventCreateWithFlags(&inputs_, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  }
  /// Waits for the last call's work: the compressor's memory may go back to a pool after.
  ~stream_order() {
    cudaEventSynchronize(done_);
    cudaEventDestroy(done_);
    cudaEventDestroy(inputs_);
  }
  stream_order(const stream_order&) = delete;
  stream_order& operator=(const stream_order&) = delete;

  /// Runs `work(stream)`, which queues its work on `stream`, in the order above; `caller`
  /// is the stream on which the caller's own work runs (PyTorch's current stream), the
  /// same as `stream` for a call on it. The event is recorded however `work` ends: a
  /// refused call may have queued work before it threw.
  /// \throws gradcomp::error (device) if the CUDA runtime fails, and what `work` throws.
  template <class Work>
  void run(cudaStream_t stream, cudaStream_t caller, Work&& work) {
    const device_scope scope(device_);
    if (stream == caller) {
      ok(cudaStreamWaitEvent(stream, done_, 0), "cudaStreamWaitEvent");  // a no-op before the first call
    } else {
      // Usually long done (the call before, a step ago): a query, which never blocks,
      // spares the host a synchronization call then. Not ready is no error, but the
      // runtime keeps it as the last one: cleared, as torch's CUDAEvent::query() does.
      const cudaError_t state = cudaEventQuery(done_);
      if (state == cudaErrorNotReady) {
        (void)cudaGetLastError();
        ok(cudaEventSynchronize(done_), "cudaEventSynchronize");
      } else {
        ok(state, "cudaEventQuery");
      }
      ok(cudaEventRecord(inputs_, caller), "cudaEventRecord");
      ok(cudaStreamWaitEvent(stream, inputs_, 0), "cudaStreamWaitEvent");
    }
    // Should the record fail, the call's work is waited for instead, so that the next call
    // cannot overtake it.
    const auto finish = [&] {
      if (cudaEventRecord(done_, stream) != cudaSuccess) {
        cudaStreamSynchronize(stream);
        return;
      }
      if (stream != caller) cudaStreamWaitEvent(caller, done_, 0);
    };
    try {
      work(stream);
    } catch (...) {
      finish();
      throw;
    }
    finish();
  }

  /// The device of the events.
  [[nodiscard]] int device() const noexcept { return device_; }

 private:
  // `device` current for the scope, the previous one after.
  class device_scope {
   public:
    explicit device_scope(int device) {
      ok(cudaGetDevice(&previous_), "cudaGetDevice");
      if (previous_ != device) ok(cudaSetDevice(device), "cudaSetDevice");
      changed_ = previous_ != device;
    }
    ~device_scope() {
      if (changed_) cudaSetDevice(previous_);
    }
    device_scope(const device_scope&) = delete;
    device_scope& operator=(const device_scope&) = delete;

   private:
    int previous_ = 0;
    bool changed_ = false;
  };

  static void ok(cudaError_t e, const char* what) {
    if (e != cudaSuccess) detail::fail(errc::device, what, " failed: ", cudaGetErrorString(e));
  }

  int device_;
  cudaEvent_t done_ = nullptr;    // recorded after each call's work
  cudaEvent_t inputs_ = nullptr;  // the caller's stream, before a call on another
};

}  // namespace backend
GRADCOMP_NAMESPACE_END
