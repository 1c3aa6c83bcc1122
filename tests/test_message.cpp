// The decoder trusts nothing: every corruption raises gradcomp::error and leaves the
// destination untouched.
#include <doctest/doctest.h>
#include <gradcomp/detail/codec/decode.hpp>
#include <gradcomp/gradcomp.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>

#include "support/inputs.hpp"
#include "support/counted_device.hpp"
#include "support/frames.hpp"
#include "support/opaque_host.hpp"

namespace gc = gradcomp;

namespace {

std::vector<std::byte> sample_message(std::size_t n, std::size_t k, bool checksum = false) {
  gc::compressor c{gc::backend::host{}, n, gc::select::exact_topk{.count = k}, gc::correct::none{},
                   gc::encode::index_value{.index = gc::index_coding::raw32, .checksum = checksum}};
  std::vector<std::byte> buf(c.max_message_bytes());
  const auto m = c.compress(inputs::make(inputs::shape::normal, n, 11), buf);
  return {m.bytes().begin(), m.bytes().end()};
}

template <class T>
void poke(std::vector<std::byte>& b, std::size_t at, T v) {
  std::memcpy(b.data() + at, &v, sizeof(T));
}

// What accumulating `bytes` into a dense tensor of n elements (filled with 3.25) gives:
// the tensor, or the error's code and text.
struct outcome {
  std::vector<float> dense;
  std::string error;
  friend bool operator==(const outcome&, const outcome&) = default;
};

// The reference: the host's sequential reader (message_reader, which decode() uses),
// checking in accumulate's order (header and checksum, n, entries), then adding.
outcome reader_outcome(const std::vector<std::byte>& bytes, std::size_t n) {
  outcome o{std::vector<float>(n, 3.25f), {}};
  try {
    const gc::detail::message_reader reader(bytes);
    gc::detail::require(reader.header().n == n, gc::errc::invalid_argument, "accumulate: dense.size() = ", n,
                        " does not match the message's n = ", reader.header().n);
    reader.validate_entries();
    reader.visit([&](std::uint32_t i, float v) { o.dense[i] += 0.5f * v; });
  } catch (const gc::error& e) {
    o.error = std::string(gc::to_string(e.code())) + ": " + e.what();
  }
  return o;
}

// gc::accumulate on backend::host (the generic decoder, with a new workspace per call).
outcome accumulate_outcome(const std::vector<std::byte>& bytes, std::size_t n) {
  outcome o{std::vector<float>(n, 3.25f), {}};
  try {
    gc::accumulate(gc::backend::host{}, bytes, o.dense, 0.5f);
  } catch (const gc::error& e) {
    o.error = std::string(gc::to_string(e.code())) + ": " + e.what();
  }
  return o;
}

// The generic decoder (detail/codec/decode.hpp, what backend::cuda runs) on
// `Backend`: check, then add, with a decoder kept across calls as the device's are.
template <class Backend>
outcome generic_outcome(gc::detail::message_decoder<Backend>& decoder, const std::vector<std::byte>& bytes,
                        std::size_t n) {
  outcome o{std::vector<float>(n, 3.25f), {}};
  const Backend be{};
  try {
    decoder.add(be, decoder.check(be, bytes, n, "accumulate"), o.dense, 0.5f);
  } catch (const gc::error& e) {
    o.error = std::string(gc::to_string(e.code())) + ": " + e.what();
  }
  return o;
}

// The generic decoder's queue_framed_add (the DDP hook's exchange: the header read where
// the frame is, the faults left in a word, the add done only without one) of `bytes` in
// a frame, read as `format`: "fault" where a check found one (the tensor untouched),
// else the sums.
template <class Backend>
outcome framed_outcome(gc::detail::message_decoder<Backend>& decoder, const std::vector<std::byte>& frame,
                       std::size_t n, const gc::encode::index_value& format) {
  outcome o{std::vector<float>(n, 3.25f), {}};
  std::uint32_t fault = 0;
  decoder.queue_framed_add(Backend{}, format, frame, o.dense, 0.5f, &fault);
  if (fault != 0) o.error = "fault";
  return o;
}

// The generic decoder on backend::host and on opaque_host (kept across calls, as the
// device's are), and gc::accumulate, give exactly what the host's reader gives: the
// same sums, or the same error with the tensor untouched. queue_framed_add finds a
// fault exactly where the reader raises, and then adds nothing; read as automatic, the
// same.
void require_generic_decoder_agrees(const std::vector<std::byte>& bytes, std::size_t n) {
  static gc::detail::message_decoder<gc::backend::host> on_host{gc::backend::host{}};
  static gc::detail::message_decoder<opaque_host> on_opaque{opaque_host{}};
  const outcome want = reader_outcome(bytes, n);
  const outcome got_host = generic_outcome(on_host, bytes, n);
  const outcome got_opaque = generic_outcome(on_opaque, bytes, n);
  const outcome got_accumulate = accumulate_outcome(bytes, n);
  CHECK(got_host.error == want.error);
  CHECK(got_opaque.error == want.error);
  CHECK(got_accumulate.error == want.error);
  CHECK(got_host.dense == want.dense);
  CHECK(got_opaque.dense == want.dense);
  CHECK(got_accumulate.dense == want.dense);
  const std::vector<std::byte> frame = frames::frame_of(bytes);
  gc::encode::index_value format = frames::format_named_by(bytes);
  std::vector<gc::encode::index_value> formats{format};
  format.index = gc::index_coding::automatic;
  formats.push_back(format);
  for (const auto& f : formats) {
    // A new decoder each (its workspace zeroed): a pass that did not run cannot borrow
    // the indices an earlier message left.
    gc::detail::message_decoder<gc::backend::host> new_on_host{gc::backend::host{}};
    gc::detail::message_decoder<opaque_host> new_on_opaque{opaque_host{}};
    for (const outcome& framed : {framed_outcome(new_on_host, frame, n, f), framed_outcome(new_on_opaque, frame, n, f),
                                  framed_outcome(on_opaque, frame, n, f)}) {
      CHECK(framed.error.empty() == want.error.empty());
      CHECK(framed.dense == want.dense);
    }
  }
}

// Runs decode and accumulate on `bytes`; both must throw corrupt_message and leave a
// sentinel-filled destination untouched; the generic decoder must say the same.
void require_rejected(const std::vector<std::byte>& bytes, std::size_t n, const char* what) {
  CAPTURE(what);
  require_generic_decoder_agrees(bytes, n);
  CHECK_THROWS_AS(gc::decode(bytes), gc::error);
  std::vector<float> dense(n, 3.25f);
  try {
    gc::accumulate(gc::backend::host{}, bytes, dense, 1.0f);
    FAIL("accumulate accepted a corrupt message");
  } catch (const gc::error& e) {
    CHECK(e.code() == gc::errc::corrupt_message);
  }
  CHECK(std::all_of(dense.begin(), dense.end(), [](float v) { return v == 3.25f; }));
}

}  // namespace

