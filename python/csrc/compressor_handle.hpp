// gradcomp.torch's compressor on torch tensors (gradcomp._C.Compressor) and ScaleCom's
// cyclic exchange over a process group (gradcomp._C.CyclicExchange): construction on CPU
// or CUDA from a method and its keyword options, each call checked (tensors.hpp), run with
// the GIL released and the compressor to itself, on CUDA in its call order across torch's
// streams (torch_cuda.hpp).
#pragma once

#include <torch/extension.h>

#include <gradcomp/comm/agreement.hpp>
#include <gradcomp/detail/step/state_io.hpp>

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "api.hpp"
#include "messages.hpp"
#include "process_group.hpp"
#include "tensors.hpp"
#include "torch_cuda.hpp"

namespace gradcomp_py {

namespace py = pybind11;
namespace gc = gradcomp;

/// The keyword options of gradcomp.torch.Compressor as the C++ layer reads them.
inline options options_of(const py::dict& kwargs) {
  options o;
  for (const auto& [key, value] : kwargs) {
    const auto name = key.cast<std::string>();
    if (py::isinstance<py::bool_>(value)) {
      o.set(name, value.cast<bool>());
    } else if (py::isinstance<py::int_>(value)) {
      try {
        o.set(name, value.cast<std::int64_t>());
      } catch (const py::cast_error&) {
        invalid("option ", name, " = ", py::str(value).cast<std::string>(), " does not fit a 64-bit integer");
      }
    } else if (py::isinstance<py::float_>(value)) {
      o.set(name, value.cast<double>());
    } else if (py::isinstance<py::str>(value)) {
      o.set(name, value.cast<std::string>());
    } else {
      invalid("option ", name, " must be a bool, int, float or str, got ",
              py::str(value.get_type()).cast<std::string>());
    }
  }
  return o;
}

class compressor_handle {
 public:
  compressor_handle(std::int64_t numel, const std::string& method, const py::dict& kwargs, const torch::Device& device)
      : device_(device.is_cpu() ? torch::Device(torch::kCPU) : device) {  // cpu:0 is the cpu tensors' device
    if (numel < 1) invalid("Compressor: numel must be >= 1, got ", numel);
    gradcomp_py::options o = options_of(kwargs);
    py::gil_scoped_release unlocked;  // allocating (and on CUDA zeroing) n floats a few times
    if (device.is_cpu()) {
      c_ = gradcomp_py::make_host(static_cast<std::size_t>(numel), method, o);
    } else if (device.is_cuda()) {
#if defined(GRADCOMP_PY_CUDA)
      const int index = device.has_index() ? device.index() : at::cuda::current_device();
      device_ = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
      c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(index));
      c_ = gradcomp_py::make_cuda(static_cast<std::size_t>(numel), method, o, index);
      order_ = std::make_unique<gc::backend::stream_order>(index);
#else
      invalid("Compressor: this build of gradcomp has no CUDA support (gradcomp._build.NO_CUDA says why)");
#endif
    } else {
      invalid("Compressor: device must be cpu or cuda, got ", device);
    }
  }

  /// Runs `work()` with the GIL released and no other call of this compressor running:
  /// Python threads may share a compressor, and none waits for the GPU or a collective
  /// holding the GIL (the collectives run in C++, process_group.hpp).
  template <class Work>
  decltype(auto) exclusive(Work&& work) {
    // Released before the lock: a thread holding the lock may need the GIL. (The DDP
    // hook's jobs call in from a thread of their own, which does not hold it.)
    std::optional<py::gil_scoped_release> unlocked;
    if (PyGILState_Check() != 0) unlocked.emplace();
    const std::lock_guard<std::mutex> lock(busy_);
    return work();
  }

