// comm::nccl with one rank on one GPU: the sparse all-gather, the dense fallback and the
// bucketed exchange give what the host's accumulate gives for the same messages, a
// corrupt message changes nothing, and cyclic_topk equals ScaleCom written out on the
// host, and sparse_allreduce equals a host compressor accepted in part. (More ranks need
// more GPUs.) Needs a GPU and NCCL
// (exit 77 without a GPU).
#define DOCTEST_CONFIG_IMPLEMENT
#include "device.cuh"

#include <gradcomp/comm/leader_exchange.hpp>
#include <gradcomp/comm/nccl.cuh>
#include <gradcomp/gradcomp.hpp>

#include <cmath>
#include <sstream>
#include <vector>

#include "../support/inputs.hpp"
#include "../support/topk_message.hpp"
#include "../support/leader_broadcast.hpp"

namespace gc = gradcomp;

namespace {

struct one_rank {
  ncclComm_t comm = nullptr;
  one_rank() {
    int device = 0;
    gc::detail::nccl_check(ncclCommInitAll(&comm, 1, &device), "ncclCommInitAll");
  }
  ~one_rank() { ncclCommDestroy(comm); }
};

}  // namespace

TEST_CASE("one-rank NCCL aggregation equals the host's accumulate") {
  one_rank world;
  gc::comm::nccl comm(world.comm, gc::backend::cuda{});
  CHECK(comm.rank() == 0);
  CHECK(comm.size() == 1);
  const std::size_t n = 100'000;
  const auto x = inputs::make(inputs::shape::student_t3, n, 8);
  const auto start = inputs::make(inputs::shape::normal, n, 9);
  for (const double density : {0.001, 0.05, 0.9}) {  // 0.9: the dense path
    CAPTURE(density);
    const auto bytes = support::topk_message(x, density);
    auto expected = start;
    gc::accumulate(gc::backend::host{}, bytes, expected, 0.25f);
    auto d_bytes = device::copy_of(bytes);
    auto dense = device::copy_of(start);
    const auto taken = comm.allgather_accumulate(device::span_of(d_bytes), device::span_of(dense), 0.25f);
    CHECK(taken == (density > 0.5 ? gc::comm::path::dense : gc::comm::path::sparse));
    CHECK(device::same_bits(device::host_copy(dense), expected));
  }
}

