// Checkpoints: a restored compressor continues with byte-identical messages; corrupt
// records are rejected without changing anything. Thread count never changes results.
#include <doctest/doctest.h>
#include <gradcomp/gradcomp.hpp>

#include <sstream>

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

  gc::compressor other_n{gc::backend::host{}, 70000, gc::select::exact_topk{.density = 0.003}, gc::correct::error_feedback{}};
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
