// gradcomp._C: the compressor, decode and accumulate on torch tensors, the collectives of
// the DDP hook, and the schedules. Tensors are checked here (tensors.hpp: dtype, shape,
// layout, device, autograd) and every gradcomp::error becomes the Python exception of its
// code (gradcomp.errors), with the same message.
#include <torch/extension.h>

#include "api.hpp"
#include "names.hpp"
#include "process_group.hpp"
#include "tensors.hpp"

#include <gradcomp/backend/host.hpp>
#include <gradcomp/detail/collective_checks.hpp>
#include <gradcomp/message.hpp>
#include <gradcomp/schedule/ratio_plan.hpp>
#include <gradcomp/schedule/warmup.hpp>

#if defined(GRADCOMP_PY_CUDA)
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <gradcomp/backend/device_allocator.hpp>
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string_view>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace py = pybind11;
namespace gc = gradcomp;
using gradcomp_py::any_compressor;
using gradcomp_py::check_gradient;
using gradcomp_py::check_tensor;
using gradcomp_py::describe;
using gradcomp_py::invalid;
using gradcomp_py::values_of;
using gradcomp_py::written;

namespace {

std::span<const std::byte> bytes_of(const torch::Tensor& t) {
  return {reinterpret_cast<const std::byte*>(t.data_ptr<std::uint8_t>()), static_cast<std::size_t>(t.numel())};
}

gradcomp_py::options options_of(const py::dict& kwargs) {
  gradcomp_py::options o;
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

// -- CUDA: torch's allocator, and the order of a compressor's calls across streams ------------

#if defined(GRADCOMP_PY_CUDA)
/// backend::cuda's device memory from torch's caching allocator. A block comes free for
/// torch's current stream only (work of its last owner may still be queued there), and
/// gradcomp uses it on other streams too, so that stream is waited for: allocations are
/// made when a compressor is (and on the first 16-bit gradient or preview), not per step.
class torch_allocator final : public gc::backend::device_allocator {
 public:
  void* allocate(std::size_t bytes) override {
    void* p = c10::cuda::CUDACachingAllocator::raw_alloc(bytes);
    const cudaError_t synced = cudaStreamSynchronize(at::cuda::getCurrentCUDAStream().stream());
    if (synced != cudaSuccess) {
      c10::cuda::CUDACachingAllocator::raw_delete(p);
      gc::detail::fail(gc::errc::device, "cudaStreamSynchronize failed: ", cudaGetErrorString(synced));
    }
    return p;
  }
  void deallocate(void* p, std::size_t) noexcept override { c10::cuda::CUDACachingAllocator::raw_delete(p); }
};

/// The order of one CUDA compressor's calls across streams. Each call runs on one
/// stream: compress, stage and preview on torch's current stream, the call's execution
/// context, so that they follow the work that wrote their inputs and precede the work
/// that reads their outputs with no handoff; the calls that take no stream on the
/// compressor's own. A call's work follows the previous call's, wherever that ran (an
/// event recorded after each call: the compressor's state may be read on a stream other
/// than the one that wrote it, and the current stream changes from call to call); a call
/// on the compressor's own stream follows torch's current stream and precedes its later
/// work, and starts once every earlier call has finished: those calls (set_density,
/// load_state) may free memory, which goes back to torch's pool at once. Calls come one
/// at a time (the caller holds a lock).
class call_order {
 public:
  explicit call_order(int device) : device_(static_cast<c10::DeviceIndex>(device)) {
    c10::cuda::CUDAGuard guard(device_);
    ok(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    ok(cudaEventCreateWithFlags(&inputs_, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  }
  /// Waits for the last call's work: the compressor's memory may go back to the pool after.
  ~call_order() {
    cudaEventSynchronize(done_);
    cudaEventDestroy(done_);
    cudaEventDestroy(inputs_);
  }
  call_order(const call_order&) = delete;
  call_order& operator=(const call_order&) = delete;

  /// Runs `work(stream)`, which queues its work on `stream`, torch's current stream, in
  /// the order above.
  template <class Work>
  void run_on_current(Work&& work) {
    c10::cuda::CUDAGuard guard(device_);
    const cudaStream_t current = current_stream();
    run(current, current, work);
  }
  /// The same on `stream`, another stream than torch's current one.
  template <class Work>
  void run_on(cudaStream_t stream, Work&& work) {
    c10::cuda::CUDAGuard guard(device_);
    run(stream, current_stream(), work);
  }

 private:
  [[nodiscard]] cudaStream_t current_stream() const { return at::cuda::getCurrentCUDAStream(device_).stream(); }

  template <class Work>
  void run(cudaStream_t stream, cudaStream_t torch_stream, Work&& work) {
    if (stream == torch_stream) {
      ok(cudaStreamWaitEvent(stream, done_, 0), "cudaStreamWaitEvent");  // a no-op before the first call
    } else {
      ok(cudaEventSynchronize(done_), "cudaEventSynchronize");
      ok(cudaEventRecord(inputs_, torch_stream), "cudaEventRecord");
      ok(cudaStreamWaitEvent(stream, inputs_, 0), "cudaStreamWaitEvent");
    }
    // Recorded however the call ends: a refused call may have queued work before it threw.
    // Should the record fail, the call's work is waited for instead, so that the next
    // call cannot overtake it.
    const auto finish = [&] {
      if (cudaEventRecord(done_, stream) != cudaSuccess) {
        cudaStreamSynchronize(stream);
        return;
      }
      if (stream != torch_stream) cudaStreamWaitEvent(torch_stream, done_, 0);
    };
    try {
      work(static_cast<void*>(stream));
    } catch (...) {
      finish();
      throw;
    }
    finish();
  }

  static void ok(cudaError_t e, const char* what) {
    if (e != cudaSuccess) gc::detail::fail(gc::errc::device, what, " failed: ", cudaGetErrorString(e));
  }
  c10::DeviceIndex device_;
  cudaEvent_t done_ = nullptr;    // recorded after each call's work
  cudaEvent_t inputs_ = nullptr;  // torch's current stream, before a call on the own stream
};
#endif

void add_message(const torch::Tensor& message, torch::Tensor& dense, float scale);  // below, with accumulate

// -- the compressor ----------------------------------------------------------------------------

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
      order_ = std::make_unique<call_order>(index);
#else
      invalid("Compressor: this build of gradcomp has no CUDA support (built against a CPU-only torch)");
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
    py::gil_scoped_release unlocked;  // before the lock: a thread holding the lock may need the GIL
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
  torch::Device device() const { return device_; }

  torch::Tensor compress(const torch::Tensor& grad, bool staged) {
    return exclusive([&] {
      const auto type = check_gradient(staged ? "stage" : "compress", "grad", grad, device_, numel());
      torch::Tensor out = message_buffer();
      const written w = run(values_of(grad), type, out, staged);
      return compact(out, w.bytes);
    });
  }
  void accept_staged() {
    exclusive([&] { c_->accept_staged(); });
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
  torch::Tensor corrector_state(std::size_t a) {
    return exclusive([&] {
      std::vector<float> s;
      on_own_stream([&] { s = c_->corrector_state(a); });
      return torch::tensor(at::ArrayRef<float>(s), torch::kFloat).to(device_);
    });
  }

  /// One step of a DDP bucket over `group` (gradcomp.torch.ddp's hook, every method but
  /// scalecom): every rank stages `grad` and reports its verdict (or `error`, met before
  /// the call), `settings` and the policies in one agreement, so that every rank raises
  /// the same error or none does; then the messages, padded to the longest, are
  /// all-gathered, every rank checks and adds each one times `scale` to `mean` (the same
  /// bytes everywhere, so the same outcome everywhere), and only then accepts its step.
  /// Returns the bytes this rank put into the collectives.
  std::uint64_t exchange(const py::object& group, const torch::Tensor& grad, torch::Tensor& mean, double scale,
                         const std::string& who, const std::vector<gradcomp_py::named_value>& settings,
                         const gradcomp_py::reported_error& error) {
    gradcomp_py::transport t = gradcomp_py::transport_of(group, device_, c_->stream());
    std::vector<gc::detail::setting> shared;
    for (const auto& [name, value] : settings) shared.emplace_back(name, value);
    shared.emplace_back("the policies", signature());
    exclusive([&] {
      gradcomp_py::agreement_comm comm{t};
      torch::Tensor out;
      const std::vector<std::uint64_t> sizes = gc::detail::agree(comm, who.c_str(), shared, [&]() -> std::uint64_t {
        gradcomp_py::rethrow(error);
        const auto type = check_gradient(who.c_str(), "the bucket", grad, device_, numel());
        check_tensor(who.c_str(), "mean", mean, torch::kFloat, device_, numel());
        out = message_buffer();
        return run(values_of(grad), type, out, true).bytes;
      });
      // The ranks agreed on n, the policies and their parameters, so no message of theirs
      // outgrows this rank's capacity: a size above it is a broken peer's, refused alike
      // on every rank (each reads the same sizes).
      const auto capacity = static_cast<std::uint64_t>(message_capacity());
      std::uint64_t longest = 0;
      for (std::size_t r = 0; r < sizes.size(); ++r) {
        gc::detail::require(sizes[r] <= capacity, gc::errc::corrupt_message, who, ": rank ", r,
                            " reported a message of ", sizes[r], " bytes, more than the ", capacity,
                            " its policies can write");
        longest = std::max(longest, sizes[r]);
      }
      const auto mine = static_cast<std::int64_t>(sizes[static_cast<std::size_t>(t.rank)]);
      std::vector<std::byte> padded(static_cast<std::size_t>(longest), std::byte{0});
      const torch::Tensor message = out.narrow(0, 0, mine).to(torch::kCPU);
      std::memcpy(padded.data(), message.data_ptr<std::uint8_t>(), static_cast<std::size_t>(mine));
      std::vector<std::byte> all(sizes.size() * padded.size());
      t.all_gather(padded, all);
      const torch::Tensor gathered =
          torch::from_blob(all.data(), {static_cast<std::int64_t>(all.size())}, torch::kUInt8).to(device_);
      for (std::size_t r = 0; r < sizes.size(); ++r) {
        const torch::Tensor theirs =
            gathered.narrow(0, static_cast<std::int64_t>(r * padded.size()), static_cast<std::int64_t>(sizes[r]));
        try {
          add_message(theirs, mean, static_cast<float>(scale));
        } catch (const gc::error& e) {
          gc::detail::fail(e.code(), std::string_view(e.what()).substr(std::strlen("gradcomp: ")),
                           " (the message of rank ", r, " of ", sizes.size(), ")");
        }
      }
      c_->accept_staged();
    });
    return *t.sent;
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

  /// Runs `work()`, a call that takes no execution context (set_density, checkpoints,
  /// the cyclic exchange): on CUDA on the compressor's own stream, in its call order.
  template <class Work>
  void on_own_stream(Work&& work) {
#if defined(GRADCOMP_PY_CUDA)
    if (order_) {
      order_->run_on(static_cast<cudaStream_t>(c_->stream()), [&](void*) { work(); });
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
      order_->run_on_current(work);
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
  std::unique_ptr<call_order> order_;
#endif
};

class cyclic_handle {
 public:
  cyclic_handle(compressor_handle& c, const py::object& group, double leader_density)
      : cyclic_handle(c, gradcomp_py::transport_of(group, c.device(), c.impl().stream()), leader_density) {}

  /// Bytes this rank has put into the exchange's collectives.
  std::uint64_t bytes_sent() const { return *sent_; }

  torch::Tensor step(const torch::Tensor& grad_in, torch::Tensor& dense, double scale) {
    // Sizes are the compressor's to check, inside the exchange (every rank alike).
    check_tensor("cyclic step", "grad", grad_in, torch::kFloat, c_.device());
    check_tensor("cyclic step", "dense", dense, torch::kFloat, c_.device());
    gradcomp_py::check_written("cyclic step", "dense", dense);
    const torch::Tensor grad = values_of(grad_in);
    return c_.exclusive([&] {
      torch::Tensor out = c_.message_buffer();
      written w;
      c_.on_own_stream([&] {
        w = x_->step(grad.data_ptr<float>(), dense.data_ptr<float>(), static_cast<std::size_t>(dense.numel()),
                     static_cast<float>(scale), reinterpret_cast<std::byte*>(out.data_ptr<std::uint8_t>()),
                     static_cast<std::size_t>(out.numel()));
      });
      return compressor_handle::compact(out, w.bytes);
    });
  }

 private:
  cyclic_handle(compressor_handle& c, gradcomp_py::transport t, double leader_density)
      : c_(c), sent_(t.sent), x_(c.impl().cyclic(std::move(t), leader_density)) {}

  compressor_handle& c_;
  std::shared_ptr<std::uint64_t> sent_;
  std::unique_ptr<gradcomp_py::cyclic_exchange> x_;
};

// -- messages ----------------------------------------------------------------------------------

#if defined(GRADCOMP_PY_CUDA)
/// accumulate()'s workspace on one device, kept from call to call (no allocation per
/// call), its calls ordered across streams as a compressor's are, one at a time.
struct device_accumulate {
  explicit device_accumulate(int device) : add(gradcomp_py::make_cuda_accumulator(device)), order(device) {}
  std::unique_ptr<gradcomp_py::cuda_accumulator> add;
  call_order order;
  std::mutex busy;
};

/// The device_accumulate of `device`, made on first use. Never destroyed: at exit torch's
/// allocator may be gone before static destructors would run.
device_accumulate& accumulate_on(int device) {
  static std::mutex made;
  static auto* each = new std::map<int, std::unique_ptr<device_accumulate>>();
  const std::lock_guard<std::mutex> lock(made);
  auto& slot = (*each)[device];
  if (!slot) slot = std::make_unique<device_accumulate>(device);
  return *slot;
}
#endif

py::tuple decode(const torch::Tensor& message_in) {
  check_tensor("decode", "message", message_in, torch::kUInt8, message_in.device());
  const torch::Tensor host = values_of(message_in).to(torch::kCPU);
  gc::sparse_vector s;
  {
    py::gil_scoped_release unlocked;
    s = gc::decode(bytes_of(host));
  }
  torch::Tensor indices = torch::empty({static_cast<std::int64_t>(s.indices.size())}, torch::kLong);
  auto* ip = indices.data_ptr<std::int64_t>();
  for (std::size_t j = 0; j < s.indices.size(); ++j) ip[j] = s.indices[j];
  torch::Tensor values = torch::tensor(at::ArrayRef<float>(s.values), torch::kFloat);
  return py::make_tuple(indices.to(message_in.device()), values.to(message_in.device()), py::int_(s.n));
}

/// dense += scale * the entries of `message` (checked tensors on one device), with the
/// GIL released by the caller.
void add_message(const torch::Tensor& message, torch::Tensor& dense, float scale) {
  if (message.is_cpu()) {
    gc::accumulate(gc::backend::host{}, bytes_of(message),
                   std::span<float>(dense.data_ptr<float>(), static_cast<std::size_t>(dense.numel())), scale);
    return;
  }
#if defined(GRADCOMP_PY_CUDA)
  const int device = message.device().index();
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  device_accumulate& on = accumulate_on(device);
  const std::lock_guard<std::mutex> lock(on.busy);
  on.order.run_on_current([&](void* stream) {
    on.add->add(stream, bytes_of(message), dense.data_ptr<float>(), static_cast<std::size_t>(dense.numel()), scale);
  });
#else
  invalid("accumulate: this build of gradcomp has no CUDA support");
#endif
}

void accumulate(const torch::Tensor& message, torch::Tensor& dense, double scale) {
  check_tensor("accumulate", "message", message, torch::kUInt8, message.device());
  check_tensor("accumulate", "dense", dense, torch::kFloat, message.device());
  gradcomp_py::check_written("accumulate", "dense", dense);
  if (!(std::fabs(scale) <= static_cast<double>(std::numeric_limits<float>::max()))) {
    invalid("accumulate: scale must be a finite float32, got ", scale);
  }
  const torch::Tensor bytes = values_of(message);
  {
    py::gil_scoped_release unlocked;
    add_message(bytes, dense, static_cast<float>(scale));
  }
  gradcomp_py::bump_version(dense);
}

// -- errors ------------------------------------------------------------------------------------

const char* error_class(gc::errc code) {
  switch (code) {
    case gc::errc::invalid_argument:
      return "InvalidArgumentError";
    case gc::errc::buffer_too_small:
      return "BufferTooSmallError";
    case gc::errc::non_finite:
      return "NonFiniteError";
    case gc::errc::corrupt_message:
      return "CorruptMessageError";
    case gc::errc::io:
      return "StateIOError";
    case gc::errc::device:
      return "DeviceError";
  }
  return "Error";
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "gradcomp's compressors on torch tensors (use gradcomp.torch)";
  m.attr("cuda") = py::bool_(
#if defined(GRADCOMP_PY_CUDA)
      true
#else
      false
#endif
  );
#if defined(GRADCOMP_PY_CUDA)
  gc::backend::set_device_allocator(std::make_shared<torch_allocator>());
#endif
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const gc::error& e) {
      const py::object cls = py::module_::import("gradcomp.errors").attr(error_class(e.code()));
      PyErr_SetString(cls.ptr(), e.what());
    }
  });

  py::class_<compressor_handle>(m, "Compressor")
      .def(py::init<std::int64_t, const std::string&, const py::dict&, const torch::Device&>(), py::arg("numel"),
           py::arg("method"), py::arg("options"), py::arg("device"))
      .def_property_readonly("numel", &compressor_handle::numel)
      .def_property_readonly("max_message_bytes", &compressor_handle::max_message_bytes)
      .def_property_readonly("step", &compressor_handle::step)
      .def_property_readonly("signature", &compressor_handle::signature)
      .def_property_readonly("device", &compressor_handle::device)
      .def_property_readonly("density", &compressor_handle::density)
      .def_property_readonly("state_arrays", &compressor_handle::state_arrays)
      .def("compress", [](compressor_handle& c, const torch::Tensor& g) { return c.compress(g, false); })
      .def("stage", [](compressor_handle& c, const torch::Tensor& g) { return c.compress(g, true); })
      .def("accept_staged", &compressor_handle::accept_staged)
      .def_property_readonly("has_staged", &compressor_handle::has_staged)
      .def("preview", &compressor_handle::preview)
      .def("set_density", &compressor_handle::set_density)
      .def("set_indices", &compressor_handle::set_indices)
      .def("save_state", &compressor_handle::save_state)
      .def("load_state", &compressor_handle::load_state)
      .def("corrector_state", &compressor_handle::corrector_state)
      .def("exchange", &compressor_handle::exchange);

  py::class_<cyclic_handle>(m, "CyclicExchange")
      .def(py::init<compressor_handle&, const py::object&, double>(), py::keep_alive<1, 2>())
      .def("step", &cyclic_handle::step)
      .def_property_readonly("bytes_sent", &cyclic_handle::bytes_sent);

  m.def("methods", &gradcomp_py::method_names, "The methods a Compressor takes (names.hpp)");
  m.def("decode", &decode, py::arg("message"));
  m.def("agree", &gradcomp_py::agree, py::arg("group"), py::arg("who"), py::arg("settings"), py::arg("error"));
  m.def("accumulate", &accumulate, py::arg("message"), py::arg("dense"), py::arg("scale") = 1.0);

  m.def(
      "warmup_by_epoch",
      [](double start, double factor, double final_density, std::uint64_t epoch) {
        return gc::schedule::warmup{.start = start, .factor = factor, .final_density = final_density}.by_epoch(epoch);
      },
      py::arg("start"), py::arg("factor"), py::arg("final_density"), py::arg("epoch"));
  m.def(
      "warmup_by_step",
      [](double start, double factor, double final_density, std::uint64_t step, std::uint64_t steps_per_epoch) {
        return gc::schedule::warmup{.start = start, .factor = factor, .final_density = final_density}.by_step(
            step, steps_per_epoch);
      },
      py::arg("start"), py::arg("factor"), py::arg("final_density"), py::arg("step"), py::arg("steps_per_epoch"));
  m.def(
      "ratio_plan",
      [](const std::vector<double>& volumes, double mean_density, double min_density) {
        return gc::schedule::ratio_plan(volumes, mean_density, min_density);
      },
      py::arg("volumes"), py::arg("mean_density"), py::arg("min_density"));
}
