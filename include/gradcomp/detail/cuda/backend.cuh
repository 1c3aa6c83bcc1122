/// \file detail/cuda/backend.cuh
/// backend::cuda and its primitives, without its fast paths: what the fast paths of
/// detail/cuda/select_*.cuh build on. Include backend/cuda.cuh, which adds them (and
/// says how to build).
#pragma once

#include <gradcomp/backend/device_allocator.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/detail/cuda/compaction.cuh>
#include <gradcomp/detail/cuda/device_buffer.cuh>
#include <gradcomp/detail/cuda/launch.cuh>
#include <gradcomp/detail/cuda/pinned_staging.cuh>
#include <gradcomp/error.hpp>
#include <gradcomp/memory.hpp>

#include <cuda_runtime.h>

#include <cstddef>
#include <memory>
#include <span>
#include <type_traits>
#include <vector>

GRADCOMP_NAMESPACE_BEGIN
namespace backend {

/// Runs gradcomp on the current CUDA device, ordered on one stream.
struct cuda {
  /// The stream every kernel and copy is queued on (0: the legacy default stream).
  cudaStream_t stream = nullptr;
  /// The device the compressor's memory lives on; -1 (the default): the current device
  /// when the compressor is made, which it then records. Every call that touches that
  /// memory must run with this device current.
  int device = -1;
  /// Where this compressor's state and workspace come from (PyTorch's caching
  /// allocator, RMM, a pool of the caller's); null, the default: the one
  /// set_device_allocator installed for the process, else cudaMalloc.
  std::shared_ptr<device_allocator> allocator = nullptr;

  /// Gradients, state and dense tensors live in device memory (device_span): the
  /// compressor queues its work and reads a step_status back.
  using memory = gradcomp::device_memory;
  /// Messages are written and read in device memory (device_span, device_message).
  using message_memory = gradcomp::device_memory;

  /// Owning device storage for compressor state and workspace.
  template <class T>
  using buffer = detail::device_buffer<T>;

  /// Allocates `count` elements of device memory, zero-filled on the stream before it
  /// returns (waits for the stream).
  /// \throws gradcomp::error (errc::device) if the allocation fails.
  template <class T>
  [[nodiscard]] buffer<T> allocate(std::size_t count) const {
    return buffer<T>(count, allocator, stream);
  }
  /// Allocates `count` elements of device memory for a step to write before it reads
  /// them (detail::allocate_scratch): not zeroed, and nothing waited for.
  /// \throws gradcomp::error (errc::device) if the allocation fails.
  template <class T>
  [[nodiscard]] buffer<T> allocate_scratch(std::size_t count) const {
    return buffer<T>(count, allocator, stream, /*zeroed=*/false);
  }

  /// Allocates `count` elements of device memory for the work of a step queued on the
  /// stream, which writes them before it reads them, and release_after_stream() gives
  /// back (detail::allocate_for_stream): stream-ordered where it can be (the device's
  /// pool, cudaMallocAsync, or an allocator that is stream_ordered() for the stream:
  /// PyTorch's for its current stream), so that neither waits.
  /// \throws gradcomp::error (errc::device) if the allocation fails.
  template <class T>
  [[nodiscard]] buffer<T> allocate_for_stream(std::size_t count) const {
    return buffer<T>::for_stream(count, allocator, stream);
  }
  /// Gives `buffers` back once the work queued on the stream so far is done, waiting for
  /// nothing where they came from allocate_for_stream() stream-ordered; else after one
  /// wait for the stream. False, the rest kept, where waiting fails.
  template <class T>
  bool release_after_stream(std::span<buffer<T>> buffers) const noexcept {
    bool waited = false;
    for (auto& b : buffers) {
      if (!b.release_after(stream, waited)) return false;
    }
    return true;
  }

  /// Queues the zeroing of `count` elements at device address `p`.
  template <class T>
  void clear(T* p, std::size_t count) const {
    detail::cuda_check(cudaMemsetAsync(p, 0, count * sizeof(T), stream), "cudaMemsetAsync");
  }

  /// Queues `body(i)` for every i in [0, n) on the stream. `body` must be a
  /// GRADCOMP_HOST_DEVICE functor holding device pointers; where it has live_items(),
  /// the items past it are skipped (concepts.hpp).
  template <class Body>
  void for_each(std::size_t n, const Body& body) const {
    if (n == 0) return;
    launch("for_each (launch)", detail::cuda_launch::for_each<Body>, detail::cuda_launch::grid_for(n), 0,
           std::uint64_t{n}, body);
  }

