// gradcomp._C: the compressor, decode and accumulate on torch tensors, the collectives of
// the DDP hook, and the schedules. Tensors are checked here (dtype, shape, layout,
// device) and every gradcomp::error becomes the Python exception of its code
// (gradcomp.errors), with the same message.
#include <torch/extension.h>

#include "api.hpp"

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

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace py = pybind11;
namespace gc = gradcomp;
using gradcomp_py::any_compressor;
using gradcomp_py::written;

namespace {

template <class... Parts>
[[noreturn]] void invalid(Parts&&... parts) {
  gc::detail::fail(gc::errc::invalid_argument, std::forward<Parts>(parts)...);
}

std::string describe(const torch::Tensor& t) {
  std::ostringstream out;
  out << t.scalar_type() << " tensor of shape " << t.sizes() << " on " << t.device();
  return out.str();
}

/// A 1-D contiguous tensor of `dtype` on `device` (of `numel` elements unless < 0).
void check_tensor(const char* who, const char* name, const torch::Tensor& t, torch::ScalarType dtype,
                  const torch::Device& device, std::int64_t numel = -1) {
  if (!t.defined()) invalid(who, ": ", name, " is undefined");
  if (t.scalar_type() != dtype) {
    invalid(who, ": ", name, " must be a ", dtype, " tensor, got a ", describe(t),
            dtype == torch::kFloat && t.is_floating_point() ? " (convert it with .float())" : "");
  }
  if (t.dim() != 1) invalid(who, ": ", name, " must be 1-D, got a ", describe(t), " (flatten it with .view(-1))");
  if (!t.is_contiguous()) invalid(who, ": ", name, " must be contiguous (call .contiguous())");
  if (t.device() != device) invalid(who, ": ", name, " is on ", t.device(), ", expected ", device);
  if (numel >= 0 && t.numel() != numel) invalid(who, ": ", name, " has ", t.numel(), " elements, expected ", numel);
}

/// A gradient: a 1-D contiguous float32, float16 or bfloat16 tensor of `numel`
/// elements on `device`. Returns its element type.
gradcomp_py::element check_gradient(const char* who, const char* name, const torch::Tensor& t,
                                    const torch::Device& device, std::int64_t numel) {
  if (!t.defined()) invalid(who, ": ", name, " is undefined");
  const torch::ScalarType type = t.scalar_type();
  if (type != torch::kFloat && type != torch::kHalf && type != torch::kBFloat16) {
    invalid(who, ": ", name, " must be a float32, float16 or bfloat16 tensor, got a ", describe(t),
            t.is_floating_point() ? " (convert it with .float())" : "");
  }
  check_tensor(who, name, t, type, device, numel);
  return type == torch::kHalf ? gradcomp_py::element::f16
         : type == torch::kBFloat16 ? gradcomp_py::element::bf16
                                     : gradcomp_py::element::f32;
}

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
      o.set(name, value.cast<std::int64_t>());
    } else if (py::isinstance<py::float_>(value)) {
      o.set(name, value.cast<double>());
    } else if (py::isinstance<py::str>(value)) {
      o.set(name, value.cast<std::string>());
    } else {
      invalid("option ", name, " must be a bool, int, float or str, got ", py::str(value.get_type()).cast<std::string>());
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

// -- a transport: torch.distributed's collectives, called back through Python --------------

/// The collectives of `t` (a gradcomp.torch.ddp transport) on the memory of a compressor
/// on `device`. Device arrays are handed to Python only once the compressor's `stream`
/// has written them, and handed back once torch's current stream (on which Python
/// queued the collective and its copies) has finished with them. They are called with
/// the GIL released (compressor_handle::exclusive) and take it for Python's part only;
/// the transport itself is made, copied and destroyed with the GIL held.
gradcomp_py::transport transport_of(const py::object& t, const torch::Device& device, void* stream) {
  gradcomp_py::transport out;
  out.rank = t.attr("rank").cast<int>();
  out.size = t.attr("size").cast<int>();
  out.all_gather = [t](std::span<const std::byte> mine, std::span<std::byte> all) {
    const torch::Tensor send = torch::from_blob(const_cast<std::byte*>(mine.data()),
                                                {static_cast<std::int64_t>(mine.size())}, torch::kUInt8)
                                   .clone();
    torch::Tensor got;
    {
      py::gil_scoped_acquire held;
      got = t.attr("all_gather")(send).cast<torch::Tensor>();
    }
    got = got.to(torch::kCPU).contiguous();
    if (got.scalar_type() != torch::kUInt8 || static_cast<std::size_t>(got.numel()) != all.size()) {
      invalid("transport.all_gather returned a ", describe(got), ", expected ", all.size(), " bytes");
    }
    std::memcpy(all.data(), got.data_ptr<std::uint8_t>(), all.size());
  };
  const auto options = torch::TensorOptions().device(device);
  const auto in_order = [device, stream](auto&& call) {
#if defined(GRADCOMP_PY_CUDA)
    if (device.is_cuda()) {
      const cudaError_t synced = cudaStreamSynchronize(static_cast<cudaStream_t>(stream));
      if (synced != cudaSuccess) {
        gc::detail::fail(gc::errc::device, "cudaStreamSynchronize failed: ", cudaGetErrorString(synced));
      }
      call();
      at::cuda::getCurrentCUDAStream().synchronize();
      return;
    }
#endif
    (void)device;
    (void)stream;
    call();
  };
  out.broadcast = [t, options, in_order](std::span<std::uint32_t> data, int root) {
    if (data.empty()) return;
    in_order([&] {
      py::gil_scoped_acquire held;
      t.attr("broadcast")(
          torch::from_blob(data.data(), {static_cast<std::int64_t>(data.size())}, options.dtype(torch::kInt32)), root);
    });
  };
  out.reduce_broadcast = [t, options, in_order](std::span<float> values, int root) {
    if (values.empty()) return;
    in_order([&] {
      py::gil_scoped_acquire held;
      t.attr("reduce_broadcast")(
          torch::from_blob(values.data(), {static_cast<std::int64_t>(values.size())}, options.dtype(torch::kFloat)),
          root);
    });
  };
  return out;
}

/// detail::agree's view of a transport (host memory only).
struct agreement_comm {
  gradcomp_py::transport& t;
  [[nodiscard]] int rank() const noexcept { return t.rank; }
  [[nodiscard]] int size() const noexcept { return t.size; }
  void all_gather(std::span<const std::byte> mine, std::span<std::byte> all) { t.all_gather(mine, all); }
};

// -- the compressor ----------------------------------------------------------------------------

class compressor_handle {
 public:
  compressor_handle(std::int64_t numel, const std::string& method, const py::dict& kwargs, const torch::Device& device)
      : device_(device) {
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
  /// Python threads may share a compressor, and none waits for the GPU holding the GIL.
  /// Work that calls back into Python (a transport's collectives) takes the GIL there.
  template <class Work>
  decltype(auto) exclusive(Work&& work) {
    py::gil_scoped_release unlocked;  // before the lock: a thread holding the lock may need the GIL
    const std::lock_guard<std::mutex> lock(busy_);
    return work();
  }

  // Every call that reads or changes the compressor runs in exclusive() (the size, the
  // device and the policies never change).
  std::int64_t numel() const { return static_cast<std::int64_t>(c_->size()); }
  std::int64_t max_message_bytes() { return exclusive([&] { return message_capacity(); }); }
  std::uint64_t step() { return exclusive([&] { return c_->step(); }); }
  std::string signature() const { return c_->signature(); }
  torch::Device device() const { return device_; }

  torch::Tensor compress(const torch::Tensor& grad, bool staged) {
    return exclusive([&] {
      const auto type = check_gradient(staged ? "stage" : "compress", "grad", grad, device_, numel());
      torch::Tensor out = message_buffer();
      const written w = run(grad, type, out, staged);
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
      torch::Tensor out = torch::empty({numel()}, torch::TensorOptions().dtype(torch::kFloat).device(device_));
      on_current_stream([&](void* stream) { c_->preview(stream, grad.data_ptr(), type, out.data_ptr<float>()); });
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
    const torch::Tensor i = indices.to(torch::kCPU, torch::kLong).contiguous().view(-1);
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

  /// stage() on every rank, agreed over `transport` before any rank may accept: the
  /// ranks' grad checks and steps, and `settings` (plus the policies) must agree, else
  /// every rank raises the same error and none has anything staged. Returns this rank's
  /// message and every rank's message size.
  py::tuple stage_agreed(const py::object& transport, const torch::Tensor& grad, const std::string& who,
                         const std::vector<std::pair<std::string, std::int64_t>>& settings) {
    gradcomp_py::transport t = transport_of(transport, device_, c_->stream());
    agreement_comm comm{t};
    std::vector<gc::detail::setting> shared;
    for (const auto& [name, value] : settings) shared.push_back({name.c_str(), static_cast<std::uint64_t>(value)});
    const std::string policies = signature();
    shared.push_back({"the policies", gc::detail::fingerprint().add(policies).value()});
    torch::Tensor out;
    std::size_t bytes = 0;
    const std::vector<std::uint64_t> sizes = exclusive([&] {
      return gc::detail::agree(comm, who.c_str(), shared, [&]() -> std::uint64_t {
        const auto type = check_gradient(who.c_str(), "the bucket", grad, device_, numel());
        out = message_buffer();
        bytes = run(grad, type, out, true).bytes;
        return bytes;
      });
    });
    py::list all;
    for (const auto s : sizes) all.append(py::int_(s));
    return py::make_tuple(compact(out, bytes), all);
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
  cyclic_handle(compressor_handle& c, const py::object& transport, double leader_density)
      : c_(c), x_(c.impl().cyclic(transport_of(transport, c.device(), c.impl().stream()), leader_density)) {}

  torch::Tensor step(const torch::Tensor& grad, torch::Tensor& dense, double scale) {
    // Shapes are the compressor's to check, inside the exchange (every rank alike).
    check_tensor("cyclic step", "grad", grad, torch::kFloat, c_.device());
    check_tensor("cyclic step", "dense", dense, torch::kFloat, c_.device());
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
  compressor_handle& c_;
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

py::tuple decode(const torch::Tensor& message) {
  check_tensor("decode", "message", message, torch::kUInt8, message.device());
  const torch::Tensor host = message.to(torch::kCPU);
  gc::sparse_vector s;
  {
    py::gil_scoped_release unlocked;
    s = gc::decode(bytes_of(host));
  }
  torch::Tensor indices = torch::empty({static_cast<std::int64_t>(s.indices.size())}, torch::kLong);
  auto* ip = indices.data_ptr<std::int64_t>();
  for (std::size_t j = 0; j < s.indices.size(); ++j) ip[j] = s.indices[j];
  torch::Tensor values = torch::tensor(at::ArrayRef<float>(s.values), torch::kFloat);
  return py::make_tuple(indices.to(message.device()), values.to(message.device()), py::int_(s.n));
}

void accumulate(const torch::Tensor& message, torch::Tensor& dense, double scale) {
  check_tensor("accumulate", "message", message, torch::kUInt8, message.device());
  check_tensor("accumulate", "dense", dense, torch::kFloat, message.device());
  if (message.is_cpu()) {
    py::gil_scoped_release unlocked;
    gc::accumulate(gc::backend::host{}, bytes_of(message),
                   std::span<float>(dense.data_ptr<float>(), static_cast<std::size_t>(dense.numel())),
                   static_cast<float>(scale));
    return;
  }
#if defined(GRADCOMP_PY_CUDA)
  const int device = message.device().index();
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  py::gil_scoped_release unlocked;  // before the locks: a thread holding one never waits for the GIL
  device_accumulate& on = accumulate_on(device);
  const std::lock_guard<std::mutex> lock(on.busy);
  on.order.run_on_current([&](void* stream) {
    on.add->add(stream, bytes_of(message), dense.data_ptr<float>(), static_cast<std::size_t>(dense.numel()),
                static_cast<float>(scale));
  });
#else
  invalid("accumulate: this build of gradcomp has no CUDA support");
#endif
}

// -- errors ------------------------------------------------------------------------------------

const char* error_class(gc::errc code) {
  switch (code) {
    case gc::errc::invalid_argument: return "InvalidArgumentError";
    case gc::errc::buffer_too_small: return "BufferTooSmallError";
    case gc::errc::non_finite: return "NonFiniteError";
    case gc::errc::corrupt_message: return "CorruptMessageError";
    case gc::errc::io: return "StateIOError";
    case gc::errc::device: return "DeviceError";
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
      .def("stage_agreed", &compressor_handle::stage_agreed);

  py::class_<cyclic_handle>(m, "CyclicExchange")
      .def(py::init<compressor_handle&, const py::object&, double>(), py::keep_alive<1, 2>())
      .def("step", &cyclic_handle::step);

  m.def("decode", &decode, py::arg("message"));
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
