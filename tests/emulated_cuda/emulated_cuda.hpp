// The CUDA runtime, the device built-ins, and the parts of CUB, Thrust and cooperative
// groups that gradcomp and its CUDA tests use, emulated on the CPU: the CUDA tests
// (tests/cuda/*.cu) compile with the host compiler against this and run every kernel of
// backend::cuda here, on machines without a GPU. Test code, not API.
//
// What it keeps of a GPU, so that a test passing here says something:
// - Each block's threads run as fibers, switched only at __syncthreads() and at warp
//   collectives (__ballot_sync, __shfl_sync, __syncwarp), in an order shuffled at every
//   barrier, and blocks run in a shuffled order: a kernel that reads what another thread
//   wrote without the barrier between them, or that depends on the order of its blocks,
//   gets different results in different orders. A barrier that not every thread reaches,
//   or a warp collective that a lane of its mask does not reach, aborts with a message.
// - Dynamic shared memory is filled with garbage before each block.
// - Work queued on a stream (kernels, asynchronous copies and memsets, CUB's device-wide
//   calls, stream-ordered frees) runs only when the host waits for it (a synchronize, a
//   copy to pageable memory, cudaFree), and then only the work that wait needs, each
//   stream in the order it was queued, the streams taken in a shuffled order: a host
//   that reads device results, or rewrites pinned memory a queued copy reads, without
//   waiting, or that waits for one stream and reads what another wrote, and a stream that
//   reads what another wrote with no event waited for between them, see what a GPU may
//   show them. The legacy default stream and the blocking streams wait for each other.
//   `host_waits()` counts the waits that found work queued.
// - cudaPointerGetAttributes tells device memory (cudaMalloc) from host memory.
// - A stream captured into a CUDA graph records its work, which each launch of the graph
//   queues again; a call that waits or allocates outside the stream's order during the
//   capture fails and invalidates it, as in the runtime's global capture mode.
// - A kernel's pointer argument to pageable host memory aborts (check_arguments).
// - Built with ThreadSanitizer, it tells TSan how CUDA orders work (`race`, below), so that
//   a data race within a block, between streams, or between the host and a stream is
//   reported, though a thread runs alone between barriers here.
// What it does not: memory is the host's, so a kernel that reads pageable memory through
// a pointer inside a structure passed to it works; a grid's blocks are ordered after the
// blocks that ran before them, so races between blocks of one grid and missing fences are
// not found; coalesced_threads() is each thread alone (a valid group); a function's
// __CUDA_ARCH__ branch is not compiled, its host branch runs instead; there is no second
// device and no timing. One host thread. x86-64 only (the fibers switch in assembly).
#pragma once

#ifndef __x86_64__
#error "tests/emulated_cuda switches fibers with x86-64 assembly"
#endif

#define GRADCOMP_EMULATED_CUDA 1

#include <sys/mman.h>

// Built with ThreadSanitizer (gcc says so with a macro, clang with a feature).
#if defined(__SANITIZE_THREAD__)
#define GRADCOMP_EMULATED_RACES 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define GRADCOMP_EMULATED_RACES 1
#endif
#endif
#if defined(GRADCOMP_EMULATED_RACES)
#include <linux/futex.h>
#include <sanitizer/tsan_interface.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <thread>
extern "C" void __tsan_ignore_thread_begin();
extern "C" void __tsan_ignore_thread_end();
#endif

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <type_traits>
#include <utility>
#include <vector>

// -- The CUDA keywords: kernels are functions, shared memory is static storage of the OS
// thread that runs the block (one block runs at a time on each; under TSan, the grid's
// second set of blocks runs on a second OS thread: block_sets).
#define __global__
#define __device__
#define __host__
#define __shared__ static thread_local
#define __forceinline__ inline
#define __launch_bounds__(...)

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3() = default;
  constexpr dim3(unsigned x_, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
// The built-in variables, set by the scheduler before it resumes a thread.
inline thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;

// -- Runtime types.
enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevice = 101,
  cudaErrorNotReady = 600,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
};
using cudaError = cudaError_t;
struct CUstream_st {
  std::size_t queue = 0;  // its queue of work (emulated_cuda::work_queue::streams)
};
struct CUevent_st {
  std::size_t stream = 0;  // the queue and id of the work it waits for (0: none)
  std::uint64_t id = 0;
};
using cudaStream_t = CUstream_st*;
using cudaEvent_t = CUevent_st*;
enum cudaStreamCaptureMode {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2
};
enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4
};
enum cudaMemoryType {
  cudaMemoryTypeUnregistered = 0,
  cudaMemoryTypeHost = 1,
  cudaMemoryTypeDevice = 2,
  cudaMemoryTypeManaged = 3
};
struct cudaPointerAttributes {
  cudaMemoryType type = cudaMemoryTypeUnregistered;
  int device = 0;
  void* devicePointer = nullptr;
  void* hostPointer = nullptr;
};
enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16, cudaDevAttrMemoryPoolsSupported = 115 };
inline constexpr unsigned cudaStreamDefault = 0;
inline constexpr unsigned cudaStreamNonBlocking = 1;
inline constexpr unsigned cudaEventDefault = 0;
inline constexpr unsigned cudaEventDisableTiming = 2;
inline constexpr unsigned cudaHostAllocDefault = 0;
inline constexpr unsigned cudaHostAllocMapped = 2;

