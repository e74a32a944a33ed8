"""What an attached file is, by its first bytes: an image or audio clip libmtmd decodes itself, a
media format it does not, or neither (text, or another binary file).

libmtmd tries stb_image on anything that is not WAV, MP3 or FLAC, and, in builds with video,
ffmpeg after that: only files recognised here reach it.
"""

from __future__ import annotations

from dataclasses import dataclass

WORKS = "PNG, JPEG, BMP or GIF images, or WAV, MP3 or FLAC audio"


@dataclass(frozen=True)
class MediaKind:
    kind: str  # image | audio
    format: str  # PNG, JPEG, ...


def sniff(data: bytes) -> MediaKind | None:
    """The media a file's bytes hold, where libmtmd can decode them; None otherwise."""
    head = data[:16]
    if head.startswith(b"\x89PNG\r\n\x1a\n") and data[12:16] == b"IHDR":
        return MediaKind("image", "PNG")
    if head.startswith(b"\xff\xd8\xff") and len(data) >= 4:
        return MediaKind("image", "JPEG")
    if head[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 13:
        return MediaKind("image", "GIF")
    # "BM", then the DIB header's size at offset 14: one of the sizes BMP versions have.
    if (
        head.startswith(b"BM")
        and len(data) >= 18
        and int.from_bytes(data[14:18], "little") in (12, 40, 52, 56, 64, 108, 124)
    ):
        return MediaKind("image", "BMP")
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
        return MediaKind("audio", "WAV")
    if head.startswith(b"fLaC"):
        return MediaKind("audio", "FLAC")
    if head.startswith(b"ID3") or (
        len(head) >= 2 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0 and (head[1] >> 1) & 3 == 1
    ):
        return MediaKind("audio", "MP3")  # an ID3 tag, or an MPEG layer III frame header
    return None


def unsupported(data: bytes) -> str | None:
    """The name of a media format libmtmd does not decode, where the bytes are one."""
    head = data[:16]
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "a WebP image"
    if head[:4] in (b"II*\x00", b"MM\x00*"):
        return "a TIFF image"
    if head[4:8] == b"ftyp":
        brand = head[8:12]
        if brand in (b"heic", b"heix", b"mif1", b"msf1"):
            return "a HEIC image"
        if brand in (b"avif", b"avis"):
            return "an AVIF image"
        return "an MP4/M4A file"
    if head.startswith(b"OggS"):
        return "an Ogg file"
    if head.startswith(b"\x00\x00\x01\x00"):
        return "an ICO image"
    if head.startswith(b"%PDF"):
        return "a PDF document"
    return None
