#!/usr/bin/env python3
"""Writes the hand-made HDF5 bad inputs of tests/data/bad/kv_h5/ whose forged length sits past
the superblock (each next to the 2.6 TiB continuation block that fuzz_kv_h5 found):

    python3 tests/fuzz/make_bad_kv_h5.py [build/dev/app/cli/kvscope-cli]

Each file is a valid KV file with one length field changed; the .error files hold the line
kv_h5_bounds.cpp must give. Version 0 files come from `kvscope-cli synth` (old-style groups,
version 1 object headers); the version 2 ones from h5py with libver='latest' (new-style dense
groups in fractal heaps and v2 B-trees, whose headers carry a Jenkins lookup3 checksum, which is
recomputed after the change so libhdf5 would take the forged field at its word). The valid
version 2 file is also written as the fuzz_kv_h5 seed tests/fuzz/corpus/fuzz_kv_h5/v2-dense.h5.
Synthetic values are not byte-stable between runs; the fields and the error lines are.
"""
import os
import re
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, 'tests', 'data', 'bad', 'kv_h5')


def rot(x, k):
    return ((x << k) | (x >> (32 - k))) & 0xffffffff


def lookup3(data, initval=0):
    """Bob Jenkins' hashlittle, the checksum of HDF5's version 2 metadata."""
    M = 0xffffffff
    n = len(data)
    a = b = c = (0xdeadbeef + n + initval) & M
    i = 0
    word = lambda j: int.from_bytes(data[j:j + 4], 'little')
    while n > 12:
        a = (a + word(i)) & M
        b = (b + word(i + 4)) & M
        c = (c + word(i + 8)) & M
        a = (a - c) & M; a ^= rot(c, 4); c = (c + b) & M
        b = (b - a) & M; b ^= rot(a, 6); a = (a + c) & M
        c = (c - b) & M; c ^= rot(b, 8); b = (b + a) & M
        a = (a - c) & M; a ^= rot(c, 16); c = (c + b) & M
        b = (b - a) & M; b ^= rot(a, 19); a = (a + c) & M
        c = (c - b) & M; c ^= rot(b, 4); b = (b + a) & M
        n -= 12
        i += 12
    if n == 0:
        return c
    tail = bytes(data[i:i + n]) + bytes(12 - n)
    if n > 8:
        c = (c + int.from_bytes(tail[8:12], 'little')) & M
    if n > 4:
        b = (b + int.from_bytes(tail[4:8], 'little')) & M
    a = (a + int.from_bytes(tail[0:4], 'little')) & M
    c ^= b; c = (c - rot(b, 14)) & M
    a ^= c; a = (a - rot(c, 11)) & M
    b ^= a; b = (b - rot(a, 25)) & M
    c ^= b; c = (c - rot(b, 16)) & M
    a ^= c; a = (a - rot(c, 4)) & M
    b ^= a; b = (b - rot(a, 14)) & M
    c ^= b; c = (c - rot(b, 24)) & M
    return c


def write(name, data, error):
    with open(os.path.join(OUT, name), 'wb') as f:
        f.write(data)
    with open(os.path.join(OUT, name + '.error'), 'w') as f:
        f.write('{path}: ' + error + '\n')
    print(name, len(data), 'bytes')


def patched(src, edits, checksum=None):
    d = bytearray(src)
    for at, fmt, v in edits:
        struct.pack_into(fmt, d, at, v)
    if checksum:
        start, n = checksum
        struct.pack_into('<I', d, start + n, lookup3(bytes(d[start:start + n])))
    return bytes(d)