  // Every call that reads or changes the compressor runs in exclusive() (the size, the
  // device and the policies never change).
  std::int64_t numel() const { return static_cast<std::int64_t>(c_->size()); }
  std::int64_t max_message_bytes() {
    return exclusive([&] { return message_capacity(); });
  }
  std::uint64_t step() {
    return exclusive([&] { return c_->step(); });
  }
  std::string signature() const { return c_->signature(); }
  gc::encode::index_value encoder() const { return c_->encoder(); }
  torch::Device device() const { return device_; }
  /// {"state": bytes, "workspace": bytes} the compressor holds (gradcomp/held_memory.hpp).
  std::map<std::string, std::uint64_t> memory_bytes() {
    return exclusive([&] {
      const gradcomp::held_memory use = c_->memory_bytes();
      return std::map<std::string, std::uint64_t>{{"state", use.state}, {"workspace", use.workspace}};
    });
  }

  /// Gives the workspace back until the next step (compressor::release_workspace).
  void release_workspace() {
    exclusive([&] { on_own_stream([&] { c_->release_workspace(); }); });
  }

  torch::Tensor compress(const torch::Tensor& grad, bool staged) {
    return exclusive([&] {
      const auto type = check_gradient(staged ? "stage" : "compress", "grad", grad, device_, numel());
      torch::Tensor out = message_buffer();
      const written w = run(values_of(grad), type, out, staged);
      return compact(out, w.bytes);
    });
  }
  void accept_staged() {
    // The staged step's commit is queued now: on CUDA on torch's current stream, as stage() is
    // (no host wait for the compressor's own stream).
    exclusive([&] { on_current_stream([&](void* stream) { c_->accept_staged(stream); }); });
  }
  bool has_staged() {
    return exclusive([&] { return c_->has_staged(); });
  }

  torch::Tensor preview(const torch::Tensor& grad) {
    return exclusive([&] {
      const auto type = check_gradient("preview", "grad", grad, device_, numel());
      const torch::Tensor values = values_of(grad);
      torch::Tensor out = torch::empty({numel()}, torch::TensorOptions().dtype(torch::kFloat).device(device_));
      on_current_stream([&](void* stream) { c_->preview(stream, values.data_ptr(), type, out.data_ptr<float>()); });
      return out;
    });
  }

  py::object density() {
    const auto d = exclusive([&] { return c_->density(); });
    return d ? py::object(py::float_(*d)) : py::none();
  }
  void set_density(double d) {
    exclusive([&] { on_own_stream([&] { c_->set_density(d); }); });
  }
  void set_indices(const torch::Tensor& indices) {
    if (!indices.defined() || indices.layout() != torch::kStrided || indices.dim() != 1 ||
        !c10::isIntegralType(indices.scalar_type(), /*includeBool=*/false)) {
      invalid("set_indices: indices must be a 1-D tensor of integers, got a ",
              indices.defined() ? describe(indices) : std::string("undefined tensor"));
    }
    const torch::Tensor i = values_of(indices).to(torch::kCPU, torch::kLong).contiguous();
    std::vector<std::uint32_t> values(static_cast<std::size_t>(i.numel()));
    const auto* p = i.data_ptr<std::int64_t>();
    for (std::size_t j = 0; j < values.size(); ++j) {
      if (p[j] < 0 || p[j] > static_cast<std::int64_t>(UINT32_MAX)) {
        invalid("set_indices: indices[", j, "] = ", p[j], " is not an index");
      }
      values[j] = static_cast<std::uint32_t>(p[j]);
    }
    exclusive([&] { on_own_stream([&] { c_->set_indices(values); }); });
  }