// The fiber switch: saves the callee-saved registers and the FPU/SSE control words on
// the current stack, stores its pointer in *from, and continues on `to` (a pointer that
// this function stored, or a new fiber's prepared stack). A COMDAT section, so that
// every test that includes this defines it once.
extern "C" void gradcomp_emulated_switch(void** from, void* to);
asm(R"(
  .pushsection .text.gradcomp_emulated_switch,"axG",@progbits,gradcomp_emulated_switch,comdat
  .globl gradcomp_emulated_switch
  .type gradcomp_emulated_switch,@function
gradcomp_emulated_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $16, %rsp
  stmxcsr 8(%rsp)
  fnstcw (%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  fldcw (%rsp)
  ldmxcsr 8(%rsp)
  addq $16, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size gradcomp_emulated_switch, .-gradcomp_emulated_switch
  .popsection
)");

namespace emulated_cuda {

[[noreturn]] inline void fail(const char* what) {
  std::fprintf(stderr, "emulated CUDA: %s\n", what);
  std::fflush(stderr);
  std::abort();
}

// -- What ThreadSanitizer sees, in a build with -fsanitize=thread (ctest's races_* tests;
// without it these do nothing). Each stream's work runs as a TSan fiber of its own, and
// each of a block's threads as one per stream and thread index, ordered by
// happens-before only where CUDA orders them: a queued item after the host's calls that
// queued it and after the work it waits for (its stream's earlier work, events waited
// for, the legacy default stream's rule); the host after the work a wait or a query
// found done; a block's threads after the block's barriers (__syncthreads, __syncwarp;
// ballots and shuffles order no memory); a grid's blocks after its earlier blocks of the
// same set, and after blocks of the other set only through fences and atomics
// (block_sets). Any other two accesses to the same bytes, one a write and not both
// atomic, are a data race TSan reports: a plain read-modify-write where an atomic is
// needed, shared memory read without the barrier after its write, two blocks writing one
// word, the last block of a grid reading what the others wrote without the fences
// between, a stream reading what another writes with no event between them, a host
// writing pinned memory that a queued copy still reads, memory freed on one stream while
// another uses it. The emulation's own bookkeeping is left out (`unrecorded`).
namespace race {
enum item_token : unsigned { queued = 0, finished = 1 };
#if defined(GRADCOMP_EMULATED_RACES)
inline constexpr bool recorded = true;
inline void* current() { return __tsan_get_current_fiber(); }
inline void* create() { return __tsan_create_fiber(0); }
inline void destroy(void* fiber) {
  if (fiber != nullptr) __tsan_destroy_fiber(fiber);
}
inline void enter(void* fiber) { __tsan_switch_to_fiber(fiber, __tsan_switch_to_fiber_no_sync); }
inline void release(const void* token) { __tsan_release(const_cast<void*>(token)); }
inline void acquire(const void* token) { __tsan_acquire(const_cast<void*>(token)); }
// TSan keys happens-before by address: two bytes per queued item (by its id) stand for
// "queued" and "finished".
inline const unsigned char* token_of(std::uint64_t id, item_token which) {
  static std::vector<std::unique_ptr<unsigned char[]>> chunks;
  constexpr std::uint64_t chunk = std::uint64_t{1} << 16;
  const std::uint64_t at = 2 * id + which;
  while (chunks.size() <= at / chunk) chunks.push_back(std::make_unique<unsigned char[]>(chunk));
  return chunks[at / chunk].get() + at % chunk;
}
inline void release(std::uint64_t id, item_token which) { release(token_of(id, which)); }
inline void acquire(std::uint64_t id, item_token which) {
  if (id != 0) acquire(token_of(id, which));
}
// The emulation's bookkeeping, in a scope: not recorded.
struct unrecorded {
  unrecorded() { __tsan_ignore_thread_begin(); }
  ~unrecorded() { __tsan_ignore_thread_end(); }
  unrecorded(const unrecorded&) = delete;
  unrecorded& operator=(const unrecorded&) = delete;
};
#else
inline constexpr bool recorded = false;
inline void* current() { return nullptr; }
inline void* create() { return nullptr; }
inline void destroy(void*) {}
inline void enter(void*) {}
inline void release(const void*) {}
inline void acquire(const void*) {}
inline void release(std::uint64_t, item_token) {}
inline void acquire(std::uint64_t, item_token) {}
struct unrecorded {
  unrecorded() {}  // NOLINT: user-provided, so that a guard never reads as unused
  ~unrecorded() {}
  unrecorded(const unrecorded&) = delete;
  unrecorded& operator=(const unrecorded&) = delete;
};
#endif
}  // namespace race

// -- The grid's blocks in sets: under TSan, each block is drawn into one of two sets, the
// first run on the host's OS thread and the second on an OS thread of its own, which
// holds its own copy of the static shared memory (__shared__ is thread_local). A set's
// blocks are ordered one after another, as the plain emulation runs every block, and
// the two sets only as a GPU orders blocks: by a __threadfence() before atomics and one
// after them (fence()). So a race between two blocks, or a missing fence, is reported
// where the blocks fall in different sets: half the pairs, drawn anew at each launch
// (grid_run::fiber_of says why the second set's warps share a TSan fiber). One OS thread
// runs at a time; the handoff between them is hidden from TSan.
#if defined(GRADCOMP_EMULATED_RACES)
inline constexpr unsigned block_sets = 2;
namespace second_thread {
// Sets *word to `value` and wakes the other OS thread; waits until *word is `value`.
// Not instrumented, and a raw futex, so that TSan sees no order in the handoff itself.
__attribute__((no_sanitize("thread"))) inline void set(int* word, int value) {
  __atomic_store_n(word, value, __ATOMIC_SEQ_CST);
  syscall(SYS_futex, word, FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
}
__attribute__((no_sanitize("thread"))) inline void wait(int* word, int value) {
  for (int seen; (seen = __atomic_load_n(word, __ATOMIC_SEQ_CST)) != value;) {
    syscall(SYS_futex, word, FUTEX_WAIT_PRIVATE, seen, nullptr, nullptr, 0);
  }
}
struct state {
  int turn = 0;  // 1 while the thread runs `job`
  const std::function<void()>* job = nullptr;
  unsigned char started = 0;  // its start (its thread-local storage written), which its blocks follow
};
inline state shared;
[[noreturn]] inline void loop() {
  race::release(&shared.started);
  __tsan_ignore_thread_begin();  // the emulation's bookkeeping, all it does itself
  for (;;) {
    wait(&shared.turn, 1);
    (*shared.job)();
    set(&shared.turn, 0);
  }
}
// Made before main, ordered after nothing a stream did.
inline const bool started = [] {
  std::thread(loop).detach();
  return true;
}();
// Runs `job` there, and returns when it is done.
inline void run(const std::function<void()>& job) {
  shared.job = &job;
  set(&shared.turn, 1);
  wait(&shared.turn, 0);
}
inline const unsigned char* start_token() { return &shared.started; }
}  // namespace second_thread
#else
inline constexpr unsigned block_sets = 1;
namespace second_thread {
inline void run(const std::function<void()>&) { fail("a second set of blocks without TSan"); }
inline const unsigned char* start_token() { return nullptr; }
}  // namespace second_thread
#endif

// -- Contexts: a stack of its own (over a guard page), where its code stopped (the stack
// pointer gradcomp_emulated_switch saved), and its TSan fiber. A stream's items run on
// one, and each thread index of its kernels on one, made at first use and kept until the
// stream's queue is given to a new stream: then each stream's memory accesses, its
// stacks' included, are its own to TSan.
struct context {
  unsigned char* base = nullptr;  // the mapping, guard page first
  std::size_t bytes = 0;
  void* sp = nullptr;
  void* fiber = nullptr;
};
inline constexpr std::size_t guard_bytes = 4096;
// A new context's stack, as gradcomp_emulated_switch leaves one: the control words, six
// registers, and `entry` as the return address (16-byte aligned, as after a call).
inline void* prepare(unsigned char* top, void (*entry)()) {
  auto* slot = reinterpret_cast<std::uint64_t*>(reinterpret_cast<std::uintptr_t>(top) & ~std::uintptr_t{15}) - 2;
  slot[0] = reinterpret_cast<std::uint64_t>(entry);
  slot[1] = 0;
  std::uint64_t* sp = slot - 8;
  for (int r = 2; r < 8; ++r) sp[r] = 0;  // r15 .. rbp
  std::uint32_t mxcsr = 0;
  std::uint16_t fpu = 0;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(fpu));
  std::memcpy(reinterpret_cast<unsigned char*>(sp) + 8, &mxcsr, sizeof mxcsr);
  std::memcpy(sp, &fpu, sizeof fpu);
  return sp;
}
inline context make_context(std::size_t bytes, void (*entry)(), bool with_fiber = true) {
  void* p = mmap(nullptr, bytes + guard_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) fail("no memory for a stack");
  mprotect(p, guard_bytes, PROT_NONE);
  auto* base = static_cast<unsigned char*>(p);
  return {base, bytes, prepare(base + guard_bytes + bytes, entry), with_fiber ? race::create() : nullptr};
}
// Continues on `fiber` at `sp`, saving where this one stops in *save (every pointer read
// before TSan is told of the switch, so that the one switched from reads them).
inline void switch_to(void* fiber, void** save, void* sp) {
  race::enter(fiber);
  gradcomp_emulated_switch(save, sp);
}
inline void drop_context(context& c) {
  if (c.base == nullptr) return;
  munmap(c.base, c.bytes + guard_bytes);
  race::destroy(c.fiber);
  c = {};
}

// -- Memory: what cudaMalloc and cudaHostAlloc gave, by start.
struct allocation {
  std::size_t bytes;
  cudaMemoryType type;
};
inline std::map<std::uintptr_t, allocation>& allocations() {
  static std::map<std::uintptr_t, allocation> all;
  return all;
}
inline cudaMemoryType memory_type(const void* p) {
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  auto& all = allocations();
  auto it = all.upper_bound(at);
  if (it == all.begin()) return cudaMemoryTypeUnregistered;
  --it;
  return at < it->first + std::max<std::size_t>(it->second.bytes, 1) ? it->second.type : cudaMemoryTypeUnregistered;
}
inline void* allocate(std::size_t bytes, cudaMemoryType type) {
  const std::size_t rounded = (std::max<std::size_t>(bytes, 1) + 255) / 256 * 256;
  void* p = std::aligned_alloc(256, rounded);
  if (p == nullptr) return nullptr;
  std::memset(p, 0xA5, rounded);  // what cudaMalloc gives is not zero
  allocations()[reinterpret_cast<std::uintptr_t>(p)] = {bytes, type};
  return p;
}
inline bool release(void* p, cudaMemoryType type) {
  if (p == nullptr) return true;
  {
    race::unrecorded bookkeeping;  // a stream's item may run this
    auto& all = allocations();
    const auto it = all.find(reinterpret_cast<std::uintptr_t>(p));
    if (it == all.end() || it->second.type != type) return false;
    all.erase(it);
  }
  std::free(p);  // recorded: freeing memory that other work still uses races with it
  return true;
}

// The orders' seed: GRADCOMP_EMULATED_SEED, else a fixed one (every run the same).
// At namespace scope, so that it is made before main: a function's static is made at its
// first call, and TSan would order every later caller after that one.
inline std::mt19937_64 order_engine([] {
  const char* seed = std::getenv("GRADCOMP_EMULATED_SEED");
  return seed != nullptr ? std::strtoull(seed, nullptr, 10) : 20261130ull;
}());
inline std::mt19937_64& order_source() { return order_engine; }
// -- Streams: each a queue of its work in the order queued, run only when the host waits
// for some of it, and then only what that wait needs (the work before it on its stream
// and, transitively, the work on other streams that this waits for), taking the streams
// whose next work is ready in an order drawn from the seed: a host that waits for one
// stream and reads what another wrote, or a stream that reads another's results with no
// event waited for between them, sees what a GPU may show it. The legacy default stream
// (null) and the blocking streams wait for each other's earlier work; non-blocking
// streams wait only for events.
struct work_id {
  std::size_t stream = 0;  // the queue's index
  std::uint64_t id = 0;    // 1-based, in the order queued (0: nothing)
};
struct queued_work {
  std::uint64_t id;
  std::vector<work_id> after;  // work on other streams it waits for
  std::function<void()> run;
};
struct stream_queue {
  bool blocking = true;  // waits for, and is waited for by, the legacy default stream
  bool alive = true;     // its stream exists (a destroyed one's queued work still runs)
  std::deque<queued_work> pending;
  std::uint64_t last = 0;                                // the id of the last work queued on it
  std::vector<work_id> waited;                           // finished work an event wait ordered its next work after
  context runner;                                        // where its work runs
  std::array<std::vector<context>, block_sets> threads;  // where its kernels' threads run, by set and index
};
inline constexpr std::size_t runner_stack_bytes = 8 << 20;
inline constexpr std::size_t thread_stack_bytes = 256 * 1024;
// A queue given to a new stream starts afresh: new stacks and fibers, ordered after
// nothing the old stream did.
inline void renew(stream_queue& s, bool blocking, std::vector<std::uint64_t>& retired) {
  if (s.last != 0) retired.push_back(s.last);  // a wait for the whole device still covers it
  drop_context(s.runner);
  for (auto& set : s.threads) {
    for (context& c : set) drop_context(c);
  }
  s = stream_queue{};
  s.blocking = blocking;
}
struct work_queue {
  std::vector<stream_queue> streams = std::vector<stream_queue>(1);  // [0]: the legacy default stream
  std::uint64_t kernels = 0;                 // kernels launched (CUB's device-wide calls count as one each)
  cudaStream_t capturing = nullptr;          // the stream being captured into a graph, if any
  bool capture_invalidated = false;          // a call the capture does not allow was made
  std::vector<std::function<void()>> graph;  // the work captured
  std::uint64_t queued = 0;                  // items ever queued
  std::vector<std::uint64_t> retired;        // the last items of streams whose queue was renewed
  std::uint64_t waits = 0;                   // host waits that found work to run
};
inline work_queue& queue() {
  static work_queue q;
  return q;
}
inline std::size_t queue_of(cudaStream_t stream) { return stream == nullptr ? 0 : stream->queue; }
inline bool done(work_id w) {
  const auto& pending = queue().streams[w.stream].pending;
  return pending.empty() || pending.front().id > w.id;
}
// Whether new work on queue `s` waits for queue `t`'s earlier work by the legacy default
// stream's rule: the legacy stream's for the blocking streams', and theirs for its.
inline bool waits_by_legacy_rule(std::size_t s, std::size_t t) {
  const auto& streams = queue().streams;
  return s == 0 ? t != 0 && streams[t].blocking : t == 0 && streams[s].blocking;
}
// Whether a host wait for `s`'s work (tail()) covers `t`'s by that rule: always for a
// blocking stream; for the legacy stream only at an action.
inline bool wait_covers_by_legacy_rule(std::size_t s, std::size_t t, bool action) {
  return (s != 0 || action) && waits_by_legacy_rule(s, t);
}
// The item a stream's runner is running, and where the host waits for it.
struct item_run {
  std::size_t stream = 0;
  queued_work* work = nullptr;
  void* host_sp = nullptr;
  void* host_fiber = nullptr;
};
inline item_run& current_item() {
  static item_run r;
  return r;
}
// A stream's runner: runs the item it is given on the stream's own stack and fiber, after
// what the item waits for, then hands back to the host.
[[noreturn]] inline void runner_entry() {
  for (;;) {
    // What it reads of the emulation's state is read unrecorded, and no ignore is held
    // across the switch back (a runner is destroyed parked there, and TSan warns of a
    // fiber that ends with one; so for the threads' contexts in fiber_entry).
    const queued_work* work = nullptr;
    {
      race::unrecorded bookkeeping;
      work = current_item().work;
      race::acquire(work->id, race::queued);
      for (const work_id& a : work->after) race::acquire(a.id, race::finished);
    }
    work->run();
    void** save = nullptr;
    void* host_sp = nullptr;
    void* host_fiber = nullptr;
    {
      race::unrecorded bookkeeping;
      race::release(work->id, race::finished);
      const item_run& r = current_item();
      save = &queue().streams[r.stream].runner.sp;
      host_sp = r.host_sp;
      host_fiber = r.host_fiber;
    }
    switch_to(host_fiber, save, host_sp);
  }
}
inline void run_item(std::size_t s, queued_work& w) {
  item_run& r = current_item();
  if (r.work != nullptr) fail("a host wait inside a stream's work");
  r = {s, &w, nullptr, race::current()};
  context& runner = queue().streams[s].runner;
  switch_to(runner.fiber, &r.host_sp, runner.sp);
  current_item().work = nullptr;
}
inline std::uint64_t enqueue(cudaStream_t stream, std::function<void()> run, std::vector<work_id> after = {}) {
  work_queue& q = queue();
  if (q.capturing != nullptr && stream == q.capturing) {
    q.graph.push_back(std::move(run));
    return 0;
  }
  const std::size_t s = queue_of(stream);
  // Work on the legacy default stream would wait for a blocking stream under capture:
  // the runtime invalidates the capture (cudaErrorStreamCaptureImplicit).
  if (s == 0 && q.capturing != nullptr && q.streams[queue_of(q.capturing)].blocking) q.capture_invalidated = true;
  // What it waits for, finished or not (finished work holds nothing up; TSan orders after it).
  for (std::size_t t = 0; t < q.streams.size(); ++t) {
    if (!waits_by_legacy_rule(s, t)) continue;
    if (q.streams[t].last != 0) after.push_back({t, q.streams[t].last});
    after.insert(after.end(), q.streams[t].waited.begin(), q.streams[t].waited.end());
  }
  stream_queue& on = q.streams[s];
  after.insert(after.end(), on.waited.begin(), on.waited.end());
  on.waited.clear();
  if (on.runner.base == nullptr) on.runner = make_context(runner_stack_bytes, &runner_entry);
  const std::uint64_t id = ++q.queued;
  on.pending.push_back({id, std::move(after), std::move(run)});
  on.last = id;
  race::release(id, race::queued);
  return id;
}
// Runs the work `need` names (by stream, the last id needed) and what it waits for, the
// ready streams taken in a shuffled order, and now and then work that nothing waits for
// yet, which a GPU may also run early.
inline void run_needed(std::vector<std::uint64_t> need) {
  work_queue& q = queue();
  for (bool grew = true; grew;) {
    grew = false;
    for (std::size_t s = 0; s < q.streams.size(); ++s) {
      for (const queued_work& w : q.streams[s].pending) {
        if (w.id > need[s]) break;
        for (const work_id& a : w.after) {
          if (a.id > need[a.stream]) need[a.stream] = a.id, grew = true;
        }
      }
    }
  }
  bool waited = false;
  std::vector<std::size_t> ready, early;
  for (;;) {
    ready.clear();
    early.clear();
    bool left = false;
    for (std::size_t s = 0; s < q.streams.size(); ++s) {
      const auto& pending = q.streams[s].pending;
      if (pending.empty()) continue;
      const bool needed = pending.front().id <= need[s];
      left = left || needed;
      if (std::all_of(pending.front().after.begin(), pending.front().after.end(), done)) {
        (needed ? ready : early).push_back(s);
      }
    }
    if (!left) return;
    if (ready.empty()) fail("queued work that waits for itself");
    if (!waited) ++q.waits, waited = true;
    const auto& from = !early.empty() && order_source()() % 4 == 0 ? early : ready;
    const std::size_t s = from[order_source()() % from.size()];
    run_item(s, q.streams[s].pending.front());
    race::unrecorded bookkeeping;  // the host does not touch what the item read
    q.streams[s].pending.pop_front();
  }
}
// A host wait for `w` and what it waits for.
inline void run_until(work_id w) {
  if (!done(w)) {
    std::vector<std::uint64_t> need(queue().streams.size(), 0);
    need[w.stream] = w.id;
    run_needed(std::move(need));
  }
  race::acquire(w.id, race::finished);
}
// The host after the finished work of other streams that the legacy default stream's
// rule orders a wait for `s`'s work after, which tail() queues no item for (TSan).
inline void acquire_legacy_rule(std::size_t s, bool action) {
  const auto& streams = queue().streams;
  for (std::size_t t = 0; t < streams.size(); ++t) {
    if (wait_covers_by_legacy_rule(s, t, action)) race::acquire(streams[t].last, race::finished);
  }
}
// All of `stream`'s work so far: its last; for a blocking stream, also the legacy default
// stream's work queued after that, and for the legacy stream at an action (an event
// recorded, a synchronous copy), the blocking streams' work queued after its last, which
// an empty item queued then holds.
inline work_id tail(cudaStream_t stream, bool action) {
  work_queue& q = queue();
  const std::size_t s = queue_of(stream);
  const auto newer = [&](std::size_t t) {
    return !q.streams[t].pending.empty() && q.streams[t].last > q.streams[s].last;
  };
  // An event wait the stream's next work has yet to carry (waited) also takes an item.
  bool held = !q.streams[s].waited.empty();
  for (std::size_t t = 0; t < q.streams.size(); ++t) {
    if (wait_covers_by_legacy_rule(s, t, action)) held = held || newer(t) || !q.streams[t].waited.empty();
  }
  return {s, held ? enqueue(stream, [] {}) : q.streams[s].last};
}
// A host wait for `stream`'s work (tail()).
inline void wait_for(cudaStream_t stream, bool action = true) {
  run_until(tail(stream, action));
  acquire_legacy_rule(queue_of(stream), action);
}
// A wait for the whole device (cudaDeviceSynchronize, cudaFree).
inline void run_all() {
  std::vector<std::uint64_t> need;
  for (const stream_queue& s : queue().streams) need.push_back(s.last);
  run_needed(std::move(need));
  for (const stream_queue& s : queue().streams) race::acquire(s.last, race::finished);
  for (const std::uint64_t id : queue().retired) race::acquire(id, race::finished);
  queue().retired.clear();  // the host is ordered after them from now on
}
/// How many times the host waited for queued work (a synchronize, a copy to pageable
/// memory, a free).
inline std::uint64_t host_waits() { return queue().waits; }
/// How many kernels were launched (a CUB device-wide call counts as one).
inline std::uint64_t kernels_launched() { return queue().kernels; }
/// How many items were queued on streams (kernels, copies, memsets, frees).
inline std::uint64_t items_queued() { return queue().queued; }

inline cudaError_t& last_error() {
  static cudaError_t e = cudaSuccess;
  return e;
}
inline cudaError_t report(cudaError_t e) {
  if (e != cudaSuccess) last_error() = e;
  return e;
}
// Whether a capture is under way: a call that would wait for the device, allocate or
// free memory outside the stream's order then fails and invalidates it, as the
// runtime's global capture mode has it.
inline bool refused_while_capturing() {
  if (queue().capturing == nullptr) return false;
  queue().capture_invalidated = true;
  report(cudaErrorStreamCaptureUnsupported);
  return true;
}

// -- Fibers: a block's threads, each on its stream's context for its index.
enum class waiting : std::uint8_t { no, at_block_barrier, at_warp_collective, done };
struct fiber {
  std::uint32_t mask = 0;                // a warp collective's lanes
  int kind = 0;                          // which collective (a ballot meets only ballots)
  std::uint64_t value = 0;               // what this lane brings to it
  unsigned barriers = 0;                 // __syncthreads() passed in this block
  unsigned syncwarps = 0;                // __syncwarp() passed in this block
  bool fenced = false;                   // passed a __threadfence(): its atomics release (TSan)
  std::array<const void*, 8> updated{};  // the last locations it updated atomically since a fence (TSan)
};
// A grid's happens-before tokens (TSan keys them by address, so each grid has new ones):
// its start, its threads' ends, and each set's chain by the parity of its blocks (a
// block's threads follow the set's earlier blocks, not each other); and a block's: the
// barriers by parity, and each lane's __syncwarp by parity.
enum grid_token : std::size_t { grid_start = 0, grid_end = 1, set_chain = 2 };
inline constexpr std::size_t grid_tokens = set_chain + 2 * block_sets;
enum block_token : std::size_t { block_barrier = 0, lane_barrier = 2 };
inline constexpr std::size_t block_tokens(unsigned threads) { return lane_barrier + 2 * std::size_t{threads}; }
// A grid's run on one set of blocks.
struct grid_run {
  unsigned set = 0;
  unsigned blocks_run = 0;                      // the set's blocks run so far
  const unsigned char* grid = nullptr;          // the grid's tokens
  const unsigned char* thread_start = nullptr;  // the set's OS thread's start, where not the host's
  // By thread index: what each waits for, apart from the rest of its fiber, as the
  // scheduler reads every thread's between rounds (read from the 360-byte fibers, 7% more
  // time in the emulated tests, 2026-12-01).
  std::vector<waiting> states;
  std::vector<fiber> fibers;
  // By warp: what each lane brought to the warp's last collective, which its lanes read
  // as they resume (before any of them can reach the next).
  std::vector<std::array<std::uint64_t, 32>> warp_values;
  context* contexts = nullptr;  // the stream's, by thread index
  // The TSan fiber thread t runs on: its own in the first set; its warp's in the second,
  // so that a stream's fibers stay within TSan's 256 clock slots (past them, slots pass
  // between fibers and order what they ran, and races between blocks went unreported).
  void* fiber_of(unsigned t) const { return contexts[set == 0 ? t : t / 32 * 32].fiber; }
  // The set's chain token a block acquires when `blocks` of the set ran before it; it
  // releases the next one.
  const unsigned char* chain(unsigned blocks) const { return &grid[set_chain + 2 * set + blocks % 2]; }
  void* scheduler_sp = nullptr;
  void* scheduler_fiber = nullptr;
  unsigned current = 0;
  const std::function<void()>* kernel = nullptr;
  std::vector<unsigned char> dynamic_shared;
  std::unique_ptr<unsigned char[]> tokens;
};
inline thread_local grid_run* running = nullptr;

// A thread's context runs a block's thread at each resume after it finished one.
[[noreturn]] inline void fiber_entry() {
  for (;;) {
    grid_run* run = nullptr;
    {
      race::unrecorded bookkeeping;
      run = running;
      race::acquire(&run->grid[grid_start]);
      race::acquire(run->chain(run->blocks_run));
      if (run->thread_start != nullptr) race::acquire(run->thread_start);
    }
    (*run->kernel)();
    void** save = nullptr;
    {
      race::unrecorded bookkeeping;
      race::release(run->chain(run->blocks_run + 1));
      race::release(&run->grid[grid_end]);
      run->states[run->current] = waiting::done;
      save = &run->contexts[run->current].sp;
    }
    switch_to(run->scheduler_fiber, save, run->scheduler_sp);
  }
}

// The orders a block's threads run in between barriers: eight shuffles of [0, threads),
// drawn once per block size and taken in turn (a shuffle per barrier took a tenth of the
// emulated tests' time).
inline std::map<unsigned, std::array<std::vector<unsigned>, 8>> thread_orders;  // made before main (order_engine)
inline const std::vector<unsigned>& thread_order(unsigned threads, std::uint64_t turn) {
  auto [it, fresh] = thread_orders.try_emplace(threads);
  if (fresh) {
    for (auto& order : it->second) {
      order.resize(threads);
      std::iota(order.begin(), order.end(), 0u);
      std::shuffle(order.begin(), order.end(), order_source());
    }
  }
  return it->second[turn % 8];
}

// Called by a thread: waits, as `how`, until the scheduler lets it go on; at
// __syncthreads(), then ordered after what the block's threads wrote before it.
// No ignore is held across the switch: the next thread may run on the same TSan fiber.
inline void wait_as(waiting how) {
  const unsigned char* token = nullptr;
  void* scheduler = nullptr;
  void** save = nullptr;
  void* scheduler_sp = nullptr;
  {
    race::unrecorded bookkeeping;
    grid_run& run = *running;
    const unsigned t = run.current;
    if (how == waiting::at_block_barrier) token = &run.tokens[block_barrier + run.fibers[t].barriers % 2];
    run.states[t] = how;
    if (token != nullptr) race::release(token);
    scheduler = run.scheduler_fiber;
    save = &run.contexts[t].sp;
    scheduler_sp = run.scheduler_sp;
  }
  switch_to(scheduler, save, scheduler_sp);
  if (token != nullptr) race::acquire(token);
}

// The lanes of warp `first / 32` waiting at a collective of mask `mask`, all there: let
// them go on, each with every lane's value.
inline bool release_warp(grid_run& run, unsigned first, unsigned threads) {
  for (unsigned lane = 0; lane < 32 && first + lane < threads; ++lane) {
    if (run.states[first + lane] != waiting::at_warp_collective) continue;
    const fiber& f = run.fibers[first + lane];
    const std::uint32_t mask = f.mask;
    std::array<std::uint64_t, 32> got{};
    bool all_there = true;
    for (unsigned l = 0; l < 32; ++l) {
      if ((mask >> l & 1u) == 0) continue;
      if (first + l >= threads) fail("a warp collective names a lane past the block");
      const fiber& other = run.fibers[first + l];
      const waiting state = run.states[first + l];
      if (state == waiting::done) fail("a warp collective names a lane that has returned");
      if (state != waiting::at_warp_collective || other.mask != mask || other.kind != f.kind) {
        all_there = false;
        break;
      }
      got[l] = other.value;
    }
    if (!all_there) continue;
    run.warp_values[first / 32] = got;
    for (unsigned l = 0; l < 32; ++l) {
      if ((mask >> l & 1u) != 0) run.states[first + l] = waiting::no;
    }
    return true;
  }
  return false;
}

inline void run_block(grid_run& run, unsigned threads) {
  run.states.assign(threads, waiting::no);
  run.fibers.assign(threads, fiber{});
  run.warp_values.resize((threads + 31) / 32);
  static std::uint64_t turn = 0;
  for (;;) {
    for (const unsigned t : thread_order(threads, turn++)) {
      if (run.states[t] != waiting::no) continue;
      threadIdx = dim3(t);
      run.current = t;
      switch_to(run.fiber_of(t), &run.scheduler_sp, run.contexts[t].sp);
    }
    // Every thread has returned or waits.
    bool released = false;
    for (unsigned first = 0; first < threads; first += 32) released = release_warp(run, first, threads) || released;
    if (released) continue;
    bool any_at_barrier = false;
    bool all_at_barrier = true;
    for (const waiting state : run.states) {
      if (state == waiting::at_block_barrier) any_at_barrier = true;
      if (state == waiting::at_warp_collective) all_at_barrier = false;
    }
    if (!any_at_barrier && all_at_barrier) return;  // every thread returned
    if (!all_at_barrier) fail("deadlock: a warp collective that not every lane of its mask reaches");
    for (const waiting state : run.states) {
      if (state == waiting::done) fail("__syncthreads() that a returned thread of the block never reaches");
    }
    for (unsigned t = 0; t < threads; ++t) {
      if (run.states[t] == waiting::at_block_barrier) run.states[t] = waiting::no, ++run.fibers[t].barriers;
    }
  }
}

// Runs blocks [first, last) of a grid on the OS thread it is called on.
inline void run_blocks(grid_run& run, const unsigned* first, const unsigned* last, unsigned grid, unsigned threads) {
  run.scheduler_fiber = race::current();
  running = &run;
  gridDim = dim3(grid);
  blockDim = dim3(threads);
  for (; first != last; ++first) {
    blockIdx = dim3(*first);
    std::fill(run.dynamic_shared.begin(), run.dynamic_shared.end(), static_cast<unsigned char>(0xA5));
    run.tokens = std::make_unique<unsigned char[]>(block_tokens(threads));  // two per thread
    run_block(run, threads);
    ++run.blocks_run;
    run.tokens.reset();  // freed, TSan forgets the block's tokens
  }
  running = nullptr;
}
// Runs on the runner of the stream whose item launched it: the blocks in a shuffled
// order, each drawn into a set (block_sets), each run of one set's blocks on its OS thread.
inline void run_grid(unsigned grid, unsigned threads, std::size_t shared, const std::function<void()>& kernel) {
  race::unrecorded bookkeeping;
  if (running != nullptr) fail("a kernel launched from a kernel");
  auto& sets = queue().streams[current_item().stream].threads;
  const auto tokens = std::make_unique<unsigned char[]>(grid_tokens);
  std::array<grid_run, block_sets> runs;
  for (unsigned s = 0; s < block_sets; ++s) {
    while (sets[s].size() < threads) {
      const std::size_t t = sets[s].size();
      sets[s].push_back(make_context(thread_stack_bytes, &fiber_entry, s == 0 || t % 32 == 0));
    }
    runs[s].set = s;
    runs[s].grid = tokens.get();
    runs[s].thread_start = s == 0 ? nullptr : second_thread::start_token();
    runs[s].kernel = &kernel;
    runs[s].contexts = sets[s].data();
    runs[s].dynamic_shared.resize(std::max<std::size_t>(shared, 1));
  }
  std::vector<unsigned> blocks(grid);
  std::iota(blocks.begin(), blocks.end(), 0u);
  std::shuffle(blocks.begin(), blocks.end(), order_source());
  // The first block in the first set, where each thread is its own TSan fiber: a grid of
  // one block is checked within its warps too.
  std::vector<unsigned> set_of(grid, 0);
  for (std::size_t i = 1; i < grid; ++i) {
    set_of[i] = block_sets == 1 ? 0 : static_cast<unsigned>(order_source()() % block_sets);
  }
  race::release(&tokens[grid_start]);
  for (std::size_t from = 0; from < grid;) {
    std::size_t to = from + 1;
    while (to < grid && set_of[to] == set_of[from]) ++to;
    grid_run& run = runs[set_of[from]];
    const std::function<void()> job = [&, from, to] {
      run_blocks(run, blocks.data() + from, blocks.data() + to, grid, threads);
    };
    if (run.set == 0) {
      job();
    } else {
      second_thread::run(job);
    }
    from = to;
  }
  race::acquire(&tokens[grid_end]);
}

/// Aborts, naming the launch, where a kernel's pointer argument points to pageable host
/// memory, which a kernel reads here (memory is the host's) and which faults on a GPU;
/// device and pinned memory, their ends, and null pass. Only the arguments themselves
/// are seen, not pointers inside the structures passed.
template <class... Args>
void check_arguments(const char* what, const Args&... args) {
  const auto check = [&](const auto& arg) {
    using T = std::remove_cvref_t<decltype(arg)>;
    if constexpr (std::is_pointer_v<T> && !std::is_function_v<std::remove_pointer_t<T>>) {
      const auto* p =
          static_cast<const unsigned char*>(const_cast<const void*>(static_cast<const volatile void*>(arg)));
      if (p == nullptr || memory_type(p) != cudaMemoryTypeUnregistered ||
          memory_type(p - 1) != cudaMemoryTypeUnregistered) {
        return;
      }
      std::fprintf(stderr, "emulated CUDA: %s: a kernel argument points to pageable host memory\n", what);
      std::fflush(stderr);
      std::abort();
    }
  };
  (check(args), ...);
}

/// Queues `kernel` over `grid` blocks of `threads` threads on `stream`: what
/// gradcomp::detail::cuda_launch::launch does with `<<<...>>>` under nvcc.
inline void launch(unsigned grid, unsigned threads, std::size_t shared, cudaStream_t stream,
                   std::function<void()> kernel) {
  if (grid == 0 || threads == 0 || threads > 1024 || shared > 48 * 1024) {
    report(cudaErrorInvalidConfiguration);
    return;
  }
  ++queue().kernels;
  enqueue(stream, [=, kernel = std::move(kernel)] { run_grid(grid, threads, shared, kernel); });
}

/// The running block's dynamic shared memory.
inline void* dynamic_shared() { return running->dynamic_shared.data(); }

// Called by a thread: waits for the lanes of `mask` and returns what each brought.
inline std::array<std::uint64_t, 32> warp_collective(int kind, std::uint32_t mask, std::uint64_t value) {
  {
    race::unrecorded bookkeeping;
    grid_run& run = *running;
    fiber& self = run.fibers[run.current];
    if ((mask >> (run.current % 32) & 1u) == 0) fail("a warp collective called by a lane outside its mask");
    self.kind = kind;
    self.mask = mask;
    self.value = value;
  }
  wait_as(waiting::at_warp_collective);
  race::unrecorded bookkeeping;
  return running->warp_values[running->current / 32];
}
// __syncwarp(mask): a warp collective that also orders its lanes' memory (ballots and
// shuffles only exchange values). Each lane releases a token of its own, by the parity
// of its __syncwarp()s (a lane that goes on may reach one more before the others
// resume), and acquires those of the lanes it met, whose parities the collective brings.
inline void sync_warp(std::uint32_t mask) {
  const auto token = [](unsigned thread, std::uint64_t p) { return &running->tokens[lane_barrier + 2 * thread + p]; };
  unsigned t = 0;
  unsigned parity = 0;
  {
    race::unrecorded bookkeeping;
    t = running->current;
    parity = running->fibers[t].syncwarps++ % 2;
    race::release(token(t, parity));
  }
  const auto parities = warp_collective(1, mask, parity);
  race::unrecorded bookkeeping;
  for (unsigned l = 0; l < 32; ++l) {
    if ((mask >> l & 1u) != 0) race::acquire(token(t / 32 * 32 + l, parities[l]));
  }
}

}  // namespace emulated_cuda

// -- Device built-ins.
inline void __syncthreads() { emulated_cuda::wait_as(emulated_cuda::waiting::at_block_barrier); }
inline void __syncwarp(unsigned mask = 0xFFFFFFFFu) { emulated_cuda::sync_warp(mask); }
inline unsigned __ballot_sync(unsigned mask, int predicate) {
  const auto got = emulated_cuda::warp_collective(2, mask, predicate != 0 ? 1 : 0);
  unsigned bits = 0;
  for (unsigned l = 0; l < 32; ++l) {
    if ((mask >> l & 1u) != 0 && got[l] != 0) bits |= 1u << l;
  }
  return bits;
}
template <class T>
T __shfl_sync(unsigned mask, T var, int source, int width = 32) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>);
  std::uint64_t bits = 0;
  std::memcpy(&bits, &var, sizeof(T));
  if (width <= 0 || width > 32 || (width & (width - 1)) != 0) emulated_cuda::fail("__shfl_sync: width");
  const auto got = emulated_cuda::warp_collective(3, mask, bits);
  const unsigned lane = threadIdx.x % 32;
  const auto w = static_cast<unsigned>(width);
  const unsigned from = (lane & ~(w - 1)) + (static_cast<unsigned>(source) & (w - 1));
  if ((mask >> from & 1u) == 0) emulated_cuda::fail("__shfl_sync from a lane outside its mask");
  T out;
  std::memcpy(&out, &got[from], sizeof(T));
  return out;
}
namespace emulated_cuda {
// CUDA's fences, to TSan: a fence and an atomic update after it release what the thread
// did before the fence, and an atomic update and a fence after it acquire what was
// released through the location it updated (the fence-fence synchronization of CUDA's
// memory model, for the last 8 locations a thread updated since its last fence).
inline void fence() {
  if constexpr (race::recorded) {
    race::unrecorded bookkeeping;
    if (running == nullptr) return;
    fiber& self = running->fibers[running->current];
    self.fenced = true;
    for (const void*& at : self.updated) {
      if (at != nullptr) race::acquire(at);
      at = nullptr;
    }
  }
}
// Notes an atomic update of `at` by the running thread; whether it releases.
inline bool update_releases(const void* at) {
  if constexpr (race::recorded) {
    race::unrecorded bookkeeping;
    if (running == nullptr) return false;
    fiber& self = running->fibers[running->current];
    auto it = std::find(self.updated.begin(), self.updated.end(), at);
    if (it == self.updated.end()) --it;  // the oldest goes
    std::rotate(self.updated.begin(), it, it + 1);
    self.updated[0] = at;
    return self.fenced;
  }
  return false;
}
// A device atomic: relaxed, as CUDA's are (a release after a fence), and seen as atomic by TSan.
template <class T, class Next>
T atomic_update(T* at, Next next) {
  const bool releases = update_releases(at);
  T seen;
  __atomic_load(at, &seen, __ATOMIC_RELAXED);
  for (;;) {
    T want = next(seen);
    T expected = seen;
    if (releases ? __atomic_compare_exchange(at, &expected, &want, false, __ATOMIC_RELEASE, __ATOMIC_RELAXED)
                 : __atomic_compare_exchange(at, &expected, &want, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
      return seen;
    }
    seen = expected;
  }
}
}  // namespace emulated_cuda
inline void __threadfence() { emulated_cuda::fence(); }
template <class T>
T atomicAdd(T* at, T value) {
  return emulated_cuda::atomic_update(at, [&](T old) { return static_cast<T>(old + value); });
}
template <class T>
T atomicOr(T* at, T value) {
  return emulated_cuda::atomic_update(at, [&](T old) { return static_cast<T>(old | value); });
}
template <class T>
T atomicMax(T* at, T value) {
  return emulated_cuda::atomic_update(at, [&](T old) { return old < value ? value : old; });
}
template <class T>
T atomicCAS(T* at, T compare, T value) {
  return emulated_cuda::atomic_update(at, [&](T old) { return old == compare ? value : old; });
}
inline int __popc(unsigned x) { return std::popcount(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline unsigned __float_as_uint(float x) { return std::bit_cast<unsigned>(x); }
inline float __uint_as_float(unsigned x) { return std::bit_cast<float>(x); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
template <class T>
T max(T a, T b) {
  return a < b ? b : a;
}

// -- The runtime API.
inline cudaError_t cudaGetLastError() { return std::exchange(emulated_cuda::last_error(), cudaSuccess); }
inline cudaError_t cudaPeekAtLastError() { return emulated_cuda::last_error(); }
inline const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorNotReady:
      return "cudaErrorNotReady";
    case cudaErrorStreamCaptureUnsupported:
      return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated:
      return "cudaErrorStreamCaptureInvalidated";
  }
  return "cudaErrorUnknown";
}
inline const char* cudaGetErrorString(cudaError_t e) { return cudaGetErrorName(e); }

inline cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}
inline cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
inline cudaError_t cudaSetDevice(int device) {
  return device == 0 ? cudaSuccess : emulated_cuda::report(cudaErrorInvalidDevice);
}
inline cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attribute, int device) {
  if (device != 0) return emulated_cuda::report(cudaErrorInvalidDevice);
  // Two multiprocessors: grid_for's grids (8 blocks each) stay small.
  *value = attribute == cudaDevAttrMultiProcessorCount ? 2 : 1;
  return cudaSuccess;
}

