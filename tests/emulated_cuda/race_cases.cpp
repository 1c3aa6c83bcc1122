// What the emulated device shows ThreadSanitizer, case by case (ctest's races_case_*,
// built with clang's -fsanitize=thread): each racy case must be reported as a data race
// and each ordered twin must not be, so that a race test that passes says something.
//
//   race_cases CASE
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <gradcomp/detail/cuda/launch.cuh>
#include <string>

namespace {

using gradcomp::detail::cuda_launch::launch;
constexpr unsigned n = 1000;

// A histogram of four bins in shared memory, added plainly or atomically.
template <bool Atomic>
__global__ void histogram(const unsigned* in, unsigned count, unsigned* out) {
  __shared__ unsigned bins[4];
  if (threadIdx.x < 4) bins[threadIdx.x] = 0;
  __syncthreads();
  for (unsigned i = threadIdx.x; i < count; i += blockDim.x) {
    if constexpr (Atomic) {
      atomicAdd(&bins[in[i] % 4], 1u);
    } else {
      bins[in[i] % 4] += 1;
    }
  }
  __syncthreads();
  if (threadIdx.x < 4) atomicAdd(&out[threadIdx.x], bins[threadIdx.x]);
}
// Each thread's item read back by its neighbour, with or without the barrier between.
template <bool Barrier>
__global__ void rotate(unsigned* out) {
  __shared__ unsigned items[64];
  items[threadIdx.x] = threadIdx.x;
  if constexpr (Barrier) __syncthreads();
  out[threadIdx.x] = items[(threadIdx.x + 1) % blockDim.x];
}
// The same, within a warp: __syncwarp orders it, a ballot does not.
template <bool Syncwarp>
__global__ void rotate_in_warp(unsigned* out) {
  __shared__ unsigned items[32];
  items[threadIdx.x] = threadIdx.x;
  if constexpr (Syncwarp) {
    __syncwarp();
  } else {
    (void)__ballot_sync(0xFFFFFFFFu, 1);
  }
  out[threadIdx.x] = items[(threadIdx.x + 1) % 32];
}
// Two rounds within a warp, each read a neighbour's: without the __syncwarp() between the
// rounds, a lane reads its neighbour's second write after the first __syncwarp() only
// (a race whichever lane runs first, so each lane's __syncwarp()s are told apart).
template <bool Between>
__global__ void two_rounds(unsigned* out) {
  __shared__ unsigned first[32];
  __shared__ unsigned second[32];
  first[threadIdx.x] = threadIdx.x;
  __syncwarp();
  second[threadIdx.x] = first[(threadIdx.x + 1) % 32];
  if constexpr (Between) __syncwarp();
  out[threadIdx.x] = second[(threadIdx.x + 1) % 32];
  __syncwarp();
}
// Every block's first thread writes one word, plainly or atomically.
template <bool Atomic>
__global__ void one_word(unsigned* out) {
  if (threadIdx.x != 0) return;
  if constexpr (Atomic) {
    atomicAdd(out, blockIdx.x);
  } else {
    *out = blockIdx.x;
  }
}
// Each block's first thread writes its partial sum plainly, and the last thread of the
// last block to finish adds them: the threadFenceReduction pattern, through
// last_block_to_finish (Fences 0), without the fence before the count (1), or with the
// fence after the count made by every thread after the barrier (2), which orders only
// the thread that counted.
template <int Fences>
__global__ void last_block_sums(const unsigned* in, unsigned* partial, unsigned* finished, unsigned* out) {
  if (threadIdx.x == 0) {
    unsigned sum = 0;
    for (unsigned i = 0; i < blockDim.x; ++i) sum += in[blockIdx.x * blockDim.x + i];
    partial[blockIdx.x] = sum;
  }
  bool last = false;
  if constexpr (Fences == 0) {
    last = gradcomp::detail::cuda_launch::last_block_to_finish(finished);
  } else {
    __shared__ bool is_last;
    if constexpr (Fences != 1) __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
      is_last = atomicAdd(finished, 1u) == gridDim.x - 1;
      if (Fences != 2 && is_last) __threadfence();
    }
    __syncthreads();
    last = is_last;
    if (Fences == 2 && last) __threadfence();
  }
  if (last && threadIdx.x == blockDim.x - 1) {
    unsigned sum = 0;
    for (unsigned b = 0; b < gridDim.x; ++b) sum += partial[b];
    *out = sum;
  }
}
__global__ void fill(unsigned* p, unsigned count, unsigned value) {
  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x) p[i] = value;
}
__global__ void sum(const unsigned* p, unsigned count, unsigned* out) {
  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x) atomicAdd(out, p[i]);
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorName(e));
    std::exit(2);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string c = argc > 1 ? argv[1] : "";
  unsigned *in = nullptr, *out = nullptr, *pinned = nullptr;
  check(cudaMalloc(&in, n * sizeof(unsigned)), "cudaMalloc");
  check(cudaMalloc(&out, 64 * sizeof(unsigned)), "cudaMalloc");
  check(cudaMallocHost(&pinned, n * sizeof(unsigned)), "cudaMallocHost");
  cudaStream_t a = nullptr, b = nullptr;
  check(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  check(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  cudaEvent_t event = nullptr;
  check(cudaEventCreate(&event), "cudaEventCreate");
  for (unsigned i = 0; i < n; ++i) pinned[i] = i;
  check(cudaMemcpyAsync(in, pinned, n * sizeof(unsigned), cudaMemcpyHostToDevice, a), "cudaMemcpyAsync");
  check(cudaMemsetAsync(out, 0, 64 * sizeof(unsigned), a), "cudaMemsetAsync");
  check(cudaStreamSynchronize(a), "cudaStreamSynchronize");

  bool known = true;
  if (c == "shared_plain_add") {  // racy: a read-modify-write where an atomic is needed
    launch("histogram", histogram<false>, 2, 64, 0, a, in, n, out);
  } else if (c == "shared_atomic_add") {
    launch("histogram", histogram<true>, 2, 64, 0, a, in, n, out);
  } else if (c == "no_barrier") {  // racy: a neighbour's write read without __syncthreads()
    launch("rotate", rotate<false>, 1, 64, 0, a, out);
  } else if (c == "barrier") {
    launch("rotate", rotate<true>, 1, 64, 0, a, out);
  } else if (c == "ballot_for_syncwarp") {  // racy: a ballot orders no memory
    launch("rotate_in_warp", rotate_in_warp<false>, 1, 32, 0, a, out);
  } else if (c == "syncwarp") {
    launch("rotate_in_warp", rotate_in_warp<true>, 1, 32, 0, a, out);
  } else if (c == "syncwarp_once_for_two_rounds") {  // racy: the second round unordered
    launch("two_rounds", two_rounds<false>, 1, 32, 0, a, out);
  } else if (c == "syncwarp_each_round") {
    launch("two_rounds", two_rounds<true>, 1, 32, 0, a, out);
  } else if (c == "blocks_write_one_word") {  // racy: two blocks write it, neither atomically
    launch("one_word", one_word<false>, 16, 32, 0, a, out);
  } else if (c == "blocks_add_one_word") {
    launch("one_word", one_word<true>, 16, 32, 0, a, out);
  } else if (c == "last_block_to_finish") {
    launch("last_block_sums", last_block_sums<0>, 15, 64, 0, a, in, out + 32, out, out + 1);
  } else if (c == "no_fence_before_count") {  // racy: the last block may see the count only
    launch("last_block_sums", last_block_sums<1>, 15, 64, 0, a, in, out + 32, out, out + 1);
  } else if (c == "fence_after_barrier") {  // racy: the reading thread's fence read no count
    launch("last_block_sums", last_block_sums<2>, 15, 64, 0, a, in, out + 32, out, out + 1);
  } else if (c == "streams_without_event") {  // racy: b reads what a writes, nothing between
    launch("fill", fill, 2, 64, 0, a, in, n, 3u);
    launch("sum", sum, 2, 64, 0, b, in, n, out);
  } else if (c == "streams_with_event" || c == "streams_with_finished_event") {
    launch("fill", fill, 2, 64, 0, a, in, n, 3u);
    check(cudaEventRecord(event, a), "cudaEventRecord");
    if (c == "streams_with_finished_event") check(cudaStreamSynchronize(a), "cudaStreamSynchronize");
    check(cudaStreamWaitEvent(b, event, 0), "cudaStreamWaitEvent");
    launch("sum", sum, 2, 64, 0, b, in, n, out);
  } else if (c == "pinned_rewritten_before_copy") {  // racy: the queued copy still reads it
    check(cudaMemcpyAsync(in, pinned, n * sizeof(unsigned), cudaMemcpyHostToDevice, b), "cudaMemcpyAsync");
    pinned[5] = 7;
  } else if (c == "pinned_rewritten_after_wait") {
    check(cudaMemcpyAsync(in, pinned, n * sizeof(unsigned), cudaMemcpyHostToDevice, b), "cudaMemcpyAsync");
    check(cudaStreamSynchronize(b), "cudaStreamSynchronize");
    pinned[5] = 7;
  } else if (c == "host_reads_after_other_stream") {  // racy: the wait is for the wrong stream
    launch("fill", fill, 2, 64, 0, a, in, n, 3u);
    check(cudaMemcpyAsync(pinned, in, n * sizeof(unsigned), cudaMemcpyDeviceToHost, a), "cudaMemcpyAsync");
    check(cudaStreamSynchronize(b), "cudaStreamSynchronize");
    std::printf("%u\n", pinned[3]);
  } else if (c == "freed_on_other_stream" || c == "freed_after_event") {  // the first racy
    unsigned* scratch = nullptr;
    check(cudaMallocAsync(reinterpret_cast<void**>(&scratch), n * sizeof(unsigned), a), "cudaMallocAsync");
    launch("fill", fill, 2, 64, 0, a, scratch, n, 3u);
    if (c == "freed_after_event") {
      check(cudaEventRecord(event, a), "cudaEventRecord");
      check(cudaStreamWaitEvent(b, event, 0), "cudaStreamWaitEvent");
    }
    check(cudaFreeAsync(scratch, b), "cudaFreeAsync");
  } else {
    known = false;
  }
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  if (!known) {
    std::fprintf(stderr, "race_cases: no case '%s'\n", c.c_str());
    return 2;
  }
  std::printf("race_cases %s: ran\n", c.c_str());
  return 0;
}
