// build<backend::cuda, select::chunk_local>, in a translation unit of its own (see compressors.hpp).
#include "compressors_cuda.cuh"

namespace gradcomp_py {
GRADCOMP_PY_BUILD(template, gc::backend::cuda, chunk_local)
}  // namespace gradcomp_py
