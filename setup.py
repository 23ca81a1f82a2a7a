"""The one compiled part of vflo: eight-lane X25519 for PSI (src/vflo/align/_x25519.c).

Optional: where no C compiler is found the install goes on without it and PSI blinds with OpenSSL's X25519
(slower, the same numbers). Everything else about the package is in pyproject.toml.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("vflo.align._x25519", ["src/vflo/align/_x25519.c"], optional=True,
                             extra_compile_args=["-O3"])])
