// comm::mpi under mpirun (2 and 4 ranks): every collective equals a single-process
// simulation of the same ranks, and every rank ends with the same aggregate.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <gradcomp/comm/leader_exchange.hpp>
#include <gradcomp/comm/mpi.hpp>
#include <gradcomp/gradcomp.hpp>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <new>
#include <sstream>

#include "support/counted_device.hpp"
#include "support/inputs.hpp"
#include "support/opaque_host.hpp"
#include "support/reference.hpp"

namespace gc = gradcomp;

namespace {

std::vector<float> gradient_of(int rank, std::size_t n, int step) {
  return inputs::make(inputs::shape::student_t3, n,
                      1000 * static_cast<std::uint64_t>(rank) + static_cast<std::uint64_t>(step));
}

// True on every rank iff all ranks hold bit-identical `dense`.
bool same_on_all_ranks(const gc::comm::mpi& comm, const std::vector<float>& dense) {
  const std::uint32_t mine = gc::detail::crc32c(reinterpret_cast<const std::byte*>(dense.data()), dense.size() * 4);
  std::vector<std::uint32_t> all(static_cast<std::size_t>(comm.size()));
  MPI_Allgather(&mine, 1, MPI_UINT32_T, all.data(), 1, MPI_UINT32_T, comm.communicator());
  return std::all_of(all.begin(), all.end(), [&](std::uint32_t c) { return c == mine; });
}

// Runs `steps` steps: this rank compresses its gradient and aggregates over MPI; the
// simulation compresses every rank's gradient locally and accumulates in rank order.
template <class Make>
void matches_simulation(Make make, std::size_t n, int steps, gc::comm::path expected) {
  gc::comm::mpi comm;
  const int ranks = comm.size();
  auto mine = make(comm.rank(), n);
  std::vector<decltype(make(0, n))> simulated;
  for (int r = 0; r < ranks; ++r) simulated.push_back(make(r, n));
  std::vector<float> dense(n, 0.0f), reference(n, 0.0f);
  std::vector<double> magnitude(n, 0.0);  // sum of |terms|: the scale of rounding differences
  const float scale = 1.0f / static_cast<float>(ranks);
  for (int t = 0; t < steps; ++t) {
    std::vector<std::byte> buf(mine.max_message_bytes());
    const auto m = mine.compress(gradient_of(comm.rank(), n, t), buf);
    CHECK(comm.allgather_accumulate(m.bytes(), dense, scale) == expected);
    std::vector<double> sum(n, 0.0);
    for (int r = 0; r < ranks; ++r) {
      std::vector<std::byte> b(simulated[static_cast<std::size_t>(r)].max_message_bytes());
      const auto sm = simulated[static_cast<std::size_t>(r)].compress(gradient_of(r, n, t), b);
      if (expected == gc::comm::path::sparse) {
        gc::accumulate(gc::backend::host{}, sm.bytes(), reference, scale);
      } else {
        const auto s = gc::decode(sm.bytes());
        for (std::size_t j = 0; j < s.indices.size(); ++j) {
          sum[s.indices[j]] += s.values[j];
          magnitude[s.indices[j]] += scale * std::fabs(s.values[j]);
        }
      }
    }
    if (expected == gc::comm::path::dense) {
      for (std::size_t i = 0; i < n; ++i) reference[i] += scale * static_cast<float>(sum[i]);
    }
  }
  if (expected == gc::comm::path::sparse) {
    CHECK(dense == reference);  // the same operations in the same order
  } else {
    std::size_t off = 0;  // MPI chooses the summation order: rounding may differ
    for (std::size_t i = 0; i < n; ++i) off += std::fabs(dense[i] - reference[i]) > 1e-6 * magnitude[i] ? 1 : 0;
    CHECK(off == 0);
  }
  CHECK(same_on_all_ranks(comm, dense));
}

}  // namespace

TEST_CASE("sparse all-gather of top-k with error feedback") {
  matches_simulation([](int, std::size_t n) { return gc::presets::topk_ef(gc::backend::host{}, n, {.density = 0.01}); },
                     100003, 5, gc::comm::path::sparse);
}

TEST_CASE("zero-count messages on some ranks") {
  // Rank 0's threshold is out of reach: it sends nothing, every step.
  matches_simulation(
      [](int rank, std::size_t n) {
        return gc::presets::threshold_ef(gc::backend::host{}, n, {.tau = rank == 0 ? 1e30f : 2.5f});
      },
      20011, 4, gc::comm::path::sparse);
}

TEST_CASE("unequal densities from a DAGC ratio plan") {
  gc::comm::mpi comm;
  std::vector<double> volumes;
  for (int r = 0; r < comm.size(); ++r) volumes.push_back(1.0 + 3.0 * r);
  const auto plan = gc::schedule::ratio_plan(volumes, 0.01, 0.001);
  matches_simulation(
      [&](int rank, std::size_t n) {
        return gc::compressor{gc::backend::host{}, n,
                              gc::select::exact_topk{.density = plan[static_cast<std::size_t>(rank)]},
                              gc::correct::error_feedback{}};
      },
      50021, 4, gc::comm::path::sparse);
}

TEST_CASE("dense fallback when the messages together outgrow the tensor") {
  // Each message is about 0.63 of the dense tensor's bytes: two or more outgrow it, one
  // alone does not (mpirun -np 1).
  const bool outgrown = gc::comm::mpi{}.size() > 1;
  matches_simulation([](int, std::size_t n) { return gc::presets::topk_ef(gc::backend::host{}, n, {.density = 0.6}); },
                     30011, 3, outgrown ? gc::comm::path::dense : gc::comm::path::sparse);
}

TEST_CASE("a corrupt message fails on every rank and changes nothing") {
  gc::comm::mpi comm;
  const std::size_t n = 1000;
  gc::compressor c{gc::backend::host{}, n, gc::select::exact_topk{.count = 10}};
  std::vector<std::byte> buf(c.max_message_bytes());
  const auto m = c.compress(gradient_of(comm.rank(), n, 0), buf);
  std::vector<std::byte> bytes(m.bytes().begin(), m.bytes().end());
  if (comm.rank() == comm.size() - 1)
    bytes[60] = std::byte{0xFF}, bytes[61] = std::byte{0xFF}, bytes[62] = std::byte{0xFF};
  std::vector<float> dense(n, 1.0f);
  CHECK_THROWS_AS(comm.allgather_accumulate(bytes, dense, 1.0f), gc::error);
  CHECK(std::all_of(dense.begin(), dense.end(), [](float v) { return v == 1.0f; }));
}

TEST_CASE("bucketed all-gather of a model's layers equals one exchange per layer") {
  gc::comm::mpi comm;
  const std::vector<std::size_t> layers{784 * 256, 256, 256 * 10, 10, 1};
  std::vector<gc::compressor<gc::backend::host, gc::select::exact_topk, gc::correct::error_feedback>> mine, separate;
  for (const auto n : layers) {
    mine.emplace_back(gc::backend::host{}, n, gc::select::exact_topk{.density = 0.01}, gc::correct::error_feedback{});
    separate.emplace_back(gc::backend::host{}, n, gc::select::exact_topk{.density = 0.01},
                          gc::correct::error_feedback{});
  }
  std::vector<std::vector<float>> bucketed(layers.size()), one_by_one(layers.size());
  std::vector<bool> summed_by_mpi(layers.size(), false);  // a layer that took the dense fallback
  for (std::size_t l = 0; l < layers.size(); ++l) {
    bucketed[l].assign(layers[l], 0.0f);
    one_by_one[l].assign(layers[l], 0.0f);
  }
  for (int t = 0; t < 3; ++t) {
    std::vector<std::vector<std::byte>> bufs(layers.size());
    std::vector<std::span<const std::byte>> messages;
    std::vector<std::span<float>> dense;
    for (std::size_t l = 0; l < layers.size(); ++l) {
      const auto g = gradient_of(comm.rank(), layers[l], 10 * t + static_cast<int>(l));
      bufs[l].resize(mine[l].max_message_bytes());
      messages.push_back(mine[l].compress(g, bufs[l]).bytes());
      dense.push_back(bucketed[l]);
      std::vector<std::byte> b(separate[l].max_message_bytes());
      const auto path = comm.allgather_accumulate(separate[l].compress(g, b).bytes(), one_by_one[l], 0.25f);
      summed_by_mpi[l] = summed_by_mpi[l] || path == gc::comm::path::dense;
    }
    comm.allgather_accumulate(messages, dense, 0.25f);
  }
  for (std::size_t l = 0; l < layers.size(); ++l) {
    if (!summed_by_mpi[l]) {
      CHECK(bucketed[l] == one_by_one[l]);  // the same additions in the same order
      continue;
    }
    // The dense fallback (the tiny layers, where W messages outgrow the tensor) sums in
    // MPI's order, which at 3 ranks may round differently from rank order.
    for (std::size_t i = 0; i < layers[l]; ++i) {
      CHECK(std::fabs(bucketed[l][i] - one_by_one[l][i]) <= 1e-6f * (std::fabs(one_by_one[l][i]) + 1e-30f));
    }
  }
  // A bucket with the wrong number of tensors is refused on every rank.
  if (comm.size() > 1) {
    std::vector<std::span<float>> dense;
    for (auto& d : bucketed) dense.push_back(d);
    std::vector<std::vector<std::byte>> bufs(layers.size());
    std::vector<std::span<const std::byte>> messages;
    for (std::size_t l = 0; l < layers.size(); ++l) {
      bufs[l].resize(mine[l].max_message_bytes());
      messages.push_back(mine[l].compress(gradient_of(comm.rank(), layers[l], 99), bufs[l]).bytes());
    }
    const auto before = bucketed;
    if (comm.rank() == 0) messages.pop_back(), dense.pop_back();  // rank 0 sends one tensor fewer
    CHECK_THROWS_AS(comm.allgather_accumulate(messages, dense, 1.0f), gc::error);
    CHECK(bucketed == before);
  }
}

// comm::mpi moving the arrays of compressors on opaque_host (support/opaque_host.hpp),
// whose memory is the host's declared a device's: the exchanges then take the path they
// take on backend::cuda (their memory work queued on the backend, copies through to_host
// and to_device), which these tests thus run before a GPU does.
struct mpi_of_opaque_memory : gc::comm::mpi {
  using memory = gc::device_memory;
  using mpi::all_gather;
  void all_gather(gc::device_span<const std::byte> mine, gc::device_span<std::byte> all) {
    mpi::all_gather({mine.data(), mine.size()}, {all.data(), all.size()});
  }
  void broadcast(gc::device_span<std::uint32_t> data, int root) { mpi::broadcast({data.data(), data.size()}, root); }
  void reduce_broadcast(gc::device_span<float> values, int root) {
    mpi::reduce_broadcast({values.data(), values.size()}, root);
  }
  using mpi::all_reduce_sum;
  void all_reduce_sum(gc::device_span<std::uint32_t> values, std::uint64_t max_sum) {
    mpi::all_reduce_sum({values.data(), values.size()}, max_sum);
  }
  using mpi::all_to_all_v;
  void all_to_all_v(gc::device_span<const std::byte> send, std::span<const std::uint64_t> send_sizes,
                    gc::device_span<std::byte> recv, std::span<const std::uint64_t> recv_sizes) {
    mpi::all_to_all_v({send.data(), send.size()}, send_sizes, {recv.data(), recv.size()}, recv_sizes);
  }
};

// A view of `v` as the memory of Backend's compressors.
template <class Backend, class T>
gc::backend_span<Backend, T> view_as(std::vector<std::remove_const_t<T>>& v) {
  return gc::backend_span<Backend, T>(v.data(), v.size());
}

template <class Backend, class Comm>
void scalecom_matches_simulation() {
  Comm comm;
  const int ranks = comm.size();
  const std::size_t n = 40009;
  const double density = 0.005;
  const gc::presets::scalecom_options options{.density = density, .beta = 0.5f};
  auto mine = gc::presets::scalecom(Backend{}, n, options);
  gc::comm::cyclic_topk exchange(comm, mine, gc::select::exact_topk{.density = density});
  // The simulation: every rank's low-pass memory m, the leader's top-k of m + g.
  std::vector<std::vector<float>> m(static_cast<std::size_t>(ranks), std::vector<float>(n, 0.0f));
  std::vector<float> dense(n, 0.0f);
  std::vector<double> reference(n, 0.0), magnitude(n, 0.0);
  const float scale = 1.0f / static_cast<float>(ranks);
  for (int t = 0; t < 6; ++t) {
    // From step 3 on the density doubles (a schedule): the leader's k follows the compressor's.
    const double now = t < 3 ? density : 2 * density;
    if (t == 3) mine.set_density(now);
    auto own_g = gradient_of(comm.rank(), n, t);
    if (t == 2) {  // a step staged and dropped changes nothing: the leader is still rank t mod W
      std::vector<float> scratch(n, 0.0f);
      const auto memory = mine.corrector_state(0);
      const std::vector<float> before(memory.begin(), memory.end());
      (void)exchange.stage(view_as<Backend, const float>(own_g), view_as<Backend, float>(scratch), scale);
      CHECK(mine.has_staged());
      exchange.drop_staged();
      const auto after = mine.corrector_state(0);
      CHECK(std::equal(after.begin(), after.end(), before.begin(), before.end()));
      CHECK(mine.step() == 2);
    }
    // Odd steps staged, then accepted: what step() does in one call.
    const auto sent = t % 2 == 0
                          ? exchange.step(view_as<Backend, const float>(own_g), view_as<Backend, float>(dense), scale)
                          : exchange.stage(view_as<Backend, const float>(own_g), view_as<Backend, float>(dense), scale);
    if (t % 2 == 1) {
      CHECK(mine.has_staged());
      exchange.accept_staged();
    }
    const std::size_t k = reference::k_for(now, n);
    CHECK(sent.count() == k);
    const int leader = t % ranks;
    std::vector<std::vector<float>> acc(static_cast<std::size_t>(ranks), std::vector<float>(n));
    for (int r = 0; r < ranks; ++r) {
      const auto g = gradient_of(r, n, t);
      for (std::size_t i = 0; i < n; ++i) acc[r][i] = m[r][i] + g[i];
    }
    std::vector<std::uint32_t> order(n);
    std::iota(order.begin(), order.end(), 0u);
    const auto& la = acc[static_cast<std::size_t>(leader)];
    std::sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t b) {
      return std::fabs(la[a]) != std::fabs(la[b]) ? std::fabs(la[a]) > std::fabs(la[b]) : a < b;
    });
    order.resize(k);
    std::sort(order.begin(), order.end());
    CHECK(gc::decode(sent.bytes()).indices == order);
    for (int r = 0; r < ranks; ++r) {
      std::vector<float> sent_r(n, 0.0f);
      for (const auto i : order) {
        sent_r[i] = acc[r][i];
        reference[i] += scale * acc[r][i];
        magnitude[i] += scale * std::fabs(acc[r][i]);
      }
      for (std::size_t i = 0; i < n; ++i) m[r][i] = (1.0f - 0.5f) * m[r][i] + 0.5f * (acc[r][i] - sent_r[i]);
    }
  }
  std::size_t off = 0;
  for (std::size_t i = 0; i < n; ++i) off += std::fabs(dense[i] - reference[i]) > 1e-5 * magnitude[i] + 1e-30 ? 1 : 0;
  CHECK(off == 0);
  const auto own = mine.corrector_state(0);
  CHECK(std::equal(own.begin(), own.end(), m[static_cast<std::size_t>(comm.rank())].begin()));
  CHECK(same_on_all_ranks(comm, dense));
}