  /// Queues `body(i)` -> std::uint32_t for every i in [0, n), ORing the results into
  /// `*bits` (device memory, never cleared here).
  template <class Body>
  void reduce_or(std::size_t n, const Body& body, std::uint32_t* bits) const {
    if (n == 0) return;
    launch("reduce_or (launch)", detail::cuda_launch::reduce_or<Body>, detail::cuda_launch::grid_for(n), 0,
           std::uint64_t{n}, body, bits);
  }

  /// Queues `body(i)` -> std::uint32_t for every i in [0, n), raising `*word` (device
  /// memory, never lowered here) to the largest result.
  template <class Body>
  void reduce_max(std::size_t n, const Body& body, std::uint32_t* word) const {
    if (n == 0) return;
    launch("reduce_max (launch)", detail::cuda_launch::reduce_max<Body>, detail::cuda_launch::grid_for(n), 0,
           std::uint64_t{n}, body, word);
  }

  /// Queues counts[bin_of(i)] += 1 for every i in [0, n) whose bin is not
  /// detail::no_bin (atomic increments); `counts` is device memory, never cleared here.
  /// A `bin_of` that says how many bins it has (`bins()`, on the host) is counted per
  /// block in shared memory where they fit.
  template <class BinOf>
  void histogram(std::size_t n, const BinOf& bin_of, std::uint32_t* counts) const {
    if (n != 0) launch_histogram(n, bin_of, counts, detail::cuda_launch::no_then{}, nullptr);
  }

  /// The same, then `then(0)` once on the finished counts, run by the pass's last block
  /// to finish, which then clears the bin_of.bins() counts (zero before: two launches
  /// fewer than a pass and a clear of their own, detail::histogram_then);
  /// `then.finished_blocks()` is a zeroed word of device memory, left zero.
  template <class BinOf, class Then>
  void histogram(std::size_t n, const BinOf& bin_of, std::uint32_t* counts, const Then& then) const {
    if (n == 0) return for_each(1, then);  // nothing counted: the counts stay zero
    launch_histogram(n, bin_of, counts, then, then.finished_blocks());
  }

  /// Queues the sum of `term(i)` (a double) over [0, n) into `*total` (device memory),
  /// added in the order of detail/core/fixed_order_sum.hpp, exactly as the host adds it;
  /// `tile` is device workspace of tile_count(n) doubles.
  template <class Term>
  void sum(std::size_t n, const Term& term, double* tile, double* total) const {
    if (n != 0) {
      launch("sum (launch)", detail::cuda_launch::tile_sums<Term>, static_cast<unsigned>(detail::tile_count(n)), 0,
             std::uint64_t{n}, term, tile);
    }
    launch("sum (launch)", detail::cuda_launch::sum_of_tiles<>, 1, 0, static_cast<const double*>(tile),
           std::uint64_t{detail::tile_count(n)}, total);
  }

  /// Bytes of workspace that compact() needs for n indices (whatever the predicate):
  /// a word per 32 indices, then expand()'s workspace over the words.
  template <class Keep>
  [[nodiscard]] std::size_t compact_workspace(std::size_t n) const {
    const std::size_t words = (n + 31) / 32;
    return marked_words_bytes(words) + expand_workspace(words);
  }
  /// Queues the indices i < n with keep(i), ascending, into `out` (room for every kept
  /// index) and their number into `*count` (device memory): each kept index marked as
  /// a bit (a warp's ballot per 32 indices), then an ordered expansion of the n / 32
  /// words; `workspace` holds compact_workspace<Keep>(n) bytes.
  template <class Keep>
  void compact(std::size_t n, const Keep& keep, std::uint32_t* out, std::span<std::byte> workspace,
               std::uint32_t* count) const {
    if (n == 0) return clear(count, 1);
    const std::size_t words = (n + 31) / 32;
    detail::require(workspace.size() >= marked_words_bytes(words) + 2 * words * sizeof(std::uint32_t),
                    errc::invalid_argument, "compact: workspace of ", workspace.size(), " bytes for ", n,
                    " indices, below compact_workspace");               // CUB checks its scratch after these
    auto* marked = reinterpret_cast<std::uint32_t*>(workspace.data());  // allocation-aligned
    const std::span<std::byte> expansion = workspace.subspan(marked_words_bytes(words));
    constexpr std::size_t round = 32 * detail::cuda_launch::marked_runs;
    launch("compact (launch)", detail::cuda_launch::mark_kept<Keep>,
           detail::cuda_launch::grid_for((n + round - 1) / round * 32), 0, std::uint64_t{n}, keep, marked,
           counts_of(expansion));
    expand_counted(words, detail::cuda_launch::set_bits_of{marked}, out, expansion, count);
  }