inline cudaError_t cudaMalloc(void** p, std::size_t bytes) {
  if (emulated_cuda::refused_while_capturing()) return cudaErrorStreamCaptureUnsupported;
  *p = emulated_cuda::allocate(bytes, cudaMemoryTypeDevice);
  return *p != nullptr ? cudaSuccess : emulated_cuda::report(cudaErrorMemoryAllocation);
}
template <class T>
cudaError_t cudaMalloc(T** p, std::size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(p), bytes);
}
inline cudaError_t cudaMallocAsync(void** p, std::size_t bytes, cudaStream_t) { return cudaMalloc(p, bytes); }
inline cudaError_t cudaFree(void* p) {
  if (emulated_cuda::refused_while_capturing()) return cudaErrorStreamCaptureUnsupported;
  emulated_cuda::run_all();  // cudaFree waits for the device
  return emulated_cuda::release(p, cudaMemoryTypeDevice) ? cudaSuccess : emulated_cuda::report(cudaErrorInvalidValue);
}
inline cudaError_t cudaFreeAsync(void* p, cudaStream_t stream) {
  if (p != nullptr && emulated_cuda::memory_type(p) != cudaMemoryTypeDevice) {
    return emulated_cuda::report(cudaErrorInvalidValue);
  }
  // Captured, the memory stays for every replay (a graph's allocations keep their
  // addresses): the test leaks it.
  if (emulated_cuda::queue().capturing != nullptr && stream == emulated_cuda::queue().capturing) return cudaSuccess;
  emulated_cuda::enqueue(stream, [p] { emulated_cuda::release(p, cudaMemoryTypeDevice); });
  return cudaSuccess;
}
inline cudaError_t cudaHostAlloc(void** p, std::size_t bytes, unsigned) {
  *p = emulated_cuda::allocate(bytes, cudaMemoryTypeHost);
  return *p != nullptr ? cudaSuccess : emulated_cuda::report(cudaErrorMemoryAllocation);
}
inline cudaError_t cudaMallocHost(void** p, std::size_t bytes) { return cudaHostAlloc(p, bytes, 0); }
template <class T>
cudaError_t cudaMallocHost(T** p, std::size_t bytes) {
  return cudaHostAlloc(reinterpret_cast<void**>(p), bytes, 0);
}
inline cudaError_t cudaFreeHost(void* p) {
  if (emulated_cuda::refused_while_capturing()) return cudaErrorStreamCaptureUnsupported;
  emulated_cuda::run_all();
  return emulated_cuda::release(p, cudaMemoryTypeHost) ? cudaSuccess : emulated_cuda::report(cudaErrorInvalidValue);
}
inline cudaError_t cudaHostGetDevicePointer(void** device, void* host, unsigned) {
  if (emulated_cuda::memory_type(host) != cudaMemoryTypeHost) return emulated_cuda::report(cudaErrorInvalidValue);
  *device = host;
  return cudaSuccess;
}
inline cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* p) {
  *attributes = {};
  attributes->type = emulated_cuda::memory_type(p);
  if (attributes->type == cudaMemoryTypeDevice) attributes->devicePointer = const_cast<void*>(p);
  if (attributes->type == cudaMemoryTypeHost) attributes->hostPointer = const_cast<void*>(p);
  return cudaSuccess;
}

