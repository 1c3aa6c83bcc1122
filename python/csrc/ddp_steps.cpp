// gradcomp._C.HookSteps (see ddp_steps.hpp).
#include "ddp_steps.hpp"

#include <ATen/Parallel.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/jit/python/pybind_utils.h>

#include <gradcomp/comm/agreement.hpp>
#include <gradcomp/comm/frames.hpp>
#include <gradcomp/detail/codec/decode.hpp>
#include <gradcomp/message.hpp>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include <array>
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

namespace {

/// A value that is not finite, with skip_non_finite: every rank heard of it in the
/// exchange and returns NaN for this bucket (GradScaler skips the step); the step's
/// memory stays as it was, as for any failure. Returns the error's text (empty for none).
std::string skip_if_non_finite(std::exception_ptr& failure, bool skip_non_finite, const torch::Tensor& bucket,
                               torch::Tensor& result) {
  if (!failure || !skip_non_finite || !is_non_finite(failure)) return {};
  std::string text = "(no text)";
  try {
    std::rethrow_exception(failure);
  } catch (const std::exception& e) {
    text = e.what();
  }
  result = torch::full_like(bucket, std::numeric_limits<double>::quiet_NaN());
  failure = nullptr;
  return text;
}

/// The step's end: its staged buckets are accepted together, or none is. An accept that
/// fails becomes `failure` (if there was none).
void end_step(std::vector<std::function<void()>>& staged, bool& step_failed, std::exception_ptr& failure) {
  try {
    if (!step_failed) {
      for (const auto& accept : staged) accept();
    }
  } catch (...) {
    if (!failure) failure = std::current_exception();
  }
  staged.clear();
  step_failed = false;
}

/// Completes `future` with `result` or `failure`, dropping this thread's references.
/// DDP (torch 1.13) takes the hook's result as a Python object: it is made, the Future
/// completed and this thread's reference to it dropped under the GIL, so that whichever
/// reference goes last, no Python object is released without the GIL.
void complete(c10::intrusive_ptr<c10::ivalue::Future>& future, torch::Tensor& result, std::exception_ptr failure,
              const std::string& skipped_text) {
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
    result = torch::Tensor();
    future->setError(failure);
    future.reset();
    return;
  }
  const py::gil_scoped_acquire python;
  if (!skipped_text.empty()) {
    warn("ddp hook: a value that is not finite, returned as NaN (skip_non_finite): " + skipped_text);
  }
  c10::IValue value = torch::jit::toIValue(py::cast(result), c10::PyObjectType::get());
  result = torch::Tensor();
  future->markCompleted(std::move(value));
  future.reset();
}

/// Where a bucket's job works: on a device, the stream backward wrote the bucket on, and
/// the devices of its Future; on the host neither.
struct bucket_place {
  std::optional<c10::Stream> stream;
  std::vector<c10::Device> devices;

  explicit bucket_place(const torch::Device& device) {
    if (device.is_cpu()) return;
    stream = c10::impl::VirtualGuardImpl(device.type()).getStream(device);
    devices.push_back(device);
  }
};

/// A job's OpenMP threads: the hook caller's (`threads`), not the worker thread's default.
void use_threads(int threads) {
#if defined(_OPENMP)
  omp_set_num_threads(threads);
#else
  (void)threads;
#endif
}

/// Runs `add()` (which adds rank `rank`'s message), its gradcomp::error naming the rank.
template <class Add>
void naming_rank(std::size_t rank, std::size_t ranks, Add&& add) {
  try {
    add();
  } catch (const gc::error& e) {
    gc::detail::fail(e.code(), std::string_view(e.what()).substr(std::strlen("gradcomp: ")), " (the message of rank ",
                     rank, " of ", ranks, ")");
  }
}

/// The counts of a bucket before its exchange: its size, and what a ring all-reduce of
/// it would send per rank.
hook_counts counts_of(const torch::Tensor& bucket, bool compressed, int ranks_in) {
  hook_counts counts;
  counts.buckets = 1;
  counts.compressed = compressed ? 1 : 0;
  counts.elements = static_cast<std::uint64_t>(bucket.numel());
  const auto ranks = static_cast<std::uint64_t>(ranks_in);
  counts.dense_bytes = 2 * (ranks - 1) * static_cast<std::uint64_t>(bucket.numel() * bucket.element_size()) / ranks;
  return counts;
}

}  // namespace

void hook_steps::add_counts(shared& state, const hook_counts& counts, bool last) {
  const std::lock_guard<std::mutex> lock(state.lock);
  state.step += counts;
  if (last) {
    state.step.steps = 1;
    state.last = state.step;
    state.totals += state.step;
    state.step = hook_counts{};
  }
}