TEST_CASE("ScaleCom cyclic local top-k equals its simulation, O(k) per rank, across a density change") {
  scalecom_matches_simulation<gc::backend::host, gc::comm::mpi>();
}

TEST_CASE("ScaleCom cyclic local top-k on a memory the host may not read (the path backend::cuda takes)") {
  scalecom_matches_simulation<opaque_host, mpi_of_opaque_memory>();
}

TEST_CASE("cyclic_topk: a NaN on any rank is rejected on every rank, and no compressor changes") {
  gc::comm::mpi comm;
  const int ranks = comm.size();
  const std::size_t n = 5003;
  const double density = 0.01;
  auto make = [&] { return gc::presets::scalecom(gc::backend::host{}, n, {.density = density, .beta = 0.5f}); };
  auto mine = make();
  auto twin = make();  // sees only the clean steps
  gc::comm::cyclic_topk exchange(comm, mine, gc::select::exact_topk{.density = density});
  gc::comm::cyclic_topk twin_exchange(comm, twin, gc::select::exact_topk{.density = density});
  std::vector<float> dense(n, 0.0f), twin_dense(n, 0.0f);
  const auto state_of = [](const auto& c) {
    std::ostringstream out;
    c.save_state(out);
    return out.str();
  };
  // Step t's gradient; a NaN on rank `bad` (the leader at t = 0, a follower later).
  for (int t = 0; t < 4; ++t) {
    const int bad = t == 0 ? 0 : ranks - 1;
    auto g = gradient_of(comm.rank(), n, t);
    if (comm.rank() == bad) g[11] = NAN;
    const auto before = state_of(mine);
    const auto dense_before = dense;
    // Every rank raises the same error: the one of the rank that met the NaN.
    const std::string expected = "gradcomp: preview: grad[11] = nan is not finite (rank " + std::to_string(bad) +
                                 " of " + std::to_string(ranks) + ")";
    CHECK_THROWS_WITH_AS(exchange.step(g, dense, 0.5f), expected.c_str(), gc::error);
    CHECK(state_of(mine) == before);
    CHECK(dense == dense_before);
    // The clean step goes on in step with the twin, which never saw the NaN.
    const auto clean = gradient_of(comm.rank(), n, t);
    const auto a = exchange.step(clean, dense, 0.5f);
    const auto b = twin_exchange.step(clean, twin_dense, 0.5f);
    CHECK(std::equal(a.bytes().begin(), a.bytes().end(), b.bytes().begin(), b.bytes().end()));
    CHECK(dense == twin_dense);
    CHECK(state_of(mine) == state_of(twin));
  }
  // Arguments are checked in the first exchange: the lowest failing rank's error, everywhere.
  const std::string of_ranks = " of " + std::to_string(ranks) + ")";
  CHECK_THROWS_WITH_AS(
      exchange.step(gradient_of(0, n, 9), std::span<float>(dense).first(n - 1), 1.0f),
      ("gradcomp: cyclic_topk: dense.size() = 5002 does not match n = 5003 (rank 0" + of_ranks).c_str(), gc::error);
  CHECK_THROWS_WITH_AS(
      exchange.step(gradient_of(0, n, 9), dense, comm.rank() == ranks - 1 ? INFINITY : 1.0f),
      ("gradcomp: cyclic_topk: scale must be finite, got inf (rank " + std::to_string(ranks - 1) + of_ranks).c_str(),
      gc::error);
  CHECK_THROWS_WITH_AS(gc::comm::cyclic_topk(comm, mine, gc::select::exact_topk{.density = 2 * density}),
                       doctest::Contains("cyclic_topk: the leader's selector may choose 101 indices, more than the "
                                         "compressor's selector takes (51)"),
                       gc::error);
}

// Runs `call` on every rank and checks that every rank throws gradcomp::error with
// exactly `text` (in the same collective call: none is left waiting).
// With `prefix`, the text must start with `text`.
template <class Call>
void every_rank_throws(const gc::comm::mpi& comm, Call&& call, const std::string& text, bool prefix = false) {
  std::string got = "(nothing thrown)";
  try {
    call();
  } catch (const gc::error& e) {
    got = e.what();
  }
  if (prefix) {
    CHECK(got.starts_with(text));
  } else {
    CHECK(got == text);
  }
  // The same text on every rank.
  const std::uint32_t mine = gc::detail::crc32c(reinterpret_cast<const std::byte*>(got.data()), got.size());
  std::vector<std::uint32_t> all(static_cast<std::size_t>(comm.size()));
  MPI_Allgather(&mine, 1, MPI_UINT32_T, all.data(), 1, MPI_UINT32_T, comm.communicator());
  CHECK(std::all_of(all.begin(), all.end(), [&](std::uint32_t c) { return c == mine; }));
}

TEST_CASE("cyclic_topk: ranks configured differently all raise the same error, and nothing changes") {
  gc::comm::mpi comm;
  const int ranks = comm.size();
  if (ranks < 2) return;
  const bool first = comm.rank() == 0;
  const auto state_of = [](const auto& c) {
    std::ostringstream out;
    c.save_state(out);
    return out.str();
  };
  {  // rank 0 has one element more
    const std::size_t n = first ? 5004 : 5003;
    auto mine = gc::presets::scalecom(gc::backend::host{}, n, {.density = 0.01});
    gc::comm::cyclic_topk exchange(comm, mine, gc::select::exact_topk{.density = 0.01});
    std::vector<float> dense(n, 0.0f);
    const auto before = state_of(mine);
    every_rank_throws(
        comm, [&] { (void)exchange.step(gradient_of(comm.rank(), n, 0), dense, 1.0f); },
        "gradcomp: cyclic_topk: ranks disagree on n: rank 0 has 5004, rank 1 has 5003");
    CHECK(state_of(mine) == before);
    CHECK(std::all_of(dense.begin(), dense.end(), [](float v) { return v == 0.0f; }));
  }
  {  // rank 0 selects twice as many (a different density): the follower buffers stay safe
    const std::size_t n = 5003;
    const double density = first ? 0.02 : 0.01;
    auto mine = gc::presets::scalecom(gc::backend::host{}, n, {.density = density});
    gc::comm::cyclic_topk exchange(comm, mine, gc::select::exact_topk{.density = density});
    std::vector<float> dense(n, 0.0f);
    const auto before = state_of(mine);
    every_rank_throws(
        comm, [&] { (void)exchange.step(gradient_of(comm.rank(), n, 0), dense, 1.0f); },
        "gradcomp: cyclic_topk: ranks disagree on k: rank 0 has 101, rank 1 has 51");
    CHECK(state_of(mine) == before);
  }
  {  // ranks one step apart would pick different leaders
    const std::size_t n = 3001;
    auto mine = gc::presets::scalecom(gc::backend::host{}, n, {.density = 0.01});
    std::vector<std::byte> buf(mine.max_message_bytes());
    if (first) {
      mine.set_indices(std::vector<std::uint32_t>{1, 2, 3});
      (void)mine.compress(gradient_of(0, n, 0), buf);
    }
    gc::comm::cyclic_topk exchange(comm, mine, gc::select::exact_topk{.density = 0.01});
    std::vector<float> dense(n, 0.0f);
    every_rank_throws(
        comm, [&] { (void)exchange.step(gradient_of(comm.rank(), n, 1), dense, 1.0f); },
        "gradcomp: cyclic_topk: ranks disagree on the step: rank 0 has 1, rank 1 has 0");
  }
  {  // different policies: rank 0 keeps a low-pass memory, the others plain error feedback
    const std::size_t n = 3001;
    std::vector<float> dense(n, 0.0f);
    const auto attempt = [&](auto corrector) {
      auto mine = gc::compressor{gc::backend::host{}, n, gc::select::given_indices{.max_count = 31}, corrector};
      gc::comm::cyclic_topk exchange(comm, mine, gc::select::exact_topk{.density = 0.01});
      every_rank_throws(
          comm, [&] { (void)exchange.step(gradient_of(comm.rank(), n, 1), dense, 1.0f); },
          "gradcomp: cyclic_topk: ranks disagree on the policies: rank 0 has ", true);
    };
    if (first) {
      attempt(gc::correct::low_pass{.beta = 0.5f});
    } else {
      attempt(gc::correct::error_feedback{});
    }
  }
}

// An exception other than gradcomp::error in one rank's own checks (an allocator's out of
// memory: std::bad_alloc, PyTorch's c10::OutOfMemoryError) is every rank's device error,
// rather than the others waiting in the agreement for that rank.
TEST_CASE("the agreement: an allocator's exception on one rank is every rank's device error") {
  gc::comm::mpi comm;
  const int ranks = comm.size();
  const auto agree = [&] {
    (void)gc::detail::agree(comm, "exchange", {{"n", std::size_t{10}}}, [&]() -> std::uint64_t {
      if (comm.rank() == ranks - 1) throw std::bad_alloc();
      return 0;
    });
  };
  every_rank_throws(
      comm, agree,
      "gradcomp: exchange: std::bad_alloc (rank " + std::to_string(ranks - 1) + " of " + std::to_string(ranks) + ")");
  gc::errc code = gc::errc::invalid_argument;
  try {
    agree();
  } catch (const gc::error& e) {
    code = e.code();
  }
  CHECK(code == gc::errc::device);
}