TEST_CASE("a message round-trips through decode and accumulate") {
  const auto bytes = sample_message(1000, 17);
  const auto s = gc::decode(bytes);
  CHECK(s.n == 1000);
  REQUIRE(s.indices.size() == 17);
  std::vector<float> dense(1000, 1.0f);
  gc::accumulate(gc::backend::host{}, bytes, dense, 0.5f);
  for (std::size_t j = 0; j < s.indices.size(); ++j) CHECK(dense[s.indices[j]] == 1.0f + 0.5f * s.values[j]);
}

TEST_CASE("truncated messages are rejected at every length") {
  const auto bytes = sample_message(300, 9);
  for (std::size_t len = 0; len < bytes.size(); ++len) {
    require_rejected(std::vector<std::byte>(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(len)), 300,
                     "truncated");
  }
  auto longer = bytes;
  longer.push_back(std::byte{0});
  require_rejected(longer, 300, "trailing byte");
}

TEST_CASE("hostile header fields are rejected") {
  const std::size_t n = 300;
  const auto good = sample_message(n, 9);
  // The good message with the header field at byte `at` overwritten.
  auto rejected_with = [&]<class T>(std::size_t at, T value, const char* why) {
    auto b = good;
    poke<T>(b, at, value);
    require_rejected(b, n, why);
  };
  rejected_with(0, std::uint32_t(0x12345678u), "wrong magic");
  rejected_with(4, std::uint16_t(2), "future version");
  rejected_with(6, std::uint8_t(200), "unknown index coding");
  rejected_with(7, std::uint8_t(0), "unknown value coding");
  rejected_with(8, std::uint32_t(0x80u), "unknown flag");
  rejected_with(16, std::uint64_t(0), "n = 0");
  rejected_with(16, std::uint64_t{1} << 40, "n beyond 32-bit indices");
  rejected_with(16, std::uint64_t(5), "count > n");
  rejected_with(24, std::uint64_t(10), "count disagrees with sections");
  rejected_with(32, ~std::uint64_t{0}, "huge index section");
  rejected_with(40, ~std::uint64_t{0} - 10, "huge value section");
  rejected_with(24, ~std::uint64_t{0} / 4 + 1,
                "count that overflows a size computation");  // 4 * count wraps to a small number
}

