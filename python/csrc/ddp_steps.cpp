// gradcomp._C.HookSteps (see ddp_steps.hpp).
#include "ddp_steps.hpp"

#include <ATen/Parallel.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/jit/python/pybind_utils.h>

#include <gradcomp/comm/agreement.hpp>
#include <gradcomp/comm/cyclic_topk.hpp>
#include <gradcomp/comm/frames.hpp>
#include <gradcomp/detail/codec/decode.hpp>
#include <gradcomp/comm/sparse_allreduce.hpp>
#include <gradcomp/detail/comm/global_topk.hpp>
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

/// Makes `stream` current for its lifetime (a host bucket has none).
class on_stream_of {
 public:
  explicit on_stream_of(const std::optional<c10::Stream>& stream) {
    if (stream) guard_.emplace(*stream);
  }

 private:
  std::optional<c10::StreamGuard> guard_;
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

/// Adds to `counts` what `t` moves in its lifetime, however the scope ends.
class counting_into {
 public:
  counting_into(const transport& t, hook_counts& counts)
      : t_(t), counts_(counts), sent_(*t.sent), received_(*t.received), issued_(*t.issued) {}
  ~counting_into() {
    counts_.bytes_sent += *t_.sent - sent_;
    counts_.bytes_received += *t_.received - received_;
    counts_.collectives += *t_.issued - issued_;
  }
  counting_into(const counting_into&) = delete;
  counting_into& operator=(const counting_into&) = delete;

