// Checkpoints: a restored compressor continues with byte-identical messages; corrupt
// records are rejected without changing anything. Thread count never changes results.
#include <doctest/doctest.h>
#include <gradcomp/comm/frames.hpp>
#include <gradcomp/gradcomp.hpp>

#include <algorithm>
#include <bit>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>

#if GRADCOMP_HAS_OPENMP
#include <omp.h>
#endif

#include "support/counted_device.hpp"
#include "support/inputs.hpp"

namespace gc = gradcomp;

namespace {
auto make(int threads = 0) {
  return gc::compressor{gc::backend::host{.threads = threads}, 70001, gc::select::exact_topk{.density = 0.003},
                        gc::correct::error_feedback{.beta = 0.9f}};
}
std::vector<std::byte> run(auto& c, std::uint64_t seed) {
  std::vector<std::byte> buf(c.max_message_bytes());
  const auto m = c.compress(inputs::make(inputs::shape::student_t3, c.size(), seed), buf);
  return {m.bytes().begin(), m.bytes().end()};
}
// One step of `g` on `context`: the message's bytes.
std::vector<std::byte> run_on(auto& c, const gc::backend::host& context, const std::vector<float>& g) {
  std::vector<std::byte> buf(c.max_message_bytes());
  const auto m = c.compress(context, g, buf);
  return {m.bytes().begin(), m.bytes().end()};
}
}  // namespace

TEST_CASE("a restored compressor produces byte-identical messages") {
  auto original = make();
  for (std::uint64_t t = 0; t < 5; ++t) (void)run(original, t);
  original.set_density(0.01);
  std::stringstream checkpoint;
  original.save_state(checkpoint);

  auto restored = make();
  restored.load_state(checkpoint);
  CHECK(restored.step() == 5);
  CHECK(restored.selector().density == 0.01);
  for (std::uint64_t t = 5; t < 12; ++t) CHECK(run(original, t) == run(restored, t));
}

TEST_CASE("corrupt or mismatched state records are rejected and change nothing") {
  auto source = make();
  (void)run(source, 1);
  std::stringstream good_stream;
  source.save_state(good_stream);
  const std::string good = good_stream.str();

  auto target = make();
  (void)run(target, 2);
  std::stringstream before;
  target.save_state(before);

  auto expect_rejected = [&](const std::string& record, const char* what) {
    CAPTURE(what);
    std::stringstream in(record);
    CHECK_THROWS_AS(target.load_state(in), gc::error);
    std::stringstream after;
    target.save_state(after);
    CHECK(after.str() == before.str());
  };
  expect_rejected(good.substr(0, good.size() - 1), "truncated");
  expect_rejected(good.substr(0, 10), "cut in the header");
  std::string flipped = good;
  flipped[good.size() / 2] = static_cast<char>(flipped[good.size() / 2] ^ 0x10);
  expect_rejected(flipped, "bit flip in the residual");
  expect_rejected("not a checkpoint at all", "garbage");

  gc::compressor other_n{gc::backend::host{}, 70000, gc::select::exact_topk{.density = 0.003},
                         gc::correct::error_feedback{}};
  std::stringstream wrong_n;
  other_n.save_state(wrong_n);
  expect_rejected(wrong_n.str(), "different n");

  gc::compressor other_policy{gc::backend::host{}, 70001, gc::select::exact_topk{.density = 0.003}};
  std::stringstream wrong_policy;
  other_policy.save_state(wrong_policy);
  expect_rejected(wrong_policy.str(), "different corrector");
}

TEST_CASE("results are identical with one and two threads") {
  auto one = make(1);
  auto two = make(2);
  for (std::uint64_t t = 0; t < 6; ++t) CHECK(run(one, t) == run(two, t));
}

namespace {
template <class Compressor>
std::string checkpoint_of(const Compressor& c) {
  std::ostringstream out;
  c.save_state(out);
  return out.str();
}

// A staged step changes nothing until accepted; accepted, it is the step compress()
// takes; dropped, the compressor goes on as if it had never been staged.
template <class Make>
void staging_is_invisible_until_accepted(Make make) {
  auto staged = make();
  auto twin = make();
  CAPTURE(staged.corrector().name());
  const std::size_t n = staged.size();
  std::vector<std::byte> a(staged.max_message_bytes()), b(twin.max_message_bytes());
  for (std::uint64_t t = 0; t < 8; ++t) {
    auto g = inputs::make(inputs::shape::student_t3, n, t);
    for (auto& v : g) v *= 50.0f;  // large enough that clipping engages (and would run in place)
    const std::string before = checkpoint_of(staged);
    const auto m = staged.stage(g, a);
    CHECK(staged.has_staged());
    CHECK(checkpoint_of(staged) == before);
    CHECK(staged.step() == t);
    if (t % 3 == 1) {  // drop it: the next stage or compress starts from the committed state
      const auto dropped = std::vector<std::byte>(m.bytes().begin(), m.bytes().end());
      const auto again = staged.stage(g, a);
      CHECK(std::vector<std::byte>(again.bytes().begin(), again.bytes().end()) == dropped);
    }
    const std::vector<std::byte> staged_bytes(m.bytes().begin(), m.bytes().end());
    staged.accept_staged();
    CHECK_FALSE(staged.has_staged());
    const auto expected = twin.compress(g, b);
    CHECK(staged_bytes == std::vector<std::byte>(expected.bytes().begin(), expected.bytes().end()));
    CHECK(checkpoint_of(staged) == checkpoint_of(twin));
  }
  CHECK_THROWS_WITH_AS(staged.accept_staged(), "gradcomp: accept_staged: no step is staged", gc::error);
  // A rejected stage leaves nothing staged.
  auto g = inputs::make(inputs::shape::normal, n, 99);
  g[3] = NAN;
  CHECK_THROWS_AS((void)staged.stage(g, a), gc::error);
  CHECK_FALSE(staged.has_staged());
}

// Calls `check(make)` with a maker of each preset the staging tests run: top-k with error
// feedback, DGC (clipping and momentum), AdaComp and random-k with error feedback.
template <class Check>
void for_each_staged_preset(Check check) {
  const std::size_t n = 70001;
  check([&] { return gc::presets::topk_ef(gc::backend::host{}, n, {.density = 0.01}); });
  check([&] {
    return gc::presets::dgc(gc::backend::host{}, n, {.density = 0.01, .max_norm = 1.0f, .reuse_threshold = true});
  });
  check([&] { return gc::presets::adacomp(gc::backend::host{}, n); });
  check([&] { return gc::presets::randomk_ef(gc::backend::host{}, n, {.density = 0.01, .seed = 3}); });
}
}  // namespace

