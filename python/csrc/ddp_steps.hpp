// The DDP hook's steps (gradcomp._C.HookSteps, driven by gradcomp.torch.ddp): the hook
// hands each bucket to a job and returns at once a torch Future that the job completes,
// so that backward goes on to the next bucket while this one's bytes travel. Jobs run on
// the process group's ordered_worker, one after another in the order DDP called the hook
// (the same on every rank), so that every collective is issued in the same order on
// every rank. A step's staged compressor steps are accepted together at its last bucket,
// only if every bucket of the step succeeded on every rank: a step that raises changes no
// bucket's memory, whatever its aggregation.
#pragma once

#include <torch/extension.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include <gradcomp/comm/agreement.hpp>

#include "compressor_handle.hpp"
#include "ordered_worker.hpp"
#include "process_group.hpp"

namespace gradcomp_py {

/// What the hook's jobs moved and spent, summed over buckets (State.stats()).
struct hook_counts {
  std::uint64_t steps = 0;           ///< steps completed (their last bucket done)
  std::uint64_t buckets = 0;         ///< buckets exchanged
  std::uint64_t compressed = 0;      ///< of which compressed (the others all-reduced densely)
  std::uint64_t elements = 0;        ///< gradient elements in those buckets
  std::uint64_t entries = 0;         ///< entries of this rank's messages (compressed buckets)
  std::uint64_t bytes_sent = 0;      ///< bytes this rank put into the collectives
  std::uint64_t bytes_received = 0;  ///< bytes the collectives delivered to it
  std::uint64_t dense_bytes = 0;     ///< what a ring all-reduce of the same buckets sends per rank
  std::uint64_t collectives = 0;     ///< collectives issued
  std::uint64_t refused = 0;         ///< buckets whose step failed (an error, or skipped non-finite values)
  double compress_seconds = 0;       ///< compressing (the all-gather aggregation's own step)
  double exchange_seconds = 0;       ///< the rest of the jobs: agreement, collectives, decoding

  hook_counts& operator+=(const hook_counts& o);
  /// The counts by the names State.stats() gives them.
  [[nodiscard]] pybind11::dict to_dict() const;

  /// Calls `f(name, counts.field...)` for every field of every one of `counts` (the sum
  /// and the names read the one list).
  template <class F, class... Counts>
  static void fields(F&& f, Counts&... counts) {
    f("steps", counts.steps...);
    f("buckets", counts.buckets...);
    f("compressed_buckets", counts.compressed...);
    f("elements", counts.elements...);
    f("entries_sent", counts.entries...);
    f("bytes_sent", counts.bytes_sent...);
    f("bytes_received", counts.bytes_received...);
    f("dense_allreduce_bytes", counts.dense_bytes...);
    f("collectives", counts.collectives...);
    f("refused_buckets", counts.refused...);
    f("compress_seconds", counts.compress_seconds...);
    f("exchange_seconds", counts.exchange_seconds...);
  }
};

class hook_steps {
 public:
  /// The steps of one hook state over `group` (a torch.distributed ProcessGroup: the
  /// hook's own) for a DDP over `ddp_group`, which the steps only hold: its last
  /// reference, released with the GIL held, would join gloo's threads while one of them
  /// may wait for the GIL to release a tensor of DDP's (process_group.hpp), and a hook
  /// state often outlives DDP's reducer. With `skip_non_finite`, a NaN or infinity in a
  /// bucket on any rank makes that bucket's result NaN on every rank (torch's GradScaler
  /// then skips the step) instead of raising; either way the step changes no memory.
  hook_steps(const pybind11::object& group, const pybind11::object& ddp_group, bool skip_non_finite);

  /// A dense step (the warm-up): the ranks agree on `settings` (and hear of `error`, this
  /// rank's, if any), then `bucket` is divided by the world size and all-reduced in place
  /// (torch's allreduce_hook; bfloat16 through float32 where the backend is not NCCL).
  pybind11::object dense(const torch::Tensor& bucket, const std::vector<named_value>& settings,
                         const reported_error& error, bool last);

  /// A compressed step of bucket `index`, exchanged by `aggregation`: "cyclic" (ScaleCom:
  /// `exchange` a CyclicExchange) its frames, broadcast and reduce, or "sparse_allreduce"
  /// (Ok-Topk's global top-k: `exchange` a SparseAllreduce) its frames, blocks of entries,
  /// histograms, records and gather, queued, their outcome read at the step's end with
  /// every bucket's (hook_steps::exchanged); "allgather": `c` stages its step and the messages are gathered in one
  /// all-gather padded to the bucket's bound (gradcomp/comm/frames.hpp). `error`: what this rank
  /// met before (then `c` and `exchange` may be None), told to every rank in the exchange.
  /// The Future's value is the mean of the ranks' messages, in the bucket's dtype; its
  /// error, the same gradcomp::error on every rank.
  pybind11::object compressed(std::int64_t index, std::shared_ptr<compressor_handle> c, const std::string& aggregation,
                              const pybind11::object& exchange, const torch::Tensor& bucket,
                              const std::vector<named_value>& settings, const reported_error& error, bool last);

