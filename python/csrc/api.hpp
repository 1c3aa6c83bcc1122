// What the Python module (module.cpp, which includes torch) and the compressor
// instantiations (one unit per backend and selector, generated under build/units by
// setup.py and tests/CMakeLists.txt; they include only gradcomp) share: a compressor
// behind a virtual interface, the options that choose one, and the collectives a
// transport (a torch.distributed process group, process_group.hpp) offers.
// Kept free of torch and pybind11 headers so that the instantiations compile quickly
// and in parallel.
#pragma once

#include <gradcomp/comm/agreement.hpp>
#include <gradcomp/encode/codings.hpp>
#include <gradcomp/encode/index_value.hpp>
#include <gradcomp/error.hpp>
#include <gradcomp/held_memory.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace gradcomp_py {

/// The keyword arguments of gradcomp.torch.Compressor, by name. Each policy takes its
/// fields from here; finish() refuses the ones nobody took.
class options {
 public:
  using value = std::variant<bool, std::int64_t, double, std::string>;

  void set(const std::string& name, value v) { values_[name] = std::move(v); }
  [[nodiscard]] bool has(const std::string& name) const { return values_.count(name) != 0; }

  double number(const std::string& name, double fallback);
  std::int64_t integer(const std::string& name, std::int64_t fallback);
  /// A count or size: a non-negative integer.
  std::size_t size(const std::string& name, std::size_t fallback);
  bool flag(const std::string& name, bool fallback);
  std::string text(const std::string& name, const std::string& fallback);
  /// The seed of `role` ("selector" or "encoder"): `role.seed`, else `seed` if no
  /// policy read before took it (the selector reads first).
  std::uint64_t seed(const std::string& role, std::uint64_t fallback);
  gradcomp::index_coding index_coding(const std::string& name, gradcomp::index_coding fallback);
  gradcomp::value_coding value_coding(const std::string& name, gradcomp::value_coding fallback);

  /// \throws gradcomp::error naming the first option no policy of `method` took.
  void finish(const std::string& method) const;

 private:
  const value* take(const std::string& name);
  std::map<std::string, value> values_;
  std::set<std::string> taken_;
};

/// The collectives of a torch.distributed process group, issued on its c10d backend by
/// process_group.hpp, on the memory of the compressors that use them (host or CUDA device):
/// a gradcomp::comm::collectives (the ranks' agreement, the framed all-gather), which
/// compressors.hpp's transport_in<Backend> makes a gradcomp::comm::transport.
struct transport {
  int this_rank = 0;
  int ranks = 1;
  [[nodiscard]] int rank() const noexcept { return this_rank; }
  [[nodiscard]] int size() const noexcept { return ranks; }
  /// Every rank's `mine` (host memory, the same size everywhere) into `all`.
  std::function<void(std::span<const std::byte> mine, std::span<std::byte> all)> all_gather;
  /// Rank `root`'s indices into every rank's (compressor memory).
  std::function<void(std::span<std::uint32_t> data, int root)> broadcast;
  /// The sum over ranks, the same bits everywhere (compressor memory).
  std::function<void(std::span<float> values, int root)> reduce_broadcast;
  /// \name Host memory, for comm::sparse_allreduce
  /// @{
  /// Rank r's `sizes[r]` bytes into `all`, in rank order (`mine` is this rank's).
  std::function<void(std::span<const std::byte> mine, std::span<const std::uint64_t> sizes, std::span<std::byte> all)>
      all_gather_v;
  /// send's parts (send_sizes bytes each) to their ranks; recv_sizes bytes from each.
  std::function<void(std::span<const std::byte> send, std::span<const std::uint64_t> send_sizes,
                     std::span<std::byte> recv, std::span<const std::uint64_t> recv_sizes)>
      all_to_all_v;
  /// The sum over ranks of unsigned counts (exact), none above `max_sum` (< 2^32).
  std::function<void(std::span<std::uint32_t> values, std::uint64_t max_sum)> all_reduce_sum;
  /// all_gather of the compressor's memory (comm::cyclic_topk's verdicts): over NCCL they
  /// stay on the device.
  std::function<void(std::span<const std::byte> mine, std::span<std::byte> all)> all_gather_in_memory;
  /// all_to_all_v of the compressor's memory (comm::sparse_allreduce::reduce_scatter's
  /// entries): over NCCL they stay on the device.
  std::function<void(std::span<const std::byte> send, std::span<const std::uint64_t> send_sizes,
                     std::span<std::byte> recv, std::span<const std::uint64_t> recv_sizes)>
      all_to_all_v_in_memory;
  /// all_reduce_sum of the compressor's memory (comm::sparse_allreduce's histograms and
  /// global selection): over NCCL they stay on the device.
  std::function<void(std::span<std::uint32_t> values, std::uint64_t max_sum)> all_reduce_sum_in_memory;
  /// @}
  /// Bytes this rank has put into the collectives above (their inputs), shared by copies.
  std::shared_ptr<std::uint64_t> sent = std::make_shared<std::uint64_t>(0);
  /// Bytes the collectives above delivered to this rank from the others (an all-reduce's
  /// or a broadcast's result counts whole, as comm::traffic counts it), shared by copies.
  std::shared_ptr<std::uint64_t> received = std::make_shared<std::uint64_t>(0);
  /// Collectives issued (a reduce_broadcast is two), shared by copies.
  std::shared_ptr<std::uint64_t> issued = std::make_shared<std::uint64_t>(0);
};