TEST_CASE("stage, then accept or drop: a step two-phased for collectives") {
  for_each_staged_preset([](auto make) { staging_is_invisible_until_accepted(make); });
}

namespace {
// stage_queued() reads nothing back, yet staged_message() returns what stage() does and
// the frame it writes (comm::frame_byte) is the verdict gather_frames writes followed by
// the message where it fits the bound; a NaN's step is announced in the frame and raised
// by staged_message() as stage() raises it.
template <class Make>
void queued_stage_is_stage(Make make) {
  auto queued = make();
  auto twin = make();
  CAPTURE(queued.corrector().name());
  const std::size_t n = queued.size();
  const gc::backend::host on{};
  const std::uint64_t digest = 0x0123456789ABCDEFull;
  std::vector<std::byte> a(queued.max_message_bytes()), b(twin.max_message_bytes());
  const auto frame_of = [&](const gc::detail::step_status* status, std::size_t bound) {
    std::vector<std::byte> frame(gc::detail::rank_verdict::size + bound, std::byte{0x5A});
    on.for_each(frame.size(), gc::comm::frame_byte{status, 0, digest, a.data(), frame.data(), bound});
    return frame;
  };
  for (std::uint64_t t = 0; t < 6; ++t) {
    auto g = inputs::make(inputs::shape::student_t3, n, t);
    for (auto& v : g) v *= 50.0f;
    const auto* status = queued.stage_queued(on, std::span<const float>(g), a);
    CHECK(queued.has_staged());
    const auto want = twin.stage(g, b);
    const std::vector<std::byte> message(want.bytes().begin(), want.bytes().end());
    const auto got = queued.staged_message(on, std::span<const float>(g), a);
    CHECK(std::vector<std::byte>(got.bytes().begin(), got.bytes().end()) == message);
    CHECK(got.count() == want.count());
    for (const std::size_t bound : {message.size(), message.size() + 9, message.size() - 1}) {
      std::vector<std::byte> expected(gc::detail::rank_verdict::size + bound, std::byte{0});
      gc::detail::rank_verdict{0, message.size(), digest}.write(expected.data());
      if (message.size() <= bound) std::copy(message.begin(), message.end(), expected.begin() + 24);
      CHECK(frame_of(status, bound) == expected);
    }
    queued.accept_staged();
    twin.accept_staged();
    CHECK(checkpoint_of(queued) == checkpoint_of(twin));
  }
  auto g = inputs::make(inputs::shape::normal, n, 99);
  g[3] = NAN;
  const std::string before = checkpoint_of(queued);
  const auto* status = queued.stage_queued(on, std::span<const float>(g), a);
  std::vector<std::byte> expected(gc::detail::rank_verdict::size + 64, std::byte{0});
  gc::detail::rank_verdict{1 + static_cast<std::uint32_t>(gc::errc::non_finite), 0, digest}.write(expected.data());
  CHECK(frame_of(status, 64) == expected);
  std::string raised;
  try {
    (void)twin.stage(g, b);
  } catch (const gc::error& e) {
    raised = e.what();
  }
  CHECK_FALSE(raised.empty());
  CHECK_THROWS_WITH_AS((void)queued.staged_message(on, std::span<const float>(g), a), raised.c_str(), gc::error);
  CHECK_FALSE(queued.has_staged());
  CHECK(checkpoint_of(queued) == before);
}
}  // namespace

TEST_CASE("stage_queued: stage() with its status read later, and the frame written from it") {
  for_each_staged_preset([](auto make) { queued_stage_is_stage(make); });
}

namespace {
// The waits of a step on counted_device (support/counted_device.hpp: what backend::cuda
// would synchronize for), after the first step (which allocates what it keeps): the
// queued stage with its commit, and compress(). Its messages and checkpoints are those of
// the same compressor on backend::host.
struct step_waits {
  device_waits queued;    // stage_queued() and accept_staged()
  device_waits compress;  // compress()
};
template <class Make>
step_waits waits_of_steps(Make make) {
  auto on_device = make(counted_device{});
  auto on_host = make(gc::backend::host{});
  const std::size_t n = on_device.size();
  std::vector<std::byte> a(on_device.max_message_bytes()), b(on_host.max_message_bytes());
  const auto device_grad = [&](const std::vector<float>& g) { return gc::device_span<const float>(g.data(), n); };
  const gc::device_span<std::byte> out(a.data(), a.size());
  step_waits waits{};
  for (std::uint64_t t = 0; t < 4; ++t) {
    const auto g = inputs::make(inputs::shape::student_t3, n, t);
    (void)counted_device::reset();
    const auto* status = on_device.stage_queued(counted_device{}, device_grad(g), out);
    on_device.accept_staged(counted_device{});
    const device_waits queued = counted_device::reset();
    const auto want = on_host.compress(g, b);
    CHECK(status->bytes == want.bytes().size());
    CHECK(std::equal(want.bytes().begin(), want.bytes().end(), a.begin()));
    const auto g2 = inputs::make(inputs::shape::normal, n, 100 + t);
    (void)counted_device::reset();
    const auto m = on_device.compress(device_grad(g2), out);
    const device_waits compressed = counted_device::reset();
    const auto want2 = on_host.compress(g2, b);
    CHECK(std::equal(want2.bytes().begin(), want2.bytes().end(), m.bytes().data()));
    CHECK(checkpoint_of(on_device) == checkpoint_of(on_host));
    if (t == 0) continue;  // the first step allocates the workspace it keeps
    if (t > 1) {           // every later step waits as the second did
      CHECK(queued == waits.queued);
      CHECK(compressed == waits.compress);
    }
    waits = {queued, compressed};
  }
  return waits;
}
}  // namespace