TEST_CASE("one-rank NCCL bucketed exchange equals the host's accumulate per tensor") {
  one_rank world;
  gc::comm::nccl comm(world.comm, gc::backend::cuda{});
  std::vector<std::vector<std::byte>> messages;
  std::vector<std::vector<float>> start, expected;
  for (const std::size_t n : {10, 1000, 65'537}) {
    const auto t = messages.size();
    messages.push_back(support::topk_message(inputs::make(inputs::shape::log_normal, n, 20 + t), 0.01));
    start.push_back(inputs::make(inputs::shape::normal, n, 30 + t));
    expected.push_back(start.back());
    gc::accumulate(gc::backend::host{}, messages.back(), expected.back(), 0.5f);
  }
  device::check_bucketed(comm, messages, start, expected, 0.5f);
}

TEST_CASE("a corrupt message fails and changes nothing, on both paths") {
  one_rank world;
  gc::comm::nccl comm(world.comm, gc::backend::cuda{});
  const std::size_t n = 5000;
  const auto x = inputs::make(inputs::shape::normal, n, 3);
  for (const double density : {0.01, 0.9}) {
    device::check_refused_unchanged(comm, support::with_second_index_broken(support::topk_message(x, density)), n);
  }
}

namespace {

// ScaleCom with one rank on the host, written out: the leader (always rank 0) takes the
// top-k of its preview, its compressor sends its acc there, dense += scale * values.
template <class Compressor>
std::vector<std::byte> simulated_step(Compressor& sim, const std::vector<float>& g, std::vector<float>& dense,
                                      double density, float scale) {
  gc::compressor leader{gc::backend::host{}, g.size(), gc::select::exact_topk{.density = density}, gc::correct::none{},
                        gc::encode::index_value{.index = gc::index_coding::raw32}};
  const auto acc = sim.preview(g);
  std::vector<std::byte> leader_out(leader.max_message_bytes());
  sim.set_indices(gc::decode(leader.compress(acc, leader_out).bytes()).indices);
  std::vector<std::byte> out(sim.max_message_bytes());
  const auto m = sim.compress(g, out);
  const auto sent = gc::decode(m.bytes());
  for (std::size_t j = 0; j < sent.indices.size(); ++j) dense[sent.indices[j]] += scale * sent.values[j];
  return {m.bytes().begin(), m.bytes().end()};
}

}  // namespace

TEST_CASE("one-rank cyclic_topk over NCCL equals ScaleCom written out on the host") {
  one_rank world;
  gc::comm::nccl comm(world.comm, gc::backend::cuda{});
  const std::size_t n = 200'003;
  const double density = 0.002;
  const float scale = 0.5f;
  // The scalecom preset's coding (automatic indices: written by the host code) and one
  // the kernels write and read (raw32 indices, f16 values).
  const auto run = [&](auto make) {
    auto gpu = make(gc::backend::cuda{});
    auto sim = make(gc::backend::host{});
    gc::comm::cyclic_topk exchange(comm, gpu, gc::select::exact_topk{.density = density});
    thrust::device_vector<float> dense(n, 0.0f);
    std::vector<float> expected(n, 0.0f);
    for (int t = 0; t < 5; ++t) {
      CAPTURE(t);
      const auto x = inputs::make(inputs::shape::student_t3, n, 60 + static_cast<std::uint64_t>(t));
      auto g = device::copy_of(x);
      const auto m = exchange.step(device::span_of(g), device::span_of(dense), scale);
      const auto want = simulated_step(sim, x, expected, density, scale);
      REQUIRE(device::host_copy(m.bytes()) == want);
      REQUIRE(device::same_bits(device::host_copy(dense), expected));
    }
    std::ostringstream a, b;
    gpu.save_state(a);
    sim.save_state(b);
    CHECK(a.str() == b.str());
    // A NaN is rejected before anything changes.
    auto x = inputs::make(inputs::shape::normal, n, 99);
    x[12345] = NAN;
    auto g = device::copy_of(x);
    const auto dense_before = device::host_copy(dense);
    CHECK_THROWS_WITH_AS(exchange.step(device::span_of(g), device::span_of(dense), scale),
                         "gradcomp: preview: grad[12345] = nan is not finite (rank 0 of 1)", gc::error);
    std::ostringstream after;
    gpu.save_state(after);
    CHECK(after.str() == a.str());
    CHECK(device::host_copy(dense) == dense_before);
  };
  run([&](auto be) { return gc::presets::scalecom(be, n, {.density = density, .beta = 0.5f}); });
  run([&](auto be) {
    return gc::compressor{be, n,
                          gc::select::given_indices{.max_count = gc::select::exact_topk{.density = density}.k(n)},
                          gc::correct::low_pass{.beta = 0.25f},
                          gc::encode::index_value{.index = gc::index_coding::raw32, .value = gc::value_coding::f16}};
  });
}

TEST_CASE(
    "one-rank sparse_allreduce over NCCL: the global top-k of the rank's own message, its residual keeping "
    "what the selection dropped, as a host compressor staged and accepted in part") {
  one_rank world;
  gc::comm::nccl comm(world.comm, gc::backend::cuda{});
  const std::size_t n = 100'003;
  const double density = 0.004;
  const float scale = 0.5f;
  const auto make = [&](auto be) {
    return gc::compressor{be, n, gc::select::exact_topk{.density = density}, gc::correct::error_feedback{},
                          gc::encode::index_value{.value = gc::value_coding::f16}};
  };
  auto gpu = make(gc::backend::cuda{});
  auto sim = make(gc::backend::host{});
  const std::size_t k = sim.selector().max_selected(n) / 2;  // the selection drops half
  gc::comm::sparse_allreduce exchange(comm, gpu, k);
  thrust::device_vector<float> dense(n, 0.0f);
  std::vector<float> expected(n, 0.0f);
  std::vector<std::byte> buf(sim.max_message_bytes());
  for (int t = 0; t < 4; ++t) {
    CAPTURE(t);
    const auto x = inputs::make(inputs::shape::student_t3, n, 70 + static_cast<std::uint64_t>(t));
    auto g = device::copy_of(x);
    const auto got = exchange.step(device::span_of(g), device::span_of(dense), scale);
    // The host: stage, keep the k largest |sent| (ties to the lower index), add them.
    const auto sent = gc::decode(sim.stage(x, buf).bytes());
    std::vector<std::size_t> order(sent.indices.size());
    for (std::size_t j = 0; j < order.size(); ++j) order[j] = j;
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return std::fabs(sent.values[a]) > std::fabs(sent.values[b]);
    });
    order.resize(k);
    std::sort(order.begin(), order.end());
    std::vector<std::uint32_t> kept;
    for (const std::size_t j : order) {
      kept.push_back(sent.indices[j]);
      expected[sent.indices[j]] += scale * sent.values[j];
    }
    sim.accept_staged(kept);
    CHECK(std::vector<std::uint32_t>(got.begin(), got.end()) == kept);
    REQUIRE(device::same_bits(device::host_copy(dense), expected));
    const auto a = gpu.corrector_state(0);
    const auto b = sim.corrector_state(0);
    CHECK(device::same_bits(std::vector<float>(a.begin(), a.end()), std::vector<float>(b.begin(), b.end())));
  }
  // The reduce-scatter of one rank: its whole message, everything committed.
  thrust::device_vector<float> shard(n, 7.0f);
  const auto x = inputs::make(inputs::shape::normal, n, 80);
  auto g = device::copy_of(x);
  exchange.reduce_scatter(device::span_of(g), device::span_of(shard), scale);
  std::vector<float> want(n, 0.0f);
  const auto m = sim.compress(x, buf);
  gc::accumulate(gc::backend::host{}, m.bytes(), want, scale);
  CHECK(device::same_bits(device::host_copy(shard), want));
  // A NaN is rejected before anything changes.
  auto bad = x;
  bad[5] = NAN;
  auto gb = device::copy_of(bad);
  const auto dense_before = device::host_copy(dense);
  CHECK_THROWS_AS(exchange.step(device::span_of(gb), device::span_of(dense), scale), gc::error);
  CHECK(device::host_copy(dense) == dense_before);
  CHECK_FALSE(gpu.has_staged());
}

