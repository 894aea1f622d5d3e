"""Runtime layer: checking what a caller passes, before any kernel runs.

Every check raises ``InputError`` (or ``CapacityError``) naming the argument, the index and the
rule, and runs before the first launch, so a bad call never changes any sequence's state.
Works on NumPy arrays and on device arrays (CuPy, torch): shape, dtype, strides and device are read
from attributes; values (finite, signs) are checked on host arrays only, or when asked for.
"""

from __future__ import annotations

import operator

import numpy as np

from replayssm_dsl.bfloat16 import round_to_bfloat16
from replayssm_dsl.errors import CapacityError, InputError

FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
BF16_BITS_DTYPES = ("uint16", "int16")  # raw bf16 bits, for token inputs declared bfloat16


def dtype_name(array) -> str:
    name = str(getattr(array, "dtype", type(array).__name__))
    return name.replace("torch.", "")


INT32 = np.iinfo(np.int32)


def host_int_array(value, name: str) -> np.ndarray:
    """A 1-D int32 copy of a host index array (list, tuple or NumPy of integers), every value checked
    to fit in int32 before the cast (so 2**32 never wraps round to slot 0)."""
    arr = np.asarray(value)
    if arr.ndim != 1:
        raise InputError(f"{name}: expected a 1-D array of ints, got shape {tuple(arr.shape)}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise InputError(f"{name}: expected integers, got dtype {arr.dtype}")
    if isinstance(value, (list, tuple)):  # NumPy reads [True, 2] as int64 [1, 2]: a bool is no index
        flags = [i for i, v in enumerate(value) if isinstance(v, (bool, np.bool_))]
        if flags:
            raise InputError(f"{name}[{flags[0]}] = {bool(value[flags[0]])}: expected an int, got a bool")
    if arr.size:
        outside = np.flatnonzero((arr < INT32.min) | (arr > INT32.max))
        if outside.size:
            i = int(outside[0])
            raise InputError(f"{name}[{i}] = {int(arr[i])} does not fit in int32")
    return arr.astype(np.int32)


def as_index(value) -> int | None:
    """``value`` as a Python int if it is an integer (NumPy's too) and not a bool, else None."""
    if isinstance(value, (bool, np.bool_)):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def refused_index(value) -> str:
    """What a value ``as_index`` refused was, for a message: a bool as itself, anything else by its type."""
    return repr(value) if isinstance(value, (bool, np.bool_)) else type(value).__name__


def check_slot_index(value, num_slots: int, name: str) -> int:
    """One live slot given alone (``copy_records``' parent and child): an int in ``[0, num_slots)``."""
    slot = as_index(value)
    if slot is None:
        raise InputError(f"{name}: expected a slot index (int), got {refused_index(value)}")
    if not 0 <= slot < num_slots:
        raise InputError(f"{name} = {slot} is out of range [0, {num_slots})")
    return slot


def check_slots(slots, num_slots: int, name: str = "slots") -> np.ndarray:
    arr = host_int_array(slots, name)
    if arr.size == 0:
        raise InputError(f"{name}: empty batch")
    bad = np.flatnonzero((arr < -1) | (arr >= num_slots))
    if bad.size:
        i = int(bad[0])
        raise InputError(f"{name}[{i}] = {arr[i]} is out of range [0, {num_slots}) (use -1 for a padded row)")
    live = arr[arr >= 0]
    uniq, counts = np.unique(live, return_counts=True)
    if (counts > 1).any():
        raise InputError(f"{name}: slot {int(uniq[counts > 1][0])} appears twice in one batch")
    return arr


def check_pages(pages, rows: int, num_pages: int, slots: np.ndarray, name: str) -> np.ndarray:
    arr = host_int_array(pages, name)
    if arr.shape[0] != rows:
        raise InputError(f"{name}: length {arr.shape[0]} != batch rows {rows}")
    live = slots >= 0
    bad = np.flatnonzero(live & ((arr < 0) | (arr >= num_pages)))
    if bad.size:
        i = int(bad[0])
        raise InputError(f"{name}[{i}] = {arr[i]} is out of range [0, {num_pages})")
    return np.where(live, arr, -1).astype(np.int32)


def check_page_writes(slots: np.ndarray, src: np.ndarray, dst: np.ndarray, every_row_writes: bool) -> None:
    """No two live rows write one checkpoint page, and no row writes a page that another row reads.

    With ``every_row_writes`` (flush, load) every live row writes its ``dst_pages``. Otherwise (step,
    verify) a row writes its checkpoint only when its buffer fills, so only a row that moves to another
    page (``dst != src``, copy-on-write) is known here to write; keeping a shared page from being
    written in place is the slot pool's rule (it gives such a row a fresh page)."""
    live = np.flatnonzero(slots >= 0)
    writers = live if every_row_writes else live[dst[live] != src[live]]
    if writers.size == 0:
        return
    pages, first, inverse = np.unique(dst[writers], return_index=True, return_inverse=True)
    again = np.flatnonzero(first[inverse] != np.arange(writers.size))  # a writer whose page an earlier one writes
    if again.size:
        i, earlier = writers[again[0]], writers[first[inverse[again[0]]]]
        raise InputError(f"dst_pages[{i}] = {dst[i]} is also dst_pages[{earlier}]: two rows "
                         "would write one checkpoint page")
    at = np.minimum(np.searchsorted(pages, src[live]), pages.size - 1)
    writer = np.where(pages[at] == src[live], writers[first[at]], live)  # each live row's src page's writer
    clash = np.flatnonzero(writer != live)
    if clash.size:
        i, j = writer[clash[0]], live[clash[0]]
        raise InputError(f"dst_pages[{i}] = {dst[i]} is src_pages[{j}]: row {i} would overwrite the "
                         f"checkpoint that row {j} reads")


def check_drafts(drafts, slots: np.ndarray, max_drafts: int, capacity: int) -> np.ndarray:
    arr = host_int_array(drafts, "drafts")
    if arr.shape[0] != slots.shape[0]:
        raise InputError(f"drafts: length {arr.shape[0]} != batch rows {slots.shape[0]}")
    live = slots >= 0
    low = np.flatnonzero(live & (arr < 1))
    if low.size:
        i = int(low[0])
        raise InputError(f"drafts[{i}] = {arr[i]}: a verify needs at least one draft")
    high = np.flatnonzero(live & (arr > max_drafts))
    if high.size:
        i = int(high[0])
        raise CapacityError(f"drafts[{i}] = {arr[i]} exceeds max_drafts={max_drafts}: the record buffer "
                            f"capacity is {capacity} (window + max_drafts)")
    return np.where(live, arr, 0).astype(np.int32)


def check_accepted(accepted, slots: np.ndarray, drafts: np.ndarray) -> np.ndarray:
    arr = host_int_array(accepted, "accepted")
    if arr.shape[0] != slots.shape[0]:
        raise InputError(f"accepted: length {arr.shape[0]} != batch rows {slots.shape[0]}")
    live = slots >= 0
    bad = np.flatnonzero(live & ((arr < 0) | (arr > drafts)))
    if bad.size:
        i = int(bad[0])
        raise InputError(f"accepted[{i}] = {arr[i]} but {drafts[i]} drafted (need 0 <= accepted <= drafted)")
    return np.where(live, arr, 0).astype(np.int32)


def check_array(array, name: str, shape: tuple, *, dtypes=FLOAT_DTYPES, check_values: bool = True,
                sign: str = "any", contiguous: bool = False, device: str | None = None,
                finite_as: str = "float32"):
    """Check one array's shape, dtype, and on the host its values: finite once rounded to
    ``finite_as`` (the dtype the kernels read or store it in, so 1e39 is refused for a float32 input
    rather than turned into inf), and of the declared sign. A host array other than NumPy (a CPU torch
    tensor) has its values checked through a NumPy copy."""
    if not hasattr(array, "shape") or not hasattr(array, "dtype"):
        raise InputError(f"{name}: expected an array (NumPy, CuPy or torch) of shape {list(shape)}, "
                         f"got {type(array).__name__}")
    got = tuple(array.shape)
    if got != tuple(shape):
        raise InputError(f"{name}: expected shape {list(shape)}, got {list(got)}")
    dt = dtype_name(array)
    if dt not in dtypes:
        raise InputError(f"{name}: dtype {dt} not accepted; use one of {', '.join(dtypes)}")
    if device is not None:
        where = _device_of(array)
        if where != device:
            raise InputError(f"{name}: is on {where}, expected {device}")
    if contiguous and not _is_contiguous(array):
        raise InputError(f"{name}: must be C-contiguous (strides {getattr(array, 'strides', '?')})")
    if check_values and not is_device_array(array):
        _check_host_values(readable_host_array(array, name), name, sign, finite_as)
    return array


def host_values(array) -> np.ndarray:
    """A host array's values as NumPy (a torch bf16 tensor by way of float32: NumPy holds no bf16;
    one that records gradients by way of ``detach``: only its values are read)."""
    if isinstance(array, np.ndarray):
        return array
    if hasattr(array, "detach"):
        array = array.detach()
    if dtype_name(array) == "bfloat16" and hasattr(array, "float"):
        array = array.float()
    return np.asarray(array)


def readable_host_array(array, name: str) -> np.ndarray:
    """``host_values``, or an ``InputError`` naming the argument when its values cannot be read on the
    host (a torch tensor on the meta device, an object that only looks like an array)."""
    try:
        return host_values(array)
    except (TypeError, ValueError, RuntimeError, NotImplementedError) as exc:
        raise InputError(f"{name}: its values cannot be read on the host ({type(exc).__name__}: {exc})") from None


def _check_host_values(values: np.ndarray, name: str, sign: str, finite_as: str) -> None:
    rounded = values
    with np.errstate(over="ignore"):
        if finite_as == "bfloat16":
            rounded = round_to_bfloat16(values)
        elif np.dtype(finite_as).itemsize < values.dtype.itemsize:
            rounded = values.astype(finite_as)
    finite = np.isfinite(rounded)
    if not finite.all():
        idx = tuple(int(i) for i in np.argwhere(~finite)[0])
        if np.isfinite(values[idx]):
            raise InputError(f"{name}: value {values[idx]} at index {list(idx)} overflows {finite_as}, "
                             "the dtype the kernels hold it in")
        raise InputError(f"{name}: non-finite value {values[idx]} at index {list(idx)}")
    if sign == "nonpositive" and (values > 0).any():
        raise InputError(f"{name}: declared sign='nonpositive' but holds {values.max()} > 0")
    if sign == "nonnegative" and (values < 0).any():
        raise InputError(f"{name}: declared sign='nonnegative' but holds {values.min()} < 0")


def check_aligned(address: int, name: str, why: str, alignment: int = 16) -> None:
    """A device buffer that the kernels move in ``alignment``-byte units (``why``) must start on such a
    boundary (a view at an odd offset would make the access fault and end the CUDA context)."""
    if address % alignment:
        raise InputError(f"{name}: must start at a {alignment}-byte aligned address ({why}), got an address "
                         f"{address % alignment} bytes past one; pass an array of its own, not a view at an offset")


def is_device_array(array) -> bool:
    """Whether ``array`` lives on a GPU (CuPy, a torch CUDA tensor, anything with a CUDA array interface)."""
    return _device_of(array) == "cuda"


def _device_of(array) -> str:
    if isinstance(array, np.ndarray):
        return "cpu"
    if hasattr(array, "__cuda_array_interface__"):  # CuPy, Numba, any array that shares GPU memory so
        return "cuda"
    dev = getattr(array, "device", None)
    if dev is None:
        return "cpu"
    text = str(dev)
    return "cuda" if text.startswith("<CUDA Device") or text.startswith("cuda") else text


def _is_contiguous(array) -> bool:
    if hasattr(array, "is_contiguous"):
        return bool(array.is_contiguous())
    flags = getattr(array, "flags", None)
    return bool(flags["C_CONTIGUOUS"]) if flags is not None else True