  py::bytes save_state() {
    std::string record;
    exclusive([&] { on_own_stream([&] { record = c_->save_state(); }); });
    return py::bytes(record);
  }
  void load_state(const py::bytes& record) {
    const std::string bytes(record);
    exclusive([&] { on_own_stream([&] { c_->load_state(bytes); }); });
  }
  std::size_t state_arrays() const { return c_->state_arrays(); }
  /// Makes `arrays` (state_arrays() float32 tensors of numel elements) the corrector's
  /// memory and `step` the step, keeping the density and the selector's state (the DDP
  /// hook's move of each parameter's memory into the buckets DDP regrouped it into).
  /// \throws gradcomp::error (invalid_argument) for arrays of another number, type or
  ///         size, (corrupt_message) for a non-finite value; nothing changes then.
  void load_memory(std::uint64_t step, const std::vector<torch::Tensor>& arrays) {
    if (arrays.size() != c_->state_arrays()) {
      invalid("load_memory: ", arrays.size(), " arrays given, the corrector keeps ", c_->state_arrays());
    }
    std::vector<torch::Tensor> host;
    for (std::size_t a = 0; a < arrays.size(); ++a) {
      check_tensor("load_memory", "an array", arrays[a], torch::kFloat, arrays[a].device(), numel());
      host.push_back(values_of(arrays[a]).to(torch::kCPU).contiguous());
    }
    std::vector<std::span<const float>> values;
    for (const auto& h : host) values.emplace_back(h.data_ptr<float>(), static_cast<std::size_t>(h.numel()));
    exclusive([&] {
      on_own_stream([&] {
        const std::string own = c_->save_state();
        c_->load_state(gc::detail::restated(std::as_bytes(std::span(own.data(), own.size())), c_->signature(),
                                            c_->size(), step, values));
      });
    });
  }
  torch::Tensor corrector_state(std::size_t a) {
    return exclusive([&] {
      std::vector<float> s;
      on_own_stream([&] { s = c_->corrector_state(a); });
      return torch::tensor(at::ArrayRef<float>(s), torch::kFloat).to(device_);
    });
  }

  /// The DDP hook's all-gather exchange (ddp_steps.hpp): stage() of `grad` (a bucket of
  /// this compressor's size, checked, `who` naming the call) with nothing read back, and
  /// its frame for the all-gather (verdict with `digest`, message if it fits `bound`)
  /// queued into `frame` (rank_verdict::size + bound bytes in the compressor's memory),
  /// on CUDA on torch's current stream. Returns the message buffer, which
  /// staged_message() reads and accept_staged() commits.
  torch::Tensor stage_framed(const torch::Tensor& grad, const char* who, torch::Tensor& frame, std::size_t bound,
                             std::uint64_t digest) {
    return exclusive([&] {
      const auto type = check_gradient(who, "the bucket", grad, device_, numel());
      torch::Tensor out = message_buffer();
      const torch::Tensor values = values_of(grad);
      on_current_stream([&](void* stream) {
        c_->stage_framed(stream, values.data_ptr(), type, reinterpret_cast<std::byte*>(out.data_ptr<std::uint8_t>()),
                         static_cast<std::size_t>(out.numel()),
                         reinterpret_cast<std::byte*>(frame.data_ptr<std::uint8_t>()), bound, digest);
      });
      return out;
    });
  }
  /// What stage_framed() wrote into `out`, read back, or its step's error (non_finite).
  written staged_message(const torch::Tensor& grad, torch::Tensor& out) {
    return exclusive([&] {
      const auto type = check_gradient("staged_message", "the bucket", grad, device_, numel());
      const torch::Tensor values = values_of(grad);
      written w;
      on_current_stream([&](void* stream) {
        w = c_->staged_message(stream, values.data_ptr(), type,
                               reinterpret_cast<std::byte*>(out.data_ptr<std::uint8_t>()),
                               static_cast<std::size_t>(out.numel()));
      });
      return w;
    });
  }
  /// The largest message this compressor's policies can write at its density.
  std::uint64_t capacity() {
    return exclusive([&] { return static_cast<std::uint64_t>(message_capacity()); });
  }

  gradcomp_py::any_compressor& impl() { return *c_; }

  // The first `bytes` of `out`, in a tensor of their own when that saves memory.
  static torch::Tensor compact(const torch::Tensor& out, std::size_t bytes) {
    const auto used = static_cast<std::int64_t>(bytes);
    torch::Tensor view = out.narrow(0, 0, used);
    return used < out.numel() ? view.clone() : view;
  }

  /// A buffer for the largest message (the call holds exclusive()).
  torch::Tensor message_buffer() const {
    return torch::empty({message_capacity()}, torch::TensorOptions().dtype(torch::kUInt8).device(device_));
  }