// A copy to pageable host memory waits for the stream and is done when the call returns;
// one from pageable memory takes its bytes at once and writes them in stream order, as
// the runtime's staged copies do; every other copy is queued.
inline cudaError_t cudaMemcpyAsync(void* to, const void* from, std::size_t bytes, cudaMemcpyKind, cudaStream_t stream) {
  using emulated_cuda::memory_type;
  if (bytes == 0) return cudaSuccess;
  const bool pageable =
      memory_type(to) == cudaMemoryTypeUnregistered || memory_type(from) == cudaMemoryTypeUnregistered;
  if (pageable && emulated_cuda::refused_while_capturing()) return cudaErrorStreamCaptureUnsupported;
  if (memory_type(to) == cudaMemoryTypeUnregistered) {
    emulated_cuda::wait_for(stream);
    std::memmove(to, from, bytes);
  } else if (memory_type(from) == cudaMemoryTypeUnregistered) {
    const auto* first = static_cast<const unsigned char*>(from);
    emulated_cuda::enqueue(stream, [to, staged = std::vector<unsigned char>(first, first + bytes)] {
      std::memcpy(to, staged.data(), staged.size());
    });
  } else {
    emulated_cuda::enqueue(stream, [=] { std::memmove(to, from, bytes); });
  }
  return cudaSuccess;
}
// Synchronous as the runtime has it: device to device queued on the legacy default
// stream with no wait; from pageable memory to the device, after that stream's work,
// the bytes taken at once and written in its order; every other copy done on return.
inline cudaError_t cudaMemcpy(void* to, const void* from, std::size_t bytes, cudaMemcpyKind kind) {
  using emulated_cuda::memory_type;
  if (emulated_cuda::refused_while_capturing()) return cudaErrorStreamCaptureUnsupported;
  if (memory_type(to) == cudaMemoryTypeDevice && memory_type(from) != cudaMemoryTypeHost) {
    if (memory_type(from) != cudaMemoryTypeDevice) emulated_cuda::wait_for(nullptr);
    return cudaMemcpyAsync(to, from, bytes, kind, nullptr);
  }
  emulated_cuda::wait_for(nullptr);
  if (bytes != 0) std::memmove(to, from, bytes);
  return cudaSuccess;
}
inline cudaError_t cudaMemsetAsync(void* p, int value, std::size_t bytes, cudaStream_t stream) {
  if (bytes != 0 && emulated_cuda::memory_type(p) != cudaMemoryTypeDevice) {
    return emulated_cuda::report(cudaErrorInvalidValue);
  }
  emulated_cuda::enqueue(stream, [=] { std::memset(p, value, bytes); });
  return cudaSuccess;
}
// Asynchronous for device memory, as the runtime has it.
inline cudaError_t cudaMemset(void* p, int value, std::size_t bytes) {
  return cudaMemsetAsync(p, value, bytes, nullptr);
}

inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags) {
  // A queue of its own, or a destroyed stream's once its work has run.
  auto& streams = emulated_cuda::queue().streams;
  std::size_t s = 1;
  while (s < streams.size() && (streams[s].alive || !streams[s].pending.empty())) ++s;
  if (s == streams.size()) streams.emplace_back();
  emulated_cuda::renew(streams[s], /*blocking=*/(flags & cudaStreamNonBlocking) == 0, emulated_cuda::queue().retired);
  *stream = new CUstream_st{s};
  return cudaSuccess;
}
inline cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithFlags(stream, 0); }
inline cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (stream == nullptr) return emulated_cuda::report(cudaErrorInvalidValue);
  emulated_cuda::queue().streams[emulated_cuda::queue_of(stream)].alive = false;  // its queued work still runs
  delete stream;
  return cudaSuccess;
}
inline cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  if (emulated_cuda::refused_while_capturing()) return cudaErrorStreamCaptureUnsupported;
  emulated_cuda::wait_for(stream, /*action=*/false);
  return cudaSuccess;
}
inline cudaError_t cudaStreamQuery(cudaStream_t stream) {
  if (emulated_cuda::refused_while_capturing()) return cudaErrorStreamCaptureUnsupported;
  const emulated_cuda::work_id last = emulated_cuda::tail(stream, /*action=*/false);
  if (!emulated_cuda::done(last)) return emulated_cuda::report(cudaErrorNotReady);
  emulated_cuda::race::acquire(last.id, emulated_cuda::race::finished);  // the host may read its results
  emulated_cuda::acquire_legacy_rule(last.stream, /*action=*/false);
  return cudaSuccess;
}
inline cudaError_t cudaDeviceSynchronize() {
  if (emulated_cuda::refused_while_capturing()) return cudaErrorStreamCaptureUnsupported;
  emulated_cuda::run_all();
  return cudaSuccess;
}
inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned) {
  *event = new CUevent_st;
  return cudaSuccess;
}
inline cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, 0); }
inline cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete event;
  return cudaSuccess;
}
inline cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = nullptr) {
  const emulated_cuda::work_id last = emulated_cuda::tail(stream, /*action=*/true);
  event->stream = last.stream;
  event->id = last.id;
  return cudaSuccess;
}
inline cudaError_t cudaEventQuery(cudaEvent_t event) {
  if (emulated_cuda::refused_while_capturing()) return cudaErrorStreamCaptureUnsupported;
  if (!emulated_cuda::done({event->stream, event->id})) return emulated_cuda::report(cudaErrorNotReady);
  emulated_cuda::race::acquire(event->id, emulated_cuda::race::finished);  // the host may read its results
  return cudaSuccess;
}
inline cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (emulated_cuda::refused_while_capturing()) return cudaErrorStreamCaptureUnsupported;
  emulated_cuda::run_until({event->stream, event->id});
  return cudaSuccess;
}
inline cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t, cudaEvent_t) {
  *ms = 0.0f;
  return cudaSuccess;
}
// The stream's later work waits for the event's: an empty item that waits for it.
inline cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned = 0) {
  const emulated_cuda::work_id recorded{event->stream, event->id};
  if (!emulated_cuda::done(recorded)) {
    emulated_cuda::enqueue(stream, [] {}, {recorded});
  } else if (recorded.id != 0) {
    emulated_cuda::queue().streams[emulated_cuda::queue_of(stream)].waited.push_back(recorded);
  }
  return cudaSuccess;
}

