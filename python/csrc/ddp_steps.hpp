// The DDP hook's steps (gradcomp._C.HookSteps, driven by gradcomp.torch.ddp): the hook
// hands each bucket to a job and returns at once a torch Future that the job completes,
// so that backward goes on to the next bucket while this one's bytes travel. Jobs run on
// the process group's ordered_worker, one after another in the order DDP called the hook
// (the same on every rank), so that every collective is issued in the same order on
// every rank. A step's staged compressor steps are accepted together at its last bucket,
// only if every bucket of the step succeeded on every rank: a step that raises changes no
// bucket's memory (ScaleCom's exchange, which does not stage, keeps each bucket's own).
#pragma once

#include <torch/extension.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "compressor_handle.hpp"
#include "ordered_worker.hpp"
#include "process_group.hpp"

namespace gradcomp_py {

class hook_steps {
 public:
  /// The steps of one hook state over `group` (a torch.distributed ProcessGroup).
  explicit hook_steps(const pybind11::object& group);

  /// A dense warm-up step: the ranks agree on `settings`, then `bucket` is divided by the
  /// world size and all-reduced in place (torch's allreduce_hook). Returns the Future.
  pybind11::object dense(const torch::Tensor& bucket, const std::vector<named_value>& settings, bool last);

  /// A compressed step of bucket `index`: with `cyclic` (ScaleCom's exchange, when
  /// `is_cyclic`) two agreements and its broadcast and reduce; with `sparse` (Ok-Topk's
  /// global top-k, when `is_sparse`) an agreement on the hook's settings, then comm::sparse_allreduce, the
  /// commit staged like the others'; otherwise `c` stages its step
  /// and the messages are gathered in one all-gather padded to the bucket's bound
  /// (bucket_gather.hpp). `error`: what this rank met before (then `c` may be None), told
  /// to every rank in the exchange. The Future's value is the mean of the ranks' messages,
  /// in the bucket's dtype; its error, the same gradcomp::error on every rank.
  pybind11::object compressed(std::int64_t index, std::shared_ptr<compressor_handle> c,
                              std::shared_ptr<cyclic_handle> cyclic, bool is_cyclic, const torch::Tensor& bucket,
                              const std::vector<named_value>& settings, const reported_error& error, bool last,
                              std::shared_ptr<sparse_handle> sparse, bool is_sparse);

  /// Bytes this rank has put into the steps' collectives (read at any time).
  [[nodiscard]] std::uint64_t bytes_sent() const { return shared_->bytes.load(); }
  /// Collectives the steps have issued (read at any time).
  [[nodiscard]] std::uint64_t collectives() const { return shared_->collectives.load(); }

 private:
  /// What the jobs keep between them (touched by the worker's thread only, but `bytes`).
  struct shared {
    std::map<std::int64_t, std::size_t> bounds;  // each bucket's frame bound
    std::vector<std::function<void()>> staged;   // this step's staged buckets' accepts
    bool step_failed = false;
    std::atomic<std::uint64_t> bytes{0};
    std::atomic<std::uint64_t> collectives{0};
  };
  using work = std::function<torch::Tensor(transport&, const torch::Tensor& bucket)>;

  /// Queues `job` for `bucket` and returns its Future.
  pybind11::object submit(const torch::Tensor& bucket, bool last, work job);

  group_ptr group_;
  std::shared_ptr<ordered_worker> worker_;
  std::shared_ptr<shared> shared_ = std::make_shared<shared>();
};

}  // namespace gradcomp_py