  /// What `make()` returns, made as a call of this compressor is (exclusive(), its own
  /// stream): an exchange over its memory, whose allocations and first work then land on
  /// its device and in its call order, whatever device is current.
  template <class Make>
  auto made_in_order(Make&& make) {
    return exclusive([&] {
      std::invoke_result_t<Make&> made;
      on_own_stream([&] { made = make(); });
      return made;
    });
  }

  /// Runs `work()`, a call that takes no execution context (set_density, checkpoints,
  /// the cyclic exchange): on CUDA on the compressor's own stream, in its call order.
  template <class Work>
  void on_own_stream(Work&& work) {
#if defined(GRADCOMP_PY_CUDA)
    if (order_) {
      gradcomp_py::on_stream(*order_, static_cast<cudaStream_t>(c_->stream()), work);
      return;
    }
#endif
    work();
  }

 private:
  /// Runs `work(stream)`, a call that takes its execution context: on CUDA torch's
  /// current stream, in the compressor's call order; on the host no stream (nullptr).
  template <class Work>
  void on_current_stream(Work&& work) {
#if defined(GRADCOMP_PY_CUDA)
    if (order_) {
      gradcomp_py::on_current_stream(*order_, work);
      return;
    }
#endif
    work(nullptr);
  }

  std::int64_t message_capacity() const { return static_cast<std::int64_t>(c_->max_message_bytes()); }

  written run(const torch::Tensor& grad, gradcomp_py::element type, torch::Tensor& out, bool staged) {
    written w;
    on_current_stream([&](void* stream) {
      w = c_->compress(stream, grad.data_ptr(), type, reinterpret_cast<std::byte*>(out.data_ptr<std::uint8_t>()),
                       static_cast<std::size_t>(out.numel()), staged);
    });
    return w;
  }

  std::unique_ptr<any_compressor> c_;
  torch::Device device_;
  std::mutex busy_;  // held by the call running (exclusive)
#if defined(GRADCOMP_PY_CUDA)
  // Declared after c_, so destroyed before it: its destructor waits for the last call.
  std::unique_ptr<gc::backend::stream_order> order_;
#endif
};

/// An exchange's outcome as a uint8 tensor over the exchange's memory on `device`, for
/// the caller to read with others' before it settles (no copy: valid until then).
inline torch::Tensor outcome_tensor(std::span<const std::byte> outcome, const torch::Device& device) {
  return torch::from_blob(const_cast<std::byte*>(outcome.data()), {static_cast<std::int64_t>(outcome.size())},
                          torch::TensorOptions().dtype(torch::kUInt8).device(device));
}

class cyclic_handle {
 public:
  /// What the DDP hook calls this exchange in its errors.
  static constexpr const char* name = "cyclic exchange";
  cyclic_handle(compressor_handle& c, const py::object& group, double leader_density)
      : cyclic_handle(c, gradcomp_py::transport_of(gradcomp_py::group_of(group), c.device(), c.impl().stream()),
                      leader_density) {}

  /// Bytes this rank has put into the exchange's collectives.
  std::uint64_t bytes_sent() const { return *sent_; }
  /// Bytes the exchange's collectives delivered to this rank.
  std::uint64_t bytes_received() const { return *received_; }
  /// Bytes the exchange holds beside its compressor's.
  std::uint64_t memory_bytes() {
    return c_.exclusive([&] { return static_cast<std::uint64_t>(x_->memory_bytes()); });
  }
  /// Collectives the exchange has issued.
  std::uint64_t collectives() const { return *issued_; }
  /// Entries of this rank's message in the last step.
  std::uint64_t entries() const { return entries_; }