TEST_CASE("hostile entries are rejected") {
  const std::size_t n = 300;
  const auto good = sample_message(n, 9);
  const auto s = gc::decode(good);
  auto b = good;
  poke<std::uint32_t>(b, 56 + 4 * 3, 300);
  require_rejected(b, n, "index == n");
  b = good;
  poke<std::uint32_t>(b, 56 + 4 * 3, 0xFFFFFFFFu);
  require_rejected(b, n, "index far out of range");
  b = good;
  poke<std::uint32_t>(b, 56 + 4 * 4, s.indices[3]);
  require_rejected(b, n, "repeated index");
  b = good;
  poke<std::uint32_t>(b, 56 + 4 * 0, s.indices[1] + 1);
  require_rejected(b, n, "descending indices");
  b = good;
  poke<float>(b, 56 + 4 * 9 + 4 * 2, std::numeric_limits<float>::quiet_NaN());
  require_rejected(b, n, "NaN value");
  b = good;
  poke<float>(b, 56 + 4 * 9 + 4 * 2, -std::numeric_limits<float>::infinity());
  require_rejected(b, n, "infinite value");
}

TEST_CASE("every single bit flip of a checksummed message is caught") {
  const std::size_t n = 200;
  const auto good = sample_message(n, 5, true);
  CHECK_NOTHROW(gc::decode(good));
  for (std::size_t bit = 0; bit < 8 * good.size(); ++bit) {
    auto b = good;
    b[bit / 8] ^= std::byte{static_cast<unsigned char>(1u << (bit % 8))};
    CAPTURE(bit);
    require_rejected(b, n, "bit flip");
  }
}

TEST_CASE("CRC-32C gives the published check values, and a device's bit-by-bit form equals the host's table") {
  const auto crc = [](const std::vector<unsigned char>& bytes) {
    return gc::detail::crc32c(reinterpret_cast<const std::byte*>(bytes.data()), bytes.size());
  };
  // CRC-32/ISCSI's check value, and the test vectors of RFC 3720 (iSCSI), B.4.
  const std::string digits = "123456789";
  CHECK(crc({digits.begin(), digits.end()}) == 0xE3069283u);
  CHECK(crc(std::vector<unsigned char>(32, 0x00)) == 0x8A9136AAu);
  CHECK(crc(std::vector<unsigned char>(32, 0xFF)) == 0x62A8AB43u);
  std::vector<unsigned char> ascending(32);
  std::iota(ascending.begin(), ascending.end(), 0);
  CHECK(crc(ascending) == 0x46DD794Eu);
  CHECK(crc({ascending.rbegin(), ascending.rend()}) == 0x113FDB5Cu);
  // A device has no copy of the table: its crc32c_byte shifts the register bit by bit
  // (crc32c_shift_byte), which the emulated device, compiled for the host, never runs.
  std::mt19937 rng(5);
  for (int r = 0; r < 64; ++r) {
    const std::uint32_t c = r == 0 ? 0u : r == 1 ? 0xFFFFFFFFu : static_cast<std::uint32_t>(rng());
    for (std::uint32_t b = 0; b < 256; ++b) {
      CAPTURE(c);
      CAPTURE(b);
      REQUIRE(gc::detail::crc32c_shift_byte(c ^ b) == gc::detail::crc32c_byte(c, static_cast<std::byte>(b)));
    }
  }
}

