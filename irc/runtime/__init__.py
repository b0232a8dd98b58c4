"""What a module that irc generates needs at run time, as ordinary code.

The generated module (`lowering/tile_to_triton.py` prints it) holds only its
own kernels and host functions; it imports the rest from here, as Inductor's
output code imports `torch._inductor.runtime.triton_helpers`:

- `helpers`: the `@triton.jit` functions kernels call (NaN-propagating max and
  min, tanh, pow, bf16 conversions and dots, the wait of a dependent launch);
- `launch`: what host functions call (argument checks, kernel launches with a
  fast path for repeat calls, persistent grids, TMA scratch memory);
- `interpreter`: how kernels run on Triton's interpreter in a process whose
  Triton compiles for the GPU, with one comment a patch on the Triton
  behaviour it works around.

The submodules import torch and Triton; this package itself imports nothing.
"""