// -- Graphs: what a capture queued, queued again by each launch (the same arguments, as
// a graph's kernel nodes keep them).
struct CUgraph_st {
  std::vector<std::function<void()>> work;
};
using cudaGraph_t = CUgraph_st*;
using cudaGraphExec_t = CUgraph_st*;
inline cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode) {
  auto& q = emulated_cuda::queue();
  if (q.capturing != nullptr || stream == nullptr) return emulated_cuda::report(cudaErrorInvalidValue);
  q.capturing = stream;
  q.capture_invalidated = false;
  q.graph.clear();
  return cudaSuccess;
}
inline cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  auto& q = emulated_cuda::queue();
  if (q.capturing != stream) return emulated_cuda::report(cudaErrorInvalidValue);
  q.capturing = nullptr;
  *graph = nullptr;
  if (q.capture_invalidated) return emulated_cuda::report(cudaErrorStreamCaptureInvalidated);
  *graph = new CUgraph_st{std::move(q.graph)};
  q.graph.clear();
  return cudaSuccess;
}
inline cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long = 0) {
  *exec = new CUgraph_st{graph->work};
  return cudaSuccess;
}
inline cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  for (const auto& work : exec->work) emulated_cuda::enqueue(stream, work);
  return cudaSuccess;
}
inline cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete exec;
  return cudaSuccess;
}
inline cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete graph;
  return cudaSuccess;
}

