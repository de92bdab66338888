"""Blob codecs and hashes: how one kernel binary is stored in a ``kern_db`` row.

Layout of a row's blob (MIOpen's convention, kept so that both kinds of file read alike):
``uncompressed_size == 0`` means the blob is stored raw (compression did not shrink it);
otherwise ``kernel_blob`` is one frame of the bundle's codec that decodes to exactly
``uncompressed_size`` bytes. ``kernel_hash`` is the hex digest of the *uncompressed* bytes
(xxh3_128 in kdbkit bundles, MD5 in files written by MIOpen). From format version 2 on it is
*keyed*: the hash is fed :func:`entry_key_bytes` (a fixed label, then the kernel name and the
kernel args, each as its UTF-8 length in 8 little-endian bytes and the bytes) before the data,
so an entry's digest only matches under its own key: a row whose blob and hash were swapped with
another row's, or that an index leads to under another key, fails its check. Files of format 0
and 1 keep the plain digest (the reader checks their rows' own keys instead).

Codecs: ``zstd`` (kdbkit; optionally with one trained dictionary per bundle, whose id is
in every frame) and ``bzip2`` (MIOpen, block size 9; read and written for compatibility).

Decoding is bounded: no entry may claim or expand to more than :data:`MAX_BINARY_BYTES`, and
no decoder ever produces more than the row's ``uncompressed_size`` (a zstd frame's own
content size must agree with the row, or the frame is refused before anything is allocated),
so a small blob that claims or expands to gigabytes is a corrupt entry, not an out-of-memory.
"""

from __future__ import annotations

import bz2
import hashlib
import threading
from dataclasses import dataclass
from typing import Callable

import xxhash
import zstandard as zstd

from kdbkit.kdb.errors import CodecError

CODECS = ("zstd", "bzip2")
HASHES = ("xxh3_128", "sha256", "md5")
DEFAULT_HASH = "xxh3_128"

# Level 19 costs seconds per bundle offline and nothing at read time; user-cache writes
# sit on the JIT path, where level 3 keeps the store well under the compile time.
BUNDLE_LEVEL = 19
CACHE_LEVEL = 3
# The largest kernel binary an entry may hold: the biggest code objects and cubins seen are a
# few MB; anything claiming more is damage (or a decompression bomb), refused before decoding.
MAX_BINARY_BYTES = 256 << 20


def digest(data: bytes, algorithm: str = DEFAULT_HASH) -> str:
    """Hex digest of ``data`` with ``xxh3_128``, ``sha256`` or ``md5``."""
    return hasher(algorithm)(data)


# The label that starts every keyed digest's input: a digest made for another purpose over the
# same bytes can never pass as an entry's.
KEY_LABEL = b"kdbkit entry key\x00"


def entry_key_bytes(kernel_name: str, kernel_args: str) -> bytes:
    """The unambiguous encoding of an entry's key that a keyed digest covers before the data
    (length-prefixed, so no two different (name, args) pairs give the same bytes)."""
    name = kernel_name.encode("utf-8", "surrogatepass")
    args = kernel_args.encode("utf-8", "surrogatepass")
    return b"".join((KEY_LABEL, len(name).to_bytes(8, "little"), name, len(args).to_bytes(8, "little"), args))


def keyed_digest(kernel_name: str, kernel_args: str, data: bytes, algorithm: str = DEFAULT_HASH) -> str:
    """Hex digest of an entry's key and then its bytes: ``kernel_hash`` from format version 2 on."""
    return keyed_hasher(algorithm)(kernel_name, kernel_args, data)


def keyed_hasher(algorithm: str = DEFAULT_HASH) -> Callable[[str, str, bytes], str]:
    """The function giving :func:`keyed_digest` with ``algorithm``: one streaming hash, so the
    key costs one update of its own bytes and the data is never copied."""
    if algorithm == "xxh3_128":
        new = xxhash.xxh3_128
    elif algorithm in HASHES:
        def new(prefix: bytes):
            return hashlib.new(algorithm, prefix)
    else:
        raise CodecError(f"unknown hash algorithm {algorithm!r}", f"use one of {', '.join(HASHES)}")

    def keyed(kernel_name: str, kernel_args: str, data: bytes) -> str:
        h = new(entry_key_bytes(kernel_name, kernel_args))
        h.update(data)
        return h.hexdigest()
    return keyed


def hasher(algorithm: str = DEFAULT_HASH) -> Callable[[bytes], str]:
    """The function giving :func:`digest` with ``algorithm``: for ``xxh3_128``, xxhash's own C
    function, which a bundle calls on every read without a Python frame around it."""
    if algorithm == "xxh3_128":
        return xxhash.xxh3_128_hexdigest
    if algorithm not in HASHES:
        raise CodecError(f"unknown hash algorithm {algorithm!r}", f"use one of {', '.join(HASHES)}")
    return lambda data: hashlib.new(algorithm, data).hexdigest()


@dataclass(frozen=True)
class Encoded:
    """A blob as stored: the bytes and the ``uncompressed_size`` column (0 = raw)."""

    blob: bytes
    uncompressed_size: int


@dataclass(frozen=True)
class StoredBlob:
    """An entry's stored columns, encoded away from the process that writes the bundle (an
    offline build's workers compress in parallel): blob, ``uncompressed_size`` and the keyed
    hash, for a zstd bundle with no dictionary and the default hash. It names the key its hash
    was made for, so a writer can refuse to store it under another."""

    kernel_name: str
    kernel_args: str
    blob: bytes
    uncompressed_size: int
    kernel_hash: str


