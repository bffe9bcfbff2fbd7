"""Builds the `clid` package and its C++/CUDA extension `clid._C`.

    pip install --no-build-isolation -e .      (the Makefile's install step; torch is pinned)

The extension holds the fused ops (csrc/): C++ kernels, compiled for any CPU of this architecture
with copies of the hot loops for wider instruction sets chosen at run time (csrc/cpu/isa.h), and
CUDA kernels where PyTorch has CUDA and a CUDA toolkit is found (CLID_CUDA=0 leaves them out,
CLID_CUDA=1 requires them). A failed compile fails the install.
"""
import glob
import os
import sys

import torch
from setuptools import find_packages, setup
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

CUDA_ARCHS = ("80", "90")  # A100, H100 (the archs csrc/check_cuda.sh checks), and PTX of the last for newer GPUs


def use_cuda() -> bool:
    wanted = os.environ.get("CLID_CUDA", "auto")
    available = torch.version.cuda is not None and CUDA_HOME is not None
    if wanted == "1" and not available:
        raise SystemExit("error: CLID_CUDA=1, but PyTorch has no CUDA or no CUDA toolkit was found (CUDA_HOME)")
    return available and wanted != "0"


def extension():
    cuda = use_cuda()
    sources = sorted(glob.glob("csrc/*.cpp")) + sorted(glob.glob("csrc/cpu/*.cpp"))
    cxx = ["-O3", "-fopenmp", "-DNDEBUG", "-std=c++20", "-Wno-psabi"]  # (kernels pass wide vectors only internally)
    nvcc = ["-O3", "-DNDEBUG", "--expt-relaxed-constexpr", "-lineinfo", "-std=c++20"]
    if cuda:
        sources += sorted(glob.glob("csrc/cuda/*.cpp")) + sorted(glob.glob("csrc/cuda/*.cu"))
        cxx.append("-DCLID_WITH_CUDA")
        nvcc.append("-DCLID_WITH_CUDA")
        if not os.environ.get("TORCH_CUDA_ARCH_LIST"):  # not the visible GPUs: a login node has none
            nvcc += [f"-gencode=arch=compute_{a},code=sm_{a}" for a in CUDA_ARCHS]
            nvcc.append(f"-gencode=arch=compute_{CUDA_ARCHS[-1]},code=compute_{CUDA_ARCHS[-1]}")
    # torch's libraries use the shared libstdc++. A compiler that links it statically by default (some
    # cluster GCC builds) would give the extension a second, uninitialised C++ locale, and every error
    # message holding a number would crash: name the shared one before the compiler's own.
    link = ["-fopenmp"] + (["-l:libstdc++.so.6"] if sys.platform.startswith("linux") else [])
    kind = CUDAExtension if cuda else CppExtension
    return kind("clid._C", sources, include_dirs=[os.path.abspath("csrc")],
                extra_compile_args={"cxx": cxx, "nvcc": nvcc}, extra_link_args=link)


setup(  # (name, version and the app extra: pyproject.toml's [project])
    packages=find_packages(include=["clid", "clid.*"]),
    ext_modules=[extension()],
    cmdclass={"build_ext": BuildExtension},
)