  /// dense += scale * the ranks' sum at the leader's indices; returns this rank's
  /// message. The compressor's step stays staged until accept() (the DDP hook accepts a
  /// step's buckets together).
  torch::Tensor stage(const torch::Tensor& grad_in, torch::Tensor& dense, double scale) {
    // Sizes are the compressor's to check, inside the exchange (every rank alike).
    check_tensor("cyclic step", "grad", grad_in, torch::kFloat, c_.device());
    check_tensor("cyclic step", "dense", dense, torch::kFloat, c_.device());
    gradcomp_py::check_written("cyclic step", "dense", dense);
    const torch::Tensor grad = values_of(grad_in);
    return c_.exclusive([&] {
      torch::Tensor out = c_.message_buffer();
      written w;
      c_.on_own_stream([&] {
        w = x_->stage(grad.data_ptr<float>(), dense.data_ptr<float>(), static_cast<std::size_t>(dense.numel()),
                      static_cast<float>(scale), reinterpret_cast<std::byte*>(out.data_ptr<std::uint8_t>()),
                      static_cast<std::size_t>(out.numel()));
      });
      entries_ = w.count;
      return compressor_handle::compact(out, w.bytes);
    });
  }
  /// stage() up to its one read (the DDP hook's step, comm::cyclic_topk::queue): `also`
  /// the settings the ranks must share beside the exchange's (reported as `who`'s).
  /// Returns the outcome, a tensor over the exchange's memory that settle() takes read;
  /// `grad` and `dense` must live until then.
  torch::Tensor queue(const torch::Tensor& grad, torch::Tensor& dense, double scale,
                      const std::vector<gc::detail::setting>& also, const char* who) {
    check_tensor("cyclic step", "grad", grad, torch::kFloat, c_.device());
    check_tensor("cyclic step", "dense", dense, torch::kFloat, c_.device());
    gradcomp_py::check_written("cyclic step", "dense", dense);
    return c_.exclusive([&] {
      std::span<const std::byte> outcome;
      c_.on_own_stream([&] {
        outcome = x_->queue(grad.data_ptr<float>(), dense.data_ptr<float>(), static_cast<std::size_t>(dense.numel()),
                            static_cast<float>(scale), also, who);
      });
      return outcome_tensor(outcome, c_.device());
    });
  }
  /// Completes the step queue() queued from its outcome, read to the host.
  void settle(std::span<const std::byte> outcome) {
    c_.exclusive([&] { c_.on_own_stream([&] { entries_ = x_->settle(outcome); }); });
  }
  /// The next step runs at the sizes the ranks then agree (every rank alike).
  void forget_agreed_sizes() {
    c_.exclusive([&] { x_->forget_agreed_sizes(); });
  }
  void accept() {
    c_.exclusive([&] { c_.on_own_stream([&] { x_->accept(); }); });
  }
  /// stage() then accept().
  torch::Tensor step(const torch::Tensor& grad, torch::Tensor& dense, double scale) {
    torch::Tensor message = stage(grad, dense, scale);
    accept();
    return message;
  }

 private:
  cyclic_handle(compressor_handle& c, gradcomp_py::transport t, double leader_density)
      : c_(c),
        sent_(t.sent),
        received_(t.received),
        issued_(t.issued),
        x_(c.made_in_order([&] { return c.impl().cyclic(std::move(t), leader_density); })) {}

  compressor_handle& c_;
  std::shared_ptr<std::uint64_t> sent_;
  std::shared_ptr<std::uint64_t> received_;
  std::shared_ptr<std::uint64_t> issued_;
  std::unique_ptr<gradcomp_py::cyclic_exchange> x_;
  std::uint64_t entries_ = 0;
};

/// Ok-Topk's global top-k over a process group with one CPU compressor
/// (gradcomp._C.SparseAllreduce; comm::sparse_allreduce).
class sparse_handle {
 public:
  /// What the DDP hook calls this exchange in its errors.
  static constexpr const char* name = "sparse_allreduce";
  sparse_handle(compressor_handle& c, const py::object& group, std::size_t k)
      : sparse_handle(c, gradcomp_py::transport_of(gradcomp_py::group_of(group), c.device(), c.impl().stream()), k) {}