  /// A bucket waiting for its step's last (ddp_steps.cpp): of the all-gather exchange,
  /// or of an exchange of its own (ScaleCom's cyclic exchange, Ok-Topk's global top-k).
  struct pending_bucket;
  struct deferred_bucket;
  template <class Handle>
  struct exchange_bucket;
  using cyclic_bucket = exchange_bucket<cyclic_handle>;
  using sparse_bucket = exchange_bucket<sparse_handle>;

  /// Every step's counts, summed (read at any time).
  [[nodiscard]] hook_counts totals() const;
  /// The last completed step's counts.
  [[nodiscard]] hook_counts last_step() const;

 private:
  /// What the jobs keep between them (touched by the worker's thread; the counts also
  /// read by Python's, under `lock`).
  struct shared {
    std::map<std::int64_t, std::size_t> bounds;              // each bucket's frame bound
    std::vector<std::function<void()>> staged;               // this step's staged buckets' accepts
    std::vector<std::shared_ptr<deferred_bucket>> deferred;  // this step's all-gather buckets so far
    std::vector<std::shared_ptr<cyclic_bucket>> cyclic;      // this step's cyclic buckets so far
    std::vector<std::shared_ptr<sparse_bucket>> sparse;      // this step's sparse_allreduce buckets so far
    // The buckets whose last step of an exchange of their own (cyclic, sparse_allreduce)
    // every rank settled: their next step's agreement on the hook's settings travels in
    // the exchange's first collective (ddp_steps.cpp, hook_steps::exchanged).
    std::set<std::int64_t> agreed;
    bool step_failed = false;
    mutable std::mutex lock;
    hook_counts step, last, totals;
  };
  /// A bucket's exchange: returns its result; adds its message's entries and its
  /// compression's time to `counts`.
  using work = std::function<torch::Tensor(transport&, const torch::Tensor& bucket, hook_counts& counts)>;

  /// Adds a bucket's `counts` to its step's, and at the step's end the step's to the totals.
  static void add_counts(shared& state, const hook_counts& counts, bool last);
  /// The step's end of its all-gather buckets (`state.deferred`), on the worker's thread.
  static void finish_deferred(const group_ptr& group, const std::shared_ptr<shared>& state, bool skip_non_finite);
  /// The step's end of its buckets of an exchange of their own (`state.*Waiting`, of
  /// Handle's exchanges), on the worker's thread.
  template <class Handle, auto Waiting>
  static void finish_exchange(const group_ptr& group, const std::shared_ptr<shared>& state, bool skip_non_finite);
  /// The step's end of settled `buckets`: their staged steps accepted together or none,
  /// then their Futures completed.
  static void complete_step(shared& state, std::vector<std::shared_ptr<pending_bucket>> buckets, bool skip_non_finite,
                            std::chrono::steady_clock::time_point start);
  /// `buckets` moved into a list of pending ones (complete_step's, which then holds the
  /// only references: each bucket's goes before its Future completes).
  template <class Bucket>
  static std::vector<std::shared_ptr<pending_bucket>> pending_of(std::vector<std::shared_ptr<Bucket>>& buckets);
  /// A step's end of the buckets waiting in one of `shared`'s lists.
  using finisher = void (*)(const group_ptr& group, const std::shared_ptr<shared>& state, bool skip_non_finite);
  /// Submits a job that runs `queue(group, state, bucket)` for a new `Bucket` over `bucket`
  /// on the worker's thread (a throw becomes the bucket's failure), keeps it in
  /// `state.*waiting`, and at the step's last bucket runs `finish`; returns its Future.
  template <class Bucket, class Queue>
  pybind11::object pending(std::int64_t index, const torch::Tensor& bucket, bool last,
                           std::vector<std::shared_ptr<Bucket>> shared::*waiting, finisher finish, Queue queue);
  /// Queues `job` for `bucket` and returns its Future.
  pybind11::object submit(const torch::Tensor& bucket, bool last, bool compressed, work job);
  /// The all-gather aggregation of a bucket, in the bucket's memory (host or device):
  /// the step is staged, framed and all-gathered (on a CUDA bucket's stream), and every
  /// rank's message checked and added where it is, with nothing read back; the step's
  /// last bucket reads every bucket's verdicts, message headers and checks' faults in
  /// one copy and completes every bucket's Future (finish_deferred in ddp_steps.cpp).
  pybind11::object deferred(std::int64_t index, std::shared_ptr<compressor_handle> c,
                            std::vector<gradcomp::detail::setting> settings, const reported_error& error,
                            const torch::Tensor& bucket, bool last);
  /// A bucket's exchange of its own (ScaleCom's cyclic exchange, Ok-Topk's global
  /// top-k), in the bucket's memory: queued (on a bucket's first step after the ranks
  /// agreed on the host), the outcome read at the step's last bucket with every bucket's
  /// in one copy, then each settled (finish_exchange).
  template <class Handle, auto Waiting>
  pybind11::object exchanged(std::int64_t index, std::shared_ptr<Handle> exchange,
                             std::vector<gradcomp::detail::setting> settings, const reported_error& error,
                             const torch::Tensor& bucket, bool last);

  group_ptr group_;
  group_ptr ddp_group_;
  std::shared_ptr<ordered_worker> worker_;
  std::shared_ptr<shared> shared_ = std::make_shared<shared>();
  bool skip_non_finite_ = false;
};

}  // namespace gradcomp_py
