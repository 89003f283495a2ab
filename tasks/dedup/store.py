"""Per-shard arrays on disk, read back by row: signatures and shingle sets live here, not in RAM.

Arrays are ``.npy`` files at fsspec URLs. Local files are memory-mapped; other stores are read
with one ranged read per requested row, so verifying a candidate pair costs a few hundred bytes
of I/O whatever the corpus size. Rows are always returned as copies and a file is mapped only
while one shard's rows are read: every page the kernel maps around a touched row counts as
resident memory while the mapping lives (at 1 M documents, views kept into 100 mapped files
tripled the peak resident memory).

A ragged array (one variable-length shingle set per document) is two files: ``<name>.npy``
with the values concatenated and ``<name>.offsets.npy`` with D + 1 offsets.
"""

from __future__ import annotations

import io

import numpy as np

from tasks.storage import filesystem


def write_npy_to(f, array: np.ndarray) -> None:
    """``array`` in ``.npy`` format (the bytes ``np.save`` writes) to an open binary file, straight
    from the array's buffer: no in-memory copy of the file."""
    array = np.ascontiguousarray(array)
    np.lib.format.write_array_header_1_0(f, np.lib.format.header_data_from_array_1_0(array))
    f.write(array.reshape(-1).view(np.uint8).data)


class NpyFile:
    """Row access to a C-ordered ``.npy`` file at any fsspec URL."""

    def __init__(self, url: str):
        self.url = url
        self.fs, self.path = filesystem(url)
        self.local = "file" in np.atleast_1d(self.fs.protocol)
        if self.local:
            self._array = np.load(self.path, mmap_mode="r")
            self.shape, self.dtype = self._array.shape, self._array.dtype
        else:
            with self.fs.open(self.path, "rb") as f:
                version = np.lib.format.read_magic(f)
                if version == (1, 0):
                    self.shape, fortran, self.dtype = np.lib.format.read_array_header_1_0(f)
                else:
                    self.shape, fortran, self.dtype = np.lib.format.read_array_header_2_0(f)
                if fortran:
                    raise ValueError(f"{url} is Fortran-ordered; smelt writes C order")
                self.data_offset = f.tell()
        self.row_bytes = int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize

    def rows(self, index: np.ndarray) -> np.ndarray:
        """``array[index]`` for an integer index array."""
        if self.local:
            return np.asarray(self._array[index])
        out = np.empty((len(index), *self.shape[1:]), dtype=self.dtype)
        with self.fs.open(self.path, "rb") as f:
            for i, row in enumerate(index):
                f.seek(self.data_offset + int(row) * self.row_bytes)
                out[i] = np.frombuffer(f.read(self.row_bytes), dtype=self.dtype).reshape(self.shape[1:])
        return out

    def span(self, start: int, end: int) -> np.ndarray:
        """``array[start:end]``."""
        if self.local:
            return np.array(self._array[start:end])  # a copy: a view would keep the file mapped
        with self.fs.open(self.path, "rb") as f:
            f.seek(self.data_offset + start * self.row_bytes)
            data = f.read((end - start) * self.row_bytes)
        return np.frombuffer(data, dtype=self.dtype).reshape(end - start, *self.shape[1:])


def read_npy(url: str) -> np.ndarray:
    fs, path = filesystem(url)
    with fs.open(path, "rb") as f:
        return np.load(io.BytesIO(f.read()), allow_pickle=False)


def ragged_index(starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Positions ``starts[k] … starts[k] + sizes[k] - 1`` for every k, concatenated."""
    index = np.repeat(starts - (np.cumsum(sizes) - sizes), sizes)
    index += np.arange(len(index), dtype=index.dtype)
    return index


class RaggedFile:
    """Per-document variable-length arrays (``<url>.npy`` + ``<url>.offsets.npy``)."""

    def __init__(self, url: str, offsets: np.ndarray | None = None):
        self.values = NpyFile(url + ".npy")
        self.offsets = read_npy(url + ".offsets.npy") if offsets is None else offsets

    def rows(self, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(values of rows ``index`` concatenated in that order, each row's size): one gather for
        a local file, one ranged read per row otherwise."""
        starts, sizes = self.offsets[index], self.offsets[np.asarray(index) + 1] - self.offsets[index]
        if self.values.local:
            return self.values.rows(ragged_index(starts, sizes)), sizes
        parts = [self.values.span(int(lo), int(lo + n)) for lo, n in zip(starts, sizes)]
        return (np.concatenate(parts) if parts else np.zeros(0, self.values.dtype)), sizes