/// The element type of a gradient: float32, IEEE half or bfloat16 (widened exactly to
/// float32 by the compressor).
enum class element { f32, f16, bf16 };

/// What one compress wrote.
struct written {
  std::size_t bytes = 0;
  std::size_t count = 0;
};

class cyclic_exchange;
class sparse_exchange;

/// A gradcomp::compressor of any policies on any backend. Pointers are in the
/// backend's memory (host, or the CUDA device the compressor was made on). The calls
/// that take a `stream` (a cudaStream_t; ignored on the host) queue their work on it,
/// the execution context of that call (module.cpp passes torch's current stream); the
/// others queue theirs on the compressor's own stream().
class any_compressor {
 public:
  virtual ~any_compressor() = default;

  [[nodiscard]] virtual std::size_t size() const = 0;
  [[nodiscard]] virtual std::size_t max_message_bytes() const = 0;
  [[nodiscard]] virtual std::uint64_t step() const = 0;
  /// The policies' names, as checkpoints record them.
  [[nodiscard]] virtual std::string signature() const = 0;
  /// How its messages are written (the encoder its messages' readers expect).
  [[nodiscard]] virtual gradcomp::encode::index_value encoder() const = 0;
  /// The bytes it holds: state and workspace (gradcomp/held_memory.hpp).
  [[nodiscard]] virtual gradcomp::held_memory memory_bytes() const = 0;
  /// Gives the workspace back until the next step (compressor::release_workspace).
  virtual void release_workspace() = 0;
  /// The compressor's own cudaStream_t, on which the calls without a `stream` queue
  /// their work (nullptr on the host).
  [[nodiscard]] virtual void* stream() const { return nullptr; }

  /// compress(), or stage() when `staged`, of `size()` elements of type `type` at `grad`,
  /// queued on `stream`.
  virtual written compress(void* stream, const void* grad, element type, std::byte* out, std::size_t out_size,
                           bool staged) = 0;
  /// The staged step made current, its commit queued on `stream`.
  virtual void accept_staged(void* stream) = 0;
  [[nodiscard]] virtual bool has_staged() const = 0;
  /// stage() of `grad` into `out` queued on `stream` with nothing read back, then its
  /// frame for the all-gather (gradcomp/comm/frames.hpp: the verdict, from the step's
  /// status and the settings' `digest`, and the message if it fits `bound`) queued into
  /// `frame` (rank_verdict::size + bound bytes of the compressor's memory): the DDP
  /// hook's device exchange.
  virtual void stage_framed(void* stream, const void* grad, element type, std::byte* out, std::size_t out_size,
                            std::byte* frame, std::size_t bound, std::uint64_t digest) = 0;
  /// What stage_framed() wrote, read back (waits for it on a device), or the error
  /// stage() would have raised (non_finite, naming the value; the step dropped).
  virtual written staged_message(void* stream, const void* grad, element type, std::byte* out,
                                 std::size_t out_size) = 0;
  /// preview() of `grad` into `out` (size() floats), queued on `stream`.
  virtual void preview(void* stream, const void* grad, element type, float* out) = 0;

