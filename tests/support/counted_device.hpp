// counted_device: opaque_host (an opaque_backend) with its messages in its own memory
// too, as backend::cuda has them, counting every call after which backend::cuda's host
// waits for the device: read() and the copies each way (cudaMemcpyAsync, then
// cudaStreamSynchronize), and allocate() (a new buffer is zeroed and waited for; a
// step's scratch, allocate_scratch() or allocate_for_stream(), is neither; nor is an
// upload() from its staging, pinned memory copied in stream order, nor giving back a
// step's scratch in stream order, release_after_stream()). The generic algorithms take the path
// they take on backend::cuda, so a test counts on the CPU the host synchronizations a
// step or an exchange costs on a GPU, for every engine backend::cuda does not replace
// with its own (exact_topk's and chunk_local's selections).
#pragma once

#include <gradcomp/memory.hpp>

#include <algorithm>
#include <cstddef>
#include <ostream>
#include <span>
#include <utility>
#include <vector>

#include "opaque_host.hpp"

/// What counted_device's calls would have waited for on backend::cuda.
struct device_waits {
  std::size_t reads = 0;        ///< read() of a value
  std::size_t to_host = 0;      ///< copies to the host
  std::size_t to_device = 0;    ///< copies from the host
  std::size_t allocations = 0;  ///< new buffers
  std::size_t scratch = 0;      ///< new scratch buffers (allocate_scratch: no wait, counted apart)
  std::size_t uploads = 0;      ///< copies queued from the staging (upload: no wait, counted apart)
  std::size_t releases = 0;     ///< scratch given back in stream order (release_after_stream: no wait)

  bool operator==(const device_waits&) const = default;
  friend std::ostream& operator<<(std::ostream& out, const device_waits& w) {
    return out << "{reads " << w.reads << ", to_host " << w.to_host << ", to_device " << w.to_device << ", allocations "
               << w.allocations << ", scratch " << w.scratch << ", uploads " << w.uploads << ", releases " << w.releases
               << "}";
  }
};

struct counted_device : opaque_backend<counted_device> {
  using message_memory = gradcomp::device_memory;

  /// The waits counted on this thread since the last reset().
  static device_waits& counted() noexcept {
    thread_local device_waits waits;
    return waits;
  }
  /// The waits counted since the last reset(), which starts a new count.
  static device_waits reset() noexcept { return std::exchange(counted(), device_waits{}); }

  template <class T>
  [[nodiscard]] T read(const T* p) const {
    ++counted().reads;
    return *p;
  }
  template <class T>
  void to_host(const T* from, std::size_t count, T* to) const {
    ++counted().to_host;
    std::copy(from, from + count, to);
  }
  template <class T>
  void to_device(const T* from, std::size_t count, T* to) const {
    ++counted().to_device;
    std::copy(from, from + count, to);
  }
  /// backend::cuda's staging: host memory copied over in stream order, nothing waited for.
  template <class T>
  using staging = std::vector<T>;
  template <class T>
  void upload(staging<T>& from, std::size_t count, T* to) const {
    ++counted().uploads;
    std::copy_n(from.data(), count, to);
  }
  template <class T>
  [[nodiscard]] buffer<T> allocate(std::size_t count) const {
    ++counted().allocations;
    return host::allocate<T>(count);
  }
  /// A step's scratch, as backend::cuda allocates it: not zeroed, nothing waited for
  /// (counted apart). Filled with a NaN pattern, so that a step that read it before
  /// writing it would show in its results.
  template <class T>
  [[nodiscard]] buffer<T> allocate_scratch(std::size_t count) const {
    ++counted().scratch;
    buffer<T> b(count);
    std::fill(reinterpret_cast<unsigned char*>(b.data()), reinterpret_cast<unsigned char*>(b.data() + count), 0xFF);
    return b;
  }
  /// Scratch for a step's work, stream-ordered as backend::cuda allocates it (counted
  /// as scratch).
  template <class T>
  [[nodiscard]] buffer<T> allocate_for_stream(std::size_t count) const {
    return allocate_scratch<T>(count);
  }
  /// Scratch given back in stream order, as backend::cuda does: nothing waited for.
  template <class T>
  bool release_after_stream(std::span<buffer<T>> buffers) const noexcept {
    for (auto& b : buffers) {
      if (b.size() != 0) ++counted().releases;
      b = buffer<T>{};
    }
    return true;
  }
};
