// The compressors `gradcomp eval` knows, behind one small runtime interface.
#pragma once

#include <gradcomp/gradcomp.hpp>

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace cli {

/// One compressor, type-erased for the command line.
class runner {
 public:
  virtual ~runner() = default;
  virtual gradcomp::message compress(std::span<const float> grad, std::span<std::byte> out) = 0;
  [[nodiscard]] virtual std::size_t max_message_bytes() const = 0;
};

template <class Compressor>
class runner_of final : public runner {
 public:
  explicit runner_of(Compressor c) : c_(std::move(c)) {}
  gradcomp::message compress(std::span<const float> grad, std::span<std::byte> out) override {
    return c_.compress(grad, out);
  }
  [[nodiscard]] std::size_t max_message_bytes() const override { return c_.max_message_bytes(); }

 private:
  Compressor c_;
};

template <class Compressor>
std::unique_ptr<runner> make_runner(Compressor c) {
  return std::make_unique<runner_of<Compressor>>(std::move(c));
}

struct method {
  std::string name;
  std::string description;
  std::function<std::unique_ptr<runner>(std::size_t n, double density)> make;
};

inline std::vector<method> methods() {
  namespace gc = gradcomp;
  const gc::backend::host host{};
  return {
      {"topk", "exact top-k, no memory (what is not sent is lost)",
       [=](std::size_t n, double d) { return make_runner(gc::compressor{host, n, gc::select::exact_topk{.density = d}}); }},
      {"topk_ef", "exact top-k with error feedback (GRACE-style)",
       [=](std::size_t n, double d) {
         return make_runner(gc::compressor{host, n, gc::select::exact_topk{.density = d}, gc::correct::error_feedback{}});
       }},
  };
}

}  // namespace cli
