// A thread of its own that runs jobs one at a time in the order they were submitted:
// where the DDP hook's collectives run (ddp_steps.hpp). DDP calls the hook bucket by
// bucket in the same order on every rank; a job that issues its collectives from here
// issues them in that order on every rank, whatever thread completes which collective
// (a collective issued from a completion callback could interleave with another
// bucket's differently on two ranks: a hang, or two buckets' bytes mixed up).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

namespace gradcomp_py {

class ordered_worker {
 public:
  /// The worker of the process group at `group` (one per group, shared by every hook
  /// state on it, so that their collectives on the group keep one order too).
  static std::shared_ptr<ordered_worker> of(const void* group) {
    static std::mutex registry_lock;
    static auto* registry = new std::map<const void*, std::weak_ptr<ordered_worker>>;  // never destroyed at exit
    const std::lock_guard<std::mutex> lock(registry_lock);
    std::shared_ptr<ordered_worker> w = (*registry)[group].lock();
    if (!w) {
      w = std::make_shared<ordered_worker>();
      (*registry)[group] = w;
    }
    return w;
  }

  ordered_worker() : queue_(std::make_shared<queue>()) {
    // Detached, holding the queue: nothing joins it (a job may wait in a collective for a
    // rank that has died, and the interpreter's exit must not wait for that), and it ends
    // when the last owner is gone and the queue is empty.
    std::thread([q = queue_] { q->run(); }).detach();
  }
  ~ordered_worker() {
    const std::lock_guard<std::mutex> lock(queue_->mutex);
    queue_->stopping = true;
    queue_->ready.notify_one();
  }
  ordered_worker(const ordered_worker&) = delete;
  ordered_worker& operator=(const ordered_worker&) = delete;

  /// Runs `job` after every job submitted before it. `job` must not throw.
  void submit(std::function<void()> job) {
    const std::lock_guard<std::mutex> lock(queue_->mutex);
    queue_->jobs.push_back(std::move(job));
    queue_->ready.notify_one();
  }

 private:
  struct queue {
    std::mutex mutex;
    std::condition_variable ready;
    std::deque<std::function<void()>> jobs;
    bool stopping = false;

    void run() {
      for (;;) {
        std::function<void()> job;
        {
          std::unique_lock<std::mutex> lock(mutex);
          ready.wait(lock, [&] { return stopping || !jobs.empty(); });
          if (jobs.empty()) return;
          job = std::move(jobs.front());
          jobs.pop_front();
        }
        job();
      }
    }
  };
  std::shared_ptr<queue> queue_;
};

}  // namespace gradcomp_py