def encode_for_bundle(kernel_name: str, kernel_args: str, data: bytes, level: int = BUNDLE_LEVEL) -> StoredBlob:
    """``data`` as a zstd bundle without dictionary stores it under (``kernel_name``,
    ``kernel_args``) (see :meth:`Bundle.put_stored`)."""
    enc = Codec("zstd", level=level).encode(data)
    return StoredBlob(kernel_name, kernel_args, enc.blob, enc.uncompressed_size,
                      keyed_digest(kernel_name, kernel_args, data))


class Codec:
    """Compresses and decompresses the blobs of one bundle.

    Args:
        name: ``zstd`` or ``bzip2``.
        level: compression level (zstd 1-22; ignored for bzip2, which always uses 9).
        dictionary: raw zstd dictionary bytes shared by every blob of the bundle, or None.
    """

    def __init__(self, name: str = "zstd", level: int = CACHE_LEVEL, dictionary: bytes | None = None):
        if name not in CODECS:
            raise CodecError(f"unknown codec {name!r}", f"use one of {', '.join(CODECS)}")
        if dictionary is not None and name != "zstd":
            raise CodecError("only the zstd codec takes a dictionary", "drop the dictionary or use zstd")
        self.name = name
        self.level = level
        self.dictionary = dictionary
        self._zdict = zstd.ZstdCompressionDict(dictionary) if dictionary else None
        # zstd (de)compressor objects must not be used by two threads at once (a shared one
        # crashed the process under parallel JIT); one per thread, made on first use.
        self._local = threading.local()

    def _zc(self) -> zstd.ZstdCompressor:
        zc = getattr(self._local, "compressor", None)
        if zc is None:
            zc = self._local.compressor = zstd.ZstdCompressor(level=self.level, dict_data=self._zdict,
                                                              write_content_size=True)
        return zc

    def _zd(self) -> zstd.ZstdDecompressor:
        zd = getattr(self._local, "decompressor", None)
        if zd is None:
            zd = self._local.decompressor = zstd.ZstdDecompressor(dict_data=self._zdict)
        return zd

    def warm_up(self) -> None:
        """Make this thread's decompressor now (loading the dictionary, if any).

        Raises:
            CodecError: the dictionary does not load (a damaged bundle).
        """
        if self.name == "zstd":
            try:
                self._zd()
            except zstd.ZstdError as exc:
                raise CodecError(f"the bundle's zstd dictionary does not load: {exc}") from exc

    def compress_raw(self, data: bytes) -> bytes:
        """Compress without the raw fallback (used to measure and train)."""
        if self.name == "zstd":
            return self._zc().compress(data)
        return bz2.compress(data, compresslevel=9)

    def encode(self, data: bytes) -> Encoded:
        """Compress ``data``; keep it raw when compression would not make it smaller."""
        packed = self.compress_raw(data)
        if len(packed) >= len(data):
            return Encoded(bytes(data), 0)
        return Encoded(packed, len(data))

    def decode(self, blob: bytes, uncompressed_size: int) -> bytes:
        """Inverse of :meth:`encode`.

        Raises:
            CodecError: the frame is garbage, claims or expands past ``uncompressed_size``
                or :data:`MAX_BINARY_BYTES`, or decodes to another size.
        """
        size = uncompressed_size
        if size == 0:
            if len(blob) > MAX_BINARY_BYTES:
                raise CodecError(f"raw entry of {len(blob)} bytes is larger than any kernel binary ({MAX_BINARY_BYTES})")
            return bytes(blob)
        if not isinstance(size, int) or size < 0 or size > MAX_BINARY_BYTES:
            raise CodecError(f"uncompressed_size {size!r} is not a size from 1 to {MAX_BINARY_BYTES} bytes")
        if self.name != "zstd":
            return _bzip2_decode(blob, size)
        try:
            # decompress() allocates what the frame header claims, whatever max_output_size
            # says: check the claim first (-1 = not recorded; then max_output_size bounds it).
            claimed = zstd.frame_content_size(blob)
            out = self._zd().decompress(blob, max_output_size=size) if claimed == size or claimed == -1 else None
        except (zstd.ZstdError, OSError, ValueError, EOFError) as exc:
            raise CodecError(f"zstd frame does not decode: {exc}") from exc
        if out is None:
            raise CodecError(f"zstd frame claims {claimed} bytes, row says {size}")
        if len(out) != size:
            raise CodecError(f"decoded {len(out)} bytes, row says {size}")
        return out


def _bzip2_decode(blob: bytes, size: int) -> bytes:
    """A bzip2 entry (MIOpen's files) of ``size`` bytes, checked as :meth:`Codec.decode` checks."""
    decoder = bz2.BZ2Decompressor()
    try:
        out = decoder.decompress(blob, max_length=size + 1)
    except (OSError, ValueError, EOFError) as exc:
        raise CodecError(f"bzip2 frame does not decode: {exc}") from exc
    if len(out) == size and not decoder.eof:
        raise CodecError(f"bzip2 stream does not end at the row's {size} bytes")
    if len(out) != size:
        raise CodecError(f"decoded {len(out)} bytes, row says {size}")
    return out


def train_dictionary(samples: list[bytes], dict_size: int = 32 * 1024, level: int = BUNDLE_LEVEL) -> bytes | None:
    """Train a zstd dictionary over ``samples``; None when there is too little to learn from.

    A dictionary pays off on many similar small blobs (cubins share ELF headers, symbol
    tables and instruction idioms); the caller decides by comparing total sizes.
    """
    if len(samples) < 8 or sum(map(len, samples)) < 4 * dict_size:
        return None
    try:
        # Fixed cover parameters (k, d) instead of zstd's search over them: the search trains
        # many times over for a dictionary barely more effective on cubins.
        return zstd.train_dictionary(dict_size, samples, k=1024, d=8, level=level).as_bytes()
    except zstd.ZstdError:
        return None  # zstd refuses some sample sets (too uniform, too small): no dictionary
