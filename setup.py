"""Build hook: compiles the Cython bookkeeping module (replayssm_dsl.runtime._bookkeeping)."""
from Cython.Build import cythonize
from setuptools import Extension, setup

setup(
    ext_modules=cythonize(
        [Extension("replayssm_dsl.runtime._bookkeeping", ["runtime/_bookkeeping.pyx"])],
        compiler_directives={"language_level": "3", "boundscheck": False, "wraparound": False},
    )
)