int main(int argc, char** argv) { return device::run_tests(argc, argv); }

TEST_CASE("one-rank NCCL leader exchange: a round leads with this rank's own parameters, unchanged") {
  one_rank world;
  gc::comm::nccl comm(world.comm, gc::backend::cuda{});
  const std::size_t n = 10'001;
  const auto start = inputs::make(inputs::shape::normal, n, 11);
  auto params = device::copy_of(start);
  gc::comm::leader_exchange exchange(comm, comm, gc::backend::cuda{}, n, {.period = 2, .global_every = 1});
  CHECK_FALSE(exchange.step(device::span_of(params), 1.0).held);
  const auto round = exchange.step(device::span_of(params), 0.5);
  CHECK(round.held);
  CHECK(round.group_leader == 0);
  CHECK(round.global_leader == 0);
  CHECK(device::same_bits(device::host_copy(params), start));
  CHECK_THROWS_WITH_AS(exchange.step(device::span_of(params).first(n - 1), 0.5),
                       "gradcomp: leader_exchange: params.size() = 10000 does not match n = 10001", gc::error);
}

TEST_CASE("Leader SGD's pull on backend::cuda: a follower moves toward the leader's parameters as on the host") {
  // (NCCL takes one rank per GPU: the leader's broadcast is delivered by a stand-in.)
  const auto copy = [](const float* from, std::uint32_t* to, std::size_t bytes) {
    REQUIRE(cudaMemcpy(to, from, bytes, cudaMemcpyHostToDevice) == cudaSuccess);
  };
  for (const std::size_t n : inputs::awkward_sizes) {
    const auto x = inputs::make(inputs::shape::normal, n, 5);
    support::leader_broadcast<gc::device_memory, decltype(copy)> comm{inputs::make(inputs::shape::student_t3, n, 6),
                                                                      copy};
    gc::comm::whole_parameters<gc::backend::cuda> sender(gc::backend::cuda{}, n);
    auto params = device::copy_of(x);
    gc::comm::traffic moved;
    sender.pull(comm, device::span_of(params), 0, false, 0.3f, 0, moved);
    CAPTURE(n);
    CHECK(device::same_bits(device::host_copy(params), support::pulled(x, comm.leader, 0.3f)));
    CHECK(moved.received == 4 * n);
  }
}