def version0(cli, tmp):
    path = os.path.join(tmp, 'v0.h5')
    subprocess.run([cli, 'synth', '--out', path, '--layers', '1', '--kv-heads', '1',
                    '--head-dim', '4', '--tokens', '300'], check=True, stdout=subprocess.DEVNULL)
    src = open(path, 'rb').read()
    eof = struct.unpack_from('<Q', src, 0x28)[0]
    heaps = [m.start() for m in re.finditer(b'HEAP', src)]
    root_heap = heaps[0]
    data = struct.unpack_from('<Q', src, root_heap + 24)[0]
    write('heap-data-size.h5', patched(src, [(root_heap + 8, '<Q', 0x28800000000)]),
          'object header 0x60 (/): local heap 0x%x: data segment at 0x%x (0x28800000000 bytes) '
          'runs past the end of file (0x%x)' % (root_heap, data, eof))
    # the datatype of the scalar int64 attribute num_tokens: 4 GiB elements (bare libhdf5 1.10.8
    # crashes on it in H5A__attr_release_table)
    at = src.index(b'num_tokens\0') + 16
    write('attribute-type-size.h5', patched(src, [(at + 4, '<I', 0xfffffff0)]),
          'object header 0x60 (/): attribute num_tokens declares 4294967280 bytes of data, '
          'its message holds 8')
    # the first chunk B-tree (of /layers/00/key): the stored size of its first chunk
    tree = next(m.start() for m in re.finditer(b'TREE', src) if src[m.start() + 4] == 1)
    chunk = struct.unpack_from('<Q', src, tree + 24 + 8 + 8 * 4)[0]
    layout = re.search(rb'\x08\x00..\x00\x00\x00\x00\x03\x02\x04', src, re.S).start() + 8
    key_oh = find_object(src, layout)
    write('chunk-stored-size.h5', patched(src, [(tree + 24, '<I', 0xf0000000)]),
          'object header 0x%x (/layers/00/key): B-tree node 0x%x: chunk at 0x%x (0xf0000000 bytes) '
          'runs past the end of file (0x%x)' % (key_oh, tree, chunk, eof))
    # the layout of /layers/00/key: chunk dims (1, 2^30, 4) x 2 bytes
    size = len(src)
    write('chunk-dims.h5', patched(src, [(layout + 11 + 4, '<I', 0x40000000)]),
          'object header 0x%x (/layers/00/key): data layout: a chunk of 8589934592 bytes is more '
          'than a plain chunk of this %d-byte file can hold (%d)' % (key_oh, size, size + (1 << 20)))


def find_object(src, at):
    """The version 1 object header whose chunk 0 holds byte `at` (a synth file has no
    continuation blocks in its datasets)."""
    for p in range(0, at, 8):
        version, _, nmesgs, refs, size = struct.unpack_from('<BBHII', src, p)
        if version == 1 and 1 <= nmesgs <= 64 and refs == 1 and p + 16 <= at < p + 16 + size:
            return p
    return None


def kv_attributes(a, num_layers):
    """The root attributes of a kvscope KV file of num_layers layers, 1 head of 2 dims, 2 tokens."""
    import numpy as np
    a['format'] = 'kvscope-kv'
    a['version'] = np.int64(1)
    for k, v in (('num_layers', num_layers), ('num_kv_heads', 1), ('head_dim', 2), ('num_tokens', 2)):
        a[k] = np.int64(v)
    a['dtype'] = 'float16'


