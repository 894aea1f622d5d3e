"""Runtime layer: compile and launch generated kernels (CuPy), own device buffers, host bookkeeping.

May import the DSL and lowering layers. Importing this package needs neither CuPy nor a GPU:
the modules that need CuPy import it themselves and say so clearly when it is missing.
"""
