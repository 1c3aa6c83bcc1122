/// \file presets.hpp
/// The published methods, as ready-made compressors. Each takes a last argument that says
/// how its corrector's memory is stored: float_memory{} (the default) or
/// compact_memory{.bits, .block}, e.g. `presets::topk_ef(backend, n, {.density = 0.001},
/// presets::compact_memory{.bits = 8})` keeps the residual in about a byte per element.
#pragma once

#include <gradcomp/compressor.hpp>
#include <gradcomp/concepts.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/correct/chain.hpp>
#include <gradcomp/correct/clip_norm.hpp>
#include <gradcomp/correct/compact.hpp>
#include <gradcomp/correct/error_feedback.hpp>
#include <gradcomp/correct/low_pass.hpp>
#include <gradcomp/correct/momentum.hpp>
#include <gradcomp/encode/index_value.hpp>
#include <gradcomp/select/chunk_local.hpp>
#include <gradcomp/select/exact_topk.hpp>
#include <gradcomp/select/given_indices.hpp>
#include <gradcomp/select/random_k.hpp>
#include <gradcomp/select/sampled_threshold.hpp>
#include <gradcomp/select/threshold.hpp>
#include <gradcomp/settings.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <tuple>

GRADCOMP_NAMESPACE_BEGIN
namespace presets {

/// How a preset stores its corrector's memory: in float32 (the default), 4 bytes per
/// element and array.
struct float_memory {
  /// The corrector as it is.
  template <class Corrector>
  constexpr Corrector operator()(const Corrector& c) const noexcept {
    return c;
  }
};

/// ... or in blocks of 8- or 4-bit codes with a power-of-two scale per block
/// (correct::compact, docs/algorithms.md "Compressed memory"): bits / 8 + 1 / block bytes
/// per element and array.
struct compact_memory {
  std::uint32_t bits = 8;    ///< 8 or 4
  std::uint32_t block = 64;  ///< elements per scale: a multiple of 8 in [8, 4096]

  /// Its settings by name (settings.hpp), as correct::compact names them.
  static constexpr auto settings() {
    return std::tuple{setting{"memory_bits", &compact_memory::bits}, setting{"memory_block", &compact_memory::block}};
  }
  /// The corrector with its state stored in these blocks.
  template <class Corrector>
  constexpr correct::compact<Corrector> operator()(const Corrector& c) const noexcept {
    return {.inner = c, .bits = bits, .block = block};
  }
};

/// How a preset's memory is stored: float_memory or compact_memory.
template <class M>
concept memory_store = std::same_as<M, float_memory> || std::same_as<M, compact_memory>;

/// Deep Gradient Compression (Lin et al., ICLR 2018).
struct dgc_options {
  double density = 0.001;                                   ///< final density (see schedule::warmup)
  float momentum = 0.9f;                                    ///< momentum correction
  bool nesterov = false;                                    ///< Nesterov momentum
  float max_norm = std::numeric_limits<float>::infinity();  ///< local clipping threshold (infinite: none)
  int workers = 1;                                          ///< workers sharing max_norm
  std::uint64_t seed = 0;                                   ///< sampling seed
  bool reuse_threshold = false;  ///< start from last step's threshold (one pass fewer when it holds)

  /// Its settings by name (settings.hpp).
  static constexpr auto settings() {
    return std::tuple{setting{"density", &dgc_options::density},
                      setting{"momentum", &dgc_options::momentum},
                      setting{"nesterov", &dgc_options::nesterov},
                      setting{"max_norm", &dgc_options::max_norm},
                      setting{"workers", &dgc_options::workers},
                      setting{"seed", &dgc_options::seed},
                      setting{"reuse_threshold", &dgc_options::reuse_threshold}};
  }
};

/// DGC with a chosen selector (e.g. select::exact_topk to remove sampling noise):
/// clipping, momentum correction with masking, f16 values, the smallest index coding.
template <class Backend, selector Selector, memory_store Memory = float_memory>
auto dgc(Backend backend, std::size_t n, const dgc_options& o, Selector selector, Memory memory = {}) {
  return compressor{
      backend, n, selector,
      memory(correct::chain{correct::clip_norm{.max_norm = o.max_norm, .workers = o.workers},
                            correct::momentum{.beta = o.momentum, .nesterov = o.nesterov, .masking = true}}),
      encode::index_value{.index = index_coding::automatic, .value = value_coding::f16}};
}

/// DGC as published: hierarchical sampled-threshold selection.
template <class Backend, memory_store Memory = float_memory>
auto dgc(Backend backend, std::size_t n, const dgc_options& o = {}, Memory memory = {}) {
  return dgc(backend, n, o,
             select::sampled_threshold{.density = o.density, .seed = o.seed, .reuse_threshold = o.reuse_threshold},
             memory);
}

/// AdaComp (Chen et al., AAAI 2018): localized selection, residual, ternary values.
struct adacomp_options {
  std::size_t bin = 50;  ///< 50 for fully-connected/recurrent layers, 500 for convolutions