// -- cooperative_groups: each thread its own coalesced group.
namespace cooperative_groups {
struct coalesced_group {
  [[nodiscard]] unsigned thread_rank() const { return 0; }
  [[nodiscard]] unsigned size() const { return 1; }
  template <class T>
  T shfl(T value, unsigned) const {
    return value;
  }
};
inline coalesced_group coalesced_threads() { return {}; }
}  // namespace cooperative_groups

namespace cuda {
template <class T = void>
struct maximum {
  constexpr T operator()(const T& a, const T& b) const { return a < b ? b : a; }
};
}  // namespace cuda

// -- Thrust: device vectors in device memory, the iterators gradcomp uses.
namespace thrust {
// A pointer to device memory, as Thrust's: a raw pointer only through raw_pointer_cast.
template <class T>
class device_ptr {
 public:
  explicit device_ptr(T* p) : p_(p) {}
  [[nodiscard]] T* get() const { return p_; }

 private:
  T* p_;
};
template <class T>
T* raw_pointer_cast(device_ptr<T> p) {
  return p.get();
}
template <class T>
T* raw_pointer_cast(T* p) {
  return p;
}
template <class T>
class device_vector {
 public:
  using value_type = T;
  device_vector() = default;
  explicit device_vector(std::size_t n) : device_vector(n, T{}) {}
  device_vector(std::size_t n, const T& value) {
    allocate(n);
    std::fill(data_, data_ + n, value);
  }
  template <class It, class = std::enable_if_t<!std::is_integral_v<It>>>
  device_vector(It first, It last) {
    emulated_cuda::wait_for(nullptr);
    allocate(static_cast<std::size_t>(std::distance(first, last)));
    std::copy(first, last, data_);
  }
  device_vector(const device_vector& other) : device_vector(other.begin(), other.end()) {}
  device_vector(device_vector&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  device_vector& operator=(device_vector other) noexcept {
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
    return *this;
  }
  ~device_vector() {
    if (data_ != nullptr) (void)cudaFree(data_);
  }
  void resize(std::size_t n, const T& value = T{}) {
    device_vector grown(n, value);
    emulated_cuda::wait_for(nullptr);
    std::copy(data_, data_ + std::min(n, size_), grown.data_);
    *this = std::move(grown);
  }
  [[nodiscard]] std::size_t size() const { return size_; }
  [[nodiscard]] bool empty() const { return size_ == 0; }
  device_ptr<T> data() { return device_ptr<T>(data_); }
  device_ptr<const T> data() const { return device_ptr<const T>(data_); }
  T* begin() { return data_; }
  T* end() { return data_ + size_; }
  const T* begin() const { return data_; }
  const T* end() const { return data_ + size_; }
  // Thrust reads and writes an element with a synchronous copy.
  T& operator[](std::size_t i) {
    emulated_cuda::wait_for(nullptr);
    return data_[i];
  }
  const T& operator[](std::size_t i) const {
    emulated_cuda::wait_for(nullptr);
    return data_[i];
  }

 private:
  void allocate(std::size_t n) {
    size_ = n;
    if (cudaMalloc(reinterpret_cast<void**>(&data_), n * sizeof(T)) != cudaSuccess) emulated_cuda::fail("cudaMalloc");
  }
  T* data_ = nullptr;
  std::size_t size_ = 0;
};
template <class In, class Out>
Out copy(In first, In last, Out out) {
  emulated_cuda::wait_for(nullptr);
  return std::copy(first, last, out);
}
template <class It, class T>
void fill(It first, It last, const T& value) {
  emulated_cuda::wait_for(nullptr);
  std::fill(first, last, value);
}

template <class T>
struct counting_iterator {
  using difference_type = std::ptrdiff_t;
  using value_type = T;
  T value{};
  counting_iterator() = default;
  explicit counting_iterator(T v) : value(v) {}
  T operator*() const { return value; }
  T operator[](difference_type i) const { return static_cast<T>(value + static_cast<T>(i)); }
};
template <class F, class It>
struct transform_iterator {
  using difference_type = std::ptrdiff_t;
  It base;
  F f;
  transform_iterator(It b, F fn) : base(b), f(fn) {}
  auto operator[](difference_type i) const { return f(base[i]); }
  auto operator*() const { return f(*base); }
};
struct discard_iterator {
  struct sink {
    template <class T>
    sink& operator=(const T&) {
      return *this;
    }
  };
  sink operator[](std::ptrdiff_t) const { return {}; }
};
inline discard_iterator make_discard_iterator() { return {}; }
}  // namespace thrust

// -- CUB: the device-wide calls run queued, each by a plain loop; the block-wide ones
// by thread 0 between barriers, with each thread's items in shared storage.
namespace cub {
namespace detail_emulated {
// A device-wide call over n items: with no scratch, the bytes it needs (as CUB's grow
// with n); else checked and queued, the scratch scribbled over when it runs, so that
// scratch sized too small or shared with live data shows.
inline cudaError_t device_call(void* scratch, std::size_t& bytes, std::size_t n, cudaStream_t stream,
                               std::function<void()> run) {
  const std::size_t needed = 64 + n / 8;
  if (scratch == nullptr) {
    bytes = needed;
    return cudaSuccess;
  }
  if (bytes < needed || emulated_cuda::memory_type(scratch) != cudaMemoryTypeDevice) return cudaErrorInvalidValue;
  run = [run = std::move(run), scratch, needed] {
    std::memset(scratch, 0x5A, needed);
    run();
  };
  ++emulated_cuda::queue().kernels;
  emulated_cuda::enqueue(stream, std::move(run));
  return cudaSuccess;
}
}  // namespace detail_emulated

struct DeviceScan {
  template <class In, class Out, class Count>
  static cudaError_t ExclusiveSum(void* scratch, std::size_t& bytes, In in, Out out, Count n,
                                  cudaStream_t stream = nullptr) {
    return detail_emulated::device_call(scratch, bytes, static_cast<std::size_t>(n), stream, [=] {
      using T = std::remove_cvref_t<decltype(in[0])>;
      T sum{};
      for (Count i = 0; i < n; ++i) {
        const T v = in[i];
        out[i] = sum;
        sum = static_cast<T>(sum + v);
      }
    });
  }
};
struct DeviceRadixSort {
  template <class Key, class Count>
  static cudaError_t SortKeys(void* scratch, std::size_t& bytes, const Key* in, Key* out, Count n, int begin_bit = 0,
                              int end_bit = static_cast<int>(sizeof(Key) * 8), cudaStream_t stream = nullptr) {
    if (scratch != nullptr && in < out + n && out < in + n) emulated_cuda::fail("cub::DeviceRadixSort: keys in place");
    return detail_emulated::device_call(scratch, bytes, static_cast<std::size_t>(n), stream, [=] {
      std::vector<Key> keys(in, in + n);
      const auto bits = [=](Key k) {
        const Key shifted = k >> begin_bit;
        return end_bit - begin_bit >= static_cast<int>(sizeof(Key) * 8)
                   ? shifted
                   : static_cast<Key>(shifted & ((Key{1} << (end_bit - begin_bit)) - 1));
      };
      std::stable_sort(keys.begin(), keys.end(), [&](Key a, Key b) { return bits(a) < bits(b); });
      std::copy(keys.begin(), keys.end(), out);
    });
  }
};
struct DeviceReduce {
  template <class KeysIn, class UniqueOut, class ValuesIn, class AggregatesOut, class RunsOut, class Op, class Count>
  static cudaError_t ReduceByKey(void* scratch, std::size_t& bytes, KeysIn keys, UniqueOut unique, ValuesIn values,
                                 AggregatesOut aggregates, RunsOut runs, Op op, Count n,
                                 cudaStream_t stream = nullptr) {
    return detail_emulated::device_call(scratch, bytes, static_cast<std::size_t>(n), stream, [=]() mutable {
      Count run = 0;
      for (Count i = 0; i < n;) {
        const auto key = keys[i];
        auto total = values[i];
        Count j = i + 1;
        for (; j < n && keys[j] == key; ++j) total = op(total, values[j]);
        unique[run] = key;
        aggregates[run] = total;
        ++run;
        i = j;
      }
      *runs = static_cast<std::remove_cvref_t<decltype(*runs)>>(run);
    });
  }
};

template <class T, int Threads>
class BlockScan {
 public:
  struct TempStorage {
    T items[Threads];
    T aggregate;
  };
  explicit BlockScan(TempStorage& storage) : storage_(storage) {}
  void ExclusiveSum(T input, T& output) {
    T aggregate;
    ExclusiveSum(input, output, aggregate);
  }
  void ExclusiveSum(T input, T& output, T& aggregate) {
    if (blockDim.x != Threads) emulated_cuda::fail("cub::BlockScan in a block of another size");
    storage_.items[threadIdx.x] = input;
    __syncthreads();
    if (threadIdx.x == 0) {
      T sum{};
      for (int t = 0; t < Threads; ++t) sum = static_cast<T>(sum + std::exchange(storage_.items[t], sum));
      storage_.aggregate = sum;
    }
    __syncthreads();
    output = storage_.items[threadIdx.x];
    aggregate = storage_.aggregate;
  }

