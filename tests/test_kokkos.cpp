// backend::kokkos<DefaultExecutionSpace> against backend::host: the same messages,
// byte for byte, for every policy, over the conformance inputs.
#include <doctest/doctest.h>
#include <gradcomp/backend/kokkos.hpp>
#include <gradcomp/comm/leader_exchange.hpp>
#include <gradcomp/gradcomp.hpp>

#include <sstream>

#include "support/inputs.hpp"
#include "support/leader_broadcast.hpp"

namespace gc = gradcomp;
using space = Kokkos::DefaultExecutionSpace;

namespace {

// Both backends over `steps` steps of each input: identical message bytes and state.
template <class Make>
void same_as_host(Make make, int steps = 4) {
  for (const auto s : inputs::all_shapes) {
    for (const std::size_t n : inputs::awkward_sizes) {
      auto host = make(gc::backend::host{}, n);
      auto dev = make(gc::backend::kokkos<space>{}, n);
      std::vector<std::byte> hb(host.max_message_bytes()), db(dev.max_message_bytes());
      Kokkos::View<float*> g("g", n);
      for (int t = 0; t < steps; ++t) {
        const auto x = inputs::make(s, n, 300 + static_cast<std::uint64_t>(t));
        auto gh = Kokkos::create_mirror_view(g);
        for (std::size_t i = 0; i < n; ++i) gh(i) = x[i];
        Kokkos::deep_copy(g, gh);
        const auto mh = host.compress(x, hb);
        const auto md = dev.compress(gc::as_span(g), db);
        CAPTURE(inputs::name(s));
        CAPTURE(n);
        CAPTURE(t);
        REQUIRE(mh.count() == md.count());
        REQUIRE(std::vector<std::byte>(mh.bytes().begin(), mh.bytes().end()) ==
                std::vector<std::byte>(md.bytes().begin(), md.bytes().end()));
      }
      std::ostringstream sh, sd;
      host.save_state(sh);
      dev.save_state(sd);
      REQUIRE(sh.str() == sd.str());
    }
  }
}

}  // namespace

TEST_CASE("exact_topk: kokkos equals host") {
  same_as_host([](auto be, std::size_t n) { return gc::compressor{be, n, gc::select::exact_topk{.density = 0.003}}; });
  same_as_host([](auto be, std::size_t n) {
    return gc::compressor{be, n, gc::select::exact_topk{.density = 0.01}, gc::correct::error_feedback{}};
  });
  same_as_host([](auto be, std::size_t n) { return gc::compressor{be, n, gc::select::exact_topk{.density = 1.0}}; }, 2);
}

TEST_CASE("sampled_threshold: kokkos equals host") {
  same_as_host([](auto be, std::size_t n) {
    return gc::compressor{be, n, gc::select::sampled_threshold{.density = 0.001, .seed = 3},
                          gc::correct::error_feedback{}};
  });
  same_as_host([](auto be, std::size_t n) {
    return gc::compressor{be, n,
                          gc::select::sampled_threshold{.density = 0.01, .truncate = true, .reuse_threshold = true},
                          gc::correct::none{}};
  });
}

TEST_CASE("chunk_local, random_k, threshold: kokkos equals host") {
  same_as_host([](auto be, std::size_t n) { return gc::presets::adacomp(be, n, {.bin = 50}); });
  same_as_host([](auto be, std::size_t n) { return gc::presets::randomk_ef(be, n, {.density = 0.01, .seed = 4}); });
  same_as_host([](auto be, std::size_t n) {
    return gc::compressor{be, n, gc::select::random_k{.density = 0.02, .unbiased = true}};
  });
  same_as_host([](auto be, std::size_t n) { return gc::presets::threshold_ef(be, n, {.tau = 1.5f}); });
}

TEST_CASE("correctors and codecs: kokkos equals host") {
  same_as_host([](auto be, std::size_t n) { return gc::presets::dgc(be, n, {.density = 0.01, .max_norm = 50.0f}); });
  same_as_host([](auto be, std::size_t n) {
    return gc::compressor{be, n, gc::select::exact_topk{.density = 0.02}, gc::correct::momentum{.nesterov = true},
                          gc::encode::index_value{.value = gc::value_coding::qsgd, .levels = 8, .seed = 2}};
  });
  same_as_host([](auto be, std::size_t n) {
    return gc::compressor{be, n, gc::select::exact_topk{.density = 0.02}, gc::correct::low_pass{.beta = 0.5f},
                          gc::encode::index_value{.value = gc::value_coding::int8}};
  });
}