TEST_CASE("random garbage never crashes the decoder") {
  std::mt19937_64 rng(99);
  const auto good = sample_message(500, 20);
  for (int trial = 0; trial < 20000; ++trial) {
    auto b = good;
    const int flips = 1 + static_cast<int>(rng() % 6);
    for (int f = 0; f < flips; ++f) b[rng() % b.size()] = static_cast<std::byte>(rng());
    b.resize(rng() % 4 == 0 ? rng() % (b.size() + 1) : b.size());
    std::vector<float> dense(500, 0.0f);
    const auto before = dense;
    try {
      gc::accumulate(gc::backend::host{}, b, dense, 1.0f);
    } catch (const gc::error&) {
      REQUIRE(dense == before);
    }
  }
}

TEST_CASE("accumulate checks its own arguments") {
  const auto bytes = sample_message(100, 3);
  std::vector<float> dense(99, 0.0f);
  CHECK_THROWS_WITH_AS(gc::accumulate(gc::backend::host{}, bytes, dense, 1.0f), doctest::Contains("dense.size() = 99"),
                       gc::error);
  std::vector<float> right(100, 0.0f);
  CHECK_THROWS_WITH_AS(gc::accumulate(gc::backend::host{}, bytes, right, std::numeric_limits<float>::infinity()),
                       doctest::Contains("scale must be finite"), gc::error);
  CHECK(std::all_of(right.begin(), right.end(), [](float v) { return v == 0.0f; }));
}

// Memory spaces in the types (memory.hpp): host backends keep std::span and message, so
// host code reads as before; a device message's bytes are a device_span, which the host's
// decode and accumulate refuse at compile time (tests/compile_fail/*device*).
static_assert(std::is_same_v<gc::backend_span<gc::backend::host, const float>, std::span<const float>>);
static_assert(std::is_same_v<gc::message_span<gc::backend::host>, std::span<const std::byte>>);
static_assert(std::is_same_v<gc::compressor<gc::backend::host, gc::select::exact_topk>::message_type, gc::message>);
static_assert(std::is_same_v<decltype(gc::device_message{}.bytes()), gc::device_span<const std::byte>>);
static_assert(std::is_same_v<gc::span_in<gc::device_memory, float>, gc::device_span<float>>);
static_assert(!std::is_convertible_v<gc::device_span<const std::byte>, std::span<const std::byte>>);
static_assert(!std::is_convertible_v<std::span<const std::byte>, gc::device_span<const std::byte>>);
static_assert(std::is_convertible_v<gc::device_span<float>, gc::device_span<const float>>);
static_assert(!std::is_convertible_v<gc::device_span<const float>, gc::device_span<float>>);

TEST_CASE("device_span views a pointer and a size, and the host-context decode equals decode") {
  std::vector<float> storage(10);
  const gc::device_span<float> all(storage.data(), storage.size());
  CHECK(all.size() == 10);
  CHECK(all.size_bytes() == 40);
  CHECK(!all.empty());
  CHECK(all.first(3).data() == storage.data());
  CHECK(all.first(3).size() == 3);
  CHECK(all.subspan(4, 5).data() == storage.data() + 4);
  CHECK(all.subspan(4, 5).size() == 5);
  const gc::device_span<const float> read_only = all;
  CHECK(read_only.data() == storage.data());
  CHECK(gc::device_span<int>{}.empty());

  const auto bytes = sample_message(1000, 7);
  const gc::sparse_vector plain = gc::decode(bytes);
  const gc::sparse_vector on_context = gc::decode(gc::backend::host{.threads = 1}, bytes);
  CHECK(on_context.n == plain.n);
  CHECK(on_context.indices == plain.indices);
  CHECK(on_context.values == plain.values);
}

