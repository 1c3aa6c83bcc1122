// gradcomp._C.HookSteps (see ddp_steps.hpp).
#include "ddp_steps.hpp"

#include <ATen/Parallel.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/jit/python/pybind_utils.h>

#include <gradcomp/comm/agreement.hpp>
#include <gradcomp/comm/frames.hpp>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <optional>
#include <string_view>
#include <utility>

#include "messages.hpp"

namespace py = pybind11;
namespace gc = gradcomp;

namespace gradcomp_py {
namespace {

constexpr const char* who = "ddp hook";

std::vector<gc::detail::setting> settings_of(const std::vector<named_value>& settings) {
  std::vector<gc::detail::setting> out;
  for (const auto& [name, value] : settings) out.emplace_back(name, value);
  return out;
}

/// The ranks agree on `settings` (and on `error`, this rank's, if any) in one all-gather.
void agree_on(transport& t, const std::vector<gc::detail::setting>& settings, const reported_error& error) {
  (void)gc::detail::agree(t, who, settings, [&]() -> std::uint64_t {
    rethrow(error);
    return 0;
  });
}

using clock = std::chrono::steady_clock;

double seconds_since(clock::time_point start) { return std::chrono::duration<double>(clock::now() - start).count(); }

/// Whether `failure` is a gradcomp::error of code non_finite.
bool is_non_finite(const std::exception_ptr& failure) {
  try {
    std::rethrow_exception(failure);
  } catch (const gc::error& e) {
    return e.code() == gc::errc::non_finite;
  } catch (...) {
    return false;
  }
}

/// Logs `text` at WARNING under Python's "gradcomp" logger (the caller holds the GIL).
void warn(const std::string& text) {
  try {
    py::module_::import("logging").attr("getLogger")("gradcomp").attr("warning")(text);
  } catch (const py::error_already_set&) {  // the interpreter is going: nothing to log to
  }
}

/// `mean` (float32) in the dtype of `bucket`.
torch::Tensor in_dtype_of(const torch::Tensor& bucket, const torch::Tensor& mean) {
  return bucket.scalar_type() == torch::kFloat ? mean : mean.to(bucket.scalar_type());
}

}  // namespace

hook_counts& hook_counts::operator+=(const hook_counts& o) {
  fields([](const char*, auto& mine, const auto& theirs) { mine += theirs; }, *this, o);
  return *this;
}

py::dict hook_counts::to_dict() const {
  py::dict d;
  fields([&](const char* name, const auto& value) { d[name] = value; }, *this);
  return d;
}

hook_steps::hook_steps(const py::object& group, const py::object& ddp_group, bool skip_non_finite)
    : group_(group_of(group)),
      ddp_group_(group_of(ddp_group)),
      worker_(ordered_worker::of(group_.get())),
      skip_non_finite_(skip_non_finite) {}

hook_counts hook_steps::totals() const {
  const std::lock_guard<std::mutex> lock(shared_->lock);
  return shared_->totals;
}

hook_counts hook_steps::last_step() const {
  const std::lock_guard<std::mutex> lock(shared_->lock);
  return shared_->last;
}

py::object hook_steps::submit(const torch::Tensor& bucket_in, bool last, bool compressed, work job) {
  // A tensor of our own over the bucket's memory: a tensor that has had a Python object
  // needs the GIL where its last reference goes, and the job drops this one off the
  // Python thread.
  torch::Tensor bucket = bucket_in.alias();
  const torch::Device device = bucket.device();
  std::optional<c10::Stream> stream;  // where backward wrote the bucket: the job works on it
  std::vector<c10::Device> devices;
  if (!device.is_cpu()) {
    stream = c10::impl::VirtualGuardImpl(device.type()).getStream(device);
    devices.push_back(device);
  }
  auto future = c10::make_intrusive<c10::ivalue::Future>(c10::PyObjectType::get(), devices);
  const int threads = at::get_num_threads();  // the caller's, not the worker's default
  const bool skip_non_finite = skip_non_finite_;
  worker_->submit([group = group_, state = shared_, future, bucket, stream, threads, last, compressed, skip_non_finite,
                   job = std::move(job)]() mutable {
#if defined(_OPENMP)
    omp_set_num_threads(threads);
#else
    (void)threads;
#endif
    torch::Tensor result;
    std::exception_ptr failure;
    hook_counts counts;
    counts.buckets = 1;
    counts.compressed = compressed ? 1 : 0;
    counts.elements = static_cast<std::uint64_t>(bucket.numel());
    const auto ranks = static_cast<std::uint64_t>(group->getSize());
    counts.dense_bytes = 2 * (ranks - 1) * static_cast<std::uint64_t>(bucket.numel() * bucket.element_size()) / ranks;
    {
      std::optional<c10::StreamGuard> on_stream;
      if (stream) on_stream.emplace(*stream);
      transport t = transport_of(group, torch::kCPU, nullptr);
      const auto start = clock::now();
      try {
        result = job(t, bucket, counts);
      } catch (...) {
        failure = std::current_exception();
      }
      counts.exchange_seconds = std::max(0.0, seconds_since(start) - counts.compress_seconds);
      counts.bytes_sent = *t.sent;
      counts.bytes_received = *t.received;
      counts.collectives = *t.issued;
    }
    // A value that is not finite, with skip_non_finite: every rank heard of it in the
    // exchange and returns NaN for this bucket (GradScaler skips the step); the step's
    // memory stays as it was, as for any failure.
    const bool skipped = failure && skip_non_finite && is_non_finite(failure);
    std::string skipped_text;
    if (skipped) {
      try {
        std::rethrow_exception(failure);
      } catch (const std::exception& e) {
        skipped_text = e.what();
      }
      result = torch::full_like(bucket, std::numeric_limits<double>::quiet_NaN());
      failure = nullptr;
    }
    if (failure || skipped) counts.refused = 1;
    state->step_failed = state->step_failed || failure != nullptr || skipped;
    if (last) {  // the step's end: its staged buckets are accepted together, or none is
      try {
        if (!state->step_failed) {
          for (const auto& accept : state->staged) accept();
        }
      } catch (...) {
        if (!failure) failure = std::current_exception();
      }
      state->staged.clear();
      state->step_failed = false;
    }
    {
      const std::lock_guard<std::mutex> lock(state->lock);
      state->step += counts;
      if (last) {
        state->step.steps = 1;
        state->last = state->step;
        state->totals += state->step;
        state->step = hook_counts{};
      }
    }
    // Everything the job holds goes before the Future completes: once it has, the
    // training script may run to its end, and a reference dropped here after the
    // interpreter has finalized would need the GIL, which this thread cannot take then.
    job = nullptr;
    bucket = torch::Tensor();
    group.reset();
    state.reset();
    if (failure) {
      {
        const py::gil_scoped_acquire python;
        try {
          std::rethrow_exception(failure);
        } catch (const std::exception& e) {
          warn(std::string("ddp hook: a step was refused, no bucket's memory changed: ") + e.what());
        } catch (...) {
        }
      }
      future->setError(failure);
      future.reset();
      return;
    }
    // DDP (torch 1.13) takes the hook's result as a Python object. It is made, the Future
    // completed and this thread's reference to it dropped under the GIL, so that whichever
    // reference goes last, no Python object is released without the GIL.
    const py::gil_scoped_acquire python;
    if (skipped) warn("ddp hook: a value that is not finite, returned as NaN (skip_non_finite): " + skipped_text);
    c10::IValue value = torch::jit::toIValue(py::cast(result), c10::PyObjectType::get());
    result = torch::Tensor();
    future->markCompleted(std::move(value));
    future.reset();
  });
  return py::cast(std::make_shared<torch::jit::PythonFutureWrapper>(future));
}

py::object hook_steps::dense(const torch::Tensor& bucket, const std::vector<named_value>& settings,
                             const reported_error& error, bool last) {
  return submit(bucket, last, false,
                [pg = group_, settings = settings_of(settings), error](transport& t, const torch::Tensor& b,
                                                                       hook_counts& counts) {
                  agree_on(t, settings, error);
                  counts.entries = static_cast<std::uint64_t>(b.numel());  // a dense step sends every element
                  // gloo sums no bfloat16 (torch 1.13): through float32, rounded once on the way back.
                  const bool widen = b.scalar_type() == torch::kBFloat16 && pg->getBackendName() != "nccl";
                  torch::Tensor sum = widen ? b.to(torch::kFloat) : b;
                  sum.div_(pg->getSize());
                  std::vector<at::Tensor> tensors{sum};
                  pg->allreduce(tensors)->wait();
                  if (widen) b.copy_(sum);
                  *t.sent += static_cast<std::uint64_t>(sum.numel() * sum.element_size());
                  *t.received += static_cast<std::uint64_t>(sum.numel() * sum.element_size());
                  ++*t.issued;
                  return b;
                });
}

namespace {

/// The traffic an exchange (CyclicExchange, SparseAllreduce) counts itself, added to the
/// hook's counts however its step ends.
template <class Exchange>
class exchange_traffic {
 public:
  exchange_traffic(transport& t, Exchange& x)
      : t_(t), x_(x), sent_(x.bytes_sent()), received_(x.bytes_received()), issued_(x.collectives()) {}
  ~exchange_traffic() {
    *t_.sent += x_.bytes_sent() - sent_;
    *t_.received += x_.bytes_received() - received_;
    *t_.issued += x_.collectives() - issued_;
  }
  exchange_traffic(const exchange_traffic&) = delete;
  exchange_traffic& operator=(const exchange_traffic&) = delete;

