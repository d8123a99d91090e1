"""Token position <-> block arithmetic.

Block sizes are almost always powers of two; then a shift and a mask replace a 64-bit division,
which is slow and sits on the per-sequence path of every call.
"""

from numba import config

from kvnumba._kernels.jit import inlined

if config.DISABLE_JIT:  # the intrinsic exists only in compiled code (coverage runs)

    def trailing_zeros(x):
        """Index of the lowest set bit of ``x > 0``."""
        return (int(x) & -int(x)).bit_length() - 1

else:
    from numba.cpython.unsafe.numbers import trailing_zeros


@inlined
def div_block(x, block_size):
    """``x // block_size`` for ``x >= 0``."""
    if block_size & (block_size - 1) == 0:
        return x >> trailing_zeros(block_size)
    return x // block_size


@inlined
def mod_block(x, block_size):
    """``x % block_size`` for ``x >= 0``."""
    if block_size & (block_size - 1) == 0:
        return x & (block_size - 1)
    return x % block_size


@inlined
def blocks_of(length, block_size):
    """Blocks that hold ``length`` tokens."""
    return div_block(length + block_size - 1, block_size)