// The generic decoder (what backend::cuda runs for every coding) against the host's
// reader, on messages of every index and value coding, with and without a checksum, and
// on every single-bit flip of each: the same sums, or the same error with the tensor
// untouched. A flip may leave a valid message (a value's bit); both must agree then too.
TEST_CASE("the generic decoder agrees with the host's reader on every coding and every bit flip") {
  const std::size_t n = 300;
  const auto g = inputs::make(inputs::shape::student_t3, n, 4);
  for (const auto index : {gc::index_coding::raw32, gc::index_coding::delta_bitpack, gc::index_coding::bitmap}) {
    for (const auto value :
         {gc::value_coding::f32, gc::value_coding::f16, gc::value_coding::bf16, gc::value_coding::int8,
          gc::value_coding::ternary, gc::value_coding::qsgd, gc::value_coding::int4}) {
      for (const bool checksum : {false, true}) {
        for (const std::size_t k : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{200}}) {
          CAPTURE(gc::to_string(index));
          CAPTURE(gc::to_string(value));
          CAPTURE(checksum);
          CAPTURE(k);
          const gc::encode::index_value encoder{.index = index, .value = value, .levels = 5, .checksum = checksum};
          const auto message_of = [&](auto c, const std::vector<float>& grad) {
            std::vector<std::byte> out(c.max_message_bytes());
            const auto m = c.compress(grad, out);
            return std::vector<std::byte>(m.bytes().begin(), m.bytes().end());
          };
          const std::vector<std::byte> good =
              k == 0 ? message_of(gc::compressor{gc::backend::host{}, n, gc::select::threshold{.tau = 1.0f},
                                                 gc::correct::none{}, encoder},
                                  std::vector<float>(n, 0.0f))
                     : message_of(gc::compressor{gc::backend::host{}, n, gc::select::exact_topk{.count = k},
                                                 gc::correct::none{}, encoder},
                                  g);
          REQUIRE(reader_outcome(good, n).error.empty());
          require_generic_decoder_agrees(good, n);
          for (std::size_t bit = 0; bit < 8 * good.size(); bit += (k == 200 ? 7 : 1)) {
            auto b = good;
            b[bit / 8] ^= std::byte{static_cast<unsigned char>(1u << (bit % 8))};
            CAPTURE(bit);
            require_generic_decoder_agrees(b, n);
          }
        }
      }
    }
  }
}

TEST_CASE("the generic decoder agrees with the host's reader on random garbage") {
  std::mt19937_64 rng(7);
  for (const auto index : {gc::index_coding::delta_bitpack, gc::index_coding::bitmap}) {
    gc::compressor c{gc::backend::host{}, 500, gc::select::exact_topk{.count = 20}, gc::correct::none{},
                     gc::encode::index_value{.index = index, .value = gc::value_coding::qsgd, .levels = 3}};
    std::vector<std::byte> out(c.max_message_bytes());
    const auto m = c.compress(inputs::make(inputs::shape::normal, 500, 3), out);
    const std::vector<std::byte> good(m.bytes().begin(), m.bytes().end());
    for (int trial = 0; trial < 3000; ++trial) {
      auto b = good;
      const int flips = 1 + static_cast<int>(rng() % 6);
      for (int f = 0; f < flips; ++f) b[rng() % b.size()] = static_cast<std::byte>(rng());
      b.resize(rng() % 4 == 0 ? rng() % (b.size() + 1) : b.size());
      CAPTURE(trial);
      require_generic_decoder_agrees(b, 500);
    }
  }
}