  /// Bytes this rank has put into the exchange's collectives.
  std::uint64_t bytes_sent() const { return *sent_; }
  /// Bytes the exchange's collectives delivered to this rank.
  std::uint64_t bytes_received() const { return *received_; }
  /// Collectives the exchange has issued.
  std::uint64_t collectives() const { return *issued_; }
  /// Entries of this rank's message in the last step.
  std::uint64_t entries() {
    return c_.exclusive([&] { return x_->entries(); });
  }
  /// Bytes the exchange holds beside its compressor's.
  std::uint64_t memory_bytes() {
    return c_.exclusive([&] { return static_cast<std::uint64_t>(x_->memory_bytes()); });
  }
  /// The global selection's size.
  std::size_t k() {
    return c_.exclusive([&] { return x_->k(); });
  }
  /// Gives back the exchange's and the compressor's workspace until the next step.
  void release_workspace() {
    c_.exclusive([&] { c_.on_own_stream([&] { x_->release_workspace(); }); });
  }

  /// dense += scale * the global top-k of the ranks' sums; the compressor's step stays
  /// staged until accept() (the DDP hook accepts a step's buckets together). `also`:
  /// the settings the ranks must share beside the exchange's (the hook's, reported as
  /// `who`'s).
  void stage(const torch::Tensor& grad_in, torch::Tensor& dense, double scale,
             const std::vector<gc::detail::setting>& also = {}, const char* who = "sparse_allreduce") {
    const element type = checked_selection(grad_in, dense);
    const torch::Tensor grad = values_of(grad_in);
    c_.exclusive([&] {
      c_.on_own_stream([&] {
        x_->stage(grad.data_ptr(), type, dense.data_ptr<float>(), static_cast<std::size_t>(dense.numel()),
                  static_cast<float>(scale), also, who);
      });
    });
  }
  void accept() {
    c_.exclusive([&] { c_.on_own_stream([&] { x_->accept(); }); });
  }
  /// FSDP's sparse reduce-scatter: `shard` = scale * this rank's shard of the ranks'
  /// summed messages of `grad` (W equal shards); the compressor's step is committed.
  void reduce_scatter(const torch::Tensor& grad_in, torch::Tensor& shard, double scale) {
    scatter(grad_in, shard, [&](const void* grad, element type, std::size_t n) {
      x_->reduce_scatter(grad, type, n, shard.data_ptr<float>(), static_cast<std::size_t>(shard.numel()),
                         static_cast<float>(scale));
    });
  }
  /// reduce_scatter() up to its one read (FSDP's calls settled once a step): `shard`
  /// written as queued (zeros where the ranks refuse the step), the outcome returned, a
  /// tensor over the exchange's memory that settle() takes read; settle() commits.
  torch::Tensor queue_reduce_scatter(const torch::Tensor& grad_in, torch::Tensor& shard, double scale) {
    std::span<const std::byte> outcome;
    scatter(grad_in, shard, [&](const void* grad, element type, std::size_t n) {
      outcome = x_->queue_reduce_scatter(grad, type, n, shard.data_ptr<float>(),
                                         static_cast<std::size_t>(shard.numel()), static_cast<float>(scale));
    });
    return outcome_tensor(outcome, c_.device());
  }
  /// settle() from the outcome read into `read` (uint8, on the CPU, contiguous).
  void settle_read(const torch::Tensor& read) {
    check_tensor("sparse_allreduce settle", "read", read, torch::kUInt8, torch::Device(torch::kCPU));
    settle({reinterpret_cast<const std::byte*>(read.data_ptr<std::uint8_t>()), static_cast<std::size_t>(read.numel())});
  }
  /// Drops a queued exchange's staged step (one that will not be settled).
  void drop() {
    c_.exclusive([&] { x_->drop(); });
  }
  /// Whether the ranks agreed the sizes the collectives move (after a first call).
  [[nodiscard]] bool sizes_agreed() const { return x_->sizes_agreed(); }
  /// stage() then accept().
  void step(const torch::Tensor& grad, torch::Tensor& dense, double scale) {
    stage(grad, dense, scale);
    accept();
  }
  /// step() up to its one read (HSDP's all-reduce settled once a step): `dense` added to
  /// as queued (nothing where the ranks refuse the step), the outcome returned, a tensor
  /// over the exchange's memory that settle() takes read; settle() commits.
  torch::Tensor queue_step(const torch::Tensor& grad_in, torch::Tensor& dense, double scale) {
    const element type = checked_selection(grad_in, dense);
    const torch::Tensor grad = values_of(grad_in);
    return c_.exclusive([&] {
      std::span<const std::byte> outcome;
      c_.on_own_stream([&] {
        outcome = x_->queue_step(grad.data_ptr(), type, dense.data_ptr<float>(),
                                 static_cast<std::size_t>(dense.numel()), static_cast<float>(scale));
      });
      return outcome_tensor(outcome, c_.device());
    });
  }
  /// stage() up to its one read (the DDP hook's step, comm::sparse_allreduce::queue):
  /// `also` the settings the ranks must share beside the exchange's (reported as
  /// `who`'s). Returns the outcome, a tensor over the exchange's memory that settle()
  /// takes read; `grad` and `dense` must live until then.
  torch::Tensor queue(const torch::Tensor& grad, torch::Tensor& dense, double scale,
                      const std::vector<gc::detail::setting>& also, const char* who) {
    const element type = checked_selection(grad, dense);
    // The exchange reads `grad` until settle(): the caller's own values, no copy of ours.
    if (grad.is_neg()) gc::detail::fail(gc::errc::invalid_argument, "sparse_allreduce: queue takes no negated view");
    return c_.exclusive([&] {
      std::span<const std::byte> outcome;
      c_.on_own_stream([&] {
        outcome = x_->queue(grad.data_ptr(), type, dense.data_ptr<float>(), static_cast<std::size_t>(dense.numel()),
                            static_cast<float>(scale), also, who);
      });
      return outcome_tensor(outcome, c_.device());
    });
  }
  /// Completes the step queue() queued from its outcome, read to the host.
  void settle(std::span<const std::byte> outcome) {
    c_.exclusive([&] { c_.on_own_stream([&] { x_->settle(outcome); }); });
  }
  /// The next step runs at the sizes the ranks agree then (every rank alike).
  void forget_agreed_sizes() {
    c_.exclusive([&] { c_.on_own_stream([&] { x_->forget_agreed_sizes(); }); });
  }

