"""Parity codecs: the sum a group's parity is (ECRM's float64 summation code, or XOR of the
bit patterns), over ``Fields``, the per-row arrays a row and its optimizer state are."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import ClassVar

import numpy as np

Fields = dict[str, np.ndarray]  # per-row arrays (first axis: rows): "row", "state/accum", ...


class ParityCodec(ABC):
    """A sum in some group: ``lift`` maps values into it, ``add``/``sub`` combine in place,
    ``lower`` maps a decoded sum back to the values' dtype."""

    name: ClassVar[str]

    @abstractmethod
    def parity_dtype(self, dtype: np.dtype) -> np.dtype: ...

    @abstractmethod
    def lift(self, values: np.ndarray) -> np.ndarray: ...

    @abstractmethod
    def add(self, acc: np.ndarray, index: np.ndarray | slice, lifted: np.ndarray) -> None: ...

    @abstractmethod
    def sub(self, acc: np.ndarray, index: np.ndarray | slice, lifted: np.ndarray) -> None: ...

    @abstractmethod
    def lower(self, parity: np.ndarray, dtype: np.dtype) -> np.ndarray: ...

    def difference(self, new: np.ndarray, old: np.ndarray) -> np.ndarray:
        """What a holder adds to move a parity from ``old`` to ``new`` (difference propagation,
        ECRM section 3.3.2): exact with XOR; in float64, exact for any two float32 values less
        than 2**29 apart in magnitude."""
        delta = np.array(self.lift(new), copy=True)
        self.sub(delta, slice(None), self.lift(old))
        return delta


class SumCodec(ParityCodec):
    """ECRM's summation code, accumulated in float64."""

    name: ClassVar[str] = "sum"

    def parity_dtype(self, dtype: np.dtype) -> np.dtype:
        if np.dtype(dtype).kind != "f":
            raise TypeError(f"the sum codec encodes floating-point fields, got {dtype}")
        return np.dtype(np.float64)

    def lift(self, values: np.ndarray) -> np.ndarray:
        return np.asarray(values, dtype=np.float64)

    def add(self, acc: np.ndarray, index: np.ndarray | slice, lifted: np.ndarray) -> None:
        acc[index] += lifted

    def sub(self, acc: np.ndarray, index: np.ndarray | slice, lifted: np.ndarray) -> None:
        acc[index] -= lifted

    def lower(self, parity: np.ndarray, dtype: np.dtype) -> np.ndarray:
        return parity.astype(dtype)


class XorCodec(ParityCodec):
    """XOR of the bit patterns (RAID-5's code): exact, order-free, as wide as the values."""

    name: ClassVar[str] = "xor"
    _UINT: ClassVar[dict[int, type[np.unsignedinteger]]] = {
        1: np.uint8,
        2: np.uint16,
        4: np.uint32,
        8: np.uint64,
    }

    def parity_dtype(self, dtype: np.dtype) -> np.dtype:
        size = np.dtype(dtype).itemsize
        if size not in self._UINT:
            raise TypeError(f"the xor codec needs 1, 2, 4 or 8-byte fields, got {dtype}")
        return np.dtype(self._UINT[size])

    def lift(self, values: np.ndarray) -> np.ndarray:
        values = np.ascontiguousarray(values)
        return values.view(self.parity_dtype(values.dtype))

    def add(self, acc: np.ndarray, index: np.ndarray | slice, lifted: np.ndarray) -> None:
        acc[index] ^= lifted

    sub = add  # XOR is its own inverse

    def lower(self, parity: np.ndarray, dtype: np.dtype) -> np.ndarray:
        return np.ascontiguousarray(parity).view(dtype).copy()


CODECS: dict[str, type[ParityCodec]] = {"sum": SumCodec, "xor": XorCodec}


def make_codec(name: str) -> ParityCodec:
    if name not in CODECS:
        raise ValueError(f"ecrm.codec={name!r}; accepted: {', '.join(CODECS)}")
    return CODECS[name]()


def field_dtypes(fields: Mapping[str, np.ndarray]) -> dict[str, np.dtype]:
    return {name: np.asarray(value).dtype for name, value in fields.items()}


def blank(
    codec: ParityCodec, n: int, dtypes: Mapping[str, np.dtype], like: Mapping[str, np.ndarray]
) -> Fields:
    return {
        name: np.zeros((n, *np.asarray(like[name]).shape[1:]), dtype=codec.parity_dtype(dt))
        for name, dt in dtypes.items()
    }
