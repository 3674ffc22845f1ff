"""Reading the pickles of public routing analyses without running their code.

A pickle names functions that :mod:`pickle` calls while it loads: the stock unpickler runs whatever a
file names, so a downloaded pickle can run any code. :func:`read_counts_pickle` loads only plain
containers and numbers. It answers the few names a counts file needs with stand-ins that build plain
values and call nothing of the named library:

* ``collections.Counter`` and ``collections.defaultdict`` become a plain ``dict``;
* ``numpy.dtype`` of an integer or float type and ``numpy.core.multiarray.scalar`` (``numpy._core``
  in numpy 2) become a Python ``int`` or ``float`` decoded from the scalar's bytes.

Any other name (``os.system``, ``builtins.eval``, a class of any package) is refused with
:class:`UnsafePickleError` before anything is called. This is how the package reads the expert
counts of ``allenai/OLMoE``'s routing analysis (``tools/convert_routing_sources.py``).
"""

from __future__ import annotations

import io
import pickle

from moesd._files import regular_file


class UnsafePickleError(ValueError):
    """A pickle names something other than the plain containers and numbers :func:`read_counts_pickle` allows."""


_SCALAR_KINDS = {"i": "signed", "u": "unsigned", "f": "float"}


class _ScalarType:
    """Stand-in for ``numpy.dtype``: remembers the kind, size and byte order of a numeric scalar."""

    def __init__(self, spec, align=False, copy=False):
        if not isinstance(spec, str) or len(spec) < 2 or spec[0] not in _SCALAR_KINDS or not spec[1:].isdigit():
            raise UnsafePickleError(f"numpy.dtype({spec!r}) is not an integer or float type")
        self.kind, self.size, self.order = spec[0], int(spec[1:]), "<"
        if self.size not in (1, 2, 4, 8):
            raise UnsafePickleError(f"numpy.dtype({spec!r}) has an unsupported size")

    def __setstate__(self, state):
        if not isinstance(state, tuple) or len(state) < 2 or state[1] not in ("<", ">", "|", "="):
            raise UnsafePickleError(f"numpy.dtype state {state!r} is not a plain scalar's")
        self.order = ">" if state[1] == ">" else "<"


def _scalar(dtype, data=None):
    """Stand-in for ``numpy.core.multiarray.scalar``: the Python number a numpy scalar pickled as bytes holds."""
    if not isinstance(dtype, _ScalarType) or not isinstance(data, bytes) or len(data) != dtype.size:
        raise UnsafePickleError("a numpy scalar in the pickle is not a plain integer or float")
    byteorder = "big" if dtype.order == ">" else "little"
    if dtype.kind == "f":
        import struct

        if dtype.size not in (4, 8):
            raise UnsafePickleError(f"a float scalar of {dtype.size} bytes is not supported")
        return struct.unpack(("<" if byteorder == "little" else ">") + ("f" if dtype.size == 4 else "d"), data)[0]
    return int.from_bytes(data, byteorder, signed=dtype.kind == "i")


def _plain_dict(*args):
    """Stand-in for ``Counter(mapping)`` and ``defaultdict(factory, mapping)``: a plain dict of the mapping."""
    mapping = [a for a in args if isinstance(a, dict)]
    return dict(mapping[0]) if mapping else {}


_ALLOWED = {
    ("collections", "Counter"): _plain_dict,
    ("collections", "defaultdict"): _plain_dict,
    ("collections", "OrderedDict"): _plain_dict,
    ("numpy", "dtype"): _ScalarType,
    ("numpy.core.multiarray", "scalar"): _scalar,
    ("numpy._core.multiarray", "scalar"): _scalar,
}


class _CountsUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        try:
            return _ALLOWED[module, name]
        except KeyError:
            raise UnsafePickleError(f"the pickle names {module}.{name}, which a counts file has no use for: "
                                    "refusing to load it (it could run code)") from None

    def persistent_load(self, pid):
        raise UnsafePickleError("the pickle refers to persistent objects: refusing to load it")


def loads_counts(data: bytes):
    """The plain value (lists, tuples, dicts, str, int, float, bool, None) a counts pickle holds.

    Parameters
    ----------
    data : bytes
        The pickle's bytes.

    Raises
    ------
    UnsafePickleError
        If the pickle names anything besides the containers and numbers listed in the module docstring.
    ValueError
        If the bytes are not a pickle (a Git LFS pointer, a truncated file).
    """
    if data.startswith(b"version https://git-lfs"):
        raise ValueError("this is a Git LFS pointer, not the file: fetch the file's content")
    try:
        return _CountsUnpickler(io.BytesIO(data)).load()
    except UnsafePickleError:
        raise
    except (pickle.UnpicklingError, EOFError, TypeError, AttributeError, IndexError, KeyError) as error:
        raise ValueError(f"not a readable counts pickle: {error}") from None


def read_counts_pickle(path):
    """Read a counts pickle file without running code (:func:`loads_counts`).

    Parameters
    ----------
    path : str or os.PathLike
        The ``.pkl`` file.

    Returns
    -------
    object
        Plain lists, tuples, dicts and numbers.
    """
    return loads_counts(regular_file("path", path).read_bytes())