  /// Its settings by name (settings.hpp).
  static constexpr auto settings() { return std::tuple{setting{"bin", &adacomp_options::bin}}; }
};
/// AdaComp on `backend` for a tensor of n elements.
template <class Backend, memory_store Memory = float_memory>
auto adacomp(Backend backend, std::size_t n, const adacomp_options& o = {}, Memory memory = {}) {
  return compressor{backend, n, select::chunk_local{.bin = o.bin}, memory(correct::error_feedback{}),
                    encode::index_value{.index = index_coding::automatic, .value = value_coding::ternary}};
}

/// Top-k with residual memory, as in the GRACE framework.
struct topk_ef_options {
  double density = 0.001;  ///< fraction sent, in (0, 1]

  /// Its settings by name (settings.hpp).
  static constexpr auto settings() { return std::tuple{setting{"density", &topk_ef_options::density}}; }
};
/// Top-k with error feedback on `backend` for a tensor of n elements.
template <class Backend, memory_store Memory = float_memory>
auto topk_ef(Backend backend, std::size_t n, const topk_ef_options& o = {}, Memory memory = {}) {
  return compressor{backend, n, select::exact_topk{.density = o.density}, memory(correct::error_feedback{}),
                    encode::index_value{.index = index_coding::automatic, .value = value_coding::f32}};
}

/// Random-k with residual memory; workers sharing `seed` send the same indices.
struct randomk_ef_options {
  double density = 0.001;  ///< fraction sent, in (0, 1]
  std::uint64_t seed = 0;  ///< shared by the workers that must pick the same indices

  /// Its settings by name (settings.hpp).
  static constexpr auto settings() {
    return std::tuple{setting{"density", &randomk_ef_options::density}, setting{"seed", &randomk_ef_options::seed}};
  }
};
/// Random-k with error feedback on `backend` for a tensor of n elements.
template <class Backend, memory_store Memory = float_memory>
auto randomk_ef(Backend backend, std::size_t n, const randomk_ef_options& o = {}, Memory memory = {}) {
  return compressor{backend, n, select::random_k{.density = o.density, .seed = o.seed},
                    memory(correct::error_feedback{}),
                    encode::index_value{.index = index_coding::automatic, .value = value_coding::f32}};
}

/// A fixed magnitude threshold with residual memory.
struct threshold_ef_options {
  float tau = 0.0f;  ///< magnitude threshold, finite and >= 0

  /// Its settings by name (settings.hpp).
  static constexpr auto settings() { return std::tuple{setting{"tau", &threshold_ef_options::tau}}; }
};
/// A fixed threshold with error feedback on `backend` for a tensor of n elements.
template <class Backend, memory_store Memory = float_memory>
auto threshold_ef(Backend backend, std::size_t n, const threshold_ef_options& o, Memory memory = {}) {
  return compressor{backend, n, select::threshold{.tau = o.tau}, memory(correct::error_feedback{}),
                    encode::index_value{.index = index_coding::automatic, .value = value_coding::f32}};
}

/// ScaleCom (Chen et al., NeurIPS 2020): the compressor of every rank in a
/// comm::cyclic_topk exchange — the indices come from the step's leader, the memory is
/// low-pass filtered.
struct scalecom_options {
  double density = 0.001;  ///< the leader's selection, k of n as exact_topk counts it
  float beta = 1.0f;       ///< low_pass filter weight (1: plain error feedback)

  /// Its settings by name (settings.hpp).
  static constexpr auto settings() {
    return std::tuple{setting{"density", &scalecom_options::density}, setting{"beta", &scalecom_options::beta}};
  }
};
/// \throws gradcomp::error if density is outside (0, 1] (or beta outside (0, 1]).
template <class Backend, memory_store Memory = float_memory>
auto scalecom(Backend backend, std::size_t n, const scalecom_options& o = {}, Memory memory = {}) {
  detail::require(o.density > 0.0 && o.density <= 1.0, errc::invalid_argument,
                  "scalecom: density must be in (0, 1], got ", o.density);
  return compressor{backend, n, select::given_indices{.density = o.density}, memory(correct::low_pass{.beta = o.beta}),
                    encode::index_value{.index = index_coding::automatic, .value = value_coding::f32}};
}

}  // namespace presets
GRADCOMP_NAMESPACE_END
