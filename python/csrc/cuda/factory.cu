// make_cuda and accumulate_cuda: the selector dispatch over build<backend::cuda, S>
// (instantiated one selector per translation unit), each compressor with a stream of its
// own for the calls that take no stream (module.cpp runs compress, stage and preview on
// torch's current stream).
#include "compressors_cuda.cuh"

namespace gradcomp_py {

#define GRADCOMP_PY_EXTERN(S) GRADCOMP_PY_BUILD(extern template, gc::backend::cuda, S)
GRADCOMP_PY_EACH_SELECTOR(GRADCOMP_PY_EXTERN)
#undef GRADCOMP_PY_EXTERN

std::unique_ptr<any_compressor> make_cuda(std::size_t n, const std::string& method, options& o, int device) {
  gc::detail::cuda_check(cudaSetDevice(device), "cudaSetDevice");
  cudaStream_t stream = nullptr;
  gc::detail::cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  const std::shared_ptr<void> owned(stream, [](void* s) { cudaStreamDestroy(static_cast<cudaStream_t>(s)); });
  std::unique_ptr<any_compressor> made = make(gc::backend::cuda{stream}, n, method, o);
  made->keep(owned);
  return made;
}

void accumulate_cuda(std::span<const std::byte> message, float* dense, std::size_t n, float scale, void* stream) {
  gc::device_accumulator(gc::backend::cuda{static_cast<cudaStream_t>(stream)})(
      gc::device_span<const std::byte>(message.data(), message.size()), gc::device_span<float>(dense, n), scale);
}

}  // namespace gradcomp_py
