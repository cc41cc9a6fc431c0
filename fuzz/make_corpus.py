#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpora, from the repository, into OUT/<target>/.

    python3 fuzz/make_corpus.py OUT

spec            examples/*.json and every spec in a lit test (`#--- name.json` sections of tests/lit)
dynamic_layout  the CSR tables in the lit tests
tuning_db       the shipped databases (autotune_db/, cut to a few entries) and the lit tests' ones
kernel_cache    the golden entry the unit tests pin the format with, and a few written here alike
npy             small arrays of every supported dtype, in format versions 1.0, 2.0 and 3.0

Seeds are named by their SHA-1, as libFuzzer names what it finds; rerunning rewrites the same files.
Standard library only: a fresh machine runs it before anything else is installed.
"""
import glob
import hashlib
import json
import os
import re
import struct
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def lit_sections():
    """(name, text) of every `#--- name` section of the lit tests (split-file's format)."""
    for path in sorted(glob.glob(os.path.join(ROOT, "tests", "lit", "**", "*.test"), recursive=True)):
        with open(path, encoding="utf-8") as f:
            parts = re.split(r"^#--- (\S+)\n", f.read(), flags=re.M)
        for name, text in zip(parts[1::2], parts[2::2]):
            yield name, text


def npy_seeds():
    def npy(descr, shape, data, major=1, fortran=False, extra="", shape_text=None):
        if shape_text is None:
            shape_text = "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"
        header = "{'descr': '%s', 'fortran_order': %s, 'shape': %s, %s}" % (descr, fortran, shape_text, extra)
        len_bytes = 2 if major == 1 else 4
        header += " " * ((64 - (6 + 2 + len_bytes + len(header) + 1) % 64) % 64) + "\n"
        length = struct.pack("<H" if major == 1 else "<I", len(header))
        return b"\x93NUMPY" + bytes([major, 0]) + length + header.encode("latin-1") + data

    seeds = []
    for descr, fmt in (("<f2", "<e"), ("<f4", "<f"), ("<f8", "<d"), ("|u1", "<B")):
        values = [1, 2, 3, 4, 5, 6]
        seeds.append(npy(descr, (2, 3), struct.pack("<6" + fmt[1], *values)))
        seeds.append(npy(descr, (), struct.pack(fmt, 7)))
        seeds.append(npy(descr, (0, 4), b""))
    seeds.append(npy("<f4", (3,), struct.pack("<3f", 0.5, -1.0, float("inf")), major=2))
    seeds.append(npy("<f4", (1, 1, 2), struct.pack("<2f", 1.0, 2.0), major=3))
    seeds.append(npy("<f4", (2,), struct.pack("<2f", 1.0, 2.0), fortran=True))
    seeds.append(npy(">f4", (1,), struct.pack(">f", 1.0)))
    seeds.append(npy("<f8", None, struct.pack("<2d", 1.0, 2.0), shape_text="(2L, 1L)"))  # Python 2's np.save
    return seeds


def cache_entry(key_hex, payload, kernel_name, arch):
    """The bytes compiler/cache/kernel_cache.cpp's encode_cache_entry writes (layout documented there)."""
    name, arch = kernel_name.encode(), arch.encode()
    header = b"ATNJKC01" + struct.pack("<II", 1, 160 + len(name) + len(arch)) + key_hex.encode()
    header += struct.pack("<II", len(name), len(arch)) + name + arch + struct.pack("<Q", len(payload))
    header += hashlib.sha256(payload).digest()
    return header + hashlib.sha256(header).digest() + payload


def kernel_cache_seeds():
    seeds = []
    for path in sorted(glob.glob(os.path.join(ROOT, "tests", "unit", "golden", "*.ajk"))):
        with open(path, "rb") as f:
            seeds.append(f.read())
    key = hashlib.sha256(b"format=1\n").hexdigest()
    seeds.append(cache_entry(key, b"", "", ""))
    seeds.append(cache_entry(key, b"\x7fELF" + bytes(60), "attnjit_fwd_sm80", "sm_80"))
    return seeds


def tuning_db_seeds(lit):
    seeds = []
    for path in sorted(glob.glob(os.path.join(ROOT, "autotune_db", "*.json"))):
        with open(path, encoding="utf-8") as f:
            db = json.load(f)
        entries = db.get("entries", [])
        for picked in (entries[:1], [e for e in entries if e.get("key", {}).get("pass") == "backward"][:1]):
            seeds.append(json.dumps(dict(db, entries=picked), indent=1).encode())
    seeds += [text.encode() for name, text in lit if "attnjit_tuning_db" in text]
    return seeds


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    lit = list(lit_sections())
    corpora = {
        "spec": [open(p, "rb").read() for p in sorted(glob.glob(os.path.join(ROOT, "examples", "*.json")))
                 if "manifest" not in os.path.basename(p)]
                + [text.encode() for name, text in lit if name.endswith(".json") and '"attnjit"' in text],
        "dynamic_layout": [text.encode() for name, text in lit if "row_offsets" in text],
        "tuning_db": tuning_db_seeds(lit),
        "kernel_cache": kernel_cache_seeds(),
        "npy": npy_seeds(),
    }
    for target, seeds in corpora.items():
        folder = os.path.join(out, target)
        os.makedirs(folder, exist_ok=True)
        for seed in seeds:
            with open(os.path.join(folder, hashlib.sha1(seed).hexdigest()), "wb") as f:
                f.write(seed)
        print("%s: %d seeds" % (target, len(set(seeds))))


if __name__ == "__main__":
    main()
