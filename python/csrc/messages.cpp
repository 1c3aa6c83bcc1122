// gradcomp.torch's decode and accumulate on torch tensors (messages.hpp).
#include "messages.hpp"

#include <gradcomp/accumulate.hpp>
#include <gradcomp/backend/host.hpp>
#include <gradcomp/detail/codec/decode.hpp>
#include <gradcomp/message.hpp>

#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <mutex>

#include "api.hpp"
#include "tensors.hpp"
#include "torch_cuda.hpp"

namespace gradcomp_py {

namespace py = pybind11;
namespace gc = gradcomp;

namespace {
#if defined(GRADCOMP_PY_CUDA)
/// accumulate()'s workspace on one device, kept from call to call (no allocation per
/// call), its calls ordered across streams as a compressor's are, one at a time.
struct device_accumulate {
  explicit device_accumulate(int device) : add(gradcomp_py::make_cuda_accumulator(device)), order(device) {}
  std::unique_ptr<gradcomp_py::cuda_accumulator> add;
  gc::backend::stream_order order;
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

}  // namespace

pybind11::tuple decode(const torch::Tensor& message_in) {
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

namespace {

/// `dense` (float32, in host memory) as a span.
std::span<float> floats_of(torch::Tensor& dense) {
  return {dense.data_ptr<float>(), static_cast<std::size_t>(dense.numel())};
}

/// Runs `work(accumulator, stream)` with the accumulator of `message`'s CUDA device, on
/// torch's current stream, one call at a time.
template <class Work>
void with_device_accumulator(const torch::Tensor& message, Work&& work) {
#if defined(GRADCOMP_PY_CUDA)
  const int device = message.device().index();
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  device_accumulate& on = accumulate_on(device);
  const std::lock_guard<std::mutex> lock(on.busy);
  on_current_stream(on.order, [&](void* stream) { work(*on.add, stream); });
#else
  (void)message, (void)work;
  invalid("accumulate: this build of gradcomp has no CUDA support");
#endif
}

}  // namespace

/// dense += scale * the entries of `message` (checked tensors on one device), with the
/// GIL released by the caller.
void add_message(const torch::Tensor& message, torch::Tensor& dense, float scale) {
  if (message.is_cpu()) {
    gc::accumulate(gc::backend::host{}, bytes_of(message), floats_of(dense), scale);
    return;
  }
  with_device_accumulator(message, [&](auto& add, void* stream) {
    add.add(stream, bytes_of(message), dense.data_ptr<float>(), static_cast<std::size_t>(dense.numel()), scale);
  });
}

void queue_framed_add(const gc::encode::index_value& format, const torch::Tensor& frame, torch::Tensor& dense,
                      float scale, std::uint32_t* fault) {
  if (frame.is_cpu()) {
    // The decoder's workspace, per thread (each process group's hook jobs run on one).
    thread_local gc::detail::message_decoder<gc::backend::host> decoder{gc::backend::host{}};
    decoder.queue_framed_add(gc::backend::host{}, format, bytes_of(frame), floats_of(dense), scale, fault);
    return;
  }
  with_device_accumulator(frame, [&](auto& add, void* stream) {
    add.queue_framed_add(stream, format, bytes_of(frame), dense.data_ptr<float>(),
                         static_cast<std::size_t>(dense.numel()), scale, fault);
  });
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

}  // namespace gradcomp_py
