// build<backend::cuda, select::given_indices>, in a translation unit of its own (see compressors.hpp).
#include "compressors_cuda.cuh"

namespace gradcomp_py {
GRADCOMP_PY_BUILD(template, gc::backend::cuda, given_indices)
}  // namespace gradcomp_py