 private:
  // The global selection's gradient and `dense` checked (sizes are the exchange's to
  // check, every rank alike); the gradient's element type.
  element checked_selection(const torch::Tensor& grad, const torch::Tensor& dense) {
    const element type = check_gradient("sparse_allreduce", "grad", grad, c_.device(), -1);
    check_tensor("sparse_allreduce", "dense", dense, torch::kFloat, c_.device());
    gradcomp_py::check_written("sparse_allreduce", "dense", dense);
    return type;
  }

  // FSDP's input and output checked, then `run(grad, type, n)` on the compressor's own
  // stream (the reduce-scatter's, at once or queued).
  template <class Run>
  void scatter(const torch::Tensor& grad_in, torch::Tensor& shard, Run&& run) {
    const element type = check_gradient("reduce_scatter", "input", grad_in, c_.device(), -1);
    check_tensor("reduce_scatter", "output", shard, torch::kFloat, c_.device());
    gradcomp_py::check_written("reduce_scatter", "output", shard);
    const torch::Tensor grad = values_of(grad_in);
    c_.exclusive(
        [&] { c_.on_own_stream([&] { run(grad.data_ptr(), type, static_cast<std::size_t>(grad.numel())); }); });
  }

  sparse_handle(compressor_handle& c, gradcomp_py::transport t, std::size_t k)
      : c_(c),
        sent_(t.sent),
        received_(t.received),
        issued_(t.issued),
        x_(c.made_in_order([&] { return c.impl().sparse(std::move(t), k); })) {}

  compressor_handle& c_;
  std::shared_ptr<std::uint64_t> sent_;
  std::shared_ptr<std::uint64_t> received_;
  std::shared_ptr<std::uint64_t> issued_;
  std::unique_ptr<gradcomp_py::sparse_exchange> x_;
};

}  // namespace gradcomp_py
