// Device-side decode and accumulate against the host's, message by message: good and
// hostile messages of every coding, copied to device memory. Where the host accepts,
// the GPU adds bit-identical values; where the host rejects, the GPU raises the same
// error and leaves the destination untouched. Needs a GPU (exit 77 without one).
#define DOCTEST_CONFIG_IMPLEMENT
#include "device.cuh"

#include <gradcomp/gradcomp.hpp>

#include <random>
#include <utility>
#include <string>
#include <vector>

#include "../support/frames.hpp"
#include "../support/inputs.hpp"

namespace gc = gradcomp;
using gc::index_coding;
using gc::value_coding;

namespace {

// A host message of `x` at every `stride`-th index.
std::vector<std::byte> host_message(const std::vector<float>& x, std::size_t stride, gc::encode::index_value enc) {
  std::vector<std::uint32_t> idx;
  for (std::uint32_t i = 0; i < x.size(); i += static_cast<std::uint32_t>(stride)) idx.push_back(i);
  gc::compressor c{gc::backend::host{}, x.size(), gc::select::given_indices{.max_count = x.size()}, gc::correct::none{},
                   enc};
  c.set_indices(idx);
  std::vector<std::byte> buf(c.max_message_bytes());
  const auto m = c.compress(x, buf);
  return {m.bytes().begin(), m.bytes().end()};
}

struct outcome {
  bool accepted;
  gc::errc code;
  std::string what;
  std::vector<float> dense;
};

outcome on_host(const std::vector<std::byte>& bytes, std::vector<float> dense, float scale) {
  try {
    gc::accumulate(gc::backend::host{}, bytes, dense, scale);
    return {true, {}, {}, dense};
  } catch (const gc::error& e) {
    return {false, e.code(), e.what(), dense};
  }
}

// With the free accumulate, or with one device_accumulator kept across every message
// of the file (its workspace grows and is reused, after failures too).
outcome on_device(const std::vector<std::byte>& bytes, const std::vector<float>& dense, float scale, bool reused) {
  static gc::device_accumulator kept{gc::backend::cuda{}};
  auto d_bytes = device::copy_of(bytes);
  auto d_dense = device::copy_of(dense);
  try {
    if (reused) {
      kept(device::span_of(d_bytes), device::span_of(d_dense), scale);
    } else {
      gc::accumulate(gc::backend::cuda{}, device::span_of(d_bytes), device::span_of(d_dense), scale);
    }
    return {true, {}, {}, device::host_copy(d_dense)};
  } catch (const gc::error& e) {
    return {false, e.code(), e.what(), device::host_copy(d_dense)};
  }
}

// The DDP hook's decoder of frames (queue_framed_add), the message read as its header
// says it was written, and read as automatic with a new accumulator (no workspace an
// earlier message left): a fault exactly where the host rejects it, and the host's sums
// where it accepts, the tensor untouched otherwise.
void same_framed_outcome(const std::vector<std::byte>& bytes, const std::vector<float>& dense, float scale,
                         const outcome& host) {
  static gc::device_accumulator kept{gc::backend::cuda{}};
  gc::device_accumulator fresh{gc::backend::cuda{}};
  gc::encode::index_value automatic = frames::format_named_by(bytes);
  automatic.index = index_coding::automatic;
  const std::pair<gc::device_accumulator*, gc::encode::index_value> runs[] = {{&kept, frames::format_named_by(bytes)},
                                                                              {&fresh, automatic}};
  for (const auto& [add, format] : runs) {
    auto d_frame = device::copy_of(frames::frame_of(bytes));
    auto d_dense = device::copy_of(dense);
    thrust::device_vector<std::uint32_t> fault(1, 0u);
    add->queue_framed_add(gc::backend::cuda{}, format, device::span_of(d_frame), device::span_of(d_dense), scale,
                          device::span_of(fault));
    CHECK((fault[0] == 0u) == host.accepted);
    CHECK(device::same_bits(device::host_copy(d_dense), host.dense));
  }
}

void same_outcome(const std::vector<std::byte>& bytes, std::size_t n, float scale = 0.75f) {
  const std::vector<float> dense = inputs::make(inputs::shape::normal, n, 5);
  const outcome host = on_host(bytes, dense, scale);
  same_framed_outcome(bytes, dense, scale, host);
  for (const bool reused : {false, true}) {
    CAPTURE(reused);
    const outcome gpu = on_device(bytes, dense, scale, reused);
    REQUIRE(gpu.accepted == host.accepted);
    CHECK(gpu.code == host.code);
    CHECK(gpu.what == host.what);
    CHECK(device::same_bits(gpu.dense, host.dense));
    if (!host.accepted) CHECK(device::same_bits(gpu.dense, dense));
  }
}

const gc::encode::index_value encoders[] = {
    {.index = index_coding::raw32, .value = value_coding::f32},
    {.index = index_coding::raw32, .value = value_coding::f16},
    {.index = index_coding::raw32, .value = value_coding::bf16},
    {.index = index_coding::raw32, .value = value_coding::f32, .checksum = true},
    {.index = index_coding::delta_bitpack, .value = value_coding::int8},
    {.index = index_coding::bitmap, .value = value_coding::ternary},
    {.index = index_coding::raw32, .value = value_coding::qsgd, .levels = 9},
};

}  // namespace