TEST_CASE("given_indices on kokkos") {
  const std::size_t n = 1000;
  gc::compressor c{gc::backend::kokkos<space>{}, n, gc::select::given_indices{.max_count = 3}};
  const std::vector<std::uint32_t> set{5, 17, 999};
  c.set_indices(set);
  Kokkos::View<float*> g("g", n);
  Kokkos::deep_copy(g, 2.0f);
  std::vector<std::byte> buf(c.max_message_bytes());
  const auto s = gc::decode(c.compress(gc::as_span(g), buf).bytes());
  CHECK(s.indices == set);
  CHECK(s.values == std::vector<float>{2.0f, 2.0f, 2.0f});
}

TEST_CASE("accumulate into a View, non-contiguous Views rejected") {
  const std::size_t n = 4096;
  const auto x = inputs::make(inputs::shape::student_t3, n, 1);
  gc::compressor c{gc::backend::host{}, n, gc::select::exact_topk{.count = 20}};
  std::vector<std::byte> buf(c.max_message_bytes());
  const auto m = c.compress(x, buf);
  Kokkos::View<float*> dense("dense", n);
  gc::accumulate(gc::backend::kokkos<space>{}, m.bytes(), gc::as_span(dense), 0.5f);
  std::vector<float> want(n, 0.0f);
  gc::accumulate(gc::backend::host{}, m.bytes(), want, 0.5f);
  auto got = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, dense);
  for (std::size_t i = 0; i < n; ++i) REQUIRE(got(i) == want[i]);

  // A corrupt message leaves the View untouched.
  std::vector<std::byte> bad(m.bytes().begin(), m.bytes().end());
  bad[60] = std::byte{0xFF};
  bad[61] = std::byte{0xFF};
  bad[62] = std::byte{0xFF};
  bad[63] = std::byte{0xFF};
  CHECK_THROWS_AS(gc::accumulate(gc::backend::kokkos<space>{}, bad, gc::as_span(dense), 1.0f), gc::error);
  auto after = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, dense);
  for (std::size_t i = 0; i < n; ++i) REQUIRE(after(i) == want[i]);

  Kokkos::View<float**, Kokkos::LayoutRight> matrix("matrix", 8, 8);
  const auto column = Kokkos::subview(matrix, Kokkos::ALL, 3);  // stride 8
  CHECK_THROWS_WITH_AS(gc::as_span(column), doctest::Contains("is not contiguous"), gc::error);
}

TEST_CASE("a rejected step on kokkos changes nothing") {
  const std::size_t n = 70000;
  gc::compressor c{gc::backend::kokkos<space>{}, n, gc::select::exact_topk{.density = 0.01}, gc::correct::momentum{}};
  std::vector<std::byte> buf(c.max_message_bytes(), std::byte{1});
  auto x = inputs::make(inputs::shape::normal, n, 2);
  (void)c.compress(x, buf);
  std::fill(buf.begin(), buf.end(), std::byte{1});
  std::ostringstream before;
  c.save_state(before);
  x[123] = std::numeric_limits<float>::quiet_NaN();
  CHECK_THROWS_WITH_AS(c.compress(x, buf), doctest::Contains("grad[123] = nan"), gc::error);
  std::ostringstream after;
  c.save_state(after);
  CHECK(before.str() == after.str());
  CHECK(std::all_of(buf.begin(), buf.end(), [](std::byte b) { return b == std::byte{1}; }));
}

TEST_CASE("preview: kokkos equals host, and changes nothing") {
  const std::size_t n = 70'001;
  const auto check = [&](auto make) {
    auto host = make(gc::backend::host{});
    auto dev = make(gc::backend::kokkos<space>{});
    std::vector<std::byte> hb(host.max_message_bytes()), db(dev.max_message_bytes());
    for (int t = 0; t < 5; ++t) {
      auto x = inputs::make(inputs::shape::student_t3, n, 700 + static_cast<std::uint64_t>(t));
      for (auto& v : x) v *= 1.0f + 0.5f * static_cast<float>(t % 3);  // the clip switches on and off
      Kokkos::View<float*> g("g", n);
      auto gh = Kokkos::create_mirror_view(g);
      for (std::size_t i = 0; i < n; ++i) gh(i) = x[i];
      Kokkos::deep_copy(g, gh);
      std::ostringstream before, after;
      dev.save_state(before);
      const auto ph = host.preview(x);
      const auto pd = dev.preview(gc::as_span(g));
      dev.save_state(after);
      CAPTURE(t);
      REQUIRE(before.str() == after.str());
      REQUIRE(std::equal(ph.begin(), ph.end(), pd.begin(), pd.end()));
      (void)host.compress(x, hb);
      (void)dev.compress(gc::as_span(g), db);
    }
  };
  // The gradients' norms are about 440, 660 and 880: a max_norm of 600 clips two steps in three.
  check([&](auto be) { return gc::presets::dgc(be, n, {.density = 0.01, .max_norm = 600.0f}); });
  check([&](auto be) { return gc::compressor{be, n, gc::select::exact_topk{.density = 0.01}}; });
  check([&](auto be) {
    return gc::compressor{be, n, gc::select::exact_topk{.density = 0.01}, gc::correct::low_pass{.beta = 0.5f}};
  });
}

