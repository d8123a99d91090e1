"""``carve``: a typed view of a byte range of an arena, built without numba's slicing code.

``arena[a:b].view(np.int32).reshape(...)`` compiles to a long run of bounds normalisation and
dtype checks per field, and a worker that carves forty fields types and optimises all of them,
which made up much of the quick start's compile time. The arena layout is written by
:mod:`kvnumba._layout` and checked when an arena is adopted, so a view here is just a pointer, a
shape and C strides. It borrows the arena's memory (same ``meminfo``), like a numpy view.

``arena_at`` is the one-request calls' way in: an arena passed as its address and size, which
costs the call boundary less than the array.
"""

import ctypes

import numpy as np
from llvmlite import ir
from numba.core import cgutils, config, types
from numba.core.imputils import impl_ret_borrowed
from numba.extending import intrinsic
from numba.np.arrayobj import make_array, populate_array


def carve_py(arena, offset, shape, dtype):
    """Pure-Python ``carve`` (what kernels call when ``NUMBA_DISABLE_JIT`` is set).

    Parameters
    ----------
    arena : numpy.ndarray
        A uint8 vector.
    offset : int
        Byte offset of the view's first element.
    shape : tuple of int
        One or two dimensions.
    dtype : numpy dtype class
        The view's element type.

    Returns
    -------
    numpy.ndarray
        A C-contiguous view of ``arena``.
    """
    if arena.dtype != np.uint8 or arena.ndim != 1:
        raise TypeError("carve takes a 1-D uint8 arena")
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    return arena[offset : offset + nbytes].view(dtype).reshape(shape)


@intrinsic
def _carve(typingctx, arena, offset, shape, dtype):
    # The offset counts bytes: only a 1-D uint8 arena; shapes of machine integers. Layout "A"
    # is a paged kernel's pool arena (``entry.with_pages``: a step-1 view, contiguous too).
    if not (
        isinstance(arena, types.Array)
        and arena.dtype == types.uint8
        and arena.ndim == 1
        and arena.layout in ("C", "A")
        and isinstance(shape, types.UniTuple)
        and isinstance(shape.dtype, types.Integer)
    ):
        return None
    view_type = types.Array(dtype.dtype, shape.count, "C")

    def codegen(context, builder, signature, args):
        arena_value, offset_value, shape_value, _ = args
        base = make_array(signature.args[0])(context, builder, arena_value)
        view = make_array(view_type)(context, builder)
        element = context.get_data_type(view_type.dtype)
        itemsize = context.get_abi_sizeof(element)
        data = builder.bitcast(builder.gep(base.data, [offset_value]), element.as_pointer())
        dims = [
            context.cast(builder, dim, shape.dtype, types.intp)
            for dim in cgutils.unpack_tuple(builder, shape_value, shape.count)
        ]
        strides, step = [], ir.Constant(dims[0].type, itemsize)
        for dim in reversed(dims):  # C order: the last axis is contiguous
            strides.insert(0, step)
            step = builder.mul(step, dim)
        populate_array(
            view,
            data=data,
            shape=dims,
            strides=strides,
            itemsize=context.get_constant(types.intp, itemsize),
            meminfo=base.meminfo,
            parent=base.parent,
        )
        # A borrowed reference: a caller compiled with NRT owns one more reference to the arena.
        return impl_ret_borrowed(context, builder, view_type, view._getvalue())

    return view_type(arena, offset, shape, dtype), codegen


#: ``carve(arena, offset, shape, dtype)``: the view of ``arena`` at byte ``offset``.
carve = carve_py if config.DISABLE_JIT else _carve


def arena_at_py(address, nbytes):
    """Pure-Python ``arena_at`` (what kernels call when ``NUMBA_DISABLE_JIT`` is set).

    Parameters
    ----------
    address : int
        Address of the arena's first byte (``arena.ctypes.data``).
    nbytes : int
        Its size in bytes.

    Returns
    -------
    numpy.ndarray
        A uint8 vector over that memory, owning nothing.
    """
    return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(address))


@intrinsic
def _arena_at(typingctx, address, nbytes):
    # An arena passed as two integers costs the call boundary far less than an array: numba
    # wraps every array argument in a runtime record (an allocation) and frees it on return.
    # The view owns nothing (no meminfo): the caller keeps the arena alive for the call.
    if not (isinstance(address, types.Integer) and isinstance(nbytes, types.Integer)):
        return None
    arena_type = types.Array(types.uint8, 1, "C")

    def codegen(context, builder, signature, args):
        address_value, nbytes_value = args
        arena = make_array(arena_type)(context, builder)
        byte = context.get_data_type(types.uint8)
        populate_array(
            arena,
            data=builder.inttoptr(address_value, byte.as_pointer()),
            shape=[context.cast(builder, nbytes_value, signature.args[1], types.intp)],
            strides=[context.get_constant(types.intp, 1)],
            itemsize=context.get_constant(types.intp, 1),
            meminfo=None,
        )
        return arena._getvalue()

    return arena_type(address, nbytes), codegen


#: ``arena_at(address, nbytes)``: the arena of ``nbytes`` bytes at ``address`` (the one-request
#: calls take their arenas so).
arena_at = arena_at_py if config.DISABLE_JIT else _arena_at