TEST_CASE("allgather_accumulate: ranks configured differently or with a bad argument all raise the same error") {
  gc::comm::mpi comm;
  const int ranks = comm.size();
  if (ranks < 2) return;
  const bool first = comm.rank() == 0;
  const std::string of_ranks = " of " + std::to_string(ranks) + ")";
  for (const double density : {0.01, 0.6}) {  // the sparse path, and the dense fallback
    CAPTURE(density);
    const std::size_t n = first ? 1001 : 1000;
    auto c = gc::presets::topk_ef(gc::backend::host{}, n, {.density = density});
    std::vector<std::byte> buf(c.max_message_bytes());
    const auto m = c.compress(gradient_of(comm.rank(), n, 0), buf);
    std::vector<float> dense(n, 1.0f);
    every_rank_throws(
        comm, [&] { (void)comm.allgather_accumulate(m.bytes(), dense, 1.0f); },
        "gradcomp: allgather_accumulate: ranks disagree on n: rank 0 has 1001, rank 1 has 1000");
    CHECK(std::all_of(dense.begin(), dense.end(), [](float v) { return v == 1.0f; }));
  }
  const std::size_t n = 1000;
  auto c = gc::presets::topk_ef(gc::backend::host{}, n, {.density = 0.01});
  std::vector<std::byte> buf(c.max_message_bytes());
  const auto m = c.compress(gradient_of(comm.rank(), n, 0), buf);
  std::vector<float> dense(n, 1.0f);
  // A bad scale on the last rank only.
  every_rank_throws(
      comm, [&] { (void)comm.allgather_accumulate(m.bytes(), dense, comm.rank() == ranks - 1 ? NAN : 1.0f); },
      "gradcomp: allgather_accumulate: scale must be finite, got nan (rank " + std::to_string(ranks - 1) + of_ranks);
  CHECK(std::all_of(dense.begin(), dense.end(), [](float v) { return v == 1.0f; }));
  // Three messages against two dense tensors on rank 1 only (bucketed).
  std::vector<std::span<const std::byte>> messages{m.bytes(), m.bytes(), m.bytes()};
  std::vector<float> a(n, 1.0f), b(n, 1.0f), d(n, 1.0f);
  std::vector<std::span<float>> tensors{a, b, d};
  if (comm.rank() == 1) tensors.pop_back();
  every_rank_throws(
      comm, [&] { comm.allgather_accumulate(messages, tensors, 1.0f); },
      "gradcomp: allgather_accumulate: 3 messages for 2 dense tensors (rank 1" + of_ranks);
  // Tensors of other sizes on rank 0.
  std::vector<float> longer(n + 1, 1.0f);
  std::vector<std::span<float>> sized{a, first ? std::span<float>(longer) : std::span<float>(b)};
  std::vector<std::span<const std::byte>> two{m.bytes(), m.bytes()};
  every_rank_throws(
      comm, [&] { comm.allgather_accumulate(two, sized, 1.0f); },
      "gradcomp: allgather_accumulate: ranks disagree on the tensor sizes: rank 0 has ", true);
  CHECK(std::all_of(a.begin(), a.end(), [](float v) { return v == 1.0f; }));
  // After all that, a clean exchange works on every rank.
  CHECK(comm.allgather_accumulate(m.bytes(), dense, 1.0f) == gc::comm::path::sparse);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  doctest::Context context(argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  // One report, from rank 0 (every rank's with ALL_RANKS=1, passed on by mpirun -x ALL_RANKS).
  if (rank != 0 && std::getenv("ALL_RANKS") == nullptr) context.setOption("out", "/dev/null");
  const int failed = context.run();
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any_failed;
}

// -- comm::sparse_allreduce: Ok-Topk's global top-k --------------------------------------

namespace {

// docs/algorithms.md ("Global top-k") simulated for W ranks in one process: each rank's
// top-k with error feedback (e <- e + g, its k_r largest |e|, ties to the lower index,
// sent as the value coding rounds them); the sums per index in rank order; the k of
// largest |sum| (ties to the lower index); each rank's residual loses what it sent only
// where the global selection kept it.
struct global_topk_simulation {
  std::vector<std::vector<float>> e;  // each rank's residual
  std::vector<std::size_t> k_of;      // each rank's count
  std::size_t k;                      // the global selection's
  bool f16;                           // values rounded to binary16

  std::vector<std::uint32_t> step(const std::vector<std::vector<float>>& g, std::vector<float>& dense, float scale) {
    const std::size_t ranks = e.size();
    const std::size_t n = e[0].size();
    std::vector<std::vector<std::uint32_t>> chosen(ranks);
    std::vector<std::vector<float>> sent(ranks);
    std::vector<float> sum(n, 0.0f);
    std::vector<bool> any(n, false);
    for (std::size_t r = 0; r < ranks; ++r) {
      for (std::size_t i = 0; i < n; ++i) e[r][i] = e[r][i] + g[r][i];
      chosen[r] = reference::top_k(e[r], k_of[r]);
      for (const std::uint32_t i : chosen[r]) sent[r].push_back(e[r][i]);
      if (f16) sent[r] = reference::sent_values(reference::values::f16, sent[r], 0, 0, 0);
      for (std::size_t j = 0; j < chosen[r].size(); ++j) {
        const std::uint32_t i = chosen[r][j];
        sum[i] = any[i] ? sum[i] + sent[r][j] : sent[r][j];
        any[i] = true;
      }
    }
    std::vector<std::uint32_t> all;
    for (std::uint32_t i = 0; i < n; ++i) {
      if (any[i]) all.push_back(i);
    }
    const std::vector<std::uint32_t> global = reference::top_k_of(sum, all, k);
    for (const std::uint32_t i : global) dense[i] += scale * sum[i];
    for (std::size_t r = 0; r < ranks; ++r) {
      for (std::size_t j = 0; j < chosen[r].size(); ++j) {
        if (std::binary_search(global.begin(), global.end(), chosen[r][j])) e[r][chosen[r][j]] -= sent[r][j];
      }
    }
    return global;
  }
};

// Rank r's compressor for the simulation: top-k at its own density (they differ from
// rank to rank), error feedback, f32 or f16 values.
template <class Backend = gc::backend::host>
auto topk_ef_of(int rank, std::size_t n, double density, bool f16) {
  return gc::compressor{Backend{}, n, gc::select::exact_topk{.density = density * (1 + rank % 3)},
                        gc::correct::error_feedback{},
                        gc::encode::index_value{.value = f16 ? gc::value_coding::f16 : gc::value_coding::f32}};
}

// What a gradient of the global top-k's tests looks like.
enum class spread {
  heavy,   // heavy-tailed everywhere
  tied,    // a few levels, so that many sums tie at the k-th magnitude across regions
  moving,  // heavy-tailed, with a window 64 times larger that moves from step to step, so
           // that the regions cut at the last step's selection get far more entries than
           // their blocks had room for, or far fewer
};

// Gradient `t` of rank r, spread as `how`.
std::vector<float> sparse_gradient(int rank, std::size_t n, int t, spread how = spread::heavy) {
  auto g = gradient_of(rank, n, t);
  if (how == spread::tied) {
    for (auto& v : g) v = std::round(v);
  } else if (how == spread::moving && t % 2 == 1) {
    const std::size_t width = n / 13;
    const std::size_t start = static_cast<std::size_t>(t) * (3 * n / 7) % n;
    for (std::size_t j = 0; j < width; ++j) g[(start + j) % n] *= 64.0f;
  }
  return g;
}

// W ranks over MPI against the simulation: the selection, `dense` and this rank's
// residual equal it bit for bit at every step, on every rank alike. Returns how many
// steps after the first ran their exchange again (blocks or parts outgrown).
template <class Backend = gc::backend::host, class Comm = gc::comm::mpi>
int sparse_allreduce_matches_simulation(std::size_t n, double density, std::size_t k, bool f16, spread how, int steps) {
  Comm comm;
  const int ranks = comm.size();
  CAPTURE(n);
  CAPTURE(k);
  CAPTURE(f16);
  CAPTURE(static_cast<int>(how));
  auto mine = topk_ef_of<Backend>(comm.rank(), n, density, f16);
  // One k for all ranks (each rank's own density names another).
  gc::comm::sparse_allreduce exchange(comm, mine, k != 0 ? k : reference::k_for(density, n));
  global_topk_simulation sim{
      std::vector<std::vector<float>>(static_cast<std::size_t>(ranks), std::vector<float>(n)), {}, exchange.k(), f16};
  for (int r = 0; r < ranks; ++r) sim.k_of.push_back(topk_ef_of(r, n, density, f16).selector().max_selected(n));
  std::vector<float> dense(n, 0.0f), expected(n, 0.0f);
  const float scale = 1.0f / static_cast<float>(ranks);
  bool uneven = false;
  int again = 0;
  std::uint64_t fewest = ~std::uint64_t{0};  // the collectives of a step that ran once
  for (int t = 0; t < steps; ++t) {
    std::vector<std::vector<float>> g;
    for (int r = 0; r < ranks; ++r) g.push_back(sparse_gradient(r, n, t, how));
    const auto got = exchange.step(view_as<Backend, const float>(g[static_cast<std::size_t>(comm.rank())]),
                                   view_as<Backend, float>(dense), scale);
    const auto want = sim.step(g, expected, scale);
    CHECK(std::vector<std::uint32_t>(got.begin(), got.end()) == want);
    CHECK(dense == expected);
    const auto residual = mine.corrector_state(0);
    CHECK(std::vector<float>(residual.begin(), residual.end()) == sim.e[static_cast<std::size_t>(comm.rank())]);
    CHECK(mine.step() == static_cast<std::uint64_t>(t + 1));
    const std::uint64_t collectives = exchange.last_traffic().collectives;
    if (t > 0) again += collectives > fewest ? 1 : 0;
    fewest = std::min(fewest, collectives);
    // Regions after the first step are cut at the selection's quantiles, not equal.
    const auto b = exchange.regions();
    for (int j = 1; j < ranks; ++j) {
      uneven = uneven ||
               b[static_cast<std::size_t>(j)] != static_cast<std::uint32_t>(j * n / static_cast<std::size_t>(ranks));
    }
  }
  CHECK(uneven == (ranks > 1));
  CHECK(same_on_all_ranks(comm, dense));
  return again;
}

// Transport `Base` whose all_to_all_v (of host memory or of its compressors') hands rank
// `bad` a corrupt first entry (an index past every region).
template <class Base>
struct corrupting : Base {
  int bad = 1;
  template <class Send, class Recv>
  void all_to_all_v(Send send, std::span<const std::uint64_t> send_sizes, Recv recv,
                    std::span<const std::uint64_t> recv_sizes) {
    Base::all_to_all_v(send, send_sizes, recv, recv_sizes);
    if (this->rank() == bad && recv.size() >= 4) gc::detail::store_le<std::uint32_t>(recv.data(), 0xFFFFFFF0u);
  }
};
using corrupting_mpi = corrupting<gc::comm::mpi>;

std::string checkpoint(const auto& c) {
  std::ostringstream out;
  c.save_state(out);
  return out.str();
}

}  // namespace

TEST_CASE("sparse_allreduce equals its simulation of W ranks: selection, sums and every residual, bit for bit") {
  sparse_allreduce_matches_simulation(30011, 0.01, 0, false, spread::heavy, 6);
  sparse_allreduce_matches_simulation(30011, 0.01, 0, true, spread::heavy, 4);  // lossy values: e loses what was sent
  sparse_allreduce_matches_simulation(20000, 0.02, 0, false, spread::tied, 4);  // ties at the k-th sum across regions
  sparse_allreduce_matches_simulation(5003, 0.002, 400, false, spread::heavy, 3);  // k above the union: all of it
  sparse_allreduce_matches_simulation(4099, 0.01, 1, false, spread::heavy, 3);     // k = 1
  // Mass moving between regions: blocks outgrown (the step runs again with more room)
  // and rooms far above what the ranks need (shrunk), step after step.
  const int again = sparse_allreduce_matches_simulation(30011, 0.01, 0, false, spread::moving, 24);
  gc::comm::mpi comm;
  if (comm.size() > 1) CHECK(again > 0);
}

TEST_CASE("sparse_allreduce on a memory the host may not read (the path backend::cuda takes) equals its simulation") {
  sparse_allreduce_matches_simulation<opaque_host, mpi_of_opaque_memory>(30011, 0.01, 0, true, spread::heavy, 4);
  sparse_allreduce_matches_simulation<opaque_host, mpi_of_opaque_memory>(30011, 0.01, 0, false, spread::moving, 24);
}

TEST_CASE("sparse_allreduce receives about 2k entries per rank whatever W, and follows a density change") {
  gc::comm::mpi comm;
  const std::size_t n = 200003;
  auto c = gc::presets::topk_ef(gc::backend::host{}, n, {.density = 0.001});
  gc::comm::sparse_allreduce exchange(comm, c);
  const std::size_t k = exchange.k();
  CHECK(k == 201);
  std::vector<float> dense(n, 0.0f);
  for (int t = 0; t < 8; ++t) (void)exchange.step(gradient_of(comm.rank(), n, t), dense, 1.0f);
  const gc::comm::traffic last = exchange.last_traffic();
  // Entries are 8 bytes; the histograms 3.5 KB at most; the frames, the records, and each
  // block's header and its 16 entries of room to spare, a few bytes per rank.
  const std::uint64_t entries = 8 * k;
  const auto w = static_cast<std::uint64_t>(comm.size());
  const std::uint64_t fixed = 4 * (257 + 256 + 256 + 128) + (40 + 16 + 8 * 17) * w;
  CHECK(last.received <= 3 * entries + fixed);
  CHECK(last.sent <= 2 * entries + fixed);
  CHECK(last.collectives <= 10);
  c.set_density(0.002);
  CHECK(exchange.k() == 401);
  (void)exchange.step(gradient_of(comm.rank(), n, 9), dense, 1.0f);
  CHECK(same_on_all_ranks(comm, dense));
  // The workspace given back and the density lowered: the gather's capacity, sized by
  // the larger step before, follows the smaller k (a read past the selection otherwise,
  // which the sanitized run would catch).
  exchange.release_workspace();
  c.set_density(0.0002);
  CHECK(exchange.k() == 41);
  for (int t = 10; t < 12; ++t) (void)exchange.step(gradient_of(comm.rank(), n, t), dense, 1.0f);
  // After a step at the smaller k, the blocks and the gather shrink to it: its entries
  // and a part of at most k.
  CHECK(exchange.last_traffic().sent <= 2 * 8 * 41 + fixed);
  CHECK(same_on_all_ranks(comm, dense));
}

TEST_CASE(
    "sparse_allreduce: a NaN, a bad argument, a corrupt entry or a differently configured rank fails on every "
    "rank alike, changing nothing") {
  gc::comm::mpi comm;
  const int ranks = comm.size();
  const std::string of_ranks = " of " + std::to_string(ranks) + ")";
  const std::size_t n = 7001;
  auto make = [&] { return gc::presets::dgc(gc::backend::host{}, n, {.density = 0.01, .max_norm = 5.0f}); };
  auto mine = make();
  auto twin = make();  // sees only the clean steps
  gc::comm::sparse_allreduce exchange(comm, mine);
  gc::comm::sparse_allreduce twin_exchange(comm, twin);
  std::vector<float> dense(n, 0.0f), twin_dense(n, 0.0f);
  corrupting_mpi corrupting;
  gc::comm::sparse_allreduce corrupted(corrupting, mine);
  for (int t = 0; t < 3; ++t) {
    const auto before = checkpoint(mine);
    const auto dense_before = dense;
    const int bad = t % ranks;
    auto g = gradient_of(comm.rank(), n, t);
    if (comm.rank() == bad) g[5] = NAN;
    every_rank_throws(
        comm, [&] { (void)exchange.step(g, dense, 0.5f); },
        "gradcomp: compress: grad[5] = nan is not finite (rank " + std::to_string(bad) + of_ranks, true);
    every_rank_throws(
        comm, [&] { (void)exchange.step(gradient_of(comm.rank(), n, t), std::span<float>(dense).first(n - 1), 1.0f); },
        "gradcomp: sparse_allreduce: dense.size() = 7000 does not match n = 7001 (rank 0" + of_ranks);
    every_rank_throws(
        comm,
        [&] { (void)exchange.step(gradient_of(comm.rank(), n, t), dense, comm.rank() == ranks - 1 ? NAN : 1.0f); },
        "gradcomp: sparse_allreduce: scale must be finite, got nan (rank " + std::to_string(ranks - 1) + of_ranks);
    if (ranks > 1) {
      every_rank_throws(
          comm, [&] { (void)corrupted.step(gradient_of(comm.rank(), n, t), dense, 1.0f); },
          "gradcomp: sparse_allreduce: rank 1 of " + std::to_string(ranks) +
              " received entries outside its region or out of order");
    }
    CHECK_FALSE(mine.has_staged());
    CHECK(checkpoint(mine) == before);
    CHECK(dense == dense_before);
    // The clean step goes on in step with the twin, which never saw the failures.
    const auto a = exchange.step(gradient_of(comm.rank(), n, t), dense, 0.5f);
    const auto b = twin_exchange.step(gradient_of(comm.rank(), n, t), twin_dense, 0.5f);
    CHECK(std::vector<std::uint32_t>(a.begin(), a.end()) == std::vector<std::uint32_t>(b.begin(), b.end()));
    CHECK(dense == twin_dense);
    CHECK(checkpoint(mine) == checkpoint(twin));
  }
  if (ranks > 1) {
    // A rank with another k, or with other policies.
    auto other =
        comm.rank() == 1 ? gc::presets::dgc(gc::backend::host{}, n, {.density = 0.02, .max_norm = 5.0f}) : make();
    gc::comm::sparse_allreduce odd(comm, other);
    every_rank_throws(
        comm, [&] { (void)odd.step(gradient_of(comm.rank(), n, 0), dense, 1.0f); },
        "gradcomp: sparse_allreduce: ranks disagree on k: rank 0 has 71, rank 1 has 141");
    // A rank with other policies.
    auto plain = gc::presets::topk_ef(gc::backend::host{}, n, {.density = 0.01});
    gc::comm::sparse_allreduce plain_exchange(comm, plain);
    const auto before = checkpoint(mine);
    every_rank_throws(
        comm,
        [&] {
          const auto g = gradient_of(comm.rank(), n, 0);
          (void)(comm.rank() == 1 ? plain_exchange.step(g, dense, 1.0f) : exchange.step(g, dense, 1.0f));
        },
        "gradcomp: sparse_allreduce: ranks disagree on the policies: rank 0 has ", true);
    CHECK(checkpoint(mine) == before);
    CHECK(plain.step() == 0);
    // A setting of the caller's (a DDP hook's), agreed in the exchange's first all-gather
    // and reported as the caller's.
    const std::vector<gc::detail::setting> ours{{"the bucket index", comm.rank() == ranks - 1 ? "3" : "2"}};
    every_rank_throws(
        comm, [&] { (void)exchange.stage(gradient_of(comm.rank(), n, 0), dense, 1.0f, ours, "hook"); },
        "gradcomp: hook: ranks disagree on the bucket index: rank 0 has 2, rank " + std::to_string(ranks - 1) +
            " has 3");
    CHECK_FALSE(mine.has_staged());
    CHECK(checkpoint(mine) == before);
  }
  CHECK_THROWS_WITH_AS(gc::comm::sparse_allreduce(comm, mine, n + 1),
                       "gradcomp: sparse_allreduce: k = 7002 exceeds the compressor's n = 7001", gc::error);
}

// The reduce-scatter tests' layout over `comm`'s ranks: W shards of 2003 indices, this
// rank's starting at `begin`.
struct scatter_layout {
  int ranks;
  std::size_t w, n, shard_n, begin;
  explicit scatter_layout(const auto& comm)
      : ranks(comm.size()),
        w(static_cast<std::size_t>(ranks)),
        n(2003 * w),
        shard_n(2003),
        begin(2003 * static_cast<std::size_t>(comm.rank())) {}
};

// reduce_scatter on compressors of Backend over transport Comm, against the reference:
// each rank's shard and residual bit for bit; bad shapes refused on every rank alike.
template <class Backend, class Comm>
void reduce_scatter_matches_reference() {
  Comm comm;
  const auto [ranks, w, n, shard_n, begin] = scatter_layout(comm);
  const auto make = [](int rank, std::size_t size) {
    return gc::compressor{Backend{}, size, gc::select::exact_topk{.density = 0.01 * (1 + rank % 3)},
                          gc::correct::error_feedback{}, gc::encode::index_value{}};
  };
  auto mine = make(comm.rank(), n);
  gc::comm::sparse_allreduce exchange(comm, mine);
  std::vector<std::vector<float>> e(w, std::vector<float>(n, 0.0f));
  std::vector<float> shard(shard_n, 7.0f);
  for (int t = 0; t < 4; ++t) {
    std::vector<float> sum(n, 0.0f);
    std::vector<bool> any(n, false);
    for (int r = 0; r < ranks; ++r) {
      auto& er = e[static_cast<std::size_t>(r)];
      const auto g = sparse_gradient(r, n, t);
      for (std::size_t i = 0; i < n; ++i) er[i] = er[i] + g[i];
      for (const std::uint32_t i : reference::top_k(er, make(r, n).selector().max_selected(n))) {
        sum[i] = any[i] ? sum[i] + er[i] : er[i];
        any[i] = true;
        er[i] -= er[i];  // everything sent is committed: no global selection
      }
    }
    auto g = sparse_gradient(comm.rank(), n, t);
    exchange.reduce_scatter(view_as<Backend, const float>(g), view_as<Backend, float>(shard), 0.5f);
    std::vector<float> expected(shard_n, 0.0f);
    for (std::size_t i = 0; i < shard_n; ++i) expected[i] = any[begin + i] ? 0.5f * sum[begin + i] : 0.0f;
    CHECK(shard == expected);
    const auto residual = mine.corrector_state(0);
    CHECK(std::vector<float>(residual.begin(), residual.end()) == e[static_cast<std::size_t>(comm.rank())]);
  }
  const auto before = checkpoint(mine);
  const auto shard_before = shard;
  auto g = sparse_gradient(comm.rank(), n, 9);
  every_rank_throws(
      comm,
      [&] {
        exchange.reduce_scatter(view_as<Backend, const float>(g),
                                gc::backend_span<Backend, float>(shard.data(), shard_n - 1), 1.0f);
      },
      "gradcomp: sparse_allreduce: shard.size() = " + std::to_string(shard_n - 1) +
          " does not match n / ranks = " + std::to_string(shard_n) + " (rank 0 of " + std::to_string(ranks) + ")");
  CHECK(checkpoint(mine) == before);
  CHECK(shard == shard_before);
  // A NaN in the last rank's gradient: its error on every rank, nothing changed.
  if (comm.rank() == ranks - 1) g[7] = NAN;
  every_rank_throws(
      comm, [&] { exchange.reduce_scatter(view_as<Backend, const float>(g), view_as<Backend, float>(shard), 1.0f); },
      "gradcomp: compress: grad[7] = nan is not finite (rank " + std::to_string(ranks - 1) + " of " +
          std::to_string(ranks) + ")");
  CHECK(checkpoint(mine) == before);
  CHECK(shard == shard_before);
  g = sparse_gradient(comm.rank(), n, 9);
  if (ranks > 1) {
    // Every rank sends 3e38 at index 5 (the owner's sum overflows): every rank refuses,
    // nothing changed.
    g[5] = 3e38f;
    every_rank_throws(
        comm, [&] { exchange.reduce_scatter(view_as<Backend, const float>(g), view_as<Backend, float>(shard), 1.0f); },
        "gradcomp: sparse_allreduce: a sum in rank 0 of " + std::to_string(ranks) + "'s region overflows (not finite)");
    CHECK(checkpoint(mine) == before);
    CHECK(shard == shard_before);
    // Rank 1 receives a corrupt entry: every rank refuses, nothing changed.
    corrupting<Comm> bad_comm;
    gc::comm::sparse_allreduce bad_exchange(bad_comm, mine);
    g = sparse_gradient(comm.rank(), n, 9);
    every_rank_throws(
        comm,
        [&] { bad_exchange.reduce_scatter(view_as<Backend, const float>(g), view_as<Backend, float>(shard), 1.0f); },
        "gradcomp: sparse_allreduce: rank 1 of " + std::to_string(ranks) +
            " received entries outside its region or out of order");
    CHECK(checkpoint(mine) == before);
    CHECK(shard == shard_before);
    auto odd = make(comm.rank(), n + 1);
    gc::comm::sparse_allreduce odd_exchange(comm, odd);
    std::vector<float> odd_shard((n + 1) / w);
    auto odd_g = sparse_gradient(comm.rank(), n + 1, 0);
    every_rank_throws(
        comm,
        [&] {
          odd_exchange.reduce_scatter(view_as<Backend, const float>(odd_g), view_as<Backend, float>(odd_shard), 1.0f);
        },
        "gradcomp: sparse_allreduce: reduce_scatter needs n = " + std::to_string(n + 1) +
            " to be a multiple of the ranks, " + std::to_string(ranks) + " (rank 0 of " + std::to_string(ranks) + ")");
    CHECK(odd.step() == 0);
    // Rank 1 with an exchange new beside the others' agreed ones, twice (the second
    // time it holds the sizes it took part at): every rank raises, nothing changed, no
    // rank left waiting; then the agreed exchanges go on.
    gc::comm::sparse_allreduce<decltype(mine), Comm> fresh(comm, mine);
    g = sparse_gradient(comm.rank(), n, 9);
    for (int again = 0; again < 2; ++again) {
      every_rank_throws(
          comm,
          [&] {
            (comm.rank() == 1 ? fresh : exchange)
                .reduce_scatter(view_as<Backend, const float>(g), view_as<Backend, float>(shard), 1.0f);
          },
          "gradcomp: sparse_allreduce: ranks disagree on the sizes the collectives move: rank 0 has ", true);
      CHECK(checkpoint(mine) == before);
      CHECK(shard == shard_before);
    }
    exchange.reduce_scatter(view_as<Backend, const float>(g), view_as<Backend, float>(shard), 1.0f);
    CHECK(checkpoint(mine) != before);
  }
}

TEST_CASE(
    "sparse_allreduce::reduce_scatter: each rank's shard of the summed messages and every residual, bit for "
    "bit; bad shapes fail on every rank alike") {
  reduce_scatter_matches_reference<gc::backend::host, gc::comm::mpi>();
}

TEST_CASE("sparse_allreduce::reduce_scatter on a memory the host may not read (the path backend::cuda takes)") {
  reduce_scatter_matches_reference<opaque_host, mpi_of_opaque_memory>();
}

namespace {
// Whether counted_device's work since the last reset read, copied or allocated nothing
// but scratch.
bool waited_for_nothing() {
  const device_waits waits = counted_device::reset();
  return waits.reads == 0 && waits.to_host == 0 && waits.to_device == 0 && waits.allocations == 0;
}
}  // namespace

// What reduce_scatter makes the host wait for on a device (support/counted_device.hpp),
// with a selector that waits for nothing: once, for the frames and records at its end;
// the entries travel in the compressor's memory, in blocks of the room the ranks agreed.
// The first call also reads the frames of exchanges that have agreed on no sizes yet,
// and runs again once with room for its blocks (read again). Three collectives: the
// frames, the entries, the records. Its workspace is scratch (no wait), grown while the
// residual's first steps make the selection grow, then no more. The same shards and
// residuals as on backend::host. Queued (queue_reduce_scatter, after a first call), it
// waits for nothing, and settle() from the outcome the caller read for nothing more.
TEST_CASE("sparse_allreduce::reduce_scatter on a device reads back its outcome once, not its entries; queued, none") {
  mpi_of_opaque_memory comm;
  gc::comm::mpi host_comm;
  const auto w = static_cast<std::size_t>(comm.size());
  const std::size_t n = 4001 * w;
  const auto on_device = [&] { return gc::presets::threshold_ef(counted_device{}, n, {.tau = 1.5f}); };
  const auto on_host = [&] { return gc::presets::threshold_ef(gc::backend::host{}, n, {.tau = 1.5f}); };
  for (const bool queued : {false, true}) {
    CAPTURE(queued);
    auto device_compressor = on_device();
    auto host_compressor = on_host();
    gc::comm::sparse_allreduce device_exchange(comm, device_compressor);
    gc::comm::sparse_allreduce host_exchange(host_comm, host_compressor);
    std::vector<float> device_shard(n / w), host_shard(n / w);
    for (int t = 0; t < 6; ++t) {
      CAPTURE(t);
      auto g = gradient_of(comm.rank(), n, t);
      const auto device_g = view_as<counted_device, const float>(g);
      (void)counted_device::reset();
      if (queued && t > 0) {
        device_exchange.queue_reduce_scatter(device_g, view_as<counted_device, float>(device_shard), 0.5f);
        // Nothing read, copied or allocated but scratch (kept_ and the blocks as they grow).
        CHECK(waited_for_nothing());
        const auto outcome = device_exchange.outcome();
        (void)device_exchange.settle(std::vector<std::byte>(outcome.data(), outcome.data() + outcome.size()));
        CHECK(waited_for_nothing());
        host_exchange.queue_reduce_scatter(g, host_shard, 0.5f);
        (void)host_exchange.settle(host_exchange.outcome());
      } else {
        device_exchange.reduce_scatter(device_g, view_as<counted_device, float>(device_shard), 0.5f);
        const device_waits waits = counted_device::reset();
        host_exchange.reduce_scatter(g, host_shard, 0.5f);
        CHECK(waits.reads == 0);
        // A call that ran again (its blocks outgrew their room as the selection grew) made
        // an agreement and its three collectives once more, and read once more.
        const std::uint64_t again = (device_exchange.last_traffic().collectives - 3) / 4;
        CHECK(device_exchange.last_traffic().collectives == 3 + 4 * again);
        CHECK(again <= 1);
        CHECK(waits.to_host == (t == 0 ? 2 : 1) + again);
        CHECK(waits.to_device == 0);
        CHECK(waits.allocations == 0);  // its workspace is scratch
        if (t >= 2) {
          CHECK(waits.scratch == 0);
          CHECK(again == 0);
        }
      }
      CHECK(device_shard == host_shard);
      CHECK(checkpoint(device_compressor) == checkpoint(host_compressor));
      CHECK(device_exchange.last_traffic().sent == host_exchange.last_traffic().sent);
    }
  }
}

// The refusals a queued exchange meets at settle(), alike on every rank, its compressor
// unchanged: a NaN in the last rank's gradient `g`; with several ranks, a sum that
// overflows (every rank sends 3e38 at index 5, in rank 0's region). `queue(g)` queues a
// call, `unchanged()` says whether its output holds what a refused step leaves there.
template <class Compressor, class Queue, class Unchanged, class Settle>
void refused_alike_at_settle(const gc::comm::mpi& comm, const Compressor& mine, const std::vector<float>& g,
                             Queue&& queue, Unchanged&& unchanged, Settle&& settle) {
  const int ranks = comm.size();
  const auto before = checkpoint(mine);
  auto bad = g;
  if (comm.rank() == ranks - 1) bad[7] = NAN;
  queue(bad);
  CHECK(unchanged());
  every_rank_throws(comm, settle,
                    "gradcomp: compress: grad (or its error feedback) holds a NaN or infinity (rank " +
                        std::to_string(ranks - 1) + " of " + std::to_string(ranks) + ")");
  CHECK_FALSE(mine.has_staged());
  CHECK(checkpoint(mine) == before);
  if (ranks > 1) {
    bad = g;
    bad[5] = 3e38f;
    queue(bad);
    CHECK(unchanged());
    every_rank_throws(
        comm, settle,
        "gradcomp: sparse_allreduce: a sum in rank 0 of " + std::to_string(ranks) + "'s region overflows (not finite)");
    CHECK(checkpoint(mine) == before);
  }
}

// queue_reduce_scatter on compressors of Backend over transport Comm, against the
// reference: after a first call (reduce_scatter, which agrees the blocks' room), each
// queued call writes the shard before anything is read; a rank's block for a region
// carries the first `room` of its entries there (ascending) and settle() commits only
// those, the rest staying in its residual, then grows the room for the next call (the
// density triples at step 2, so that every region outgrows its block). A NaN on one rank
// zeros every shard and raises the same error on every rank at settle(), the residual
// unchanged; the calls then go on.
template <class Backend, class Comm>
void queued_reduce_scatter_matches_reference() {
  Comm comm;
  const auto [ranks, w, n, shard_n, begin] = scatter_layout(comm);
  auto mine = gc::compressor{Backend{}, n, gc::select::exact_topk{.density = 0.01}, gc::correct::error_feedback{},
                             gc::encode::index_value{}};
  gc::comm::sparse_allreduce exchange(comm, mine);
  std::vector<std::vector<float>> e(w, std::vector<float>(n, 0.0f));
  std::vector<float> shard(shard_n, 7.0f);
  const auto roomy = [](std::size_t need) { return need + need / 8 + 16; };
  std::size_t room = 0;  // the blocks' room, as the ranks agree it
  bool carried_part = false;
  // One step of every rank, blocks of `room` (none: all); the shard expected of it and
  // the most entries a rank had for a region.
  const auto reference_step = [&](int t, std::size_t k, std::optional<std::size_t> cap) {
    std::vector<float> sum(n, 0.0f);
    std::vector<bool> any(n, false);
    std::size_t largest = 0;
    for (int r = 0; r < ranks; ++r) {
      auto& er = e[static_cast<std::size_t>(r)];
      const auto g = sparse_gradient(r, n, t);
      for (std::size_t i = 0; i < n; ++i) er[i] = er[i] + g[i];
      auto chosen = reference::top_k(er, k);
      std::sort(chosen.begin(), chosen.end());
      std::vector<std::size_t> in_region(w, 0);
      for (const std::uint32_t i : chosen) {
        const std::size_t j = i / shard_n;
        largest = std::max(largest, ++in_region[j]);
        if (cap && in_region[j] > *cap) {
          carried_part = true;
          continue;  // not carried: it stays in the residual
        }
        sum[i] = any[i] ? sum[i] + er[i] : er[i];
        any[i] = true;
        er[i] -= er[i];
      }
    }
    std::vector<float> expected(shard_n, 0.0f);
    for (std::size_t i = 0; i < shard_n; ++i) expected[i] = any[begin + i] ? 0.5f * sum[begin + i] : 0.0f;
    return std::pair{expected, largest};
  };
  const auto settle = [&] {
    const auto outcome = exchange.outcome();
    (void)exchange.settle(std::vector<std::byte>(outcome.data(), outcome.data() + outcome.size()));
  };
  for (int t = 0; t < 5; ++t) {
    mine.set_density(t < 2 ? 0.01 : 0.03);
    const std::size_t k = mine.selector().max_selected(n);
    auto g = sparse_gradient(comm.rank(), n, t);
    const auto [expected, largest] = reference_step(t, k, t == 0 ? std::nullopt : std::optional{room});
    CAPTURE(t);
    if (t == 0) {
      CHECK_FALSE(exchange.sizes_agreed());
      exchange.reduce_scatter(view_as<Backend, const float>(g), view_as<Backend, float>(shard), 0.5f);
      room = roomy(largest);  // ran again at once with room for its blocks
    } else {
      CHECK(exchange.sizes_agreed());
      const auto before = checkpoint(mine);
      exchange.queue_reduce_scatter(view_as<Backend, const float>(g), view_as<Backend, float>(shard), 0.5f);
      CHECK(shard == expected);           // written before the host read anything
      CHECK(checkpoint(mine) == before);  // committed at the settle
      settle();
      room = largest > room ? roomy(largest) : roomy(largest) < room / 2 ? roomy(largest) : room;
    }
    CHECK(shard == expected);
    const auto residual = mine.corrector_state(0);
    CHECK(std::vector<float>(residual.begin(), residual.end()) == e[static_cast<std::size_t>(comm.rank())]);
  }
  CHECK(carried_part);  // some block was outgrown and carried what fit
  // A NaN, an overflow: zeros in every shard (not the infinity).
  const auto before = checkpoint(mine);
  refused_alike_at_settle(
      comm, mine, sparse_gradient(comm.rank(), n, 9),
      [&](std::vector<float>& g) {
        shard.assign(shard_n, 7.0f);
        exchange.queue_reduce_scatter(view_as<Backend, const float>(g), view_as<Backend, float>(shard), 1.0f);
      },
      [&] { return shard == std::vector<float>(shard_n, 0.0f); }, settle);
  // This rank's own bad argument: the shard is left as it is, the error on every rank.
  std::vector<float> short_shard(shard_n - 1, 7.0f);
  auto g = sparse_gradient(comm.rank(), n, 5);
  exchange.queue_reduce_scatter(view_as<Backend, const float>(g),
                                view_as<Backend, float>(comm.rank() == 0 ? short_shard : shard), 1.0f);
  if (comm.rank() == 0) CHECK(short_shard == std::vector<float>(shard_n - 1, 7.0f));
  every_rank_throws(comm, settle,
                    "gradcomp: sparse_allreduce: shard.size() = " + std::to_string(shard_n - 1) +
                        " does not match n / ranks = " + std::to_string(shard_n) + " (rank 0 of " +
                        std::to_string(ranks) + ")");
  CHECK(checkpoint(mine) == before);
  // The calls go on from the residual the refused ones left.
  const auto [expected, largest] = reference_step(5, mine.selector().max_selected(n), room);
  exchange.queue_reduce_scatter(view_as<Backend, const float>(g), view_as<Backend, float>(shard), 0.5f);
  settle();
  CHECK(shard == expected);
  const auto residual = mine.corrector_state(0);
  CHECK(std::vector<float>(residual.begin(), residual.end()) == e[static_cast<std::size_t>(comm.rank())]);
}

TEST_CASE(
    "sparse_allreduce::queue_reduce_scatter: the shard written before any read, blocks carrying what fits and "
    "settle() committing only that; refusals alike at settle()") {
  queued_reduce_scatter_matches_reference<gc::backend::host, gc::comm::mpi>();
}

TEST_CASE("sparse_allreduce::queue_reduce_scatter on a memory the host may not read (the path backend::cuda takes)") {
  queued_reduce_scatter_matches_reference<opaque_host, mpi_of_opaque_memory>();
}

// queue_step on compressors of Backend over transport Comm, against the reference of
// docs/algorithms.md ("Global top-k", "Carrying what fits"): a rank's block for a
// region carries the first `room` of its entries there (ascending), the sums are of
// what was carried, the global top-k of them is cut, region by region, to the first
// `capacity` of each region's part, and each rank commits only the selected entries it
// carried. The regions, the room and the capacity follow as the ranks agree them.
// Refusals: nothing added to dense, the same error on every rank at settle().
template <class Backend, class Comm>
void queued_step_matches_reference() {
  Comm comm;
  const int ranks = comm.size();
  const auto w = static_cast<std::size_t>(ranks);
  const std::size_t n = 20011;
  auto mine = gc::compressor{Backend{}, n, gc::select::exact_topk{.density = 0.01}, gc::correct::error_feedback{},
                             gc::encode::index_value{}};
  gc::comm::sparse_allreduce exchange(comm, mine);
  std::vector<std::vector<float>> e(w, std::vector<float>(n, 0.0f));
  std::vector<std::uint32_t> bounds;
  for (std::size_t j = 0; j <= w; ++j) bounds.push_back(static_cast<std::uint32_t>(j * n / w));
  const auto roomy = [](std::size_t need) { return need + need / 8 + 16; };
  const auto shrunk = [&](std::size_t size, std::size_t need) { return roomy(need) < size / 2 ? roomy(need) : size; };
  std::size_t room = 0, capacity = 0;  // as the ranks agree them
  bool carried_part = false, cut_part = false, left_out_selected = false;
  const float scale = 0.5f;
  // Gradients the ranks largely share; at steps 3 and 4 rank 0's is a hundredth of the
  // others' and crowds the upper half of the indices, so that its blocks there leave
  // out entries that the others send, sum and select (which rank 0 must not commit).
  const auto grad_of = [&](int r, int t) {
    auto g = gradient_of(0, n, t);
    const auto own = gradient_of(r + 1, n, t);
    for (std::size_t i = 0; i < n; ++i) g[i] += 0.25f * own[i];
    if (r == 0) {
      for (std::size_t i = 0; i < n; ++i) g[i] *= (t == 3 || t == 4) && i >= n / 2 ? 0.1f : 0.01f;
    }
    return g;
  };
  // One step of every rank: dense added to, the residuals and the regions updated; the
  // most entries a rank had for a region and the largest part of the uncut selection.
  // Without `carry`, blocks and parts hold everything (a step() that runs again).
  const auto reference_step = [&](int t, std::size_t k, std::vector<float>& dense, bool carry) {
    const auto region_of = [&](std::uint32_t i) {
      return static_cast<std::size_t>(std::upper_bound(bounds.begin(), bounds.end(), i) - bounds.begin() - 1);
    };
    std::vector<float> sum(n, 0.0f);
    std::vector<bool> any(n, false);
    std::vector<std::vector<std::uint32_t>> carried(w), left_out(w);
    std::size_t largest = 0;
    for (std::size_t r = 0; r < w; ++r) {
      const auto g = grad_of(static_cast<int>(r), t);
      for (std::size_t i = 0; i < n; ++i) e[r][i] = e[r][i] + g[i];
      std::vector<std::size_t> in_region(w, 0);
      for (const std::uint32_t i : reference::top_k(e[r], k)) {
        const std::size_t count = ++in_region[region_of(i)];
        largest = std::max(largest, count);
        if (carry && count > room) {
          carried_part = true;
          left_out[r].push_back(i);
          continue;  // not carried: it stays in the residual
        }
        sum[i] = any[i] ? sum[i] + e[r][i] : e[r][i];
        any[i] = true;
        carried[r].push_back(i);
      }
    }
    std::vector<std::uint32_t> all;
    for (std::uint32_t i = 0; i < n; ++i) {
      if (any[i]) all.push_back(i);
    }
    std::vector<std::uint32_t> global;
    std::vector<std::size_t> part(w, 0);
    std::size_t longest = 0;
    for (const std::uint32_t i : reference::top_k_of(sum, all, k)) {
      const std::size_t count = ++part[region_of(i)];
      longest = std::max(longest, count);
      if (carry && count > capacity) {
        cut_part = true;
        continue;  // the part carries its lowest indices
      }
      global.push_back(i);
    }
    for (const std::uint32_t i : global) dense[i] += scale * sum[i];
    for (std::size_t r = 0; r < w; ++r) {
      for (const std::uint32_t i : carried[r]) {
        if (std::binary_search(global.begin(), global.end(), i)) e[r][i] -= e[r][i];
      }
      for (const std::uint32_t i : left_out[r]) {
        left_out_selected = left_out_selected || std::binary_search(global.begin(), global.end(), i);
      }
    }
    if (!global.empty()) {
      for (std::size_t j = 1; j < w; ++j) bounds[j] = global[j * global.size() / w];
    }
    return std::pair{largest, longest};
  };
  const auto settle = [&] {
    const auto outcome = exchange.outcome();
    (void)exchange.settle(std::vector<std::byte>(outcome.data(), outcome.data() + outcome.size()));
  };
  std::vector<float> dense(n, 0.0f), expected(n, 0.0f);
  for (int t = 0; t < 6; ++t) {
    CAPTURE(t);
    mine.set_density(t < 2 ? 0.01 : 0.03);
    const std::size_t k = mine.selector().max_selected(n);
    auto g = grad_of(comm.rank(), t);
    const auto [largest, longest] = reference_step(t, k, expected, t != 0);
    if (t == 0) {
      CHECK_FALSE(exchange.sizes_agreed());
      (void)exchange.step(view_as<Backend, const float>(g), view_as<Backend, float>(dense), scale);
      room = roomy(largest);  // it ran again, with room for its blocks, then for its parts
      capacity = std::min(k, roomy(longest));
    } else {
      const auto before = checkpoint(mine);
      exchange.queue_step(view_as<Backend, const float>(g), view_as<Backend, float>(dense), scale);
      CHECK(dense == expected);           // added to before the host read anything
      CHECK(checkpoint(mine) == before);  // committed at the settle
      settle();
      if (largest > room || longest > capacity) {
        room = largest > room ? roomy(largest) : room;
        capacity = longest > capacity ? std::min(k, roomy(longest)) : capacity;
      } else {
        room = shrunk(room, largest);
        capacity = std::min(k, shrunk(capacity, longest));
      }
    }
    CHECK(dense == expected);
    const auto residual = mine.corrector_state(0);
    CHECK(std::vector<float>(residual.begin(), residual.end()) == e[static_cast<std::size_t>(comm.rank())]);
    const auto regions = exchange.regions();
    CHECK(std::vector<std::uint32_t>(regions.begin(), regions.end()) == bounds);
  }
  CHECK(carried_part);  // some block was outgrown and carried what fit
  CHECK(cut_part);      // some part of the selection outgrew the gather and carried what fit
  // Some entry a rank's block left out was sent by another, and selected: that rank
  // did not commit it.
  CHECK(left_out_selected == (ranks > 1));
  // A NaN, an overflow: nothing added (not the infinity).
  const auto before = checkpoint(mine);
  refused_alike_at_settle(
      comm, mine, grad_of(comm.rank(), 9),
      [&](std::vector<float>& g) {
        exchange.queue_step(view_as<Backend, const float>(g), view_as<Backend, float>(dense), 1.0f);
      },
      [&] { return dense == expected; }, settle);
  // This rank's own bad argument: nothing added, the error on every rank.
  std::vector<float> short_dense(n - 1, 7.0f);
  auto g = grad_of(comm.rank(), 6);
  if (comm.rank() == 0) {
    exchange.queue_step(view_as<Backend, const float>(g), view_as<Backend, float>(short_dense), 1.0f);
    CHECK(short_dense == std::vector<float>(n - 1, 7.0f));
  } else {
    exchange.queue_step(view_as<Backend, const float>(g), view_as<Backend, float>(dense), 1.0f);
  }
  every_rank_throws(comm, settle,
                    "gradcomp: sparse_allreduce: dense.size() = " + std::to_string(n - 1) +
                        " does not match n = " + std::to_string(n) + " (rank 0 of " + std::to_string(ranks) + ")");
  CHECK(dense == expected);
  CHECK(checkpoint(mine) == before);
  // A step queued and dropped unsettled (a backward pass that raised before its end):
  // nothing committed, the regions its selection cut for the next step put back.
  auto dropped = grad_of(comm.rank(), 7);
  exchange.queue_step(view_as<Backend, const float>(dropped), view_as<Backend, float>(dense), scale);
  exchange.drop_staged();
  CHECK(checkpoint(mine) == before);
  dense = expected;  // what the dropped step added is the caller's to throw away
  // The calls go on from the residual the refused ones left.
  (void)reference_step(6, mine.selector().max_selected(n), expected, true);
  exchange.queue_step(view_as<Backend, const float>(g), view_as<Backend, float>(dense), scale);
  settle();
  CHECK(dense == expected);
  const auto residual = mine.corrector_state(0);
  CHECK(std::vector<float>(residual.begin(), residual.end()) == e[static_cast<std::size_t>(comm.rank())]);
  const auto regions = exchange.regions();
  CHECK(std::vector<std::uint32_t>(regions.begin(), regions.end()) == bounds);
}

TEST_CASE(
    "sparse_allreduce::queue_step: dense added to before any read, blocks and parts carrying what fits and "
    "settle() committing only that; refusals alike at settle()") {
  queued_step_matches_reference<gc::backend::host, gc::comm::mpi>();
}

TEST_CASE("sparse_allreduce::queue_step on a memory the host may not read (the path backend::cuda takes)") {
  queued_step_matches_reference<opaque_host, mpi_of_opaque_memory>();
}

// queue_step on a device, with a selector that waits for nothing: nothing read, copied or
// allocated but scratch until the outcome, and settle() from it reads nothing more; the
// same dense sums and checkpoints as on backend::host.
TEST_CASE("sparse_allreduce::queue_step on a device reads nothing until its outcome, and equals the host's") {
  mpi_of_opaque_memory comm;
  gc::comm::mpi host_comm;
  const std::size_t n = 12007;
  auto device_compressor = gc::presets::threshold_ef(counted_device{}, n, {.tau = 1.5f});
  auto host_compressor = gc::presets::threshold_ef(gc::backend::host{}, n, {.tau = 1.5f});
  gc::comm::sparse_allreduce device_exchange(comm, device_compressor, 300);
  gc::comm::sparse_allreduce host_exchange(host_comm, host_compressor, 300);
  std::vector<float> device_dense(n, 0.0f), host_dense(n, 0.0f);
  for (int t = 0; t < 6; ++t) {
    CAPTURE(t);
    auto g = gradient_of(comm.rank(), n, t);
    const auto device_g = view_as<counted_device, const float>(g);
    if (t == 0) {
      (void)device_exchange.step(device_g, view_as<counted_device, float>(device_dense), 0.5f);
      (void)host_exchange.step(g, host_dense, 0.5f);
    } else {
      (void)counted_device::reset();
      device_exchange.queue_step(device_g, view_as<counted_device, float>(device_dense), 0.5f);
      CHECK(waited_for_nothing());
      const auto outcome = device_exchange.outcome();
      (void)device_exchange.settle(std::vector<std::byte>(outcome.data(), outcome.data() + outcome.size()));
      CHECK(waited_for_nothing());
      host_exchange.queue_step(g, host_dense, 0.5f);
      (void)host_exchange.settle(host_exchange.outcome());
    }
    CHECK(device_dense == host_dense);
    CHECK(checkpoint(device_compressor) == checkpoint(host_compressor));
  }
}

// What sparse_allreduce::step (Ok-Topk's global top-k, the DDP hook's sparse_allreduce
// aggregation) makes the host wait for on a device, with a selector that waits for
// nothing: once, at the end, for the ranks' frames and records, the selection and the
// next regions. The first step also reads the frames (no sizes agreed yet) and runs
// twice more, reading each: its blocks outgrow their empty room, then its parts the
// gather's. The entries, the histograms and the selection travel in the compressor's
// memory, and the commit reads the selection where it arrived (nothing copied to the
// device). Its workspace is scratch (no wait), grown as the residual's selection grows.
// The same selection, dense sums and residuals as on backend::host.
TEST_CASE("sparse_allreduce::step on a device: what it waits for, and its commit of the kept entries") {
  mpi_of_opaque_memory comm;
  gc::comm::mpi host_comm;
  const std::size_t n = 30011;
  auto on_device = gc::presets::threshold_ef(counted_device{}, n, {.tau = 1.5f});
  auto on_host = gc::presets::threshold_ef(gc::backend::host{}, n, {.tau = 1.5f});
  gc::comm::sparse_allreduce device_exchange(comm, on_device, 300);
  gc::comm::sparse_allreduce host_exchange(host_comm, on_host, 300);
  std::vector<float> device_dense(n, 0.0f), host_dense(n, 0.0f);
  for (int t = 0; t < 8; ++t) {
    auto g = gradient_of(comm.rank(), n, t);
    (void)counted_device::reset();
    const auto chosen = device_exchange.step(view_as<counted_device, const float>(g),
                                             view_as<counted_device, float>(device_dense), 0.5f);
    const std::vector<std::uint32_t> device_chosen(chosen.begin(), chosen.end());
    const device_waits waits = counted_device::reset();
    const auto want = host_exchange.step(g, host_dense, 0.5f);
    CHECK(device_chosen == std::vector<std::uint32_t>(want.begin(), want.end()));
    CHECK(device_dense == host_dense);
    CHECK(checkpoint(on_device) == checkpoint(on_host));
    CAPTURE(t);
    CHECK(waits.reads == 0);
    // A step that ran again (its blocks or parts outgrew their room as the selection
    // grew) made an agreement and its eight collectives once more, and read once more;
    // the first ran twice more, its first two runs without a gather (no capacity yet).
    const std::uint64_t collectives = device_exchange.last_traffic().collectives;
    const std::uint64_t again = t == 0 ? 2 : (collectives - 8) / 9;
    CHECK(collectives == (t == 0 ? 7 + 8 + 9 : 8 + 9 * again));
    CHECK(again <= (t == 0 ? 2 : 1));
    CHECK(waits.to_host == (t == 0 ? 2 : 1) + again);
    CHECK(waits.to_device == 0);
    CHECK(waits.allocations == 0);
  }
}

// What cyclic_topk (ScaleCom) makes the host wait for on a device
// (support/counted_device.hpp): its verdicts, indices and sums travel in the
// compressor's memory and the host reads the exchange's outcome once, at its end; the
// first step, and a step after the density changed, run the exchange twice (the
// collectives move the count the ranks agreed on before). The leader's selection waits
// besides as exact_topk waits on this backend (backend::cuda runs an engine of its own
// for it), measured apart. The same dense sums and memories as on backend::host, every
// step.
TEST_CASE("cyclic_topk on a device reads its outcome once per step, and matches the host") {
  mpi_of_opaque_memory comm;
  gc::comm::mpi host_comm;
  const std::size_t n = 20011;
  const double density = 0.01;
  auto on_device = gc::presets::scalecom(counted_device{}, n, {.density = density, .beta = 0.5f});
  auto on_host = gc::presets::scalecom(gc::backend::host{}, n, {.density = density, .beta = 0.5f});
  gc::comm::cyclic_topk device_exchange(comm, on_device, gc::select::exact_topk{.density = density});
  gc::comm::cyclic_topk host_exchange(host_comm, on_host, gc::select::exact_topk{.density = density});
  std::vector<float> device_dense(n, 0.0f), host_dense(n, 0.0f);
  gc::compressor leader_alone{
      counted_device{}, n, gc::select::exact_topk{.density = density}, gc::correct::none{},
      gc::encode::index_value{.index = gc::index_coding::raw32, .value = gc::value_coding::f32}};
  std::vector<std::byte> scratch(leader_alone.max_message_bytes());
  for (int t = 0; t < 6; ++t) {
    if (t == 4) {
      on_device.set_density(2 * density);
      on_host.set_density(2 * density);
    }
    auto g = gradient_of(comm.rank(), n, t);
    (void)counted_device::reset();
    (void)leader_alone.compress(view_as<counted_device, const float>(g),
                                gc::device_span<std::byte>(scratch.data(), scratch.size()));
    device_waits selection = counted_device::reset();
    selection.reads -= 1;  // compress() reads its status besides, where the exchange's leader reads nothing
    const auto m = device_exchange.step(view_as<counted_device, const float>(g),
                                        view_as<counted_device, float>(device_dense), 0.5f);
    const device_waits waits = counted_device::reset();
    const auto want = host_exchange.step(g, host_dense, 0.5f);
    CAPTURE(t);
    CHECK(m.count() == want.count());
    CHECK(m.bytes().size() == want.bytes().size());
    CHECK(std::memcmp(m.bytes().data(), want.bytes().data(), want.bytes().size()) == 0);
    CHECK(device_dense == host_dense);
    CHECK(checkpoint(on_device) == checkpoint(on_host));
    const std::size_t exchanges = t == 0 || t == 4 ? 2 : 1;
    const std::size_t leads = comm.rank() == t % comm.size() ? exchanges : 0;
    CHECK(waits.to_host == exchanges + leads * selection.to_host);
    CHECK(waits.reads == leads * selection.reads);
    CHECK(waits.to_device == leads * selection.to_device);
    if (t != 0 && t != 4) CHECK(waits.allocations == 0);
  }
}

// A queued exchange (cyclic_topk, sparse_allreduce) whose caller's setting differs on
// the last rank (`hook` elsewhere): every rank fails at settle, as the caller's,
// nothing staged and nothing changed.
template <class Exchange, class Compressor>
void queued_with_other_settings(mpi_of_opaque_memory& comm, Exchange& exchange, Compressor& c,
                                std::vector<float>& dense, std::vector<float> g, float scale,
                                const std::vector<gc::detail::setting>& hook) {
  if (comm.size() < 2) return;
  const std::vector<gc::detail::setting> other{{"the bucket's dtype", "torch.float16"}};
  const bool last = comm.rank() == comm.size() - 1;
  const std::string before = checkpoint(c);
  const std::vector<float> dense_before = dense;
  every_rank_throws(
      comm,
      [&] {
        exchange.queue(view_as<counted_device, const float>(g), view_as<counted_device, float>(dense), scale,
                       last ? other : hook, "hook");
        const auto outcome = exchange.outcome();
        (void)exchange.settle(std::vector<std::byte>(outcome.data(), outcome.data() + outcome.size()));
      },
      "gradcomp: hook: ranks disagree on the bucket's dtype: rank 0 has torch.float32, rank " +
          std::to_string(comm.size() - 1) + " has torch.float16");
  CHECK(checkpoint(c) == before);
  CHECK(dense == dense_before);
  CHECK(!c.has_staged());
}

// A DDP hook's step over ScaleCom's exchanges (python/csrc/ddp_steps.cpp): each bucket's
// exchange queued, the outcomes read together at the step's end, then each settled.
// Queued, an exchange waits for nothing but its leader's selection; settled from its
// outcome, for nothing (the first step runs again inside settle(), at the count the
// ranks agreed). The dense sums and memories equal step()'s on backend::host. A setting
// of the caller's that one rank holds differently fails every rank alike, reported as
// the caller's, with nothing changed.
TEST_CASE("cyclic_topk: exchanges queued together and settled after their outcomes are read") {
  mpi_of_opaque_memory comm;
  gc::comm::mpi host_comm;
  const std::size_t sizes[] = {20011, 7001};
  const double density = 0.01;
  const float scale = 0.5f;
  using device_preset = decltype(gc::presets::scalecom(counted_device{}, 1, {}));
  using host_preset = decltype(gc::presets::scalecom(gc::backend::host{}, 1, {}));
  std::vector<device_preset> on_device;
  std::vector<host_preset> on_host;
  for (const std::size_t n : sizes) {
    on_device.push_back(gc::presets::scalecom(counted_device{}, n, {.density = density, .beta = 0.5f}));
    on_host.push_back(gc::presets::scalecom(gc::backend::host{}, n, {.density = density, .beta = 0.5f}));
  }
  using device_exchange = gc::comm::cyclic_topk<gc::select::exact_topk, device_preset, mpi_of_opaque_memory>;
  using host_exchange = gc::comm::cyclic_topk<gc::select::exact_topk, host_preset, gc::comm::mpi>;
  std::vector<std::unique_ptr<device_exchange>> queued;
  std::vector<std::unique_ptr<host_exchange>> twins;
  std::vector<std::vector<float>> device_dense, host_dense;
  for (std::size_t b = 0; b < 2; ++b) {
    queued.push_back(std::make_unique<device_exchange>(comm, on_device[b], gc::select::exact_topk{.density = density}));
    twins.push_back(std::make_unique<host_exchange>(host_comm, on_host[b], gc::select::exact_topk{.density = density}));
    device_dense.emplace_back(sizes[b], 0.0f);
    host_dense.emplace_back(sizes[b], 0.0f);
  }
  const std::vector<gc::detail::setting> hook{{"the bucket's dtype", "torch.float32"}};
  for (int t = 0; t < 4; ++t) {
    CAPTURE(t);
    std::vector<std::vector<float>> grads;
    for (std::size_t b = 0; b < 2; ++b) grads.push_back(gradient_of(comm.rank() + static_cast<int>(b), sizes[b], t));
    std::vector<device_waits> queueing;
    for (std::size_t b = 0; b < 2; ++b) {
      (void)counted_device::reset();
      queued[b]->queue(view_as<counted_device, const float>(grads[b]), view_as<counted_device, float>(device_dense[b]),
                       scale, hook, "hook");
      queueing.push_back(counted_device::reset());
    }
    std::vector<std::vector<std::byte>> outcomes;
    for (std::size_t b = 0; b < 2; ++b) {
      const auto outcome = queued[b]->outcome();
      outcomes.emplace_back(outcome.data(), outcome.data() + outcome.size());  // the step's one read, in the hook
    }
    for (std::size_t b = 0; b < 2; ++b) {
      CAPTURE(b);
      const bool leads = comm.rank() == t % comm.size();
      device_waits waited = queueing[b];
      waited.scratch = 0;                           // a first step's scratch: allocated without a wait
      if (!leads) CHECK(waited == device_waits{});  // the leader's exact_topk reads as it does alone
      (void)counted_device::reset();
      const auto m = queued[b]->settle(outcomes[b]);
      const device_waits settling = counted_device::reset();
      if (t > 0) CHECK(settling == device_waits{});  // the first step runs again at the agreed count
      queued[b]->accept_staged();
      const auto want = twins[b]->step(grads[b], host_dense[b], scale);
      CHECK(m.count() == want.count());
      CHECK(std::memcmp(m.bytes().data(), want.bytes().data(), want.bytes().size()) == 0);
      CHECK(device_dense[b] == host_dense[b]);
      CHECK(checkpoint(on_device[b]) == checkpoint(on_host[b]));
    }
  }
  queued_with_other_settings(comm, *queued[0], on_device[0], device_dense[0], gradient_of(comm.rank(), sizes[0], 9),
                             scale, hook);
}

// sparse_allreduce as the DDP hook runs it: two exchanges queued, waiting for nothing,
// their outcomes read together (in the hook, one copy for the step), then settled: once
// the sizes are agreed nothing is waited for while settling; the same selections, sums
// and memories as backend::host's, every step; a setting of the caller's that differs on
// one rank fails every rank at settle, nothing staged.
TEST_CASE("sparse_allreduce: exchanges queued together and settled after their outcomes are read") {
  mpi_of_opaque_memory comm;
  gc::comm::mpi host_comm;
  const std::size_t sizes[] = {20011, 7001};
  const float scale = 0.5f;
  using device_preset = decltype(gc::presets::topk_ef(counted_device{}, 1, {}));
  using host_preset = decltype(gc::presets::topk_ef(gc::backend::host{}, 1, {}));
  std::vector<device_preset> on_device;
  std::vector<host_preset> on_host;
  for (const std::size_t n : sizes) {
    on_device.push_back(gc::presets::topk_ef(counted_device{}, n, {.density = 0.01}));
    on_host.push_back(gc::presets::topk_ef(gc::backend::host{}, n, {.density = 0.01}));
  }
  using device_exchange = gc::comm::sparse_allreduce<device_preset, mpi_of_opaque_memory>;
  using host_exchange = gc::comm::sparse_allreduce<host_preset, gc::comm::mpi>;
  std::vector<std::unique_ptr<device_exchange>> queued;
  std::vector<std::unique_ptr<host_exchange>> twins;
  std::vector<std::vector<float>> device_dense, host_dense;
  for (std::size_t b = 0; b < 2; ++b) {
    queued.push_back(std::make_unique<device_exchange>(comm, on_device[b]));
    twins.push_back(std::make_unique<host_exchange>(host_comm, on_host[b]));
    device_dense.emplace_back(sizes[b], 0.0f);
    host_dense.emplace_back(sizes[b], 0.0f);
  }
  const std::vector<gc::detail::setting> hook{{"the bucket's dtype", "torch.float32"}};
  for (int t = 0; t < 4; ++t) {
    CAPTURE(t);
    std::vector<std::vector<float>> grads;
    for (std::size_t b = 0; b < 2; ++b)
      grads.push_back(sparse_gradient(comm.rank() + static_cast<int>(b), sizes[b], t));
    for (std::size_t b = 0; b < 2; ++b) {
      // exact_topk reads as it does alone on this backend (backend::cuda runs its own
      // engine): measured apart, on a compressor of its own.
      auto alone = gc::presets::topk_ef(counted_device{}, sizes[b], {.density = 0.01});
      std::vector<std::byte> scratch(alone.max_message_bytes());
      (void)counted_device::reset();
      (void)alone.compress(view_as<counted_device, const float>(grads[b]),
                           gc::device_span<std::byte>(scratch.data(), scratch.size()));
      device_waits selecting = counted_device::reset();
      selecting.reads -= 1;  // compress() reads its status besides, where a queued step reads nothing
      queued[b]->queue(view_as<counted_device, const float>(grads[b]), view_as<counted_device, float>(device_dense[b]),
                       scale, hook, "hook");
      const device_waits queueing = counted_device::reset();
      // Nothing more: a first step also reads the frames (no sizes agreed yet).
      CHECK(queueing.reads == selecting.reads);
      CHECK(queueing.to_host == selecting.to_host + (t == 0 ? 1 : 0));
    }
    std::vector<std::vector<std::byte>> outcomes;
    for (std::size_t b = 0; b < 2; ++b) {
      const auto outcome = queued[b]->outcome();
      outcomes.emplace_back(outcome.data(), outcome.data() + outcome.size());  // the step's one read, in the hook
    }
    for (std::size_t b = 0; b < 2; ++b) {
      CAPTURE(b);
      (void)counted_device::reset();
      const auto chosen = queued[b]->settle(outcomes[b]);
      const std::vector<std::uint32_t> got(chosen.begin(), chosen.end());
      const device_waits settling = counted_device::reset();
      if (t > 0) CHECK(settling == device_waits{});  // the first step runs again, with room
      queued[b]->accept_staged();
      const auto want = twins[b]->step(grads[b], host_dense[b], scale);
      CHECK(got == std::vector<std::uint32_t>(want.begin(), want.end()));
      CHECK(device_dense[b] == host_dense[b]);
      CHECK(checkpoint(on_device[b]) == checkpoint(on_host[b]));
    }
  }
  queued_with_other_settings(comm, *queued[0], on_device[0], device_dense[0], sparse_gradient(comm.rank(), sizes[0], 9),
                             scale, hook);
}

// ScaleCom with leaders whose count is not fixed: a threshold (|acc_i| >= tau on the
// leader, docs/algorithms.md), whose count changes from step to step, so that every
// step runs the exchange twice, and which may choose none (the step then sends nothing
// and commits its memory all the same); and a random set, which moves with the leader's
// own steps. Against the simulation written out.
TEST_CASE("cyclic_topk with a threshold leader (any count, none included) and a random one") {
  gc::comm::mpi comm;
  const int ranks = comm.size();
  const std::size_t n = 3001;
  const float beta = 0.5f;
  for (const float tau : {2.5f, 1e30f}) {
    auto mine = gc::presets::scalecom(gc::backend::host{}, n, {.density = 1.0, .beta = beta});
    gc::comm::cyclic_topk exchange(comm, mine, gc::select::threshold{.tau = tau});
    std::vector<std::vector<float>> m(static_cast<std::size_t>(ranks), std::vector<float>(n, 0.0f));
    std::vector<float> dense(n, 0.0f), want(n, 0.0f);
    for (int t = 0; t < 4; ++t) {
      auto own_g = gradient_of(comm.rank(), n, t);
      const auto sent = exchange.step(own_g, dense, 1.0f);
      std::vector<std::vector<float>> acc(static_cast<std::size_t>(ranks), std::vector<float>(n));
      for (int r = 0; r < ranks; ++r) {
        const auto g = gradient_of(r, n, t);
        for (std::size_t i = 0; i < n; ++i) acc[r][i] = m[r][i] + g[i];
      }
      std::vector<std::uint32_t> chosen;
      for (std::size_t i = 0; i < n; ++i) {
        if (std::fabs(acc[static_cast<std::size_t>(t % ranks)][i]) >= tau)
          chosen.push_back(static_cast<std::uint32_t>(i));
      }
      CAPTURE(tau);
      CAPTURE(t);
      CHECK(sent.count() == chosen.size());
      CHECK(gc::decode(sent.bytes()).indices == chosen);
      for (int r = 0; r < ranks; ++r) {
        std::vector<float> sent_r(n, 0.0f);
        for (const auto i : chosen) sent_r[i] = acc[r][i];
        for (std::size_t i = 0; i < n; ++i) m[r][i] = (1.0f - beta) * m[r][i] + beta * (acc[r][i] - sent_r[i]);
      }
      for (const auto i : chosen) {
        double sum = 0.0;  // the reduce's order is the transport's: compared within rounding
        for (int r = 0; r < ranks; ++r) sum += acc[r][i];
        CHECK(std::fabs(dense[i] - want[i] - sum) <= 1e-5 * (std::fabs(sum) + 1.0));
        want[i] = dense[i];
      }
      CHECK(dense == want);  // nothing added where nothing was chosen
      const auto own = mine.corrector_state(0);
      CHECK(std::equal(own.begin(), own.end(), m[static_cast<std::size_t>(comm.rank())].begin()));
      CHECK(mine.step() == static_cast<std::uint64_t>(t + 1));
    }
  }
  // A random leader draws from (seed, its own step): a rank that leads twice draws anew.
  auto mine = gc::presets::scalecom(gc::backend::host{}, n, {.density = 0.01, .beta = beta});
  gc::comm::cyclic_topk exchange(comm, mine, gc::select::random_k{.density = 0.01, .seed = 7});
  std::vector<float> dense(n, 0.0f);
  std::vector<std::vector<std::uint32_t>> sets;
  for (int t = 0; t < 2 * ranks; ++t) {
    auto g = gradient_of(comm.rank(), n, t);
    sets.push_back(gc::decode(exchange.step(g, dense, 1.0f).bytes()).indices);
  }
  for (int t = 0; t < ranks; ++t) CHECK(sets[static_cast<std::size_t>(t)] != sets[static_cast<std::size_t>(t + ranks)]);
}

// A transport that breaks the leader's indices on their way to the other ranks (swaps
// the first two) at the steps where `broken` says so.
struct swapping_broadcast : mpi_of_opaque_memory {
  bool broken = false;
  void broadcast(gc::device_span<std::uint32_t> data, int root) {
    mpi_of_opaque_memory::broadcast(data, root);
    if (broken && rank() != root && data.size() > 1) std::swap(data.data()[0], data.data()[1]);
  }
};

TEST_CASE("cyclic_topk: indices broken on their way to one rank are refused on every rank, and nothing changes") {
  swapping_broadcast comm;
  const int ranks = comm.size();
  if (ranks < 2) return;
  const std::size_t n = 5003;
  const double density = 0.01;
  auto make = [&] { return gc::presets::scalecom(counted_device{}, n, {.density = density, .beta = 0.5f}); };
  auto mine = make();
  auto twin = make();  // sees only the whole steps
  gc::comm::cyclic_topk exchange(comm, mine, gc::select::exact_topk{.density = density});
  gc::comm::cyclic_topk twin_exchange(comm, twin, gc::select::exact_topk{.density = density});
  std::vector<float> dense(n, 0.0f), twin_dense(n, 0.0f);
  const auto both = [&](int t) {
    auto g = gradient_of(comm.rank(), n, t);
    (void)exchange.step(view_as<counted_device, const float>(g), view_as<counted_device, float>(dense), 1.0f);
    (void)twin_exchange.step(view_as<counted_device, const float>(g), view_as<counted_device, float>(twin_dense), 1.0f);
  };
  both(0);
  both(1);
  const int leader = 2 % ranks;
  const auto before = checkpoint(mine);
  const auto dense_before = dense;
  comm.broken = true;  // the indices reach every rank but the leader out of order
  auto g = gradient_of(comm.rank(), n, 2);
  CHECK_THROWS_WITH_AS(
      (void)exchange.step(view_as<counted_device, const float>(g), view_as<counted_device, float>(dense), 1.0f),
      ("gradcomp: cyclic_topk: the indices of the leader (rank " + std::to_string(leader) + ") arrived on " +
       std::to_string(ranks - 1) + " of " + std::to_string(ranks) + " ranks not ascending below n = 5003")
          .c_str(),
      gc::error);
  CHECK(checkpoint(mine) == before);
  CHECK(dense == dense_before);
  CHECK_FALSE(mine.has_staged());
  comm.broken = false;  // every rank goes on in step, with the twin
  both(2);
  both(3);
  CHECK(dense == twin_dense);
  CHECK(checkpoint(mine) == checkpoint(twin));
}

// -- comm::leader_exchange: Leader SGD ---------------------------------------------------------

namespace {

// docs/algorithms.md ("Leader SGD") simulated for W workers in one process: each worker's
// local step x -= lr g; every `period`-th step each group's worker of the lowest loss
// (ties to the lower rank) leads it and every worker of the group moves local_pull of the
// way toward the leader's parameters; every global_every-th round the lowest loss of all
// then pulls every worker by global_pull. `toward` gives what a pull's workers move
// toward from its kind (0: a group's, 1: the global one), its group and the leader's
// parameters: those themselves (the paper's exchange) unless set. A leader's own pull
// moves nothing, x - c (x - x) being x.
struct lsgd_simulation {
  using target = std::function<std::vector<float>(int kind, std::size_t group, const std::vector<float>& leader)>;
  gc::comm::lsgd policy;
  std::vector<std::vector<float>> x;
  target toward = [](int, std::size_t, const std::vector<float>& leader) { return leader; };
  std::uint64_t t = 0;

  static void pull(std::vector<float>& worker, const std::vector<float>& leader, float c) {
    for (std::size_t i = 0; i < worker.size(); ++i) worker[i] = worker[i] - c * (worker[i] - leader[i]);
  }
  static std::size_t lowest(const std::vector<double>& loss, std::size_t begin, std::size_t end) {
    std::size_t best = begin;
    for (std::size_t r = begin; r < end; ++r) best = loss[r] < loss[best] ? r : best;
    return best;
  }
  // One step of every worker; returns each worker's (group leader, global leader), -1 for none.
  std::vector<std::pair<int, int>> step(const std::vector<std::vector<float>>& grads, const std::vector<double>& loss,
                                        float lr) {
    const std::size_t w = x.size();
    for (std::size_t r = 0; r < w; ++r) {
      for (std::size_t i = 0; i < x[r].size(); ++i) x[r][i] -= lr * grads[r][i];
    }
    std::vector<std::pair<int, int>> leaders(w, {-1, -1});
    if (++t % policy.period != 0) return leaders;
    const std::size_t g = policy.group_size == 0 ? w : policy.group_size;
    for (std::size_t first = 0; first < w; first += g) {
      const std::size_t leader = lowest(loss, first, first + g);
      const std::vector<float> sent = toward(0, first / g, x[leader]);
      for (std::size_t r = first; r < first + g; ++r) {
        if (r != leader) pull(x[r], sent, policy.local_pull);
        leaders[r].first = static_cast<int>(leader);
      }
    }
    if ((t / policy.period) % policy.global_every == 0) {
      const std::size_t leader = lowest(loss, 0, w);
      const std::vector<float> sent = toward(1, 0, x[leader]);
      for (std::size_t r = 0; r < w; ++r) {
        if (r != leader) pull(x[r], sent, policy.global_pull);
        leaders[r].second = static_cast<int>(leader);
      }
    }
    return leaders;
  }
};

// Worker r's loss at step t: three values among five ranks, so that ties (to the lower
// rank) happen.
double loss_of(int rank, int step) { return static_cast<double>((rank * 7 + step * 3) % 5 / 2) * 0.25; }

}  // namespace

TEST_CASE("leader_exchange equals its simulation of W workers, groups included, bit for bit") {
  gc::comm::mpi world;
  const int ranks = world.size();
  const auto w = static_cast<std::size_t>(ranks);
  // Two groups where the ranks split evenly in groups of 2 or more, else one.
  const std::size_t group_size = ranks >= 4 && ranks % 2 == 0 ? w / 2 : 0;
  const gc::comm::lsgd policy{
      .period = 2, .global_every = 2, .local_pull = 0.25f, .global_pull = 0.5f, .group_size = group_size};
  const std::size_t g = policy.group_of(w);
  MPI_Comm split = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, world.rank() / static_cast<int>(g), world.rank(), &split);
  {
    gc::comm::mpi group(split);
    const std::size_t n = 1001;
    const float lr = 0.05f;
    lsgd_simulation sim{policy, {}};
    for (int r = 0; r < ranks; ++r)
      sim.x.push_back(inputs::make(inputs::shape::normal, n, 77 + static_cast<std::uint64_t>(r)));
    std::vector<float> x = sim.x[static_cast<std::size_t>(world.rank())];
    gc::comm::leader_exchange exchange(world, group, gc::backend::host{}, n, policy);
    int rounds = 0;
    for (int t = 0; t < 12; ++t) {
      std::vector<std::vector<float>> grads;
      std::vector<double> loss;
      for (int r = 0; r < ranks; ++r) {
        grads.push_back(gradient_of(r, n, t));
        loss.push_back(loss_of(r, t));
      }
      const auto leaders = sim.step(grads, loss, lr);
      const auto& g_mine = grads[static_cast<std::size_t>(world.rank())];
      for (std::size_t i = 0; i < n; ++i) x[i] -= lr * g_mine[i];
      const gc::comm::leader_round round = exchange.step(x, loss_of(world.rank(), t));
      CAPTURE(t);
      CHECK(round.held == ((t + 1) % 2 == 0));
      CHECK(round.group_leader == leaders[static_cast<std::size_t>(world.rank())].first);
      CHECK(round.global_leader == leaders[static_cast<std::size_t>(world.rank())].second);
      CHECK(x == sim.x[static_cast<std::size_t>(world.rank())]);
      rounds += round.held ? 1 : 0;
      if (round.held && ranks > 1) {  // the leader sends n floats, the others receive them
        const bool led = round.group_leader == world.rank();
        CHECK(exchange.last_traffic().received >= (led ? 0 : 4 * n));
      }
    }
    CHECK(rounds == 6);
    CHECK(exchange.steps() == 12);

    // A NaN loss on the last rank at a round: every rank throws the same error, and no
    // rank's parameters or step count change.
    const std::vector<float> before = x;
    exchange.step(x, 1.0);  // step 13: no round
    const double bad = world.rank() == ranks - 1 ? std::nan("") : 1.0;
    every_rank_throws(
        world, [&] { exchange.step(x, bad); },
        "gradcomp: leader_exchange: the loss must be finite, got nan (rank " + std::to_string(ranks - 1) + " of " +
            std::to_string(ranks) + ")");
    CHECK(x == before);
    CHECK(exchange.steps() == 13);
    // The group communicator of another split than the policy's: refused on every rank.
    if (group_size != 0) {
      gc::comm::leader_exchange wrong(world, world, gc::backend::host{}, n, policy);
      wrong.set_steps(1);
      every_rank_throws(
          world, [&] { wrong.step(x, 1.0); },
          "gradcomp: leader_exchange: the group communicator's rank 0 of " + std::to_string(ranks) +
              " is not this rank's place in its group of " + std::to_string(g) + " (rank 0) (rank 0 of " +
              std::to_string(ranks) + ")",
          true);
      CHECK(x == before);
    }
  }
  MPI_Comm_free(&split);
  CHECK_THROWS_WITH_AS(
      gc::comm::leader_exchange(world, world, gc::backend::host{}, 10, {.group_size = w + 1}),
      ("gradcomp: lsgd: group_size must divide the " + std::to_string(ranks) + " ranks, got " + std::to_string(w + 1))
          .c_str(),
      gc::error);
}