 private:
  TempStorage& storage_;
};

template <class Key, int Threads, int Items>
class BlockRadixSort {
 public:
  struct TempStorage {
    Key keys[Threads * Items];
  };
  explicit BlockRadixSort(TempStorage& storage) : storage_(storage) {}
  // Keys held blocked (thread t's item q is key t * Items + q) come back striped (item q
  // of thread t is the (q * Threads + t)-th smallest), sorted stably by bits
  // [begin_bit, end_bit).
  void SortBlockedToStriped(Key (&keys)[Items], int begin_bit = 0, int end_bit = static_cast<int>(sizeof(Key) * 8)) {
    if (blockDim.x != Threads) emulated_cuda::fail("cub::BlockRadixSort in a block of another size");
    for (int q = 0; q < Items; ++q) storage_.keys[threadIdx.x * Items + q] = keys[q];
    __syncthreads();
    if (threadIdx.x == 0) {
      const auto bits = [=](Key k) {
        const Key shifted = k >> begin_bit;
        return end_bit - begin_bit >= static_cast<int>(sizeof(Key) * 8)
                   ? shifted
                   : static_cast<Key>(shifted & ((Key{1} << (end_bit - begin_bit)) - 1));
      };
      std::stable_sort(storage_.keys, storage_.keys + Threads * Items, [&](Key a, Key b) { return bits(a) < bits(b); });
    }
    __syncthreads();
    for (int q = 0; q < Items; ++q) keys[q] = storage_.keys[q * Threads + threadIdx.x];
  }

 private:
  TempStorage& storage_;
};
}  // namespace cub
