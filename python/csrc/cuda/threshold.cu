// build<backend::cuda, select::threshold>, in a translation unit of its own (see compressors.hpp).
#include "compressors_cuda.cuh"

namespace gradcomp_py {
template std::unique_ptr<any_compressor> build<gc::backend::cuda, gc::select::threshold>(const gc::backend::cuda&,
                                                                                     std::size_t, const std::string&,
                                                                                     options&);
}  // namespace gradcomp_py
