// make_cuda and make_cuda_accumulator: the selector dispatch over build<backend::cuda, S>
// (instantiated one selector per translation unit, scripts/binding_units.py), each compressor with a stream of its
// own for the calls that take no stream (module.cpp runs compress, stage and preview on
// torch's current stream).
#include "compressors_cuda.cuh"

namespace gradcomp_py {

#define GRADCOMP_PY_EXTERN(S) GRADCOMP_PY_BUILD(extern template, gc::backend::cuda, S)
GRADCOMP_SELECTORS(GRADCOMP_PY_EXTERN)
#undef GRADCOMP_PY_EXTERN

namespace {

/// A non-blocking stream on `device` (made current), destroyed with the last owner.
std::shared_ptr<void> own_stream(int device) {
  gc::detail::cuda_check(cudaSetDevice(device), "cudaSetDevice");
  cudaStream_t stream = nullptr;
  gc::detail::cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  return {stream, [](void* s) { cudaStreamDestroy(static_cast<cudaStream_t>(s)); }};
}

/// Its workspace grows on a stream of its own (zeroing waits for that stream alone).
class accumulator_of_device final : public cuda_accumulator {
 public:
  explicit accumulator_of_device(int device)
      : device_(device),
        stream_(own_stream(device)),
        add_(gc::backend::cuda{.stream = raw(stream_), .device = device}) {}
  void add(void* stream, std::span<const std::byte> message, float* dense, std::size_t n, float scale) override {
    add_(gc::backend::cuda{.stream = static_cast<cudaStream_t>(stream), .device = device_},
         gc::device_span<const std::byte>(message.data(), message.size()), gc::device_span<float>(dense, n), scale);
  }
  void queue_framed_add(void* stream, const gc::encode::index_value& format, std::span<const std::byte> frame,
                        float* dense, std::size_t n, float scale, std::uint32_t* fault) override {
    add_.queue_framed_add(gc::backend::cuda{.stream = static_cast<cudaStream_t>(stream), .device = device_}, format,
                          gc::device_span<const std::byte>(frame.data(), frame.size()),
                          gc::device_span<float>(dense, n), scale, gc::device_span<std::uint32_t>(fault, 1));
  }

 private:
  static cudaStream_t raw(const std::shared_ptr<void>& s) { return static_cast<cudaStream_t>(s.get()); }
  int device_;
  std::shared_ptr<void> stream_;  // declared before add_: destroyed after it
  gc::device_accumulator add_;
};

}  // namespace

std::unique_ptr<any_compressor> make_cuda(std::size_t n, const std::string& method, options& o, int device) {
  std::shared_ptr<void> stream = own_stream(device);
  std::unique_ptr<any_compressor> made = make(gc::backend::cuda{static_cast<cudaStream_t>(stream.get())}, n, method, o);
  made->keep(std::move(stream));
  return made;
}

std::unique_ptr<cuda_accumulator> make_cuda_accumulator(int device) {
  return std::make_unique<accumulator_of_device>(device);
}

}  // namespace gradcomp_py