// What a step makes the host wait for on a device, counted on the CPU for the engines
// backend::cuda shares with every backend (its own exact_topk and chunk_local engines
// are counted on the GPU: experiments/gpu_step_cost.py). The DDP hook stages each bucket
// with stage_queued() and reads nothing back per bucket (docs/torch.md): every wait here
// would be a host synchronization per bucket and step.
TEST_CASE("a queued step waits for nothing on a device; compress() reads its status once") {
  const std::size_t n = 70001;
  const device_waits none{};
  const device_waits status_read{.reads = 1};
  SUBCASE("DGC: sampled threshold, clipping and momentum") {
    for (const bool reuse : {false, true}) {
      CAPTURE(reuse);
      const auto w = waits_of_steps([&](auto be) {
        return gc::presets::dgc(be, n, {.density = 0.01, .max_norm = 1.0f, .reuse_threshold = reuse});
      });
      CHECK(w.queued == none);
      CHECK(w.compress == status_read);
    }
  }
  SUBCASE("a fixed threshold with error feedback") {
    const auto w = waits_of_steps([&](auto be) { return gc::presets::threshold_ef(be, n, {.tau = 1.5f}); });
    CHECK(w.queued == none);
    CHECK(w.compress == status_read);
  }
  SUBCASE("random-k: the host's draw, copied over in stream order") {
    const auto w =
        waits_of_steps([&](auto be) { return gc::presets::randomk_ef(be, n, {.density = 0.01, .seed = 3}); });
    CHECK(w.queued == device_waits{.uploads = 1});
    CHECK(w.compress == device_waits{.reads = 1, .uploads = 1});
  }
  SUBCASE("8-bit memory: the step's float32 arrays, allocated for the step and given back in stream order") {
    const auto w = waits_of_steps([&](auto be) {
      return gc::presets::dgc(be, n, {.density = 0.01, .max_norm = 1.0f}, gc::presets::compact_memory{.bits = 8});
    });
    CHECK(w.queued == device_waits{.scratch = 2, .releases = 2});
    CHECK(w.compress == device_waits{.reads = 1, .scratch = 2, .releases = 2});
  }
}

TEST_CASE("a bfloat16 gradient stages, previews and compresses as its float32 values do") {
  const std::size_t n = 70001;
  auto wide = make(2);
  auto narrow = make(2);
  std::vector<std::byte> wide_buf(wide.max_message_bytes()), narrow_buf(narrow.max_message_bytes());
  for (std::uint64_t t = 0; t < 4; ++t) {
    const auto g = inputs::make(inputs::shape::student_t3, n, t);
    std::vector<gc::bfloat16> b(n);
    std::vector<float> truncated(n);  // the bfloat16 of each value, rounded toward zero
    for (std::size_t i = 0; i < n; ++i) {
      b[i] = {static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(g[i]) >> 16)};
      truncated[i] = std::bit_cast<float>(std::bit_cast<std::uint32_t>(g[i]) & 0xFFFF0000u);
    }
    const auto want_preview = wide.preview(truncated);
    const std::vector<float> preview(want_preview.begin(), want_preview.end());
    const auto got_preview = narrow.preview(b);
    CHECK(std::equal(preview.begin(), preview.end(), got_preview.begin(), got_preview.end()));
    const auto want = wide.compress(truncated, wide_buf);
    const auto got = narrow.stage(b, narrow_buf);
    narrow.accept_staged();
    REQUIRE(std::equal(want.bytes().begin(), want.bytes().end(), got.bytes().begin(), got.bytes().end()));
  }
  std::ostringstream a, c;
  wide.save_state(a);
  narrow.save_state(c);
  CHECK(a.str() == c.str());
}

namespace {

// A checkpoint record cut open where the selector's state starts (a compressor without
// a corrector: no arrays before it), and sealed again with a recomputed CRC.
struct opened_record {
  std::string head;  // everything before the selector's record
  std::string selector;
  explicit opened_record(const auto& c) {
    std::stringstream out;
    c.save_state(out);
    const std::string bytes = out.str();
    std::uint32_t signature = 0;
    std::memcpy(&signature, bytes.data() + 8, 4);
    const std::size_t at = 12 + signature + 8 + 8 + 8 + 4;  // n, step, density, arrays (0)
    head = bytes.substr(0, at);
    selector = bytes.substr(at, bytes.size() - 4 - at);
  }
  template <class T>
  static std::string bytes_of(T v) {
    std::string s(sizeof v, '\0');
    std::memcpy(s.data(), &v, sizeof v);
    return s;
  }
  std::string sealed(std::uint16_t version, const std::string& selector_part) const {
    std::string all = head;
    std::memcpy(all.data() + 4, &version, 2);
    all += selector_part;
    return all + bytes_of(gc::detail::crc32c(reinterpret_cast<const std::byte*>(all.data()), all.size()));
  }
};

template <class Compressor>
void refused(Compressor& c, const std::string& record, const char* what) {
  std::stringstream before, after;
  c.save_state(before);
  std::stringstream in(record);
  CHECK_THROWS_WITH_AS(c.load_state(in), doctest::Contains(what), gc::error);
  c.save_state(after);
  CHECK(after.str() == before.str());
}

}  // namespace