// The DDP hook's frames (queue_framed_add): what the verdict says before the message, a
// bound the message need not fill, an encoder the ranks agreed on, and no host wait.
TEST_CASE("a frame's message is checked and added where it is, with nothing read back") {
  const std::size_t n = 3000;
  const std::vector<std::byte> good = sample_message(n, 40);
  const outcome want = reader_outcome(good, n);
  REQUIRE(want.error.empty());
  const outcome untouched{std::vector<float>(n, 3.25f), {}};
  const gc::encode::index_value agreed{.index = gc::index_coding::raw32, .value = gc::value_coding::f32};
  gc::detail::message_decoder<opaque_host> decoder{opaque_host{}};
  SUBCASE("a message that fills its frame, or leaves some of it, is added") {
    CHECK(framed_outcome(decoder, frames::frame_of(good, 0, 0), n, agreed) == want);
    CHECK(framed_outcome(decoder, frames::frame_of(good, 0, 1000), n, agreed) == want);
  }
  SUBCASE("an automatic encoder's message is read whatever its coding, in a frame too small for a bitmap too") {
    const gc::encode::index_value automatic{};
    for (const std::size_t k : {std::size_t{1}, std::size_t{40}, std::size_t{300}}) {
      gc::compressor c{gc::backend::host{}, n, gc::select::exact_topk{.count = k}, gc::correct::none{}, automatic};
      std::vector<std::byte> out(c.max_message_bytes());
      const auto m = c.compress(inputs::make(inputs::shape::normal, n, 12), out);
      const std::vector<std::byte> bytes(m.bytes().begin(), m.bytes().end());
      CAPTURE(k);
      CHECK((bytes.size() + 40 < gc::message_header::size + (n + 7) / 8) == (k < 300));  // no bitmap fits
      gc::detail::message_decoder<opaque_host> fresh{opaque_host{}};
      CHECK(framed_outcome(fresh, frames::frame_of(bytes), n, automatic) == reader_outcome(bytes, n));
    }
  }
  SUBCASE("a rank's error, or a message announced larger than its frame, adds nothing and is no fault") {
    const auto non_finite = 1 + static_cast<std::uint32_t>(gc::errc::non_finite);
    CHECK(framed_outcome(decoder, frames::frame_of(good, non_finite), n, agreed) == untouched);
    const std::vector<std::byte> first(good.begin(), good.begin() + 100);
    CHECK(framed_outcome(decoder, frames::frame_of(first, 0, 0, good.size()), n, agreed) == untouched);
  }
  SUBCASE("a message not written as the ranks agreed is a fault, and adds nothing") {
    for (const gc::encode::index_value other :
         {gc::encode::index_value{.index = gc::index_coding::raw32, .value = gc::value_coding::f16},
          gc::encode::index_value{.index = gc::index_coding::bitmap, .value = gc::value_coding::f32},
          gc::encode::index_value{
              .index = gc::index_coding::raw32, .value = gc::value_coding::f32, .checksum = true}}) {
      const outcome got = framed_outcome(decoder, frames::frame_of(good), n, other);
      CHECK(got.error == "fault");
      CHECK(got.dense == untouched.dense);
    }
    CHECK(framed_outcome(decoder, frames::frame_of(std::vector<std::byte>(10), 0, 0), n, agreed).error ==
          "fault");  // no header
  }
  SUBCASE("on a device, nothing is read back once the workspace has grown") {
    gc::detail::message_decoder<counted_device> on_device{counted_device{}};
    gc::encode::index_value automatic = agreed;
    automatic.index = gc::index_coding::automatic;
    for (const auto& format : {agreed, automatic}) {
      (void)framed_outcome(on_device, frames::frame_of(good), n, format);
      counted_device::reset();
      CHECK(framed_outcome(on_device, frames::frame_of(good), n, format) == want);
      CHECK(counted_device::reset() == device_waits{});
    }
  }
}

// Messages of at least accumulate_generic_from entries take the generic decoder inside
// gc::accumulate on backend::host (smaller ones the reader): the same sums and errors as
// the reader's, for every index coding, good and with bits flipped.
TEST_CASE("accumulate of a large message equals the reader's, good or corrupt") {
  const std::size_t n = 300'000;
  const std::size_t k = gc::accumulate_generic_from + 5;
  const auto g = inputs::make(inputs::shape::normal, n, 8);
  std::mt19937_64 rng(5);
  for (const auto index : {gc::index_coding::raw32, gc::index_coding::delta_bitpack, gc::index_coding::bitmap}) {
    for (const bool checksum : {false, true}) {
      CAPTURE(gc::to_string(index));
      CAPTURE(checksum);
      gc::compressor c{gc::backend::host{}, n, gc::select::exact_topk{.count = k}, gc::correct::none{},
                       gc::encode::index_value{.index = index, .value = gc::value_coding::bf16, .checksum = checksum}};
      std::vector<std::byte> out(c.max_message_bytes());
      const auto m = c.compress(g, out);
      const std::vector<std::byte> good(m.bytes().begin(), m.bytes().end());
      REQUIRE(reader_outcome(good, n).error.empty());
      CHECK(accumulate_outcome(good, n) == reader_outcome(good, n));
      for (int trial = 0; trial < 40; ++trial) {
        auto b = good;
        const std::size_t bit = rng() % (8 * b.size());
        b[bit / 8] ^= std::byte{static_cast<unsigned char>(1u << (bit % 8))};
        CAPTURE(bit);
        CHECK(accumulate_outcome(b, n) == reader_outcome(b, n));
      }
    }
  }
}