py::object hook_steps::submit(const torch::Tensor& bucket_in, bool last, bool compressed, work job) {
  // A tensor of our own over the bucket's memory: a tensor that has had a Python object
  // needs the GIL where its last reference goes, and the job drops this one off the
  // Python thread.
  torch::Tensor bucket = bucket_in.alias();
  const bucket_place place(bucket.device());
  auto future = c10::make_intrusive<c10::ivalue::Future>(c10::PyObjectType::get(), place.devices);
  const int threads = at::get_num_threads();
  const bool skip_non_finite = skip_non_finite_;
  worker_->submit([group = group_, state = shared_, future, bucket, stream = place.stream, threads, last, compressed,
                   skip_non_finite, job = std::move(job)]() mutable {
    use_threads(threads);
    torch::Tensor result;
    std::exception_ptr failure;
    hook_counts counts = counts_of(bucket, compressed, group->getSize());
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
    const bool failed = failure != nullptr;
    const std::string skipped = skip_if_non_finite(failure, skip_non_finite, bucket, result);
    if (failed) counts.refused = 1;
    state->step_failed = state->step_failed || failed;
    if (last) end_step(state->staged, state->step_failed, failure);
    add_counts(*state, counts, last);
    // Everything the job holds goes before the Future completes: once it has, the
    // training script may run to its end, and a reference dropped here after the
    // interpreter has finalized would need the GIL, which this thread cannot take then.
    job = nullptr;
    bucket = torch::Tensor();
    group.reset();
    state.reset();
    complete(future, result, failure, skipped);
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

struct hook_steps::deferred_bucket {
  std::int64_t index = 0;
  std::shared_ptr<compressor_handle> c;  // null where this rank met an error before
  std::vector<gc::detail::setting> settings;
  reported_error error;               // this rank's, met before the exchange
  gc::detail::rank_draft draft;       // this rank's verdict as its frame carries it, and its report
  torch::Tensor bucket, flat;         // the bucket, and as the compressor reads it
  torch::Tensor message;              // the staged message (the compressor's largest)
  torch::Tensor gathered;             // every rank's frame, in rank order
  torch::Tensor faults;               // each rank's message's checks (int32 words), where they were queued
  std::exception_ptr add_failure;     // queueing the adds failed (this rank's, raised once the ranks settled)
  torch::Tensor mean;                 // the result: the mean of the ranks' messages
  std::size_t bound = 0;              // message bytes of a frame
  std::vector<std::uint64_t> sizes;   // each rank's message size, once settled
  std::optional<c10::Stream> stream;  // a device bucket's, where backward wrote it: its work goes there
  c10::intrusive_ptr<c10::ivalue::Future> future;
  hook_counts counts;
  std::exception_ptr failure;

  explicit deferred_bucket(std::optional<c10::Stream> s) : stream(s) {}
  [[nodiscard]] std::size_t frame_bytes() const { return gc::detail::rank_verdict::size + bound; }
};

namespace {

/// Makes `stream` current for its lifetime (a host bucket has none).
class on_stream_of {
 public:
  explicit on_stream_of(const std::optional<c10::Stream>& stream) {
    if (stream) guard_.emplace(*stream);
  }

 private:
  std::optional<c10::StreamGuard> guard_;
};

constexpr std::size_t verdict_bytes = gc::detail::rank_verdict::size;
/// What the step's end reads of each frame: the verdict and the message's header.
constexpr std::size_t head_bytes = verdict_bytes + gc::message_header::size;

/// Rank `rank`'s message header in `heads` (its frame's first bytes, as many as the frame
/// has, up to head_bytes each), zero-padded where the frame is shorter.
std::array<std::byte, gc::message_header::size> header_in(const std::byte* heads, std::size_t each, std::size_t rank) {
  std::array<std::byte, gc::message_header::size> h{};
  const std::size_t have = each > verdict_bytes ? each - verdict_bytes : 0;
  std::memcpy(h.data(), heads + rank * each + verdict_bytes, std::min(have, h.size()));
  return h;
}

/// Stages bucket `d`, all-gathers its frames and adds every rank's message to the mean
/// where it is, reading nothing back: the frame's verdict comes from the step's status
/// on the device, or from this rank's error met on the host (then written from the
/// host); each message's header is read and its checks' faults kept on the device,
/// where the step's end reads them with the verdicts.
void send_frames(c10d::ProcessGroup& pg, std::map<std::int64_t, std::size_t>& bounds, hook_steps::deferred_bucket& d) {
  const std::int64_t ranks = pg.getSize();
  d.flat = compressible(d.bucket);
  d.mean = torch::zeros({d.flat.numel()}, d.flat.options().dtype(torch::kFloat));
  d.bound = bounds[d.index];  // 0 at first: the first step's messages go the fallback's way
  const auto frame_bytes = static_cast<std::int64_t>(d.frame_bytes());
  torch::Tensor frame = torch::empty({frame_bytes}, d.flat.options().dtype(torch::kUInt8));
  const std::uint64_t digest = gc::detail::rank_verdict::digest_of(gc::detail::rank_report::written(d.settings));
  const auto start = clock::now();
  d.draft = gc::detail::draft(who, d.settings, [&]() -> std::uint64_t {
    rethrow(d.error);
    if (!d.c) invalid(who, ": no compressor for bucket ", d.index);
    d.message = d.c->stage_framed(d.flat, who, frame, d.bound, digest);
    return 0;  // the message's size stays on the device, in the frame
  });
  d.counts.compress_seconds = seconds_since(start);
  if (d.draft.report.code != 0) {  // this rank's error, known here: its verdict alone
    std::vector<std::uint8_t> host(static_cast<std::size_t>(frame_bytes), 0);
    d.draft.verdict.write(reinterpret_cast<std::byte*>(host.data()));
    frame.copy_(torch::from_blob(host.data(), {frame_bytes}, torch::kUInt8));
  }
  // The frame to every rank in one all-to-all, as the transport's all-gathers go (gloo's
  // ring all-gather sends W - 1 messages per rank per part: process_group.cpp).
  d.gathered = torch::empty({ranks * frame_bytes}, frame.options());
  torch::Tensor copies = frame.repeat({ranks});
  std::vector<std::int64_t> even;
  pg.alltoall_base(d.gathered, copies, even, even)->wait();  // over NCCL the current stream waits, not the host
  d.counts.bytes_sent += static_cast<std::uint64_t>(frame_bytes);
  d.counts.bytes_received += static_cast<std::uint64_t>((ranks - 1) * frame_bytes);
  d.counts.collectives += 1;
  // Every rank's message added where it is, each only if its checks pass (a rank's error
  // or a message that outgrew the frame adds nothing): this rank's own error, or a frame
  // that holds no message yet, leaves it to the step's end.
  if (d.draft.report.code != 0 || d.bound < gc::message_header::size) return;
  static_assert(gc::detail::decoding::verdict_bytes == verdict_bytes, "the decoder reads the frame's verdict");
  d.faults = torch::zeros({ranks}, d.gathered.options().dtype(torch::kInt32));
  const gc::encode::index_value format = d.c->encoder();
  const auto scale = static_cast<float>(1.0 / static_cast<double>(ranks));
  auto* fault = reinterpret_cast<std::uint32_t*>(d.faults.data_ptr<std::int32_t>());
  try {  // after the all-to-all: this rank must still take part in the step's end's collectives
    for (std::int64_t r = 0; r < ranks; ++r) {
      queue_framed_add(format, d.gathered.narrow(0, r * frame_bytes, frame_bytes), d.mean, scale, fault + r);
    }
  } catch (...) {
    d.add_failure = std::current_exception();
  }
}

/// A message of bucket `d` outgrew its frame (the first step's, or one that grew past
/// the slack): every rank's again at its own size, through host memory, and added with
/// the checks read back. Rare: the next frames are sized to the longest.
void gather_again_on_host(transport& t, hook_steps::deferred_bucket& d, float scale) {
  const auto rank = static_cast<std::size_t>(t.rank());
  const torch::Tensor mine = d.message.narrow(0, 0, static_cast<std::int64_t>(d.sizes[rank])).to(torch::kCPU);
  std::vector<std::byte> all(static_cast<std::size_t>(gc::detail::total_size(d.sizes)));
  t.all_gather_v(bytes_of(mine), d.sizes, all);
  for (std::size_t r = 0, at = 0; r < d.sizes.size(); at += static_cast<std::size_t>(d.sizes[r]), ++r) {
    const torch::Tensor bytes =
        torch::from_blob(all.data() + at, {static_cast<std::int64_t>(d.sizes[r])}, torch::kUInt8).to(d.mean.device());
    naming_rank(r, d.sizes.size(), [&] { add_message(bytes, d.mean, scale); });
  }
}

/// A message whose checks found a fault on the device: its error, from the checked add
/// (on a copy of the result, which the device's add left without it). The ranks agreed
/// on their policies and options, so a sound message is written as this rank reads it.
[[noreturn]] void explain_fault(const hook_steps::deferred_bucket& d, const torch::Tensor& message, std::size_t rank,
                                float scale) {
  torch::Tensor copy = d.mean.clone();
  naming_rank(rank, d.sizes.size(), [&] { add_message(message, copy, scale); });
  gc::detail::fail(gc::errc::corrupt_message, who, ": the message of rank ", rank,
                   " failed a check on the device that the checked add passes (a gradcomp bug: please report it)");
}

}  // namespace

py::object hook_steps::deferred(std::int64_t index, std::shared_ptr<compressor_handle> c,
                                std::vector<gc::detail::setting> settings, const reported_error& error,
                                const torch::Tensor& bucket, bool last) {
  const bucket_place place(bucket.device());
  auto d = std::make_shared<deferred_bucket>(place.stream);
  d->index = index;
  d->c = std::move(c);
  d->settings = std::move(settings);
  d->error = error;
  d->bucket = bucket.alias();  // a tensor of our own (see submit)
  d->counts = counts_of(d->bucket, true, group_->getSize());
  d->future = c10::make_intrusive<c10::ivalue::Future>(c10::PyObjectType::get(), place.devices);
  py::object returned = py::cast(std::make_shared<torch::jit::PythonFutureWrapper>(d->future));
  const int threads = at::get_num_threads();
  worker_->submit([group = group_, state = shared_, d, last, threads, skip_non_finite = skip_non_finite_]() mutable {
    use_threads(threads);
    {
      const on_stream_of guard(d->stream);
      const auto start = clock::now();
      try {
        send_frames(*group, state->bounds, *d);
      } catch (...) {
        d->failure = std::current_exception();
      }
      d->counts.exchange_seconds = std::max(0.0, seconds_since(start) - d->counts.compress_seconds);
    }
    state->deferred.push_back(std::move(d));
    if (last) finish_deferred(group, state, skip_non_finite);
    group.reset();
    state.reset();
  });
  return returned;
}

void hook_steps::finish_deferred(const group_ptr& group, const std::shared_ptr<shared>& state, bool skip_non_finite) {
  std::vector<std::shared_ptr<deferred_bucket>> buckets;
  buckets.swap(state->deferred);
  const auto ranks = static_cast<std::size_t>(group->getSize());
  const auto rank = static_cast<std::size_t>(group->getRank());
  const auto scale = static_cast<float>(1.0 / static_cast<double>(ranks));
  const auto start = clock::now();
  const on_stream_of guard(buckets.back()->stream);
  const auto each_head = [](const deferred_bucket& d) { return std::min(head_bytes, d.frame_bytes()); };

  // The step's one read: every frame's verdict and message header, and the faults of
  // the messages added on the device, in one copy.
  std::vector<torch::Tensor> heads;
  for (const auto& d : buckets) {
    if (d->failure) continue;
    if (d->stream && *d->stream != *buckets.back()->stream) {  // its adds' faults, read on the last's stream
      c10::Event added(d->stream->device_type());
      added.record(*d->stream);
      added.block(*buckets.back()->stream);
    }
    const auto frame = static_cast<std::int64_t>(d->frame_bytes());
    for (std::size_t r = 0; r < ranks; ++r) {
      heads.push_back(
          d->gathered.narrow(0, static_cast<std::int64_t>(r) * frame, static_cast<std::int64_t>(each_head(*d))));
    }
    if (d->faults.defined()) heads.push_back(d->faults.view(torch::kUInt8));
  }
  const torch::Tensor host_heads = heads.empty() ? torch::Tensor() : torch::cat(heads).to(torch::kCPU);
  const auto* read =
      host_heads.defined() ? reinterpret_cast<const std::byte*>(host_heads.data_ptr<std::uint8_t>()) : nullptr;

  // Each bucket settled as gather_frames settles it: its messages were added (or, where
  // one outgrew the frame, are gathered and added again); a fault is explained.
  transport t = transport_of(group, torch::kCPU, nullptr);
  for (auto& bucket : buckets) {
    deferred_bucket& d = *bucket;
    if (d.failure) continue;
    const std::size_t each = each_head(d);
    const std::byte* mine_heads = read;
    read += ranks * each;
    std::vector<std::uint32_t> faults(d.faults.defined() ? ranks : 0);
    if (!faults.empty()) std::memcpy(faults.data(), read, faults.size() * sizeof(std::uint32_t));
    read += faults.size() * sizeof(std::uint32_t);
    const std::uint64_t sent = *t.sent, received = *t.received, issued = *t.issued;
    const on_stream_of bucket_stream(d.stream);
    try {
      std::vector<std::byte> verdicts(ranks * verdict_bytes);
      for (std::size_t r = 0; r < ranks; ++r) {
        std::memcpy(verdicts.data() + r * verdict_bytes, mine_heads + r * each, verdict_bytes);
      }
      gc::detail::rank_draft mine = d.draft;
      if (mine.report.code == 0 && gc::detail::rank_verdict::read(mine_heads + rank * each).code != 0) {
        // The step met a NaN or infinity: its error, read now (the step is dropped).
        mine = gc::detail::draft(who, d.settings, [&]() -> std::uint64_t {
          (void)d.c->staged_message(d.flat, d.message);
          invalid(who, ": the step's status said a value was not finite; read again, it did not");
        });
      }
      d.sizes = gc::detail::settle(t, who, mine, verdicts);
      const std::uint64_t capacity = d.c->capacity();
      std::uint64_t longest = 0;
      for (std::size_t r = 0; r < ranks; ++r) {
        gc::detail::require(d.sizes[r] <= capacity, gc::errc::corrupt_message, who, ": rank ", r,
                            " reported a message of ", d.sizes[r], " bytes, more than the ", capacity,
                            " its policies can write");
        longest = std::max(longest, d.sizes[r]);
      }
      if (longest <= d.bound) {
        d.counts.entries = gc::detail::read_header(header_in(mine_heads, each, rank), d.sizes[rank]).count;
        const auto frame = static_cast<std::int64_t>(d.frame_bytes());
        if (d.add_failure) std::rethrow_exception(d.add_failure);
        for (std::size_t r = 0; r < faults.size(); ++r) {
          if (faults[r] == 0) continue;
          explain_fault(d,
                        d.gathered.narrow(0, static_cast<std::int64_t>(r) * frame + verdict_bytes,
                                          static_cast<std::int64_t>(d.sizes[r])),
                        r, scale);
        }
      } else {
        d.counts.entries = d.c->staged_message(d.flat, d.message).count;
        d.mean.zero_();  // what fitted its frame was added: every message again, in rank order
        gather_again_on_host(t, d, scale);
        if (d.add_failure) std::rethrow_exception(d.add_failure);
      }
      state->bounds[d.index] = gc::comm::next_frame_bound(longest, capacity);
    } catch (...) {
      d.failure = std::current_exception();
    }
    d.counts.bytes_sent += *t.sent - sent;
    d.counts.bytes_received += *t.received - received;
    d.counts.collectives += *t.issued - issued;
  }

  // The step's end, as submit()'s: accepted together, or none.
  for (const auto& d : buckets) {
    state->step_failed = state->step_failed || d->failure != nullptr;
    if (d->c) state->staged.push_back([c = d->c] { c->accept_staged(); });
  }
  std::exception_ptr accept_failure;
  end_step(state->staged, state->step_failed, accept_failure);
  buckets.back()->counts.exchange_seconds += seconds_since(start);  // the step's end, in its last bucket's time
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    deferred_bucket& d = *buckets[b];
    const on_stream_of bucket_stream(d.stream);
    std::exception_ptr failure = d.failure ? d.failure : accept_failure;
    torch::Tensor result = failure ? torch::Tensor() : in_dtype_of(d.bucket, d.mean);
    if (failure) d.counts.refused = 1;
    const std::string skipped = skip_if_non_finite(failure, skip_non_finite, d.bucket, result);
    add_counts(*state, d.counts, b + 1 == buckets.size());
    c10::intrusive_ptr<c10::ivalue::Future> future = std::move(d.future);
    d = deferred_bucket(d.stream);  // what it held goes before its Future completes (see submit)
    complete(future, result, failure, skipped);
  }
}

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
                  [state = shared_, shared, cyclic = exchange_of<cyclic_handle>(exchange), error](
                      transport& t, const torch::Tensor& b, hook_counts& counts) {
                    agree_on(t, shared, error);  // a rank without its exchange has an error here
                    if (!cyclic) invalid(who, ": no cyclic exchange for this bucket");
                    const torch::Tensor flat = b.to(torch::kFloat);
                    torch::Tensor mean = torch::zeros({flat.numel()}, flat.options());
                    const exchange_traffic<cyclic_handle> traffic(t, *cyclic);
                    (void)cyclic->stage(flat, mean, 1.0 / t.size());
                    counts.entries = cyclic->entries();
                    state->staged.push_back([cyclic] { cyclic->accept(); });
                    return in_dtype_of(b, mean);
                  });
  }
  if (aggregation != "allgather")
    invalid(who, ": aggregation must be allgather, cyclic or sparse_allreduce, got ", aggregation);
  if (c) shared.emplace_back("the policies", c->signature());
  return deferred(index, std::move(c), std::move(shared), error, bucket, last);
}

}  // namespace gradcomp_py