TEST_CASE("the selector's typed state record: written field by field, checked on load, version 1 still read") {
  const std::size_t n = 50000;
  const gc::select::sampled_threshold policy{.density = 0.01, .reuse_threshold = true};
  gc::compressor original{gc::backend::host{}, n, policy};
  for (std::uint64_t t = 0; t < 3; ++t) (void)run(original, t);
  const opened_record r(original);

  // Version 2: two fields, {has, key}, each u8 width 4 and a u32.
  using rec = opened_record;
  REQUIRE(r.selector.size() == 4 + 2 * 5);
  CHECK(r.selector.substr(0, 4) == rec::bytes_of(std::uint32_t{2}));
  CHECK(r.selector.substr(4, 5) == rec::bytes_of(std::uint8_t{4}) + rec::bytes_of(std::uint32_t{1}));
  std::uint32_t key = 0;
  std::memcpy(&key, r.selector.data() + 10, 4);
  CHECK(key > 0);
  CHECK(key < 0x7F800000u);  // a finite magnitude's key

  // The same state as version 1 wrote it (f64 values) continues identically.
  const std::string v1 =
      r.sealed(1, rec::bytes_of(std::uint32_t{2}) + rec::bytes_of(1.0) + rec::bytes_of(static_cast<double>(key)));
  gc::compressor from_v1{gc::backend::host{}, n, policy};
  std::stringstream in(v1);
  from_v1.load_state(in);
  for (std::uint64_t t = 3; t < 8; ++t) CHECK(run(original, t) == run(from_v1, t));

  // Doctored records are refused, naming what is wrong, and change nothing.
  gc::compressor target{gc::backend::host{}, n, policy};
  (void)run(target, 1);
  const auto field32 = [](std::uint32_t v) { return rec::bytes_of(std::uint8_t{4}) + rec::bytes_of(v); };
  refused(target,
          r.sealed(2, rec::bytes_of(std::uint32_t{2}) + rec::bytes_of(std::uint8_t{8}) +
                          rec::bytes_of(std::uint64_t{1}) + field32(key)),
          "field 0 of sampled_threshold's saved state is 8 bytes wide, expected 4");
  refused(target, r.sealed(2, rec::bytes_of(std::uint32_t{3}) + field32(1) + field32(key) + field32(0)),
          "has 3 fields, sampled_threshold keeps 2");
  refused(target, r.sealed(2, rec::bytes_of(std::uint32_t{1}) + field32(1)), "has 1 fields, too few");
  refused(target, r.sealed(2, rec::bytes_of(std::uint32_t{2}) + field32(2) + field32(key)),
          "the saved state of sampled_threshold is invalid");
  refused(target, r.sealed(2, rec::bytes_of(std::uint32_t{2}) + field32(1) + field32(0x7F800000u)),
          "the saved state of sampled_threshold is invalid");
  refused(target, r.sealed(2, rec::bytes_of(std::uint32_t{1}) + rec::bytes_of(std::uint8_t{3}) + "abc"),
          "a field of the selector's state is 3 bytes wide");
  refused(target, r.sealed(1, rec::bytes_of(std::uint32_t{2}) + rec::bytes_of(1.5) + rec::bytes_of(1.0)),
          "the selector's saved value 1.5 is not an unsigned integer");

  // A selector that keeps no state refuses a record that has some.
  gc::compressor stateless{gc::backend::host{}, n, gc::select::exact_topk{.density = 0.01}};
  const opened_record s(stateless);
  CHECK(s.selector == rec::bytes_of(std::uint32_t{0}));
  refused(stateless, s.sealed(2, rec::bytes_of(std::uint32_t{1}) + field32(1)),
          "the record holds selector state, exact_topk keeps none");
}

TEST_CASE("an execution context per call: any host threads up to the constructor's give the same steps") {
  auto plain = make(2);
  auto with_context = make(2);
  const std::size_t n = plain.size();
  std::vector<std::byte> a(plain.max_message_bytes()), b(with_context.max_message_bytes());
  for (std::uint64_t t = 0; t < 6; ++t) {
    const auto g = inputs::make(inputs::shape::student_t3, n, 300 + t);
    const gc::backend::host context{.threads = 1 + static_cast<int>(t % 2)};
    CAPTURE(context.threads);
    CHECK(std::equal(plain.preview(g).begin(), plain.preview(g).end(), with_context.preview(context, g).begin()));
    const auto want = plain.compress(g, a).bytes();
    if (t % 3 == 2) {  // stage, then accept
      const auto got = with_context.stage(context, g, b).bytes();
      REQUIRE(std::equal(want.begin(), want.end(), got.begin(), got.end()));
      with_context.accept_staged();
    } else {
      const auto got = with_context.compress(context, g, b).bytes();
      REQUIRE(std::equal(want.begin(), want.end(), got.begin(), got.end()));
    }
  }
  // A bfloat16 gradient on a context: as its float32 values on the compressor's threads.
  const auto g = inputs::make(inputs::shape::normal, n, 400);
  std::vector<gc::bfloat16> narrow(n);
  std::vector<float> wide(n);
  for (std::size_t i = 0; i < n; ++i) {
    narrow[i] = {static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(g[i]) >> 16)};
    wide[i] = std::bit_cast<float>(std::uint32_t{narrow[i].bits} << 16);
  }
  const auto want = plain.compress(wide, a).bytes();
  const auto got = with_context.compress(gc::backend::host{.threads = 1}, narrow, b).bytes();
  CHECK(std::equal(want.begin(), want.end(), got.begin(), got.end()));

  // More threads than the workspace was sized for: refused, naming them; nothing changes.
  std::stringstream before, after;
  with_context.save_state(before);
  std::vector<std::byte> untouched(b.size(), std::byte{0x5A});
  CHECK_THROWS_WITH_AS(with_context.compress(gc::backend::host{.threads = 3}, g, untouched),
                       "gradcomp: compress: the context's threads = 3 (3 threads) exceed the 2 the compressor was "
                       "made with, which sized its workspace",
                       gc::error);
  CHECK_THROWS_WITH_AS((void)with_context.preview(gc::backend::host{.threads = 3}, g),
                       doctest::Contains("preview: the context's threads = 3"), gc::error);
  with_context.save_state(after);
  CHECK(after.str() == before.str());
  CHECK(std::all_of(untouched.begin(), untouched.end(), [](std::byte x) { return x == std::byte{0x5A}; }));
}

