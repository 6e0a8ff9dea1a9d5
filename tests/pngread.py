"""A PNG read with the standard library only (zlib): its size from IHDR and its pixels, unfiltered, for checking
that a screenshot shows something (more than one colour) without comparing pixels. 8-bit RGB and RGBA,
non-interlaced: what Chromium writes."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

SIGNATURE = b"\x89PNG\r\n\x1a\n"


class Png:
    def __init__(self, width: int, height: int, channels: int, rows: list[bytes]) -> None:
        self.width, self.height, self.channels, self.rows = width, height, channels, rows

    def colours(self, step: int = 1) -> set[bytes]:
        """The distinct pixel values of every ``step``-th row."""
        n = self.channels
        return {row[i : i + n] for row in self.rows[::step] for i in range(0, len(row), n)}

    def share_of(self, colour: bytes, step: int = 4) -> float:
        """The share of the pixels (of every ``step``-th row) that are ``colour``."""
        n = self.channels
        pixels = [row[i : i + n] for row in self.rows[::step] for i in range(0, len(row), n)]
        return sum(p == colour for p in pixels) / max(len(pixels), 1)


def read(path: Path) -> Png:
    data = path.read_bytes()
    if not data.startswith(SIGNATURE):
        raise ValueError(f"{path} is not a PNG")
    at, chunks, idat = len(SIGNATURE), {}, bytearray()
    while at < len(data):
        (length,) = struct.unpack(">I", data[at : at + 4])
        kind, body = data[at + 4 : at + 8], data[at + 8 : at + 8 + length]
        (crc,) = struct.unpack(">I", data[at + 8 + length : at + 12 + length])
        if zlib.crc32(kind + body) != crc:
            raise ValueError(f"{path}: chunk {kind!r} fails its CRC")
        if kind == b"IDAT":
            idat += body
        chunks.setdefault(kind, body)
        at += 12 + length
    width, height, depth, colour_type, _, _, interlace = struct.unpack(">IIBBBBB", chunks[b"IHDR"])
    if depth != 8 or colour_type not in (2, 6) or interlace:
        raise ValueError(
            f"{path}: depth {depth}, colour type {colour_type}, interlace {interlace} not read here"
        )
    channels = 3 if colour_type == 2 else 4
    return Png(
        width, height, channels, _unfilter(zlib.decompress(bytes(idat)), width * channels, height, channels)
    )


def _unfilter(raw: bytes, stride: int, height: int, bpp: int) -> list[bytes]:
    rows, prior = [], bytes(stride)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        if kind == 1:
            for i in range(bpp, stride):
                line[i] = (line[i] + line[i - bpp]) & 0xFF
        elif kind == 2:
            line = bytearray((a + b) & 0xFF for a, b in zip(line, prior))
        elif kind == 3:
            for i in range(stride):
                left = line[i - bpp] if i >= bpp else 0
                line[i] = (line[i] + ((left + prior[i]) >> 1)) & 0xFF
        elif kind == 4:
            for i in range(stride):
                a = line[i - bpp] if i >= bpp else 0
                b, c = prior[i], prior[i - bpp] if i >= bpp else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        elif kind != 0:
            raise ValueError(f"unknown PNG filter {kind}")
        rows.append(bytes(line))
        prior = rows[-1]
    return rows
