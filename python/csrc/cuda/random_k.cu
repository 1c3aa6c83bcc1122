// build<backend::cuda, select::random_k>, in a translation unit of its own (see compressors.hpp).
#include "compressors_cuda.cuh"

namespace gradcomp_py {
GRADCOMP_PY_BUILD(template, gc::backend::cuda, random_k)
}  // namespace gradcomp_py
