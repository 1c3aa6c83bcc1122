// Whole compression steps and codecs: the DGC step and top-k with error feedback,
// fused (the compressor: the selector's first pass rides on the corrector's) and
// unfused (the same engines run one after the other), against the streaming read; and
// delta_bitpack index coding throughput on one core.
#include <gradcomp/detail/codec/decode.hpp>
#include <gradcomp/gradcomp.hpp>

#include <bit>
#include <type_traits>

#include "support/engine_stages.hpp"

#include "bench_common.hpp"

namespace gc = gradcomp;

namespace {

constexpr std::int64_t step_n = 25'000'000;

void account(benchmark::State& state, std::size_t n) {
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * n));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * n * 4));
}

// The bench gradient, or its bfloat16 (the top half of each float).
template <class Element>
std::vector<Element> gradient_as(std::size_t n) {
  const auto& g = bench::gradient(n);
  if constexpr (std::is_same_v<Element, float>) {
    return g;
  } else {
    std::vector<Element> out(n);
    for (std::size_t i = 0; i < n; ++i) out[i] = {static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(g[i]) >> 16)};
    return out;
  }
}

template <class Element = float, class Compressor>
void run_fused(benchmark::State& state, Compressor c) {
  const std::vector<Element> g = gradient_as<Element>(c.size());
  std::vector<std::byte> buf(c.max_message_bytes());
  std::size_t bytes = 0;
  // Steady state, as in training: the first steps touch the state arrays for the first
  // time (page faults) and, before any clipping is seen, run the optimistic pass.
  for (int warm = 0; warm < 3; ++warm) (void)c.compress(g, buf);
  for (auto _ : state) bytes = c.compress(g, buf).bytes().size();
  account(state, c.size());
  state.counters["msg_bytes"] = static_cast<double>(bytes);
}

// The same step with each engine doing its own passes, as without fusion.
template <class Selector, class Corrector, class Encoder>
void run_unfused(benchmark::State& state, std::size_t n, Selector s, Corrector c, Encoder e) {
  const auto& g = bench::gradient(n);
  const gc::backend::host host{};
  gc::detail::engine_for<Selector, gc::backend::host> select(host, s, n);
  gc::detail::engine_for<Corrector, gc::backend::host> correct(host, c, n);
  gc::detail::engine_for<Encoder, gc::backend::host> encode(host, e, n, s.max_selected(n));
  std::vector<std::uint32_t> index(s.max_selected(n));
  std::vector<float> sent(index.size());
  std::vector<std::byte> buf(e.max_bytes(n, index.size()));
  std::uint64_t step = 0;
  auto one_step = [&] {
    const bool finite = support::update_now(correct, host, c, g);
    benchmark::DoNotOptimize(finite);
    const auto acc = correct.acc(g);
    const auto chosen = support::select_now(select, host, s, {acc, g, step}, index);
    const std::span<const std::uint32_t> idx(index.data(), chosen.count);
    support::encode_now(encode, host, e, {acc, idx, step, chosen.value_scale}, buf, sent);
    support::commit_now(correct, host, c, idx, std::span<const float>(sent.data(), chosen.count));
    correct.accept();
    select.accept();
    ++step;
  };
  for (int warm = 0; warm < 3; ++warm) one_step();  // steady state, as for the fused step
  for (auto _ : state) one_step();
  account(state, n);
}

const gc::presets::dgc_options dgc_opts{.density = 0.001, .max_norm = 1.0f};

void BM_dgc_step(benchmark::State& s) { run_fused(s, gc::presets::dgc(gc::backend::host{}, step_n, dgc_opts)); }
// The same with reuse_threshold: the candidates are collected in the corrector's pass.
void BM_dgc_step_reuse(benchmark::State& s) {
  auto o = dgc_opts;
  o.reuse_threshold = true;
  run_fused(s, gc::presets::dgc(gc::backend::host{}, step_n, o));
}
void BM_dgc_step_unfused(benchmark::State& s) {
  const auto c = gc::presets::dgc(gc::backend::host{}, step_n, dgc_opts);
  run_unfused(s, step_n, c.selector(), c.corrector(), c.encoder());
}
void BM_topk_ef_step(benchmark::State& s) {
  run_fused(s, gc::presets::topk_ef(gc::backend::host{}, step_n, {.density = 0.001}));
}
void BM_topk_ef_step_unfused(benchmark::State& s) {
  const auto c = gc::presets::topk_ef(gc::backend::host{}, step_n, {.density = 0.001});
  run_unfused(s, step_n, c.selector(), c.corrector(), c.encoder());
}