 private:
  const transport& t_;
  hook_counts& counts_;
  std::uint64_t sent_, received_, issued_;
};

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
    // The bucket's stream stays current through complete(): the Future's events are
    // recorded on the current stream, and DDP's wait orders its reads after them alone.
    const on_stream_of guard(stream);
    {
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

struct hook_steps::pending_bucket {
  std::int64_t index = 0;
  torch::Tensor bucket;               // the bucket (a tensor of our own: see submit)
  torch::Tensor mean;                 // the result: the mean of the ranks' messages
  std::optional<c10::Stream> stream;  // a device bucket's, where backward wrote it: its work goes there
  c10::intrusive_ptr<c10::ivalue::Future> future;
  hook_counts counts;
  std::exception_ptr failure;
  std::function<void()> accept;  // commits its staged step (null where this rank has none)

  explicit pending_bucket(std::optional<c10::Stream> s) : stream(s) {}
  virtual ~pending_bucket() = default;
  pending_bucket(const pending_bucket&) = delete;
  pending_bucket& operator=(const pending_bucket&) = delete;
};

struct hook_steps::deferred_bucket : pending_bucket {
  std::shared_ptr<compressor_handle> c;  // null where this rank met an error before
  std::vector<gc::detail::setting> settings;
  reported_error error;              // this rank's, met before the exchange
  gc::detail::rank_draft draft;      // this rank's verdict as its frame carries it, and its report
  torch::Tensor flat;                // the bucket as the compressor reads it
  torch::Tensor message;             // the staged message (the compressor's largest)
  torch::Tensor gathered;            // every rank's frame, in rank order
  torch::Tensor faults;              // each rank's message's checks (int32 words), where they were queued
  std::exception_ptr add_failure;    // queueing the adds failed (this rank's, raised once the ranks settled)
  std::size_t bound = 0;             // message bytes of a frame
  std::vector<std::uint64_t> sizes;  // each rank's message size, once settled

  using pending_bucket::pending_bucket;
  [[nodiscard]] std::size_t frame_bytes() const { return gc::detail::rank_verdict::size + bound; }
};

/// A bucket of an exchange of its own (ScaleCom's, Ok-Topk's): queued, its outcome read
/// at the step's end.
template <class Handle>
struct hook_steps::exchange_bucket : pending_bucket {
  std::shared_ptr<Handle> exchange;  // null where this rank met an error before
  torch::Tensor flat;                // the bucket as the exchange reads it
  torch::Tensor outcome;             // the exchange's outcome, to read at the step's end
  /// A rank without its exchange takes part as a stand-in: its draft (its error) and the
  /// verdicts it read, which settle at the step's end as the others' outcomes do.
  std::optional<gc::detail::rank_draft> stand_in;
  std::vector<std::byte> verdicts;

  using pending_bucket::pending_bucket;
};

namespace {

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

/// The step's one read, on the last bucket's stream (after each bucket's own): the
/// tensors `parts(d, out)` appends for each bucket `d` that has not failed, in one copy
/// to the host. A read that fails fails every bucket.
template <class Bucket, class Parts>
torch::Tensor read_together(std::vector<std::shared_ptr<Bucket>>& buckets, Parts&& parts) {
  try {
    std::vector<torch::Tensor> all;
    const std::optional<c10::Stream>& last = buckets.back()->stream;
    for (const auto& d : buckets) {
      if (d->failure) continue;
      if (d->stream && *d->stream != *last) {
        c10::Event done(d->stream->device_type());
        done.record(*d->stream);
        done.block(*last);
      }
      parts(*d, all);
    }
    return all.empty() ? torch::Tensor() : torch::cat(all).to(torch::kCPU).contiguous();
  } catch (...) {
    const std::exception_ptr failure = std::current_exception();
    for (const auto& d : buckets) {
      if (!d->failure) d->failure = failure;
    }
    return {};
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
  return pending<deferred_bucket>(index, bucket, last, &shared::deferred, &hook_steps::finish_deferred,
                                  [c = std::move(c), settings = std::move(settings), error](
                                      const group_ptr& group, shared& state, deferred_bucket& d) mutable {
                                    d.c = std::move(c);
                                    d.settings = std::move(settings);
                                    d.error = error;
                                    send_frames(*group, state.bounds, d);
                                  });
}

template <class Bucket, class Queue>
py::object hook_steps::pending(std::int64_t index, const torch::Tensor& bucket, bool last,
                               std::vector<std::shared_ptr<Bucket>> shared::*waiting, finisher finish, Queue queue) {
  const bucket_place place(bucket.device());
  auto d = std::make_shared<Bucket>(place.stream);
  d->index = index;
  d->bucket = bucket.alias();  // a tensor of our own (see submit)
  d->counts = counts_of(d->bucket, true, group_->getSize());
  d->future = c10::make_intrusive<c10::ivalue::Future>(c10::PyObjectType::get(), place.devices);
  py::object returned = py::cast(std::make_shared<torch::jit::PythonFutureWrapper>(d->future));
  const int threads = at::get_num_threads();
  worker_->submit([group = group_, state = shared_, d, last, threads, waiting, finish, queue = std::move(queue),
                   skip_non_finite = skip_non_finite_]() mutable {
    use_threads(threads);
    {
      const on_stream_of guard(d->stream);
      const auto start = clock::now();
      try {
        queue(group, *state, *d);
      } catch (...) {
        d->failure = std::current_exception();
      }
      d->counts.exchange_seconds = std::max(0.0, seconds_since(start) - d->counts.compress_seconds);
    }
    ((*state).*waiting).push_back(std::move(d));
    if (last) finish(group, state, skip_non_finite);
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
  // the messages added on the device.
  const torch::Tensor host_heads =
      read_together(buckets, [&](const deferred_bucket& d, std::vector<torch::Tensor>& heads) {
        const auto frame = static_cast<std::int64_t>(d.frame_bytes());
        for (std::size_t r = 0; r < ranks; ++r) {
          heads.push_back(
              d.gathered.narrow(0, static_cast<std::int64_t>(r) * frame, static_cast<std::int64_t>(each_head(d))));
        }
        if (d.faults.defined()) heads.push_back(d.faults.view(torch::kUInt8));
      });
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
    const counting_into counting(t, d.counts);
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
  }

  for (const auto& d : buckets) {
    if (d->c) d->accept = [c = d->c] { c->accept_staged(); };
  }
  complete_step(*state, pending_of(buckets), skip_non_finite, start);
}

template <class Bucket>
std::vector<std::shared_ptr<hook_steps::pending_bucket>> hook_steps::pending_of(
    std::vector<std::shared_ptr<Bucket>>& buckets) {
  std::vector<std::shared_ptr<pending_bucket>> pending(std::make_move_iterator(buckets.begin()),
                                                       std::make_move_iterator(buckets.end()));
  buckets.clear();
  return pending;
}

void hook_steps::complete_step(shared& state, std::vector<std::shared_ptr<pending_bucket>> buckets,
                               bool skip_non_finite, clock::time_point start) {
  // As submit()'s step's end: accepted together, or none.
  for (const auto& d : buckets) {
    state.step_failed = state.step_failed || d->failure != nullptr;
    if (d->accept) state.staged.push_back(std::move(d->accept));
  }
  std::exception_ptr accept_failure;
  end_step(state.staged, state.step_failed, accept_failure);
  buckets.back()->counts.exchange_seconds += seconds_since(start);  // the step's end, in its last bucket's time
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    std::exception_ptr failure;
    torch::Tensor result;
    std::string skipped;
    c10::intrusive_ptr<c10::ivalue::Future> future;
    const on_stream_of bucket_stream(buckets[b]->stream);
    {
      pending_bucket& d = *buckets[b];
      failure = d.failure ? d.failure : accept_failure;
      result = failure ? torch::Tensor() : in_dtype_of(d.bucket, d.mean);
      if (failure) d.counts.refused = 1;
      skipped = skip_if_non_finite(failure, skip_non_finite, d.bucket, result);
      add_counts(state, d.counts, b + 1 == buckets.size());
      future = std::move(d.future);
    }
    buckets[b].reset();  // what it held goes before its Future completes (see submit)
    complete(future, result, failure, skipped);
  }
}

namespace {

/// A rank without its exchange (it met an error before it had one) sends its verdict
/// (`mine`, its error) in the exchange's first collective, the frames (detail::sized_frame),
/// with no sizes, and reads every rank's at once (an error's path): the sizes the other
/// ranks' exchanges agreed, at which it takes part in their later collectives, and the
/// verdicts, which it settles with them at the end.
std::vector<std::byte> gather_frames(transport& t, const torch::Device& device, const gc::detail::rank_draft& mine) {
  using frame = gc::detail::sized_frame;
  const auto ranks = static_cast<std::size_t>(t.size());
  std::vector<std::byte> own(frame::size, std::byte{0});
  mine.verdict.write(own.data());
  const torch::Tensor in =
      torch::from_blob(own.data(), {static_cast<std::int64_t>(own.size())}, torch::kUInt8).to(device).contiguous();
  torch::Tensor all = torch::empty({static_cast<std::int64_t>(ranks * frame::size)}, in.options());
  t.all_gather_in_memory(bytes_of(in), writable(all));
  const torch::Tensor read = all.to(torch::kCPU).contiguous();
  const std::span<const std::byte> frames = bytes_of(read);
  return {frames.begin(), frames.end()};
}

/// The sizes the first rank's frame that has them carries (not both 0), or zeros.
std::array<std::uint64_t, 2> sizes_in(std::span<const std::byte> frames) {
  using frame = gc::detail::sized_frame;
  for (std::size_t at = 0; at + frame::size <= frames.size(); at += frame::size) {
    const std::array<std::uint64_t, 2> sizes{
        gc::detail::load_le<std::uint64_t>(frames.data() + at + frame::sizes_at),
        gc::detail::load_le<std::uint64_t>(frames.data() + at + frame::sizes_at + 8)};
    if (sizes[0] != 0 || sizes[1] != 0) return sizes;
  }
  return {0, 0};
}

/// The verdicts in every rank's frame.
std::vector<std::byte> verdicts_in(std::span<const std::byte> frames) {
  using frame = gc::detail::sized_frame;
  std::vector<std::byte> verdicts;
  for (std::size_t at = 0; at + frame::size <= frames.size(); at += frame::size) {
    verdicts.insert(verdicts.end(), frames.begin() + static_cast<std::ptrdiff_t>(at),
                    frames.begin() + static_cast<std::ptrdiff_t>(at + gc::detail::rank_verdict::size));
  }
  return verdicts;
}

/// A rank without its cyclic exchange takes part in the exchange's collectives
/// (comm::cyclic_topk: the frames, then the leader's indices and the sums, at the count
/// and root the others' frames carry) and keeps the verdicts to settle at the step's end
/// with the others.
void stand_in(const group_ptr& group, hook_steps::cyclic_bucket& d, const gc::detail::rank_draft& mine) {
  const torch::Device device = d.bucket.device();
  transport t = transport_of(group, device, nullptr);
  const counting_into counting(t, d.counts);
  const std::vector<std::byte> frames = gather_frames(t, device, mine);
  const auto [count, root_plus_one] = sizes_in(frames);
  const int root = root_plus_one == 0 ? 0 : static_cast<int>(root_plus_one - 1);
  torch::Tensor index =
      torch::zeros({static_cast<std::int64_t>(count)}, torch::TensorOptions().dtype(torch::kInt32).device(device));
  torch::Tensor sums =
      torch::zeros({static_cast<std::int64_t>(count + 1)}, torch::TensorOptions().dtype(torch::kFloat).device(device));
  if (count > 0) {
    t.broadcast(std::span<std::uint32_t>(reinterpret_cast<std::uint32_t*>(index.data_ptr<std::int32_t>()), count),
                root);
  }
  t.reduce_broadcast(std::span<float>(sums.data_ptr<float>(), count + 1), root);
  d.stand_in = mine;
  d.verdicts = verdicts_in(frames);
}

/// A rank without its sparse exchange takes part in comm::sparse_allreduce's collectives,
/// sending nothing: the frames, then at the sizes the others' frames carry (the blocks'
/// room + 1 and the gather's capacity) the blocks of entries, the radix select's
/// histograms, the records and the gather; and keeps the verdicts to settle at the step's
/// end with the others.
void stand_in(const group_ptr& group, hook_steps::sparse_bucket& d, const gc::detail::rank_draft& mine) {
  const torch::Device device = d.bucket.device();
  transport t = transport_of(group, device, nullptr);
  const counting_into counting(t, d.counts);
  const auto ranks = static_cast<std::size_t>(t.size());
  const std::vector<std::byte> frames = gather_frames(t, device, mine);
  const auto [room_plus_one, capacity] = sizes_in(frames);
  const std::size_t block = sizeof(gc::comm::sparse_entry) * std::max<std::uint64_t>(room_plus_one, 1);
  const auto zeros = [&](std::size_t bytes) {
    return torch::zeros({static_cast<std::int64_t>(bytes)}, torch::TensorOptions().dtype(torch::kUInt8).device(device));
  };
  const std::vector<std::uint64_t> sizes(ranks, block);
  t.all_to_all_v_in_memory(bytes_of(zeros(ranks * block)), sizes, writable(zeros(ranks * block)), sizes);
  for (std::size_t digit = 0; digit < gc::detail::collective_digits.size(); ++digit) {
    const std::size_t count = (std::size_t{1} << gc::detail::collective_digits[digit].bits) + (digit == 0 ? 1 : 0);
    const torch::Tensor bins = zeros(4 * count);
    t.all_reduce_sum_in_memory(std::span<std::uint32_t>(reinterpret_cast<std::uint32_t*>(bins.data_ptr()), count),
                               static_cast<std::uint64_t>(d.bucket.numel()));  // the bound the exchange passes: n
  }
  const std::size_t record = sizeof(gc::detail::global_topk::record);
  t.all_gather_in_memory(bytes_of(zeros(record)), writable(zeros(ranks * record)));
  if (capacity != 0) {
    const std::size_t part = capacity * sizeof(gc::comm::sparse_entry);
    t.all_gather_in_memory(bytes_of(zeros(part)), writable(zeros(ranks * part)));
  }
  d.stand_in = mine;
  d.verdicts = verdicts_in(frames);
}

}  // namespace

template <class Handle, auto Waiting>
py::object hook_steps::exchanged(std::int64_t index, std::shared_ptr<Handle> exchange,
                                 std::vector<gc::detail::setting> settings, const reported_error& error,
                                 const torch::Tensor& bucket, bool last) {
  using Bucket = exchange_bucket<Handle>;
  return pending<Bucket>(
      index, bucket, last, Waiting, &hook_steps::finish_exchange<Handle, Waiting>,
      [exchange = std::move(exchange), settings = std::move(settings), error](const group_ptr& group, shared& state,
                                                                              Bucket& d) mutable {
        d.exchange = std::move(exchange);
        transport t = transport_of(group, torch::kCPU, nullptr);
        const counting_into counting(t, d.counts);
        // A bucket's first step (or the first after a refused one): the ranks agree on the
        // hook's settings on the host first, so that a rank on another path (another
        // method) or without its exchange fails with the others before the exchange's
        // collectives, and the exchanges run at the sizes they then agree (a rank's may be
        // new). After that, the settings travel in the exchange's first collective.
        const auto prepare = [&]() -> std::uint64_t {
          rethrow(error);
          if (!d.exchange) invalid(who, ": no ", Handle::name, " for bucket ", d.index);
          // ScaleCom's exchange reads float32; Ok-Topk's what its compressor takes.
          d.flat = std::is_same_v<Handle, cyclic_handle> ? d.bucket.to(torch::kFloat) : compressible(d.bucket);
          d.mean = torch::zeros({d.flat.numel()}, d.flat.options().dtype(torch::kFloat));
          return 0;
        };
        const bool agreed = state.agreed.count(d.index) != 0;
        if (!agreed) {
          (void)gc::detail::agree(t, who, settings, prepare);
          d.exchange->forget_agreed_sizes();
        }
        // A failure here (this rank's error, or its memory) goes in its verdict.
        const gc::detail::rank_draft mine =
            agreed ? gc::detail::draft(who, settings, prepare) : gc::detail::rank_draft{};
        if (mine.report.code != 0) {
          stand_in(group, d, mine);
          return;
        }
        const exchange_traffic<Handle> traffic(t, *d.exchange);
        d.outcome = d.exchange->queue(d.flat, d.mean, 1.0 / static_cast<double>(t.size()), settings, who);
        d.accept = [x = d.exchange] { x->accept(); };
      });
}

template <class Handle, auto Waiting>
void hook_steps::finish_exchange(const group_ptr& group, const std::shared_ptr<shared>& state, bool skip_non_finite) {
  std::vector<std::shared_ptr<exchange_bucket<Handle>>> buckets;
  buckets.swap((*state).*Waiting);
  const auto start = clock::now();
  const on_stream_of guard(buckets.back()->stream);

  // The step's one read: every queued exchange's outcome (a stand-in's read its own).
  const torch::Tensor read =
      read_together(buckets, [](const exchange_bucket<Handle>& d, std::vector<torch::Tensor>& outcomes) {
        if (d.outcome.defined()) outcomes.push_back(d.outcome);
      });
  const auto* at = read.defined() ? reinterpret_cast<const std::byte*>(read.data_ptr<std::uint8_t>()) : nullptr;

  // Each bucket settled in the order the ranks queued them: every rank throws alike, or
  // none does; a step the ranks must run again (the first; sizes that grew) runs at once.
  transport t = transport_of(group, torch::kCPU, nullptr);
  for (const auto& bucket : buckets) {
    exchange_bucket<Handle>& d = *bucket;
    if (d.failure) continue;
    const on_stream_of bucket_stream(d.stream);
    const counting_into counting(t, d.counts);
    try {
      if (d.stand_in) {
        (void)gc::detail::settle(t, who, *d.stand_in, d.verdicts);
        invalid(who, ": bucket ", d.index, " settled on a rank without its exchange");  // settle() threw its error
      }
      const auto size = static_cast<std::size_t>(d.outcome.numel());
      const std::span<const std::byte> outcome(at, size);
      at += size;
      const exchange_traffic<Handle> traffic(t, *d.exchange);
      d.exchange->settle(outcome);
      d.counts.entries = d.exchange->entries();
      state->agreed.insert(d.index);
    } catch (...) {
      d.failure = std::current_exception();
      d.accept = nullptr;
      state->agreed.erase(d.index);
    }
  }
  complete_step(*state, pending_of(buckets), skip_non_finite, start);
}

py::object hook_steps::compressed(std::int64_t index, std::shared_ptr<compressor_handle> c,
                                  const std::string& aggregation, const py::object& exchange,
                                  const torch::Tensor& bucket, const std::vector<named_value>& settings,
                                  const reported_error& error, bool last) {
  std::vector<gc::detail::setting> agreed = settings_of(settings);  // the settings every rank must share
  if (aggregation == "sparse_allreduce") {
    return exchanged<sparse_handle, &shared::sparse>(index, exchange_of<sparse_handle>(exchange), std::move(agreed),
                                                     error, bucket, last);
  }
  if (aggregation == "cyclic") {
    return exchanged<cyclic_handle, &shared::cyclic>(index, exchange_of<cyclic_handle>(exchange), std::move(agreed),
                                                     error, bucket, last);
  }
  if (aggregation != "allgather")
    invalid(who, ": aggregation must be allgather, cyclic or sparse_allreduce, got ", aggregation);
  if (c) agreed.emplace_back("the policies", c->signature());
  return deferred(index, std::move(c), std::move(agreed), error, bucket, last);
}

}  // namespace gradcomp_py
