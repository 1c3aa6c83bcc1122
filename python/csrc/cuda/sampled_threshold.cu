// build<backend::cuda, select::sampled_threshold>, in a translation unit of its own (see compressors.hpp).
#include "compressors_cuda.cuh"

namespace gradcomp_py {
GRADCOMP_PY_BUILD(template, gc::backend::cuda, sampled_threshold)
}  // namespace gradcomp_py
