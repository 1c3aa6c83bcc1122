// comm::nccl across ranks (one process and one GPU each, under mpirun): the sparse
// all-gather, its dense fallback, the bucketed exchange and the all-to-all give what the
// host computes from every rank's messages, the same on every rank, and a corrupt
// message on one rank fails on every rank and changes nothing; ScaleCom's cyclic_topk
// and Ok-Topk's sparse_allreduce on the GPU's compressors equal the same exchanges of
// host compressors over comm::mpi, bit for bit. NCCL takes one GPU per rank, so on one
// machine this runs on the emulated device (tests/emulated_cuda, whose NCCL is MPI); it
// builds against the real ones too.
// Checks that can fail on one rank alone are CHECKs, not REQUIREs: a rank that left its
// test case would leave the others waiting in their collectives.
#define DOCTEST_CONFIG_IMPLEMENT
#include "device.cuh"

#include <gradcomp/comm/mpi.hpp>
#include <gradcomp/comm/nccl.cuh>
#include <gradcomp/gradcomp.hpp>
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "../support/inputs.hpp"
#include "../support/topk_message.hpp"

namespace gc = gradcomp;

namespace {

struct ranks {
  ncclComm_t comm = nullptr;
  int rank = 0;
  int size = 1;
  ranks() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    ncclUniqueId id{};
    if (rank == 0) gc::detail::nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    gc::detail::nccl_check(ncclCommInitRank(&comm, size, id, rank), "ncclCommInitRank");
  }
  ~ranks() { ncclCommDestroy(comm); }
  ranks(const ranks&) = delete;
  ranks& operator=(const ranks&) = delete;
};

// Rank r's gradient for a tensor of n values (every rank can make every rank's).
std::vector<float> gradient_of(int r, std::size_t n, std::uint64_t salt) {
  return inputs::make(inputs::shape::student_t3, n, 1000 * salt + static_cast<std::uint64_t>(r));
}
// How many of `got` differ from `want` by more than rounding (NCCL sums floats across
// ranks in an order of its own).
std::size_t off_by_more_than_rounding(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return want.size() + 1;
  std::size_t off = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (!(std::fabs(got[i] - want[i]) <= 1e-5f * (std::fabs(want[i]) + 1.0f))) ++off;
  }
  return off;
}
// Whether `values` has the same bits on every rank.
bool same_on_every_rank(std::vector<float> values) {
  std::vector<float> first = values;
  MPI_Bcast(first.data(), static_cast<int>(first.size()), MPI_FLOAT, 0, MPI_COMM_WORLD);
  int same = device::same_bits(first, values) ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &same, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return same == 1;
}

}  // namespace

TEST_CASE("NCCL across ranks: the sparse all-gather adds every rank's message in rank order, as the host does") {
  ranks world;
  gc::comm::nccl comm(world.comm, gc::backend::cuda{});
  REQUIRE(comm.size() == world.size);
  const std::size_t n = 100'000;
  const auto start = inputs::make(inputs::shape::normal, n, 9);
  for (const double density : {0.001, 0.05}) {
    CAPTURE(density);
    auto expected = start;
    for (int r = 0; r < world.size; ++r) {
      gc::accumulate(gc::backend::host{}, support::topk_message(gradient_of(r, n, 1), density), expected, 0.25f);
    }
    auto message = device::copy_of(support::topk_message(gradient_of(world.rank, n, 1), density));
    auto dense = device::copy_of(start);
    CHECK(comm.allgather_accumulate(device::span_of(message), device::span_of(dense), 0.25f) == gc::comm::path::sparse);
    CHECK(device::same_bits(device::host_copy(dense), expected));
  }
}

TEST_CASE("NCCL across ranks: messages that outgrow the tensor are summed densely, the same bits on every rank") {
  ranks world;
  gc::comm::nccl comm(world.comm, gc::backend::cuda{});
  const std::size_t n = 20'000;
  const auto start = inputs::make(inputs::shape::normal, n, 10);
  std::vector<float> sum(n, 0.0f);  // NCCL sums in an order of its own: compared within rounding
  for (int r = 0; r < world.size; ++r) {
    gc::accumulate(gc::backend::host{}, support::topk_message(gradient_of(r, n, 2), 0.9), sum, 1.0f);
  }
  auto message = device::copy_of(support::topk_message(gradient_of(world.rank, n, 2), 0.9));
  auto dense = device::copy_of(start);
  CHECK(comm.allgather_accumulate(device::span_of(message), device::span_of(dense), 0.5f) == gc::comm::path::dense);
  std::vector<float> want(n);
  for (std::size_t i = 0; i < n; ++i) want[i] = start[i] + 0.5f * sum[i];
  const auto got = device::host_copy(dense);
  CHECK(off_by_more_than_rounding(got, want) == 0);
  CHECK(same_on_every_rank(got));
}