TEST_CASE("leader_exchange with compressed changes equals its simulation: every reference bit-identical") {
  gc::comm::mpi world;
  const int ranks = world.size();
  const auto w = static_cast<std::size_t>(ranks);
  const std::size_t group_size = ranks >= 4 && ranks % 2 == 0 ? w / 2 : 0;
  const gc::comm::lsgd policy{
      .period = 1, .global_every = 3, .local_pull = 0.25f, .global_pull = 0.5f, .group_size = group_size};
  const std::size_t g = policy.group_of(w);
  const auto me = static_cast<std::size_t>(world.rank());
  MPI_Comm split = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, world.rank() / static_cast<int>(g), world.rank(), &split);
  {
    gc::comm::mpi group(split);
    const std::size_t n = 2003;
    const double density = 0.05;
    const float lr = 0.05f;
    auto topk = gc::compressor{gc::backend::host{}, n, gc::select::exact_topk{.density = density}, gc::correct::none{},
                               gc::encode::index_value{}};
    const std::size_t k = topk.selector().k(n);
    lsgd_simulation sim{policy, {}};
    for (std::size_t r = 0; r < w; ++r) sim.x.push_back(inputs::make(inputs::shape::normal, n, 300 + r));
    std::vector<float> mine = sim.x[me];
    gc::comm::leader_exchange exchange(world, group, gc::backend::host{}, n, policy,
                                       gc::comm::compressed_changes{topk});
    // The simulation: per group (and for the global pulls) a reference, set whole at its
    // first round, then moved by the leader's top-k of its change (f32 values: exact).
    std::vector<std::vector<float>> group_ref(w / g), global_ref(1);
    sim.toward = [&](int kind, std::size_t in_group, const std::vector<float>& leader) {
      std::vector<float>& ref = kind == 0 ? group_ref[in_group] : global_ref[0];
      if (ref.empty()) {
        ref = leader;
        return ref;
      }
      std::vector<float> change(n);
      for (std::size_t i = 0; i < n; ++i) change[i] = leader[i] - ref[i];
      for (const std::uint32_t i : reference::top_k(change, k)) ref[i] = ref[i] + change[i];
      return ref;
    };
    std::vector<std::vector<float>>& x = sim.x;
    for (int t = 0; t < 9; ++t) {
      std::vector<std::vector<float>> grads;
      std::vector<double> loss;
      for (std::size_t r = 0; r < w; ++r) {
        grads.push_back(gradient_of(static_cast<int>(r), n, t));
        loss.push_back(loss_of(static_cast<int>(r), t));
      }
      sim.step(grads, loss, lr);
      const auto grad = gradient_of(world.rank(), n, t);
      for (std::size_t i = 0; i < n; ++i) mine[i] -= lr * grad[i];
      exchange.step(mine, loss[me]);
      CAPTURE(t);
      CHECK(mine == x[me]);
      const auto ref = exchange.sender().reference(0);
      CHECK(std::vector<float>(ref.begin(), ref.end()) == group_ref[me / g]);
      if (t >= 2) {
        const auto global = exchange.sender().reference(1);
        CHECK(std::vector<float>(global.begin(), global.end()) == global_ref[0]);
      }
      // After the first round of its kind (t = 0 for the group's, t = 2 for the global
      // one) a leader sends a message of k entries, not n floats.
      if (t >= 1 && t != 2 && ranks > 1) CHECK(exchange.last_traffic().received <= 24 * w + 2 * (8 * k + 64));
    }
    // A checkpoint: a second exchange given the first's step count and references goes on
    // as the first does, bit for bit.
    auto topk2 = gc::compressor{gc::backend::host{}, n, gc::select::exact_topk{.density = density}, gc::correct::none{},
                                gc::encode::index_value{}};
    gc::comm::leader_exchange resumed(world, group, gc::backend::host{}, n, policy,
                                      gc::comm::compressed_changes{topk2});
    CHECK_THROWS_WITH_AS(resumed.sender().set_reference(2, {}),
                         "gradcomp: compressed_changes: the reference's kind must be 0 (the group's) or 1 (the "
                         "global), got 2",
                         gc::error);
    CHECK_THROWS_WITH_AS(resumed.sender().set_reference(0, std::vector<float>(n - 1)),
                         ("gradcomp: compressed_changes: a reference of " + std::to_string(n - 1) +
                          " floats for parameters of " + std::to_string(n))
                             .c_str(),
                         gc::error);
    CHECK(resumed.sender().reference(0).empty());
    resumed.set_steps(exchange.steps());
    for (const int kind : {0, 1}) resumed.sender().set_reference(kind, exchange.sender().reference(kind));
    std::vector<float> again = mine;
    for (int t = 9; t < 12; ++t) {
      const auto grad = gradient_of(world.rank(), n, t);
      for (std::size_t i = 0; i < n; ++i) {
        mine[i] -= lr * grad[i];
        again[i] -= lr * grad[i];
      }
      exchange.step(mine, loss_of(world.rank(), t));
      resumed.step(again, loss_of(world.rank(), t));
      CAPTURE(t);
      CHECK(again == mine);
      for (const int kind : {0, 1}) {
        const auto a = exchange.sender().reference(kind);
        const auto b = resumed.sender().reference(kind);
        CHECK(std::vector<float>(a.begin(), a.end()) == std::vector<float>(b.begin(), b.end()));
      }
    }
  }
  MPI_Comm_free(&split);
}