  /// Bytes of workspace that expand() needs for m items.
  [[nodiscard]] std::size_t expand_workspace(std::size_t m) const {
    return detail::cuda_launch::expand_scratch(m, stream);
  }
  /// Queues the ordered expansion: item b < m makes body(b, at) -> std::size_t outputs,
  /// written from `at` on, or only counted when `at` is null; the outputs land in `out`
  /// in item order and their number in `*count` (device memory). A counting kernel, an
  /// exclusive scan of the counts (CUB), a writing kernel; `workspace` holds
  /// expand_workspace(m) bytes.
  template <class Body>
  void expand(std::size_t m, const Body& body, std::uint32_t* out, std::span<std::byte> workspace,
              std::uint32_t* count) const {
    if (m == 0) return clear(count, 1);
    launch("expand (launch)", detail::cuda_launch::expand_counts<Body>, blocks_for(m), 0, std::uint64_t{m}, body,
           counts_of(workspace));
    expand_counted(m, body, out, workspace, count);
  }

  /// Device memory: the host reaches it only through read(), to_host() and to_device().
  static constexpr bool host_accessible = false;

  /// This backend with `device` settled for a compressor (or accumulator) made now: the
  /// current device if it is -1.
  /// \throws gradcomp::error (invalid_argument) if it names a device that is not current.
  [[nodiscard]] cuda resolved(const char* who) const {
    cuda bound = *this;
    if (bound.device < 0) {
      detail::cuda_check(cudaGetDevice(&bound.device), "cudaGetDevice");
    } else {
      bound.require_current_device(who);
    }
    return bound;
  }

  /// `context` (its stream) checked as the execution context of one call of a
  /// compressor made with this backend: it must be on this backend's device (-1 takes
  /// it), where the compressor's memory lives.
  /// \throws gradcomp::error (invalid_argument) naming both devices otherwise.
  [[nodiscard]] cuda context_for(const char* who, const cuda& context) const {
    cuda bound = context;
    if (bound.device < 0) bound.device = device;
    detail::require(bound.device == device, errc::invalid_argument, who, ": the context is on CUDA device ",
                    bound.device, " but the compressor's memory is on device ", device);
    return bound;
  }

  /// \throws gradcomp::error (invalid_argument) unless `device` is the current device,
  ///         naming both: kernels would otherwise run on memory of another device.
  void require_current_device(const char* who) const {
    int current = 0;
    detail::cuda_check(cudaGetDevice(&current), "cudaGetDevice");
    detail::require(device < 0 || current == device, errc::invalid_argument, who,
                    ": the compressor's memory is on CUDA device ", device, " but the current device is ", current,
                    " (call cudaSetDevice(", device, ") first)");
  }

  /// \throws gradcomp::error (invalid_argument) if `p`, the start of the view `what`
  ///         that the caller passed to `who` as device memory, is host memory (a host
  ///         pointer wrapped in a device_span): kernels would read the wrong address
  ///         space. Device and managed memory pass; so does null (an empty view).
  void require_device_pointer(const char* who, const char* what, const void* p) const {
    if (p == nullptr) return;
    cudaPointerAttributes attributes{};
    detail::cuda_check(cudaPointerGetAttributes(&attributes, p), "cudaPointerGetAttributes");
    detail::require(attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged,
                    errc::invalid_argument, who, ": ", what, " (", p, ") is host memory, but backend::cuda takes ",
                    "device memory there (a device_span of a device pointer); copy it to the device first");
  }

  /// Waits for the stream and returns the value at device address `p`.
  template <class T>
  [[nodiscard]] T read(const T* p) const {
    T value{};
    to_host(p, 1, &value);
    return value;
  }

  /// Waits for the stream and copies `count` elements at device address `from` to `to`.
  template <class T>
  void to_host(const T* from, std::size_t count, T* to) const {
    copy_and_wait(to, from, count * sizeof(T), cudaMemcpyDeviceToHost);
  }

  /// A host copy of device memory (waits for the stream).
  template <class T>
  [[nodiscard]] std::vector<T> to_host(std::span<const T> on_device) const {
    std::vector<T> host(on_device.size());
    to_host(on_device.data(), on_device.size(), host.data());
    return host;
  }