TEST_CASE("NCCL across ranks: the bucketed exchange equals the host's accumulate per tensor") {
  ranks world;
  gc::comm::nccl comm(world.comm, gc::backend::cuda{});
  std::vector<std::vector<std::byte>> messages;
  std::vector<std::vector<float>> start, expected;
  for (const std::size_t n : {10, 1000, 65'537}) {
    const auto t = messages.size();
    messages.push_back(support::topk_message(gradient_of(world.rank, n, 3 + t), 0.01));
    start.push_back(inputs::make(inputs::shape::normal, n, 30 + t));
    expected.push_back(start.back());
    for (int r = 0; r < world.size; ++r) {
      gc::accumulate(gc::backend::host{}, support::topk_message(gradient_of(r, n, 3 + t), 0.01), expected.back(), 0.5f);
    }
  }
  device::check_bucketed(comm, messages, start, expected, 0.5f);
}

TEST_CASE("NCCL across ranks: the all-to-all delivers each rank's part for each rank, some of them empty") {
  ranks world;
  gc::comm::nccl comm(world.comm, gc::backend::cuda{});
  const auto W = static_cast<std::size_t>(world.size);
  const auto part = [](std::size_t from, std::size_t to) { return (from + 2 * to) % 5 * 3; };  // bytes
  const auto byte = [](std::size_t from, std::size_t to, std::size_t k) {
    return static_cast<std::byte>(from * 64 + to * 8 + k);
  };
  const auto me = static_cast<std::size_t>(world.rank);
  std::vector<std::uint64_t> send_sizes, recv_sizes;
  std::vector<std::byte> send, want;
  for (std::size_t j = 0; j < W; ++j) {
    send_sizes.push_back(part(me, j));
    for (std::size_t k = 0; k < part(me, j); ++k) send.push_back(byte(me, j, k));
    recv_sizes.push_back(part(j, me));
    for (std::size_t k = 0; k < part(j, me); ++k) want.push_back(byte(j, me, k));
  }
  SUBCASE("device memory") {
    auto d_send = device::copy_of(send);
    thrust::device_vector<std::byte> d_recv(want.size());
    comm.all_to_all_v(device::span_of(d_send), send_sizes, device::span_of(d_recv), recv_sizes);
    CHECK(device::host_copy(d_recv) == want);
  }
  SUBCASE("host memory, staged") {
    std::vector<std::byte> recv(want.size());
    comm.all_to_all_v(std::span<const std::byte>(send), send_sizes, std::span<std::byte>(recv), recv_sizes);
    CHECK(recv == want);
  }
}

TEST_CASE("NCCL across ranks: a corrupt message on one rank fails on every rank and changes nothing") {
  ranks world;
  gc::comm::nccl comm(world.comm, gc::backend::cuda{});
  const std::size_t n = 5000;
  for (const double density : {0.01, 0.9}) {
    CAPTURE(density);
    auto bytes = support::topk_message(gradient_of(world.rank, n, 4), density);
    const int broken = density < 0.5 ? 0 : world.size - 1;  // the first rank's, then the last's
    if (world.rank == broken) bytes = support::with_second_index_broken(std::move(bytes));
    device::check_refused_unchanged(comm, bytes, n);
  }
}

namespace {
template <class Compressor>
std::string state_of(const Compressor& c) {
  std::ostringstream out;
  c.save_state(out);
  return out.str();
}
}  // namespace

TEST_CASE("NCCL across ranks: cyclic_topk (ScaleCom) equals the same exchange over comm::mpi on the host") {
  ranks world;
  gc::comm::nccl nccl(world.comm, gc::backend::cuda{});
  gc::comm::mpi mpi;
  const std::size_t n = 100'003;
  const double density = 0.004;
  const float scale = 0.5f;
  auto gpu = gc::presets::scalecom(gc::backend::cuda{}, n, {.density = density, .beta = 0.5f});
  auto host = gc::presets::scalecom(gc::backend::host{}, n, {.density = density, .beta = 0.5f});
  gc::comm::cyclic_topk on_gpu(nccl, gpu, gc::select::exact_topk{.density = density});
  gc::comm::cyclic_topk on_host(mpi, host, gc::select::exact_topk{.density = density});
  thrust::device_vector<float> dense(n, 0.0f);
  std::vector<float> expected(n, 0.0f);
  for (std::uint64_t t = 0; t < 5; ++t) {  // a leader per step, in turn
    CAPTURE(t);
    const auto x = gradient_of(world.rank, n, 10 + t);
    auto g = device::copy_of(x);
    const auto got = on_gpu.step(device::span_of(g), device::span_of(dense), scale);
    const auto want = on_host.step(x, expected, scale);
    CHECK(device::host_copy(got.bytes()) == std::vector<std::byte>(want.bytes().begin(), want.bytes().end()));
    const auto sums = device::host_copy(dense);  // the ranks' values summed, then broadcast
    CHECK(off_by_more_than_rounding(sums, expected) == 0);
    CHECK(same_on_every_rank(sums));
  }
  CHECK(state_of(gpu) == state_of(host));
}

TEST_CASE("NCCL across ranks: sparse_allreduce (Ok-Topk) equals the same exchange over comm::mpi on the host") {
  ranks world;
  gc::comm::nccl nccl(world.comm, gc::backend::cuda{});
  gc::comm::mpi mpi;
  const std::size_t n = 100'008;  // a reduce-scatter's shards: a multiple of 2, 3 and 4 ranks
  const auto make = [&](auto be) {
    return gc::compressor{be, n, gc::select::exact_topk{.density = 0.004}, gc::correct::error_feedback{},
                          gc::encode::index_value{.value = gc::value_coding::f16}};
  };
  auto gpu = make(gc::backend::cuda{});
  auto host = make(gc::backend::host{});
  const std::size_t k = host.selector().max_selected(n) / 2;
  gc::comm::sparse_allreduce on_gpu(nccl, gpu, k);
  gc::comm::sparse_allreduce on_host(mpi, host, k);
  thrust::device_vector<float> dense(n, 0.0f);
  std::vector<float> expected(n, 0.0f);
  for (std::uint64_t t = 0; t < 4; ++t) {
    CAPTURE(t);
    const auto x = gradient_of(world.rank, n, 20 + t);
    auto g = device::copy_of(x);
    const auto got = on_gpu.step(device::span_of(g), device::span_of(dense), 0.5f);
    const std::vector<std::uint32_t> got_indices(got.begin(), got.end());
    const auto want = on_host.step(x, expected, 0.5f);
    CHECK(got_indices == std::vector<std::uint32_t>(want.begin(), want.end()));
    CHECK(device::same_bits(device::host_copy(dense), expected));
  }
  SUBCASE("queued, its outcome read once and settled") {
    const auto x = gradient_of(world.rank, n, 30);
    auto g = device::copy_of(x);
    on_gpu.queue_step(device::span_of(g), device::span_of(dense), 0.5f);
    const auto outcome = device::host_copy(on_gpu.outcome());
    (void)on_gpu.settle(outcome);
    on_host.queue_step(x, expected, 0.5f);
    (void)on_host.settle(on_host.outcome());
    CHECK(device::same_bits(device::host_copy(dense), expected));
  }
  SUBCASE("the reduce-scatter") {
    const auto x = gradient_of(world.rank, n, 40);
    auto g = device::copy_of(x);
    const std::size_t shard_size = n / static_cast<std::size_t>(world.size);
    thrust::device_vector<float> shard(shard_size, 7.0f);
    std::vector<float> want(shard_size, 7.0f);
    on_gpu.reduce_scatter(device::span_of(g), device::span_of(shard), 0.5f);
    on_host.reduce_scatter(x, want, 0.5f);
    CHECK(device::same_bits(device::host_copy(shard), want));
  }
  CHECK(state_of(gpu) == state_of(host));
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int devices = 0;
  if (cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0) cudaSetDevice(rank % devices);
  const int result = device::run_tests(argc, argv);
  MPI_Finalize();
  return result;
}