// accumulate writes into `dense` only once everything is known to fit: a dense tensor
// that shares memory with the message (its own writes would change the indices it reads)
// and a sum that would not be finite are refused, with dense as it was, on each path: the
// reader (small messages), the generic decoder (large ones), and a backend whose memory
// the host cannot read (opaque_host: read on the host, checked and scattered there).
TEST_CASE("accumulate refuses a dense tensor sharing the message's memory, and sums that overflow, changing nothing") {
  const std::size_t n = 300'000;
  for (const std::size_t k : {std::size_t{100}, std::size_t{gc::accumulate_generic_from + 5}}) {
    CAPTURE(k);
    const auto bytes = sample_message(n, k);
    const gc::sparse_vector s = gc::decode(bytes);

    // The message's bytes inside dense's memory.
    std::vector<float> storage(n + bytes.size() / sizeof(float) + 1, 3.25f);
    std::memcpy(storage.data() + n / 2, bytes.data(), bytes.size());
    const std::vector<float> before = storage;
    const std::span<const std::byte> inside(reinterpret_cast<const std::byte*>(storage.data() + n / 2), bytes.size());
    CHECK_THROWS_WITH_AS(gc::accumulate(gc::backend::host{}, inside, std::span<float>(storage.data(), n), 1.0f),
                         "gradcomp: accumulate: dense shares memory with the message (its writes would change the "
                         "message while it is read)",
                         gc::error);
    CHECK(storage == before);

    // scale * value overflows for the entries of |value| > 1; the first of them is named.
    const float scale = 3e38f;
    std::size_t first = s.values.size();
    for (std::size_t j = 0; j < s.values.size() && first == s.values.size(); ++j) {
      if (!std::isfinite(3.25f + scale * s.values[j])) first = j;
    }
    REQUIRE(first < s.values.size());
    const std::string want = "gradcomp: accumulate: dense[" + std::to_string(s.indices[first]) + "] + scale * value";
    std::vector<float> dense(n, 3.25f);
    CHECK_THROWS_WITH_AS(gc::accumulate(gc::backend::host{}, bytes, dense, scale), doctest::Contains(want.c_str()),
                         gc::error);
    CHECK(std::all_of(dense.begin(), dense.end(), [](float v) { return v == 3.25f; }));
    CHECK_THROWS_WITH_AS(gc::accumulate(opaque_host{}, bytes, gc::device_span<float>(dense.data(), n), scale),
                         doctest::Contains(want.c_str()), gc::error);
    CHECK(std::all_of(dense.begin(), dense.end(), [](float v) { return v == 3.25f; }));
    gc::detail::message_decoder<opaque_host> decoder{opaque_host{}};
    CHECK_THROWS_WITH_AS((void)decoder.check(opaque_host{}, bytes, n, "accumulate", {dense.data(), scale}),
                         doctest::Contains(want.c_str()), gc::error);
    // A sum that was already infinite stays refused; a finite one is added.
    dense[s.indices[0]] = std::numeric_limits<float>::infinity();
    CHECK_THROWS_AS(gc::accumulate(gc::backend::host{}, bytes, dense, 1.0f), gc::error);
    dense[s.indices[0]] = 3.25f;
    gc::accumulate(gc::backend::host{}, bytes, dense, 1.0f);
    CHECK(dense[s.indices[0]] == 3.25f + s.values[0]);
  }
}