  /// The selector's density, if it has one.
  [[nodiscard]] virtual std::optional<double> density() const = 0;
  virtual void set_density(double d) = 0;
  virtual void set_indices(std::span<const std::uint32_t> indices) = 0;

  [[nodiscard]] virtual std::string save_state() const = 0;
  virtual void load_state(const std::string& record) = 0;
  [[nodiscard]] virtual std::size_t state_arrays() const = 0;
  [[nodiscard]] virtual std::vector<float> corrector_state(std::size_t a) const = 0;

  /// ScaleCom's cyclic local top-k over `t` with this compressor (a given_indices
  /// selector), the leader selecting with exact_topk at `leader_density`.
  virtual std::unique_ptr<cyclic_exchange> cyclic(transport t, double leader_density) = 0;

  /// Ok-Topk's global top-k (comm::sparse_allreduce) over `t` with this compressor, the
  /// global selection `k` entries (0: the compressor's density's count).
  virtual std::unique_ptr<sparse_exchange> sparse(transport t, std::size_t k) = 0;

  /// Keeps `resource` (the compressor's stream) alive until after the compressor,
  /// which the derived class destroys first.
  void keep(std::shared_ptr<void> resource) { kept_ = std::move(resource); }

 private:
  std::shared_ptr<void> kept_;
};

/// comm::cyclic_topk behind a virtual interface.
class cyclic_exchange {
 public:
  virtual ~cyclic_exchange() = default;
  /// One step: dense += scale * the ranks' sum at the leader's indices; returns this
  /// rank's message (written to `out`). The compressor's step stays staged until
  /// accept() (a later stage drops it).
  virtual written stage(const float* grad, float* dense, std::size_t n, float scale, std::byte* out,
                        std::size_t out_size) = 0;
  /// stage() up to its one read (comm::cyclic_topk::queue): `also` the settings the ranks
  /// must share beside the exchange's (a DDP hook's, a disagreement reported as `who`'s).
  /// Returns the outcome to read (the compressor's memory) before settle().
  virtual std::span<const std::byte> queue(const float* grad, float* dense, std::size_t n, float scale,
                                           std::span<const gradcomp::detail::setting> also, const char* who) = 0;
  /// Completes the queued step from its outcome, read; returns its message's entries.
  virtual std::uint64_t settle(std::span<const std::byte> outcome) = 0;
  /// The next step runs at the sizes it agrees (comm::cyclic_topk::forget_agreed_sizes).
  virtual void forget_agreed_sizes() = 0;
  virtual void accept() = 0;
  /// The bytes the exchange holds beside its compressor's (all workspace).
  [[nodiscard]] virtual std::size_t memory_bytes() const = 0;
};