 private:
  transport& t_;
  Exchange& x_;
  std::uint64_t sent_, received_, issued_;
};

/// `exchange` as the handle its aggregation takes, or null for None (a rank that met an
/// error before making it).
template <class Handle>
std::shared_ptr<Handle> exchange_of(const py::object& exchange) {
  return exchange.is_none() ? nullptr : exchange.cast<std::shared_ptr<Handle>>();
}

/// The bucket as a compressor reads it: float32, float16 and bfloat16 as they are (a
/// compressor widens them exactly itself); any other dtype through a float32 copy.
torch::Tensor compressible(const torch::Tensor& b) {
  const bool native =
      b.scalar_type() == torch::kFloat || b.scalar_type() == torch::kHalf || b.scalar_type() == torch::kBFloat16;
  return native ? b : b.to(torch::kFloat);
}

}  // namespace

py::object hook_steps::compressed(std::int64_t index, std::shared_ptr<compressor_handle> c,
                                  const std::string& aggregation, const py::object& exchange,
                                  const torch::Tensor& bucket, const std::vector<named_value>& settings,
                                  const reported_error& error, bool last) {
  std::vector<gc::detail::setting> shared = settings_of(settings);
  if (aggregation == "sparse_allreduce") {
    return submit(bucket, last, true,
                  [state = shared_, shared, sparse = exchange_of<sparse_handle>(exchange), error](
                      transport& t, const torch::Tensor& b, hook_counts& counts) {
                    agree_on(t, shared, error);  // a rank without its exchange has an error here
                    if (!sparse) invalid(who, ": no sparse_allreduce for this bucket");
                    const torch::Tensor flat = compressible(b);
                    torch::Tensor mean = torch::zeros({flat.numel()}, flat.options().dtype(torch::kFloat));
                    const exchange_traffic<sparse_handle> traffic(t, *sparse);
                    sparse->stage(flat, mean, 1.0 / t.size());
                    counts.entries = sparse->entries();
                    state->staged.push_back([sparse] { sparse->accept(); });
                    return in_dtype_of(b, mean);
                  });
  }
  if (aggregation == "cyclic") {
    return submit(bucket, last, true,
                  [shared, cyclic = exchange_of<cyclic_handle>(exchange), error](transport& t, const torch::Tensor& b,
                                                                                 hook_counts& counts) {
                    agree_on(t, shared, error);  // a rank without its exchange has an error here
                    if (!cyclic) invalid(who, ": no cyclic exchange for this bucket");
                    const torch::Tensor flat = b.to(torch::kFloat);
                    torch::Tensor mean = torch::zeros({flat.numel()}, flat.options());
                    const exchange_traffic<cyclic_handle> traffic(t, *cyclic);
                    cyclic->step(flat, mean, 1.0 / t.size());
                    counts.entries = cyclic->entries();
                    return in_dtype_of(b, mean);
                  });
  }
  if (aggregation != "allgather")
    invalid(who, ": aggregation must be allgather, cyclic or sparse_allreduce, got ", aggregation);
  if (c) shared.emplace_back("the policies", c->signature());
  return submit(bucket, last, true,
                [state = shared_, index, shared, c, error](transport& t, const torch::Tensor& b, hook_counts& counts) {
                  const torch::Tensor flat = compressible(b);
                  torch::Tensor mean = torch::zeros({flat.numel()}, flat.options().dtype(torch::kFloat));
                  const std::uint64_t capacity = c ? c->capacity() : 0;
                  const auto scale = static_cast<float>(1.0 / t.size());
                  std::size_t& bound = state->bounds[index];
                  const std::uint64_t longest = gc::comm::gather_frames(
                      t, who, shared, bound, capacity,
                      [&] {
                        rethrow(error);
                        if (!c) invalid(who, ": no compressor for bucket ", index);
                        const auto start = clock::now();
                        std::size_t entries = 0;
                        auto message = c->stage_to_host(flat, who, entries);
                        counts.compress_seconds = seconds_since(start);
                        counts.entries = entries;
                        return message;
                      },
                      [&](std::span<const std::byte> message, std::size_t rank) {
                        const torch::Tensor bytes =
                            torch::from_blob(const_cast<std::byte*>(message.data()),
                                             {static_cast<std::int64_t>(message.size())}, torch::kUInt8)
                                .to(mean.device());
                        try {
                          add_message(bytes, mean, scale);
                        } catch (const gc::error& e) {
                          gc::detail::fail(e.code(), std::string_view(e.what()).substr(std::strlen("gradcomp: ")),
                                           " (the message of rank ", rank, " of ", t.size(), ")");
                        }
                      });
                  bound = gc::comm::next_frame_bound(longest, capacity);
                  state->staged.push_back([c] { c->accept_staged(); });
                  return in_dtype_of(b, mean);
                });
}

}  // namespace gradcomp_py