// The same step with the residual stored in 8 and 4 bits (correct::compact): the float32
// step plus reading the stored blocks and storing the new residual into them.
void BM_topk_ef_step_compact(benchmark::State& s) {
  run_fused(s, gc::presets::topk_ef(gc::backend::host{}, step_n, {.density = 0.001},
                                    gc::presets::compact_memory{.bits = static_cast<std::uint32_t>(s.range(0))}));
}

// The same steps with the gradient in bfloat16 (a bf16 model's DDP bucket): read as it
// is by the corrector's pass, each value widened there. Bytes processed count a 4-byte
// float32 input, as above, so the rates compare directly.
void BM_dgc_step_bf16(benchmark::State& s) {
  run_fused<gc::bfloat16>(s, gc::presets::dgc(gc::backend::host{}, step_n, dgc_opts));
}
void BM_topk_ef_step_bf16(benchmark::State& s) {
  run_fused<gc::bfloat16>(s, gc::presets::topk_ef(gc::backend::host{}, step_n, {.density = 0.001}));
}

// The memory traffic momentum correction cannot avoid: read u, v, g, write u, v, in a
// bare fused loop; in place, and into a second pair of arrays as gradcomp's rejected-
// step guarantee requires. Lower bounds for the dgc step, not gradcomp code.
void BM_momentum_traffic(benchmark::State& state) {
  const auto& g = bench::gradient(step_n);
  const bool double_buffered = state.range(0) != 0;
  std::vector<float> u(step_n), v(step_n), u2(step_n), v2(step_n);
  for (auto _ : state) {
    float* uo = double_buffered ? u2.data() : u.data();
    float* vo = double_buffered ? v2.data() : v.data();
    const float* ui = u.data();
    const float* vi = v.data();
#pragma omp parallel for simd schedule(static)
    for (std::int64_t i = 0; i < step_n; ++i) {
      const float un = 0.9f * ui[i] + g[i];
      uo[i] = un;
      vo[i] = vi[i] + un;
    }
    if (double_buffered) {
      std::swap(u, u2);
      std::swap(v, v2);
    }
  }
  account(state, step_n);
}

// delta_bitpack on the indices exact top-k selects: a whole message (f32 values) written
// by index_value's writer; bytes processed = 4 bytes of index data per entry, one thread.
std::vector<std::uint32_t> topk_indices(double density) {
  const auto& g = bench::gradient(step_n);
  gc::compressor c{gc::backend::host{}, g.size(), gc::select::exact_topk{.density = density}, gc::correct::none{},
                   gc::encode::index_value{.index = gc::index_coding::raw32}};
  std::vector<std::byte> buf(c.max_message_bytes());
  return gc::decode(c.compress(g, buf).bytes()).indices;
}

void BM_delta_encode(benchmark::State& state) {
  const auto idx = topk_indices(static_cast<double>(state.range(0)) * 1e-4);
  const gc::encode::index_value policy{.index = gc::index_coding::delta_bitpack};
  const std::vector<float> values(idx.size(), 1.0f);
  std::vector<float> sent(idx.size());
  std::vector<std::byte> out(policy.max_bytes(step_n, idx.size()));
  std::size_t bytes = 0;
  for (auto _ : state) {
    bytes = support::encode_message(policy, step_n, idx, values, out, sent, 0);
    benchmark::DoNotOptimize(out.data());
  }
  if (gc::decode(std::span<const std::byte>(out.data(), bytes)).indices != idx)
    state.SkipWithError("round trip failed");
  const auto index_bytes = gc::detail::load_le<std::uint64_t>(out.data() + 32);  // the header's index section size
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * idx.size() * 4));
  state.counters["bits_per_index"] = 8.0 * static_cast<double>(index_bytes) / static_cast<double>(idx.size());
}