/// comm::sparse_allreduce behind a virtual interface.
class sparse_exchange {
 public:
  virtual ~sparse_exchange() = default;
  /// dense += scale * the global top-k of the ranks' sums; the compressor's step stays
  /// staged until accept() (or drop()). `also`: the settings the ranks must share beside
  /// the exchange's (a DDP hook's, a disagreement reported as `who`'s).
  virtual void stage(const void* grad, element type, float* dense, std::size_t n, float scale,
                     std::span<const gradcomp::detail::setting> also, const char* who) = 0;
  /// stage() up to its one read (comm::sparse_allreduce::queue): returns the outcome to
  /// read (the compressor's memory) before settle(); `grad` and `dense` stay valid until
  /// then.
  virtual std::span<const std::byte> queue(const void* grad, element type, float* dense, std::size_t n, float scale,
                                           std::span<const gradcomp::detail::setting> also, const char* who) = 0;
  /// step() up to its one read (comm::sparse_allreduce::queue_step): `dense` added to as
  /// queued (nothing where the ranks refuse the step), the outcome returned (the
  /// compressor's memory) to read before settle(), which commits; `grad` need not
  /// outlive the call.
  virtual std::span<const std::byte> queue_step(const void* grad, element type, float* dense, std::size_t n,
                                                float scale) = 0;
  /// Completes the queued step from its outcome, read.
  virtual void settle(std::span<const std::byte> outcome) = 0;
  virtual void accept() = 0;
  virtual void drop() noexcept = 0;
  /// FSDP's sparse reduce-scatter: `shard` (n / W floats) = scale * this rank's shard of
  /// the ranks' summed messages of `grad` (n elements of `type`, read where they are);
  /// the compressor's whole step is committed.
  virtual void reduce_scatter(const void* grad, element type, std::size_t n, float* shard, std::size_t shard_n,
                              float scale) = 0;
  /// reduce_scatter() up to its one read (comm::sparse_allreduce::queue_reduce_scatter):
  /// `shard` written as queued, the outcome returned (the compressor's memory) to read
  /// before settle(), which commits; `grad` need not outlive the call.
  virtual std::span<const std::byte> queue_reduce_scatter(const void* grad, element type, std::size_t n, float* shard,
                                                          std::size_t shard_n, float scale) = 0;
  /// Whether the ranks agreed the sizes the collectives move (after a first call).
  [[nodiscard]] virtual bool sizes_agreed() const = 0;
  /// The global selection's size.
  [[nodiscard]] virtual std::size_t k() const = 0;
  /// Entries of this rank's message in the last step.
  [[nodiscard]] virtual std::uint64_t entries() const = 0;
  /// The bytes the exchange holds beside its compressor's (all workspace).
  [[nodiscard]] virtual std::size_t memory_bytes() const = 0;
  /// Gives back the exchange's and the compressor's workspace until the next step
  /// (comm::sparse_allreduce::release_workspace).
  virtual void release_workspace() = 0;
  /// The next step runs at the sizes it agrees (comm::sparse_allreduce::forget_agreed_sizes).
  virtual void forget_agreed_sizes() = 0;
};

/// The methods a compressor is built for: the presets of gradcomp/registry.hpp, then
/// "compose".
std::vector<std::string> method_names();
/// Each preset's settings with their defaults (its options struct's settings()), by
/// method, in the registry's order.
std::vector<std::pair<std::string, std::vector<std::pair<std::string, options::value>>>> preset_settings();

/// Builds a compressor of `n` elements for `method` (a preset's name, or "compose" for
/// the selector, corrector and encoder named in the options).
std::unique_ptr<any_compressor> make_host(std::size_t n, const std::string& method, options& o);
#if defined(GRADCOMP_PY_CUDA)
/// The same on CUDA device `device`, with a stream of its own (any_compressor::stream())
/// and its memory from torch's caching allocator.
std::unique_ptr<any_compressor> make_cuda(std::size_t n, const std::string& method, options& o, int device);

/// gradcomp::device_accumulator behind a virtual interface: accumulate()'s workspace on
/// one CUDA device, from torch's caching allocator, kept from call to call.
class cuda_accumulator {
 public:
  virtual ~cuda_accumulator() = default;
  /// accumulate() of a message in device memory into `dense` (n floats of device
  /// memory), checked first, queued on `stream` (a cudaStream_t). Calls on different
  /// streams share the workspace: the caller orders them.
  virtual void add(void* stream, std::span<const std::byte> message, float* dense, std::size_t n, float scale) = 0;
  /// add() of a frame's message with nothing read back (device_accumulator::
  /// queue_framed_add): the checks' faults ORed into `*fault` (device memory), `dense`
  /// added to only where there were none.
  virtual void queue_framed_add(void* stream, const gradcomp::encode::index_value& format,
                                std::span<const std::byte> frame, float* dense, std::size_t n, float scale,
                                std::uint32_t* fault) = 0;
};
/// A cuda_accumulator on CUDA device `device`.
std::unique_ptr<cuda_accumulator> make_cuda_accumulator(int device);
#endif

}  // namespace gradcomp_py