TEST_CASE("an execution-space instance per call: the same steps as the compressor's own") {
  const std::size_t n = 70'001;
  auto plain = gc::presets::dgc(gc::backend::kokkos<space>{}, n, {.density = 0.01, .max_norm = 600.0f});
  auto with_context = gc::presets::dgc(gc::backend::kokkos<space>{}, n, {.density = 0.01, .max_norm = 600.0f});
  std::vector<std::byte> a(plain.max_message_bytes()), b(with_context.max_message_bytes());
  for (int t = 0; t < 5; ++t) {
    auto x = inputs::make(inputs::shape::student_t3, n, 900 + static_cast<std::uint64_t>(t));
    for (auto& v : x) v *= 1.0f + 0.5f * static_cast<float>(t % 3);
    const gc::backend::kokkos<space> context{space{}};
    const auto pa = plain.preview(x);
    const auto pb = with_context.preview(context, x);
    REQUIRE(std::equal(pa.begin(), pa.end(), pb.begin(), pb.end()));
    const auto ma = plain.compress(x, a).bytes();
    const auto mb = with_context.compress(context, x, b).bytes();
    CAPTURE(t);
    REQUIRE(std::equal(ma.begin(), ma.end(), mb.begin(), mb.end()));
  }
}

TEST_CASE("Leader SGD's pull on kokkos: a follower moves toward the leader's parameters as on the host") {
  using memory = gc::backend::kokkos<space>::memory;
  const auto copy = [](const float* from, std::uint32_t* to, std::size_t bytes) { std::memcpy(to, from, bytes); };
  for (const std::size_t n : inputs::awkward_sizes) {
    const auto x = inputs::make(inputs::shape::normal, n, 5);
    support::leader_broadcast<memory, decltype(copy)> comm{inputs::make(inputs::shape::student_t3, n, 6), copy};
    gc::comm::whole_parameters<gc::backend::kokkos<space>> sender(gc::backend::kokkos<space>{}, n);
    Kokkos::View<float*> params("params", n);
    auto mirror = Kokkos::create_mirror_view(params);
    for (std::size_t i = 0; i < n; ++i) mirror(i) = x[i];
    Kokkos::deep_copy(params, mirror);
    gc::comm::traffic moved;
    sender.pull(comm, gc::as_span(params), 0, false, 0.3f, 0, moved);
    Kokkos::deep_copy(mirror, params);
    CAPTURE(n);
    CHECK(std::vector<float>(mirror.data(), mirror.data() + n) == support::pulled(x, comm.leader, 0.3f));
    CHECK(moved.received == 4 * n);
    CHECK(moved.sent == 0);
  }
}

TEST_CASE("memory_bytes on kokkos: the state by its definition, a compact step's float32 array only while staged") {
  const std::size_t n = 70001;
  const gc::select::exact_topk topk{.density = 0.01};
  gc::compressor ef{gc::backend::kokkos<space>{}, n, topk, gc::correct::error_feedback{}};
  gc::compressor compact{gc::backend::kokkos<space>{}, n, topk,
                         gc::correct::compact<gc::correct::error_feedback>{.bits = 4, .block = 8}};
  CHECK(ef.memory_bytes().state == 4 * n);
  CHECK(compact.memory_bytes().state == (n + 1) / 2 + (n + 7) / 8);
  std::vector<std::byte> buf(compact.max_message_bytes());
  (void)compact.compress(inputs::make(inputs::shape::normal, n, 1), buf);
  const gc::held_memory between = compact.memory_bytes();
  (void)compact.stage(inputs::make(inputs::shape::normal, n, 2), buf);
  CHECK(compact.memory_bytes().workspace == between.workspace + 4 * n);
  compact.accept_staged();
  CHECK(compact.memory_bytes().workspace == between.workspace);
  const gc::held_memory before = ef.memory_bytes();
  (void)ef.compress(inputs::make(inputs::shape::normal, n, 1), buf);
  CHECK(ef.memory_bytes().workspace == before.workspace);  // steps allocate nothing
}