namespace {
// backend::host that counts the primitives queued on it: which backend value a call's
// work runs on, the context or the one the compressor was made with. A type of its own,
// so the generic engines run (backend::host's fast paths are specialisations).
struct counting_host : gc::backend::host {
  std::shared_ptr<int> queued = std::make_shared<int>(0);
  template <class Body>
  void for_each(std::size_t n, const Body& body) const {
    ++*queued;
    host::for_each(n, body);
  }
  template <class Body>
  void reduce_or(std::size_t n, const Body& body, std::uint32_t* bits) const {
    ++*queued;
    host::reduce_or(n, body, bits);
  }
  counting_host context_for(const char* who, const counting_host& context) const {
    (void)host::context_for(who, context);
    return context;
  }
  counting_host resolved(const char* who) const {
    counting_host settled = *this;
    settled.threads = host::resolved(who).threads;
    return settled;
  }
};
}  // namespace

TEST_CASE("a call's work runs on its context, every stage of the step") {
  const counting_host own{};
  auto c = gc::compressor{own, 5000, gc::select::threshold{.tau = 1.0f}, gc::correct::error_feedback{}};
  const auto g = inputs::make(inputs::shape::normal, 5000, 1);
  std::vector<std::byte> out(c.max_message_bytes());
  (void)c.compress(g, out);
  const int own_before = *own.queued;
  CHECK(own_before > 0);
  const counting_host context{};
  const auto m = c.compress(context, g, out);
  CHECK(m.size() > 0);
  CHECK(*own.queued == own_before);  // nothing on the compressor's own backend
  CHECK(*context.queued >= 3);       // the corrector's pass, the encoder's passes
  const int after_compress = *context.queued;
  (void)c.preview(context, g);
  CHECK(*context.queued > after_compress);
  CHECK(*own.queued == own_before);
}

TEST_CASE("load_state of a byte record: exactly one record, nothing after it") {
  auto source = make();
  (void)run(source, 1);
  std::stringstream saved;
  source.save_state(saved);
  const std::string record = saved.str();
  const auto as_bytes = [](const std::string& s) {
    return std::span<const std::byte>(reinterpret_cast<const std::byte*>(s.data()), s.size());
  };

  auto target = make();
  (void)run(target, 2);
  std::stringstream before;
  target.save_state(before);
  for (const std::string& extra : {std::string(1, '\0'), std::string("trailing bytes")}) {
    CHECK_THROWS_WITH_AS(target.load_state(as_bytes(record + extra)),
                         ("gradcomp: load_state: " + std::to_string(extra.size()) + " bytes follow the " +
                          std::to_string(record.size()) + "-byte record")
                             .c_str(),
                         gc::error);
  }
  CHECK_THROWS_AS(target.load_state(as_bytes(record.substr(0, record.size() - 1))), gc::error);
  std::stringstream after;
  target.save_state(after);
  CHECK(after.str() == before.str());
  target.load_state(as_bytes(record));
  CHECK(run(target, 3) == run(source, 3));
  // A stream may go on after a record (several in one file).
  std::stringstream two(record + record);
  target.load_state(two);
  target.load_state(two);
}

#if GRADCOMP_HAS_OPENMP
// A compressor made while OpenMP's default was one thread sized its per-thread workspace
// for one: later calls with a larger default must not use more (they read past the
// workspace before: a false "non-finite value" on garbage, invalid reads under ASan).
// backend::host{} settles its count when the compressor is made; a context of threads
// 0 takes the caller's default, at most that count. Results are those of one thread.
TEST_CASE("raising OpenMP's thread count after construction changes nothing and reads nothing out of bounds") {
  const int saved = omp_get_max_threads();
  // Below 2^16 entries exact top-k histograms every entry into per-thread bins; above,
  // it samples first.
  for (const std::size_t n : {std::size_t{20'011}, std::size_t{300'001}}) {
    CAPTURE(n);
    omp_set_num_threads(1);
    auto topk = gc::presets::topk_ef(gc::backend::host{}, n, {.density = 0.01});
    auto dgc = gc::presets::dgc(gc::backend::host{}, n, {.density = 0.01, .max_norm = 5.0f});
    auto adacomp = gc::presets::adacomp(gc::backend::host{}, n);
    auto threshold = gc::presets::threshold_ef(gc::backend::host{}, n, {.tau = 1.5f});
    CHECK(topk.backend().threads == 1);
    omp_set_num_threads(4);
    auto topk_one = gc::presets::topk_ef(gc::backend::host{.threads = 1}, n, {.density = 0.01});
    auto dgc_one = gc::presets::dgc(gc::backend::host{.threads = 1}, n, {.density = 0.01, .max_norm = 5.0f});
    auto adacomp_one = gc::presets::adacomp(gc::backend::host{.threads = 1}, n);
    auto threshold_one = gc::presets::threshold_ef(gc::backend::host{.threads = 1}, n, {.tau = 1.5f});
    for (std::uint64_t t = 0; t < 4; ++t) {
      const auto g = inputs::make(inputs::shape::student_t3, n, 700 + t);
      const gc::backend::host caller_default{};  // threads 0: the caller's default, now 4
      // Without a context (the compressor's own backend), and with one of threads 0.
      CHECK(run_on(topk, t % 2 ? caller_default : topk.backend(), g) == run_on(topk_one, topk_one.backend(), g));
      CHECK(run_on(dgc, t % 2 ? dgc.backend() : caller_default, g) == run_on(dgc_one, dgc_one.backend(), g));
      CHECK(run_on(adacomp, caller_default, g) == run_on(adacomp_one, adacomp_one.backend(), g));
      CHECK(run_on(threshold, threshold.backend(), g) == run_on(threshold_one, threshold_one.backend(), g));
    }
    // Made with four, called with a default of two: two run, the same bytes again.
    auto topk_four = gc::presets::topk_ef(gc::backend::host{}, n, {.density = 0.01});
    CHECK(topk_four.backend().threads == 4);
    omp_set_num_threads(2);
    auto topk_fresh = gc::presets::topk_ef(gc::backend::host{.threads = 1}, n, {.density = 0.01});
    const auto g = inputs::make(inputs::shape::student_t3, n, 800);
    CHECK(run_on(topk_four, gc::backend::host{}, g) == run_on(topk_fresh, topk_fresh.backend(), g));
  }
  omp_set_num_threads(saved);
}
#endif