def version2(tmp):
    import h5py
    import numpy as np
    path = os.path.join(tmp, 'v2.h5')
    with h5py.File(path, 'w', libver='latest') as f:
        a = f.attrs
        kv_attributes(a, 9)
        for i in range(3):
            a['extra%d' % i] = np.int64(i)  # 10 attributes: dense storage (more than 8)
        f['tokens'] = np.arange(2, dtype=np.int32)
        g = f.create_group('layers')
        for l in range(9):  # 9 links: a dense group
            gg = g.create_group('%02d' % l)
            for k in ('key', 'value'):
                gg[k] = np.zeros((1, 2, 2), np.float16)
    with h5py.File(path, 'r') as f:
        key = h5py.h5o.get_info(f['layers/08/key'].id).addr
    src = open(path, 'rb').read()
    # the valid file itself seeds fuzz_kv_h5 with version 2 structures
    seed = os.path.join(ROOT, 'tests', 'fuzz', 'corpus', 'fuzz_kv_h5', 'v2-dense.h5')
    with open(seed, 'wb') as f:
        f.write(src)
    print(os.path.relpath(seed, ROOT), len(src), 'bytes')
    # /layers/08/key, reached only through the dense /layers group (fractal heap + v2 B-tree):
    # the size of its contiguous data, in its version 2 object header (checksum recomputed)
    flags = src[key + 5]
    pos = key + 6 + (16 if flags & 0x20 else 0) + (4 if flags & 0x10 else 0)
    width = 1 << (flags & 3)
    chunk0 = int.from_bytes(src[pos:pos + width], 'little')
    msgs = pos + width
    end = msgs + chunk0
    p = msgs
    while p + 4 <= end:
        mtype, msize = src[p], struct.unpack_from('<H', src, p + 1)[0]
        p += 4 + (2 if flags & 0x04 else 0)
        if mtype == 8 and src[p + 1] == 1:  # layout, contiguous
            data_at = struct.unpack_from('<Q', src, p + 2)[0]
            write('v2-dense-contiguous-size.h5',
                  patched(src, [(p + 10, '<Q', 0x28800000000)], (key, end - key)),
                  'object header 0x%x (/layers/08/key): contiguous data at 0x%x (0x28800000000 '
                  'bytes) runs past the end of file (0x%x)' % (key, data_at, len(src)))
            break
        p += msize
    else:
        raise SystemExit('no contiguous layout in /layers/08/key')
    heap = src.index(b'FRHP')
    bt = src.index(b'BTHD')
    write('v2-heap-block-size.h5',
          patched(src, [(heap + 112, '<Q', 1 << 41), (heap + 120, '<Q', 1 << 41)], (heap, 142)),
          'object header 0x30 (/): fractal heap 0x%x: direct block size 0x20000000000 is larger '
          'than the file can hold' % heap)
    write('v2-btree-node-size.h5', patched(src, [(bt + 6, '<I', 0xfffffff0)], (bt, 34)),
          'object header 0x30 (/): B-tree 0x%x: node size 0xfffffff0 is larger than the file' % bt)


def version2_huge(tmp):
    import h5py
    import numpy as np
    path = os.path.join(tmp, 'v2h.h5')
    with h5py.File(path, 'w', libver='latest') as f:
        a = f.attrs
        kv_attributes(a, 1)
        # 66,400 bytes: above the heap's 64 KiB managed limit, so a huge object of the dense
        # attribute storage, listed in the heap's huge-object v2 B-tree (type 1)
        a['big'] = np.arange(8300, dtype=np.int64)
        f['tokens'] = np.arange(2, dtype=np.int32)
        g = f.create_group('layers').create_group('00')
        for k in ('key', 'value'):
            g[k] = np.zeros((1, 2, 2), np.float16)
    src = open(path, 'rb').read()
    heap = src.index(b'FRHP')
    bt = next(m.start() for m in re.finditer(b'BTHD', src) if src[m.start() + 5] == 1)
    root = struct.unpack_from('<Q', src, bt + 16)[0]
    nrec = struct.unpack_from('<H', src, bt + 24)[0]
    at = struct.unpack_from('<Q', src, root + 6)[0]
    write('v2-huge-attribute-size.h5',
          patched(src, [(root + 6 + 8, '<Q', 0x28800000000)], (root, 6 + 24 * nrec)),
          'object header 0x30 (/): fractal heap 0x%x: huge object: huge object at 0x%x '
          '(0x28800000000 bytes) runs past the end of file (0x%x)' % (heap, at, len(src)))


def main():
    cli = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, 'build/dev/app/cli/kvscope-cli')
    with tempfile.TemporaryDirectory() as tmp:
        version0(cli, tmp)
        version2(tmp)
        version2_huge(tmp)


if __name__ == '__main__':
    main()
