// gradcomp_py::transport over c10d::ProcessGroup (see process_group.hpp).
#include "process_group.hpp"

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <gradcomp/comm/agreement.hpp>

#if defined(GRADCOMP_PY_CUDA)
#include <ATen/cuda/CUDAContext.h>
#endif

#include <algorithm>
#include <cstring>
#include <string_view>

#include "tensors.hpp"

namespace py = pybind11;
namespace gc = gradcomp;

namespace gradcomp_py {
group_ptr group_of(const py::object& group) {
  c10::intrusive_ptr<c10d::ProcessGroup> held;
  try {
    held = group.cast<c10::intrusive_ptr<c10d::ProcessGroup>>();
  } catch (const py::cast_error&) {
    invalid("the process group must be a torch.distributed ProcessGroup, got ",
            py::str(group.get_type()).cast<std::string>());
  }
  c10d::ProcessGroup* raw = held.get();
  return group_ptr(raw, [held = std::move(held)](c10d::ProcessGroup*) mutable {
    std::optional<py::gil_scoped_release> unlocked;
    if (PyGILState_Check() != 0) unlocked.emplace();
    held.reset();
  });
}

namespace {

/// Where `group`'s collectives take their tensors: for NCCL, the compressor's `device`
/// where it is a CUDA device (not the current one, which need not be this rank's where
/// an exchange is made), else the current CUDA device; the host for every other backend
/// (gloo moves CUDA buckets through host memory).
torch::Device collective_device(const group_ptr& group, const torch::Device& device) {
#if defined(GRADCOMP_PY_CUDA)
  if (group->getBackendName() == "nccl") {
    return device.is_cuda() ? device : torch::Device(torch::kCUDA, at::cuda::current_device());
  }
#else
  (void)device;
#endif
  return torch::kCPU;
}

#if defined(GRADCOMP_PY_CUDA)
/// Makes `later` wait for the work queued on `earlier` so far, without the host waiting.
void stream_waits(cudaStream_t later, cudaStream_t earlier) {
  if (later == earlier) return;
  cudaEvent_t done = nullptr;
  cudaError_t status = cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
  if (status == cudaSuccess) status = cudaEventRecord(done, earlier);
  if (status == cudaSuccess) status = cudaStreamWaitEvent(later, done, 0);
  if (done != nullptr) (void)cudaEventDestroy(done);  // released once it has completed
  if (status != cudaSuccess) {
    gc::detail::fail(gc::errc::device,
                     "ordering a collective after the compressor's work: ", cudaGetErrorString(status));
  }
}
#endif

/// Runs `call`, which hands arrays of a compressor's memory to a collective and copies
/// them back on torch's current stream, between the compressor's `stream` and the
/// caller's next use: the current stream waits for what `stream` queued before, and
/// `stream` for what the current stream queued in `call` (events: the host does not
/// wait, unless the collective's copies through host memory do).
template <class Call>
void in_order(const torch::Device& device, void* stream, Call&& call) {
#if defined(GRADCOMP_PY_CUDA)
  if (device.is_cuda()) {
    const auto own = static_cast<cudaStream_t>(stream);
    const cudaStream_t current = at::cuda::getCurrentCUDAStream().stream();
    stream_waits(current, own);
    try {
      call();
    } catch (...) {
      try {  // what the collective queued before it failed still comes first
        stream_waits(own, current);
      } catch (...) {
      }
      throw;
    }
    stream_waits(own, current);
    return;
  }
#endif
  (void)device;
  (void)stream;
  call();
}

/// `tensor` (a view of a compressor's memory) replaced, for the length of `call(t)`, by
/// `t` on the collective's device: itself where the devices match, else a copy that is
/// copied back after.
template <class Call>
void on_collective_device(const torch::Tensor& tensor, const torch::Device& device, Call&& call) {
  if (tensor.device() == device) {
    call(tensor);
    return;
  }
  torch::Tensor moved = tensor.to(device);
  call(moved);
  tensor.copy_(moved);
}

}  // namespace

transport transport_of(const group_ptr& pg, const torch::Device& device, void* stream) {
  const torch::Device where = collective_device(pg, device);
  transport out;
  out.this_rank = pg->getRank();
  out.ranks = pg->getSize();
  const std::shared_ptr<std::uint64_t> sent = out.sent;
  const std::shared_ptr<std::uint64_t> issued = out.issued;
  const std::shared_ptr<std::uint64_t> received = out.received;
  const auto others = static_cast<std::uint64_t>(out.ranks - 1);
  // Host arrays as tensors on the collective's device, and back.
  const auto to_where = [where](const void* data, std::int64_t count, torch::ScalarType type) {
    return torch::from_blob(const_cast<void*>(data), {count}, type).to(where).contiguous();
  };
  const auto back = [](const torch::Tensor& t, void* to) {
    const torch::Tensor host = t.to(torch::kCPU).contiguous();
    if (host.nbytes() != 0) std::memcpy(to, host.data_ptr(), host.nbytes());
  };
  // Every rank's part (sizes[r] bytes from rank r) into `all`, as an all-to-all-v in
  // which each rank sends its part to every other at its own size: gloo's all-gather takes
  // parts of one size only (padding them to the largest cost each rank W times the
  // largest), and its ring sends W - 1 messages per rank for each part where the
  // all-to-all sends one, about half the bytes on the wire for small parts
  // (docs/results.md, "Bytes on the wire").
  const auto gather_parts = [pg, to_where, back, sent, received, issued, rank = out.this_rank](
                                std::span<const std::byte> mine, std::span<const std::uint64_t> sizes,
                                std::span<std::byte> all) {
    const std::size_t ranks = sizes.size();
    const std::uint64_t total = gc::detail::total_size(sizes);
    if (total == 0) return;  // nothing to move, as every rank knows
    *sent += mine.size();
    *received += total - sizes[static_cast<std::size_t>(rank)];
    ++*issued;
    std::vector<std::uint8_t> copies(ranks * mine.size());
    for (std::size_t r = 0; r < ranks; ++r) std::memcpy(copies.data() + r * mine.size(), mine.data(), mine.size());
    at::Tensor in = to_where(copies.data(), static_cast<std::int64_t>(copies.size()), torch::kUInt8);
    at::Tensor got = torch::empty({static_cast<std::int64_t>(all.size())}, in.options());
    std::vector<std::int64_t> in_splits(ranks, static_cast<std::int64_t>(mine.size()));
    std::vector<std::int64_t> out_splits(sizes.begin(), sizes.end());
    pg->alltoall_base(got, in, out_splits, in_splits)->wait();
    back(got, all.data());
  };
  out.all_gather_v = gather_parts;
  out.all_gather = [gather_parts, ranks = out.ranks](std::span<const std::byte> mine, std::span<std::byte> all) {
    const std::vector<std::uint64_t> sizes(static_cast<std::size_t>(ranks), mine.size());
    gather_parts(mine, sizes, all);
  };
  out.all_to_all_v = [pg, to_where, back, sent, received, issued, rank = out.this_rank](
                         std::span<const std::byte> send, std::span<const std::uint64_t> send_sizes,
                         std::span<std::byte> recv, std::span<const std::uint64_t> recv_sizes) {
    *sent += send.size();
    *received += recv.size() - recv_sizes[static_cast<std::size_t>(rank)];
    ++*issued;
    at::Tensor in = to_where(send.data(), static_cast<std::int64_t>(send.size()), torch::kUInt8);
    at::Tensor got = torch::empty({static_cast<std::int64_t>(recv.size())}, in.options());
    std::vector<std::int64_t> in_splits(send_sizes.begin(), send_sizes.end());
    std::vector<std::int64_t> out_splits(recv_sizes.begin(), recv_sizes.end());
    pg->alltoall_base(got, in, out_splits, in_splits)->wait();
    back(got, recv.data());
  };
  // gloo sums no unsigned type: int32 where every sum fits it, int64 otherwise.
  out.all_reduce_sum = [pg, to_where, sent, received, issued](std::span<std::uint32_t> values, std::uint64_t max_sum) {
    const auto type = max_sum <= static_cast<std::uint64_t>(INT32_MAX) ? torch::kInt32 : torch::kInt64;
    *sent += c10::elementSize(type) * values.size();
    *received += c10::elementSize(type) * values.size();
    ++*issued;
    std::vector<std::int64_t> wide(values.begin(), values.end());
    std::vector<at::Tensor> tensors{to_where(wide.data(), static_cast<std::int64_t>(wide.size()), torch::kInt64)};
    tensors[0] = tensors[0].to(type);
    pg->allreduce(tensors)->wait();
    const torch::Tensor sum = tensors[0].to(torch::kCPU, torch::kInt64).contiguous();
    const auto* p = sum.data_ptr<std::int64_t>();
    for (std::size_t j = 0; j < values.size(); ++j) values[j] = static_cast<std::uint32_t>(p[j]);
  };
  const auto options = torch::TensorOptions().device(device);
  // `collective(tensors)` on a view of the compressor's memory, in the order above.
  const auto run = [where, device, stream](const torch::Tensor& view, auto&& collective) {
    in_order(device, stream, [&] {
      on_collective_device(view, where, [&](const torch::Tensor& t) {
        std::vector<at::Tensor> tensors{t};
        collective(tensors);
      });
    });
  };
  // The parts of the compressor's memory at `send` to their ranks, the other ranks' into
  // `recv`: tensors of that memory handed to the group as they are where it works there
  // (NCCL: the entries stay on the device), else through its device.
  out.all_to_all_v_in_memory = [pg, options, sent, received, issued, where, device, stream, rank = out.this_rank](
                                   std::span<const std::byte> send, std::span<const std::uint64_t> send_sizes,
                                   std::span<std::byte> recv, std::span<const std::uint64_t> recv_sizes) {
    *sent += send.size();
    *received += recv.size() - recv_sizes[static_cast<std::size_t>(rank)];
    ++*issued;
    const auto bytes = options.dtype(torch::kUInt8);
    // An empty part may have no memory behind it (a null pointer, which from_blob
    // cannot place on a device): an empty tensor of its own then, on every rank alike.
    const auto of = [&](std::byte* p, std::size_t size) {
      return size == 0 ? torch::empty({0}, bytes) : torch::from_blob(p, {static_cast<std::int64_t>(size)}, bytes);
    };
    const torch::Tensor in = of(const_cast<std::byte*>(send.data()), send.size());
    const torch::Tensor got = of(recv.data(), recv.size());
    std::vector<std::int64_t> in_splits(send_sizes.begin(), send_sizes.end());
    std::vector<std::int64_t> out_splits(recv_sizes.begin(), recv_sizes.end());
    in_order(device, stream, [&] {
      on_collective_device(got, where, [&](torch::Tensor to) {
        torch::Tensor from = in.to(where);
        pg->alltoall_base(to, from, out_splits, in_splits)->wait();
      });
    });
  };
  // Every rank's part of the compressor's memory into `all`, as the all-gather above
  // (an all-to-all of equal parts), on tensors of that memory.
  out.all_gather_in_memory = [pg, options, sent, received, issued, where, device, stream, others](
                                 std::span<const std::byte> mine, std::span<std::byte> all) {
    if (mine.empty()) return;
    *sent += mine.size();
    *received += others * mine.size();
    ++*issued;
    const auto bytes = options.dtype(torch::kUInt8);
    const torch::Tensor in =
        torch::from_blob(const_cast<std::byte*>(mine.data()), {static_cast<std::int64_t>(mine.size())}, bytes);
    const torch::Tensor got = torch::from_blob(all.data(), {static_cast<std::int64_t>(all.size())}, bytes);
    in_order(device, stream, [&] {
      on_collective_device(got, where, [&](torch::Tensor to) {
        torch::Tensor copies = in.to(where).repeat({static_cast<std::int64_t>(others + 1)});
        std::vector<std::int64_t> even;
        pg->alltoall_base(to, copies, even, even)->wait();
      });
    });
  };
  // The sums of the compressor's memory as all_reduce_sum sums host arrays: int32 where
  // every sum fits it, else through int64 (the unsigned counts widened, the sums
  // narrowed back modulo 2^32, which they fit).
  out.all_reduce_sum_in_memory = [pg, options, sent, received, issued, run](std::span<std::uint32_t> values,
                                                                            std::uint64_t max_sum) {
    if (values.empty()) return;
    const bool narrow = max_sum <= static_cast<std::uint64_t>(INT32_MAX);
    const std::size_t bytes = (narrow ? 4 : 8) * values.size();
    *sent += bytes;
    *received += bytes;
    ++*issued;
    run(torch::from_blob(values.data(), {static_cast<std::int64_t>(values.size())}, options.dtype(torch::kInt32)),
        [&](std::vector<at::Tensor>& tensors) {
          if (narrow) {
            pg->allreduce(tensors)->wait();
            return;
          }
          std::vector<at::Tensor> wide{tensors[0].to(torch::kInt64).bitwise_and(static_cast<std::int64_t>(0xFFFFFFFF))};
          pg->allreduce(wide)->wait();
          tensors[0].copy_(wide[0]);
        });
  };
  const auto broadcast = [pg, issued](std::vector<at::Tensor>& tensors, int root) {
    ++*issued;
    c10d::BroadcastOptions o;
    o.rootRank = root;
    pg->broadcast(tensors, o)->wait();
  };
  out.broadcast = [options, sent, received, run, broadcast, rank = out.this_rank](std::span<std::uint32_t> data,
                                                                                  int root) {
    if (data.empty()) return;
    *sent += data.size_bytes();
    if (rank != root) *received += data.size_bytes();
    run(torch::from_blob(data.data(), {static_cast<std::int64_t>(data.size())}, options.dtype(torch::kInt32)),
        [&](std::vector<at::Tensor>& tensors) { broadcast(tensors, root); });
  };
  out.reduce_broadcast = [pg, options, sent, received, issued, run, broadcast](std::span<float> values, int root) {
    if (values.empty()) return;
    *sent += 2 * values.size_bytes();  // the reduce's input, then the broadcast's
    *received += values.size_bytes();  // the sum, at the root or from it
    run(torch::from_blob(values.data(), {static_cast<std::int64_t>(values.size())}, options.dtype(torch::kFloat)),
        [&](std::vector<at::Tensor>& tensors) {
          // Summed at the root, then broadcast: every rank holds the same bits.
          c10d::ReduceOptions o;
          o.reduceOp = c10d::ReduceOp::SUM;
          o.rootRank = root;
          ++*issued;
          pg->reduce(tensors, o)->wait();
          broadcast(tensors, root);
        });
  };
  return out;
}

void rethrow(const reported_error& error) {
  if (!error) return;
  gc::errc code = gc::errc::invalid_argument;
  for (const auto each : {gc::errc::invalid_argument, gc::errc::buffer_too_small, gc::errc::non_finite,
                          gc::errc::corrupt_message, gc::errc::io, gc::errc::device}) {
    if (error->first == gc::to_string(each)) code = each;
  }
  std::string_view text = error->second;
  constexpr std::string_view prefix = "gradcomp: ";
  if (text.starts_with(prefix)) text.remove_prefix(prefix.size());
  gc::detail::fail(code, text);
}

}  // namespace gradcomp_py