namespace {
// A step staged with exact_topk and accepted in part (accept_staged(kept)) leaves the
// corrector's memory bit for bit as a step whose selector chose only the kept entries
// (given_indices) leaves it: kept entries committed as sent, the others as the update
// left them. `kept` mixes some of the step's indices with indices it did not select.
template <class Corrector>
void partial_accept_is_a_smaller_selection(Corrector corrector) {
  const std::size_t n = 20011;
  gc::compressor staged{gc::backend::host{}, n, gc::select::exact_topk{.density = 0.01}, corrector};
  gc::compressor twin{gc::backend::host{}, n, gc::select::given_indices{.density = 0.01}, corrector};
  CAPTURE(staged.corrector().name());
  std::vector<std::byte> a(staged.max_message_bytes()), b(twin.max_message_bytes());
  for (std::uint64_t t = 0; t < 6; ++t) {
    auto g = inputs::make(inputs::shape::student_t3, n, 100 + t);
    for (auto& v : g) v *= 30.0f;  // clipping engages
    const auto m = staged.stage(g, a);
    const auto chosen = gc::decode(m.bytes());
    std::vector<std::uint32_t> kept, committed;
    for (std::size_t j = 0; j < chosen.indices.size(); ++j) {
      const std::uint32_t i = chosen.indices[j];
      if ((i * 2654435761u + t) % 3 != 0) {  // about two thirds of the step's entries
        kept.push_back(i);
        committed.push_back(i);
      } else if (i + 1 < n && j + 1 < chosen.indices.size() && chosen.indices[j + 1] != i + 1) {
        kept.push_back(i + 1);  // not selected: ignored
      }
    }
    // A bad `kept` is refused and changes nothing: the step stays staged.
    if (kept.size() >= 2) {
      std::vector<std::uint32_t> unordered = kept;
      std::swap(unordered[0], unordered[1]);
      const std::string before = checkpoint_of(staged);
      CHECK_THROWS_WITH_AS(staged.accept_staged(unordered),
                           doctest::Contains("accept_staged: kept must ascend strictly, kept[0] = "), gc::error);
      CHECK(staged.has_staged());
      CHECK(checkpoint_of(staged) == before);
    }
    staged.accept_staged(kept);
    CHECK(staged.step() == t + 1);
    twin.set_indices(committed);
    const auto expected = twin.compress(g, b);
    // The twin sends the kept entries' values: the same acc.
    const auto sent = gc::decode(expected.bytes());
    CHECK(sent.indices == committed);
    for (std::size_t a_ = 0; a_ < Corrector::state_arrays; ++a_) {
      const auto x = staged.corrector_state(a_);
      const auto y = twin.corrector_state(a_);
      CHECK(std::vector<float>(x.begin(), x.end()) == std::vector<float>(y.begin(), y.end()));
    }
  }
  CHECK_THROWS_WITH_AS(staged.accept_staged(std::vector<std::uint32_t>{}), "gradcomp: accept_staged: no step is staged",
                       gc::error);
}
}  // namespace

TEST_CASE("accept_staged(kept) commits a subset: as if the selector had chosen only the kept entries") {
  partial_accept_is_a_smaller_selection(gc::correct::error_feedback{});
  partial_accept_is_a_smaller_selection(gc::correct::error_feedback{.beta = 0.9f, .gamma = 0.5f});
  partial_accept_is_a_smaller_selection(gc::correct::momentum{.beta = 0.9f});                    // DGC's masking
  partial_accept_is_a_smaller_selection(gc::correct::momentum{.beta = 0.9f, .nesterov = true});  // masking
  partial_accept_is_a_smaller_selection(gc::correct::momentum{.beta = 0.9f, .masking = false});
  partial_accept_is_a_smaller_selection(gc::correct::low_pass{.beta = 0.3f});
  partial_accept_is_a_smaller_selection(
      gc::correct::chain{gc::correct::clip_norm{.max_norm = 5.0f}, gc::correct::momentum{.beta = 0.9f}});
  partial_accept_is_a_smaller_selection(gc::correct::none{});
  partial_accept_is_a_smaller_selection(gc::correct::compact<gc::correct::error_feedback>{});
  partial_accept_is_a_smaller_selection(
      gc::correct::compact<gc::correct::chain<gc::correct::clip_norm, gc::correct::momentum>>{
          .inner = {gc::correct::clip_norm{.max_norm = 5.0f}, gc::correct::momentum{.beta = 0.9f}},
          .bits = 4,
          .block = 16});
}