  /// Host memory the host fills for upload(): pinned, so that the copy is queued and
  /// nothing waited for (detail::staging_of).
  template <class T>
  using staging = detail::pinned_staging<T>;
  /// Queues the copy of the first `count` elements of `from` to device address `to` and
  /// returns at once (`from`'s writable() waits for the copy before the host writes
  /// again).
  template <class T>
  void upload(staging<T>& from, std::size_t count, T* to) const {
    from.queue_copy(count, to, stream);
  }

  /// Copies `count` host elements to device address `to`; returns when `from` may be
  /// reused.
  template <class T>
  void to_device(const T* from, std::size_t count, T* to) const {
    copy_and_wait(to, from, count * sizeof(T), cudaMemcpyHostToDevice);
  }

 private:
  // Queues `kernel` over `grid` blocks of block_threads threads on the stream.
  template <class... Params, class... Args>
  void launch(const char* what, void (*kernel)(Params...), unsigned grid, std::size_t shared,
              const Args&... args) const {
    detail::cuda_launch::launch(what, kernel, grid, detail::cuda_launch::block_threads, shared, stream, args...);
  }
  // The counts at the front of expand()'s workspace (allocation-aligned).
  static std::uint32_t* counts_of(std::span<std::byte> workspace) noexcept {
    return reinterpret_cast<std::uint32_t*>(workspace.data());
  }
  static unsigned blocks_for(std::size_t m) noexcept {
    return static_cast<unsigned>((m + detail::cuda_launch::block_threads - 1) / detail::cuda_launch::block_threads);
  }
  // expand() once its m > 0 counts are in the workspace: their exclusive scan (CUB),
  // then each item's writes from its offset.
  template <class Body>
  void expand_counted(std::size_t m, const Body& body, std::uint32_t* out, std::span<std::byte> workspace,
                      std::uint32_t* count) const {
    std::uint32_t* counts = counts_of(workspace);
    std::uint32_t* offsets = counts + m;
    std::byte* scratch = workspace.data() + 2 * m * sizeof(std::uint32_t);
    std::size_t scratch_bytes = workspace.size() - 2 * m * sizeof(std::uint32_t);
    detail::cuda_check(
        cub::DeviceScan::ExclusiveSum(scratch, scratch_bytes, counts, offsets, static_cast<std::int64_t>(m), stream),
        "cub::DeviceScan::ExclusiveSum");
    launch("expand (launch)", detail::cuda_launch::expand_write<Body>, blocks_for(m), 0, std::uint64_t{m}, body,
           static_cast<const std::uint32_t*>(counts), static_cast<const std::uint32_t*>(offsets), out, count);
  }
  // Bytes that compact() gives its marked words, rounded up so that expand()'s
  // workspace after them stays aligned as an allocation is.
  [[nodiscard]] static std::size_t marked_words_bytes(std::size_t words) noexcept {
    return (words * sizeof(std::uint32_t) + 255) / 256 * 256;
  }

  // The histogram kernel over n > 0 items, the bins a bin_of says it has (up to
  // shared_histogram_bins) counted in shared memory.
  template <class BinOf, class Then>
  void launch_histogram(std::size_t n, const BinOf& bin_of, std::uint32_t* counts, const Then& then,
                        std::uint32_t* finished) const {
    std::uint32_t bins = 0;     // counted in shared memory
    std::uint32_t cleared = 0;  // cleared after `then`
    if constexpr (requires { bin_of.bins(); }) {
      if (bin_of.bins() <= detail::cuda_launch::shared_histogram_bins) bins = static_cast<std::uint32_t>(bin_of.bins());
      if constexpr (!std::is_same_v<Then, detail::cuda_launch::no_then>) {
        cleared = static_cast<std::uint32_t>(bin_of.bins());
      }
    } else {
      static_assert(std::is_same_v<Then, detail::cuda_launch::no_then>,
                    "histogram_then: a bin_of says how many bins it has (bins()), which the pass clears");
    }
    launch("histogram (launch)", detail::cuda_launch::histogram<BinOf, Then>, detail::cuda_launch::grid_for(n),
           bins * sizeof(std::uint32_t), std::uint64_t{n}, bin_of, counts, bins, then, finished, cleared);
  }

  void copy_and_wait(void* to, const void* from, std::size_t bytes, cudaMemcpyKind kind) const {
    detail::cuda_check(cudaMemcpyAsync(to, from, bytes, kind, stream), "cudaMemcpyAsync");
    detail::cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  }
};

}  // namespace backend
GRADCOMP_NAMESPACE_END
