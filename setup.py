"""Builds gradcomp._C, the torch extension, from the C++ headers in include/ (no copy).

With a CUDA build of torch and nvcc (CUDA_HOME), the extension also carries the CUDA
backend (GRADCOMP_PY_CUDA); GRADCOMP_CUDA=0 builds it for the CPU only.
"""
import os
import re

from setuptools import setup
from torch.utils import cpp_extension

root = os.path.dirname(os.path.abspath(__file__))
csrc = os.path.join("python", "csrc")
sources = [os.path.join(csrc, f) for f in ("module.cpp", "messages.cpp", "process_group.cpp", "ddp_steps.cpp", "options.cpp",
                                           os.path.join("host", "factory.cpp"))]


def selector_units(backend, extension, include):
    """One translation unit per selector of names.hpp's list, instantiating the binding's
    build<Backend, select::S> (generated under build/units: the list is the only place
    that names them)."""
    with open(os.path.join(root, csrc, "names.hpp")) as f:
        text = f.read()
    block = text[text.index("#define GRADCOMP_PY_SELECTORS(X)"):text.index("#define GRADCOMP_PY_PRESETS")]
    units = []
    for selector in re.findall(r"X\((\w+)\)", block):
        path = os.path.join("build", "units", backend, f"{selector}{extension}")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        text = (f'#include "{include}"\n\nnamespace gradcomp_py {{\n'
                f"GRADCOMP_PY_BUILD(template, gc::backend::{backend}, {selector})\n}}  // namespace gradcomp_py\n")
        if not os.path.exists(path) or open(path).read() != text:  # unchanged units keep their objects
            with open(path, "w") as f:
                f.write(text)
        units.append(path)
    return units


sources += selector_units("host", ".cpp", "compressors.hpp")

import torch  # noqa: E402

with_cuda = (os.environ.get("GRADCOMP_CUDA", "1") != "0" and torch.version.cuda is not None
             and cpp_extension.CUDA_HOME is not None)
cxx = ["-std=c++20", "-O3", "-fopenmp", "-Wno-deprecated-declarations"]
nvcc = ["-std=c++20", "-O3", "--expt-relaxed-constexpr", "--fmad=false", "-Xcompiler", "-fopenmp"]
define_macros = []
if with_cuda:
    sources += [os.path.join(csrc, "cuda", "factory.cu")] + selector_units("cuda", ".cu", "cuda/compressors_cuda.cuh")
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