TEST_CASE("a compact state: checkpoints restore it bit for bit, a dropped step leaves it, bad settings are refused") {
  const std::size_t n = 30011;
  const auto make_compact = [&](std::uint32_t bits) {
    return gc::compressor{
        gc::backend::host{}, n, gc::select::exact_topk{.density = 0.005},
        gc::correct::compact<gc::correct::momentum>{.inner = {.beta = 0.9f}, .bits = bits, .block = 32}};
  };
  for (const std::uint32_t bits : {8u, 4u}) {
    CAPTURE(bits);
    auto original = make_compact(bits);
    for (std::uint64_t t = 0; t < 4; ++t) (void)run(original, t);
    // A staged step that is dropped leaves the stored state as it was.
    const std::string before = checkpoint_of(original);
    std::vector<std::byte> buf(original.max_message_bytes());
    (void)original.stage(inputs::make(inputs::shape::student_t3, n, 99), buf);
    original.drop_staged();
    CHECK(checkpoint_of(original) == before);
    std::stringstream checkpoint(before);
    auto restored = make_compact(bits);
    restored.load_state(checkpoint);
    CHECK(checkpoint_of(restored) == before);
    for (std::size_t a = 0; a < 2; ++a) {
      const auto x = original.corrector_state(a);
      const auto y = restored.corrector_state(a);
      CHECK(std::memcmp(x.data(), y.data(), 4 * n) == 0);
    }
    for (std::uint64_t t = 4; t < 9; ++t) CHECK(run(original, t) == run(restored, t));
    // A compact state of other settings is another corrector: refused, nothing changed.
    auto other = make_compact(bits == 8 ? 4 : 8);
    const std::string other_before = checkpoint_of(other);
    std::stringstream wrong(before);
    CHECK_THROWS_AS(other.load_state(wrong), gc::error);
    CHECK(checkpoint_of(other) == other_before);
  }
  using ef = gc::correct::compact<gc::correct::error_feedback>;
  CHECK_THROWS_WITH_AS((gc::compressor{gc::backend::host{}, n, gc::select::exact_topk{.density = 0.01}, ef{.bits = 6}}),
                       "gradcomp: compact: bits must be 8 or 4, got 6", gc::error);
  CHECK_THROWS_WITH_AS(
      (gc::compressor{gc::backend::host{}, n, gc::select::exact_topk{.density = 0.01}, ef{.block = 12}}),
      "gradcomp: compact: block must be a multiple of 8 in [8, 4096], got 12", gc::error);
  CHECK_THROWS_WITH_AS(
      (gc::compressor{gc::backend::host{}, n, gc::select::exact_topk{.density = 0.01}, ef{.inner = {.beta = NAN}}}),
      "gradcomp: error_feedback: beta must be finite, got nan", gc::error);
}

TEST_CASE("memory_bytes: the state by its definition, the workspace as buffers come and go") {
  const std::size_t n = 30011;
  const auto ceil_div = [](std::size_t a, std::size_t b) { return (a + b - 1) / b; };
  const auto step = [](auto& c, std::uint64_t seed, bool accept = true) {
    std::vector<std::byte> buf(c.max_message_bytes());
    (void)c.stage(inputs::make(inputs::shape::student_t3, c.size(), seed), buf);
    if (accept) c.accept_staged();
  };
  const gc::select::exact_topk topk{.density = 0.01};

  SUBCASE("float32 state: 4 bytes per element and array; steps allocate nothing") {
    auto ef = gc::compressor{gc::backend::host{.threads = 2}, n, topk, gc::correct::error_feedback{}};
    auto dgc = gc::compressor{gc::backend::host{.threads = 2}, n, topk,
                              gc::correct::chain{gc::correct::clip_norm{.max_norm = 1.0f}, gc::correct::momentum{}}};
    auto none = gc::compressor{gc::backend::host{.threads = 2}, n, topk};
    CHECK(ef.memory_bytes().state == 4 * n);
    CHECK(dgc.memory_bytes().state == 2 * 4 * n);  // velocity and accumulation
    CHECK(none.memory_bytes().state == 0);
    // The second float32 copy (double-buffering) and the selection's n-sized lists.
    CHECK(ef.memory_bytes().workspace >= 4 * n);
    const gc::held_memory before = ef.memory_bytes();
    for (std::uint64_t t = 0; t < 3; ++t) step(ef, t);
    CHECK(ef.memory_bytes().state == before.state);
    CHECK(ef.memory_bytes().workspace == before.workspace);
    CHECK(ef.memory_bytes().total() == before.state + before.workspace);
    // preview's buffer: n floats, once.
    (void)ef.preview(inputs::make(inputs::shape::student_t3, n, 7));
    CHECK(ef.memory_bytes().workspace == before.workspace + 4 * n);
    // A 16-bit gradient is read as it is by a corrector with state (no float32 copy of
    // it, also with the clipping norm); a step without a corrector widens it into n
    // floats of workspace, once.
    std::vector<gc::bfloat16> narrow(n, gc::bfloat16{0x3F80});  // 1.0
    std::vector<std::byte> buf(ef.max_message_bytes());
    (void)ef.compress(narrow, buf);
    (void)ef.compress(narrow, buf);
    CHECK(ef.memory_bytes().workspace == before.workspace + 4 * n);
    const gc::held_memory dgc_before = dgc.memory_bytes();
    (void)dgc.compress(narrow, buf);
    CHECK(dgc.memory_bytes().workspace == dgc_before.workspace);
    const gc::held_memory none_before = none.memory_bytes();
    (void)none.compress(narrow, buf);
    (void)none.compress(narrow, buf);
    CHECK(none.memory_bytes().workspace == none_before.workspace + 4 * n);
  }

  SUBCASE("compact state: bits / 8 per element and one exponent per block; float32 arrays only during a step") {
    for (const auto& [bits, block] : {std::pair{8u, 64u}, std::pair{4u, 8u}, std::pair{4u, 64u}}) {
      CAPTURE(bits);
      CAPTURE(block);
      const std::size_t stored = ceil_div(n * bits, 8) + ceil_div(n, block);
      auto ef = gc::compressor{gc::backend::host{}, n, topk,
                               gc::correct::compact<gc::correct::error_feedback>{.bits = bits, .block = block}};
      auto momentum = gc::compressor{
          gc::backend::host{}, n, topk,
          gc::correct::compact<gc::correct::momentum>{.inner = {.beta = 0.9f}, .bits = bits, .block = block}};
      CHECK(ef.memory_bytes().state == stored);
      CHECK(momentum.memory_bytes().state == 2 * stored);
      step(ef, 1);
      const gc::held_memory between = ef.memory_bytes();
      CHECK(between.state == stored);
      step(ef, 2, /*accept=*/false);  // a staged step holds its float32 array until accepted
      CHECK(ef.memory_bytes().workspace == between.workspace + 4 * n);
      ef.accept_staged();
      CHECK(ef.memory_bytes().workspace == between.workspace);
      CHECK(ef.memory_bytes().state == stored);
      // Two arrays; a dropped step's stay until the next accepted step gives them back.
      step(momentum, 1);
      const gc::held_memory momentum_between = momentum.memory_bytes();
      step(momentum, 2, /*accept=*/false);
      CHECK(momentum.memory_bytes().workspace == momentum_between.workspace + 2 * 4 * n);
      momentum.drop_staged();
      CHECK(momentum.memory_bytes().workspace == momentum_between.workspace + 2 * 4 * n);
      momentum.release_workspace();  // gives back the dropped step's arrays too
      CHECK(momentum.memory_bytes().workspace <= 65536);
      step(momentum, 3);
      CHECK(momentum.memory_bytes().workspace == momentum_between.workspace);
    }
  }
}