TEST_CASE("good messages of every coding accumulate and decode as on the host") {
  for (const std::size_t n : {std::size_t{1}, std::size_t{1000}, (std::size_t{1} << 20) + 3}) {
    const auto x = inputs::make(inputs::shape::student_t3, n, 3);
    for (const auto& enc : encoders) {
      CAPTURE(enc.name());
      CAPTURE(n);
      const auto bytes = host_message(x, 7, enc);
      same_outcome(bytes, n);
      auto d_bytes = device::copy_of(bytes);
      const auto s = gc::decode(gc::backend::cuda{}, device::span_of(d_bytes));
      const auto expected = gc::decode(bytes);
      CHECK(s.indices == expected.indices);
      CHECK(device::same_bits(s.values, expected.values));
    }
  }
}

TEST_CASE("hostile messages are rejected on the device exactly as on the host") {
  std::mt19937_64 rng(77);
  const std::size_t n = 3000;
  const auto x = inputs::make(inputs::shape::normal, n, 4);
  for (const auto& enc : encoders) {
    CAPTURE(enc.name());
    const auto good = host_message(x, 5, enc);
    for (std::size_t len = 0; len < good.size(); len += 1 + len / 8) {
      same_outcome(std::vector<std::byte>(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(len)), n);
    }
    for (int trial = 0; trial < 300; ++trial) {
      auto b = good;
      const int flips = 1 + static_cast<int>(rng() % 4);
      for (int f = 0; f < flips; ++f) b[rng() % b.size()] = static_cast<std::byte>(rng());
      same_outcome(b, n);
    }
    // Entries broken on purpose: a repeated index, an index of n, a NaN value.
    if (enc.index == index_coding::raw32 && enc.value == value_coding::f32 && !enc.checksum) {
      auto b = good;
      std::memcpy(b.data() + 56 + 4 * 10, b.data() + 56 + 4 * 9, 4);
      same_outcome(b, n);
      b = good;
      const auto big = static_cast<std::uint32_t>(n);
      std::memcpy(b.data() + 56 + 4 * 599, &big, 4);
      same_outcome(b, n);
      b = good;
      const float nan = std::numeric_limits<float>::quiet_NaN();
      std::memcpy(b.data() + 56 + 4 * 600 + 4 * 17, &nan, 4);
      same_outcome(b, n);
    }
  }
  // The wrong tensor size and a non-finite scale are argument errors.
  const auto good = host_message(x, 5, encoders[0]);
  same_outcome(good, n + 1);
  auto d_bytes = device::copy_of(good);
  thrust::device_vector<float> dense(n, 1.0f);
  CHECK_THROWS_WITH_AS(gc::accumulate(gc::backend::cuda{}, device::span_of(d_bytes), device::span_of(dense), NAN),
                       doctest::Contains("scale"), gc::error);
}

int main(int argc, char** argv) { return device::run_tests(argc, argv); }