void BM_delta_decode(benchmark::State& state) {
  const auto idx = topk_indices(static_cast<double>(state.range(0)) * 1e-4);
  const gc::encode::index_value policy{.index = gc::index_coding::delta_bitpack};
  const std::vector<float> values(idx.size(), 1.0f);
  std::vector<float> sent(idx.size());
  std::vector<std::byte> message(policy.max_bytes(step_n, idx.size()));
  message.resize(support::encode_message(policy, step_n, idx, values, message, sent, 0));
  const gc::message_header h = gc::detail::read_header(message, message.size());
  const std::byte* section = message.data() + gc::message_header::size;
  std::vector<std::uint32_t> back(idx.size());
  for (auto _ : state) {
    std::size_t j = 0;
    gc::detail::validate_index_section(h, section, [&](std::uint64_t i) { back[j++] = static_cast<std::uint32_t>(i); });
    benchmark::DoNotOptimize(back.data());
  }
  if (back != idx) state.SkipWithError("delta_bitpack round trip failed");
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * idx.size() * 4));
}

// accumulate of one message into a dense tensor of step_n floats on backend::host, the
// whole message checked first: the host's sequential reader (arg 1 = 0: message_reader,
// validate then visit, what gc::accumulate ran before; the baseline), gc::accumulate
// (1: the decoder written over the primitives, detail::message_decoder, with a new
// workspace per call), and that decoder kept across calls (2: as device_accumulator
// keeps it). Density arg 0 in 1e-4.
void BM_accumulate(benchmark::State& state) {
  const auto idx = topk_indices(static_cast<double>(state.range(0)) * 1e-4);
  const gc::encode::index_value policy{.index = gc::index_coding::delta_bitpack, .value = gc::value_coding::f16};
  const std::vector<float> values(idx.size(), 0.5f);
  std::vector<float> sent(idx.size());
  std::vector<std::byte> message(policy.max_bytes(step_n, idx.size()));
  message.resize(support::encode_message(policy, step_n, idx, values, message, sent, 0));
  std::vector<float> dense(step_n, 0.0f);
  const gc::backend::host be{};
  gc::detail::message_decoder<gc::backend::host> generic(be);
  const auto way = state.range(1);
  for (auto _ : state) {
    if (way == 0) {
      const gc::detail::message_reader reader(message);
      reader.validate_entries();
      reader.visit([&](std::uint32_t i, float v) { dense[i] += v; });
    } else if (way == 1) {
      gc::accumulate(be, message, dense, 1.0f);
    } else {
      generic.add(be, generic.check(be, message, step_n, "accumulate"), dense, 1.0f);
    }
    benchmark::DoNotOptimize(dense.data());
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * message.size()));
  state.counters["entries"] = static_cast<double>(idx.size());
}

}  // namespace

BENCHMARK(bench::BM_read)->Name("read")->Arg(step_n)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.5);
BENCHMARK(BM_topk_ef_step_unfused)
    ->Name("topk_ef_step_unfused/25000000")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(0.5);
BENCHMARK(BM_topk_ef_step)->Name("topk_ef_step/25000000")->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.5);
BENCHMARK(BM_topk_ef_step_compact)
    ->Name("topk_ef_step_compact/25000000")
    ->ArgName("bits")
    ->Arg(8)
    ->Arg(4)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(0.5);
BENCHMARK(BM_dgc_step_unfused)
    ->Name("dgc_step_unfused/25000000")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(0.5);
BENCHMARK(BM_dgc_step)->Name("dgc_step/25000000")->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.5);
BENCHMARK(BM_topk_ef_step_bf16)
    ->Name("topk_ef_step_bf16/25000000")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(0.5);
BENCHMARK(BM_dgc_step_bf16)->Name("dgc_step_bf16/25000000")->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.5);
BENCHMARK(BM_dgc_step_reuse)
    ->Name("dgc_step_reuse/25000000")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(0.5);
BENCHMARK(BM_momentum_traffic)
    ->Name("momentum_traffic_in_place/25000000")
    ->Arg(0)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(0.5);
BENCHMARK(BM_momentum_traffic)
    ->Name("momentum_traffic_double_buffered/25000000")
    ->Arg(1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(0.5);
BENCHMARK(BM_delta_encode)->Name("delta_encode")->Arg(10)->Arg(100)->ArgName("d_1e4")->Threads(1);
BENCHMARK(BM_delta_decode)->Name("delta_decode")->Arg(10)->Arg(100)->ArgName("d_1e4")->Threads(1);
BENCHMARK(BM_accumulate)
    ->Name("accumulate")
    ->ArgsProduct({{10, 25, 50, 100}, {0, 1, 2}})
    ->ArgNames({"d_1e4", "way"})
    ->Threads(1);

int main(int argc, char** argv) { return bench::run_main(argc, argv, "none"); }