TEST_CASE("release_workspace: the workspace goes back and comes again, the steps and checkpoints as without it") {
  const std::size_t n = 30011;
  const auto grad = [&](std::uint64_t t) { return inputs::make(inputs::shape::student_t3, n, 100 + t); };
  // Twin compressors, one giving its workspace back after every call: the same messages,
  // state and checkpoints, through a density change, a staged step and a 16-bit gradient.
  const auto twins = [&](auto make) {
    auto kept = make();
    auto released = make();
    std::vector<std::byte> a(kept.max_message_bytes()), b(released.max_message_bytes());
    const auto same_checkpoint = [&] {
      std::ostringstream x, y;
      kept.save_state(x);
      released.save_state(y);
      return x.str() == y.str();
    };
    for (std::uint64_t t = 0; t < 6; ++t) {
      CAPTURE(t);
      const auto g = grad(t);
      if (t == 3) {
        kept.set_density(0.03);
        released.set_density(0.03);
        a.resize(kept.max_message_bytes());
        b.resize(released.max_message_bytes());
      }
      if (t == 4) {  // staged: refused while the step waits, nothing changed
        const auto ma = kept.stage(g, a);
        const auto mb = released.stage(g, b);
        const gc::held_memory staged = released.memory_bytes();
        CHECK_THROWS_WITH_AS(released.release_workspace(),
                             "gradcomp: release_workspace: a step is staged; accept_staged() or drop_staged() it first",
                             gc::error);
        CHECK(released.has_staged());
        CHECK(released.memory_bytes().workspace == staged.workspace);
        CHECK(std::ranges::equal(ma.bytes(), mb.bytes()));
        kept.accept_staged();
        released.accept_staged();
      } else if (t == 5) {
        std::vector<gc::bfloat16> narrow(n);
        for (std::size_t i = 0; i < n; ++i)
          narrow[i] = gc::bfloat16{static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(g[i]) >> 16)};
        const auto ma = kept.compress(narrow, a);
        const auto mb = released.compress(narrow, b);
        CHECK(std::ranges::equal(ma.bytes(), mb.bytes()));
      } else {
        const auto ma = kept.compress(g, a);
        const auto mb = released.compress(g, b);
        CHECK(std::ranges::equal(ma.bytes(), mb.bytes()));
      }
      const gc::held_memory before = released.memory_bytes();
      released.release_workspace();
      const gc::held_memory after = released.memory_bytes();
      CHECK(after.state == before.state);
      CHECK(after.workspace < before.workspace);
      CHECK(after.workspace <= 65536);  // per-tile and per-thread bytes
      CHECK(same_checkpoint());
      if (t == 1) {  // held again before the next step (comm::cyclic_topk's ranks do): the step then allocates it not
        released.hold_workspace();
        CHECK(released.memory_bytes().workspace > after.workspace);
        CHECK(same_checkpoint());
      }
      if (t == 2) {  // a checkpoint loaded while the workspace is given back
        std::ostringstream saved;
        kept.save_state(saved);
        std::istringstream in(saved.str());
        released.load_state(in);
        CHECK(same_checkpoint());
      }
    }
    CHECK(kept.step() == released.step());
  };
  SUBCASE("exact_topk, error feedback in float32") {
    twins([&] {
      return gc::compressor{gc::backend::host{.threads = 2}, n, gc::select::exact_topk{.density = 0.01},
                            gc::correct::error_feedback{}};
    });
  }
  SUBCASE("exact_topk, error feedback stored in 8 bits") {
    twins([&] {
      return gc::compressor{gc::backend::host{.threads = 2}, n, gc::select::exact_topk{.density = 0.01},
                            gc::correct::compact<gc::correct::error_feedback>{.bits = 8, .block = 64}};
    });
  }
  SUBCASE("sampled_threshold reusing its threshold (state carried across the release), DGC's momentum") {
    twins([&] {
      return gc::compressor{gc::backend::host{.threads = 2}, n,
                            gc::select::sampled_threshold{.density = 0.01, .reuse_threshold = true},
                            gc::correct::chain{gc::correct::clip_norm{.max_norm = 1.0f}, gc::correct::momentum{}}};
    });
  }
}
