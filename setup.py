"""The one compiled piece: tformer's block-quantized matrix product (tformer/model/csrc/ggml_kernel.c), built by
`pip install .` wherever a C compiler is found. optional=True: without one the install goes on and tformer runs
its torch paths, saying so in one line when a GGUF model would have used the kernel (tformer.model.ggml_kernel).
Everything else about the package is in pyproject.toml."""

from setuptools import Extension, setup

setup(ext_modules=[Extension(
    "tformer.model._ggml_kernel",
    sources=["tformer/model/csrc/ggml_kernel.c"],
    depends=["tformer/model/csrc/ggml_kernel_simd.h", "tformer/model/csrc/attend_rows.h"],
    # No -march=native: the wheel runs on any x86-64 and picks AVX2 / AVX-512 VNNI at run time. fp-contract off:
    # every multiply-add in the C is the one written, so a row's result is the same whatever batch it is in.
    extra_compile_args=["-O3", "-std=c11", "-ffp-contract=off", "-Wall"],
    extra_link_args=["-pthread"],
    optional=True,
)])
