"""``TupleDict``: the wrapper's return value, a dict that also unpacks like a tuple."""
from __future__ import annotations


class TupleDict(dict):
    """A dict whose iteration yields *values* in insertion order.

    ``d_row, d_col, dprob, dbias, amax, sfd_row, sfd_col = result`` unpacks the values;
    ``result["dprob_tensor"]`` is ordinary key access and ``result[2]`` positional access.
    Equality is dict equality; like dict it is unhashable.
    """

    def __iter__(self):
        return iter(list(self.values()))

    def __getitem__(self, key):
        if isinstance(key, int) and not isinstance(key, bool):
            values = list(self.values())
            try:
                return values[key]
            except IndexError:
                raise IndexError(f"TupleDict index {key} out of range for {len(values)} values") from None
        return super().__getitem__(key)

    def keys_in_order(self):
        return list(super().keys())

    def __repr__(self):
        inner = ", ".join(f"{k}={_short(v)}" for k, v in self.items())
        return f"TupleDict({inner})"


def _short(v):
    shape = getattr(v, "shape", None)
    if shape is not None:
        return f"<{type(v).__name__} {tuple(shape)} {getattr(v, 'dtype', '')}>"
    return repr(v)
