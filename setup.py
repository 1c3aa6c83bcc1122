"""Builds gradcomp._C, the torch extension, from the C++ headers in include/ (no copy).

With a CUDA build of torch and nvcc (CUDA_HOME), the extension also carries the CUDA
backend (GRADCOMP_PY_CUDA); GRADCOMP_CUDA=0 builds it for the CPU only.
"""
import os

from setuptools import setup
from torch.utils import cpp_extension

root = os.path.dirname(os.path.abspath(__file__))
csrc = os.path.join("python", "csrc")
selectors = ["exact_topk", "sampled_threshold", "chunk_local", "random_k", "threshold", "given_indices"]
sources = [os.path.join(csrc, f) for f in ("module.cpp", "process_group.cpp", "options.cpp")]
sources += [os.path.join(csrc, "host", f"{s}.cpp") for s in selectors + ["factory"]]

import torch  # noqa: E402

with_cuda = (os.environ.get("GRADCOMP_CUDA", "1") != "0" and torch.version.cuda is not None
             and cpp_extension.CUDA_HOME is not None)
cxx = ["-std=c++20", "-O3", "-fopenmp", "-Wno-deprecated-declarations"]
nvcc = ["--std=c++20", "-O3", "--expt-relaxed-constexpr", "--fmad=false", "-Xcompiler", "-fopenmp"]
define_macros = []
if with_cuda:
    sources += [os.path.join(csrc, "cuda", f"{s}.cu") for s in selectors + ["factory"]]
    define_macros.append(("GRADCOMP_PY_CUDA", "1"))
    extension = cpp_extension.CUDAExtension
else:
    extension = cpp_extension.CppExtension

setup(
    ext_modules=[
        extension(
            "gradcomp._C",
            sources,
            include_dirs=[os.path.join(root, "include"), os.path.join(root, csrc)],
            define_macros=define_macros,
            extra_compile_args={"cxx": cxx, "nvcc": nvcc},
            extra_link_args=["-fopenmp"],
        )
    ],
    cmdclass={"build_ext": cpp_extension.BuildExtension},
)
