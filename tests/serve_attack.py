#!/usr/bin/env python3
"""Legitimate clients of `kvscope-cli serve` while slowloris peers and a connect flood run (issue 32).

usage: serve_attack.py KVSCOPE_CLI [--clients 16] [--slowloris 200] [--flood 400] [--flood-every 2]
                       [--seconds 20] [--bandwidth 320Mbit] [--deadline 2.0] [--tokens 128]

Makes a synthetic KV (`synth`), encodes it with fp16 chunks of 16 tokens (`encode --codec fp16`),
starts `serve --store` on it with default options and the given link, and fetches every chunk once
calmly (the reference bytes). Then, for --seconds: --slowloris peers each send 3 bytes of a frame
header and wait (reconnecting when dropped), a flood thread keeps --flood plain connections open
(a new one every --flood-every ms, closing its oldest), and --clients clients each fetch the whole context over
and over, every run on a new connection with every chunk request pipelined. A run hits when every
chunk arrives byte-exact within --deadline seconds of its start. Prints one JSON object: the hit
rate, run times, the attackers' counts and the server's own (`serve --json`).
Python 3 standard library only.
"""
import argparse
import hashlib
import json
import os
import re
import select
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

MAGIC = b'KVS1'
CHUNK_REQUEST, CHUNK_REPLY, ERROR = 2, 0x82, 0xFF
# core/codec/chunk_codec.h CodecId; serve lists its store as context:codec.
CODEC_IDS = {'cachegen': 0, 'fp16': 1, 'int8': 2, 'kivi2': 3, 'kivi4': 4, 'zstd': 5, 'transform': 6}


def request(codec, context, chunk, level):
    payload = struct.pack('<BIIH', codec, chunk, level, len(context)) + context.encode()
    return MAGIC + bytes([CHUNK_REQUEST, 0, 0, 0]) + struct.pack('<I', len(payload)) + payload


def recv_exact(sock, n, deadline):
    buf = bytearray()
    while len(buf) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError('deadline')
        sock.settimeout(left)
        part = sock.recv(n - len(buf))
        if not part:
            raise ConnectionError('closed by the server')
        buf += part
    return bytes(buf)


def read_reply(sock, deadline):
    h = recv_exact(sock, 12, deadline)
    if h[:4] != MAGIC:
        raise ConnectionError('bad magic')
    (length,) = struct.unpack('<I', h[8:12])
    return h[4], recv_exact(sock, length, deadline)


def fetch_all(port, codec, context, chunks, deadline_s):
    """One run: a new connection, every chunk requested at once, replies read in order."""
    t0 = time.monotonic()
    deadline = t0 + deadline_s
    with socket.create_connection(('127.0.0.1', port), timeout=deadline_s) as s:
        s.sendall(b''.join(request(codec, context, c, 1) for c in range(chunks)))
        digests = []
        for c in range(chunks):
            kind, payload = read_reply(s, deadline)
            if kind != CHUNK_REPLY:
                raise ConnectionError('chunk %d: %s' % (c, payload[:200].decode(errors='replace')))
            digests.append(hashlib.sha256(payload).hexdigest())
    return time.monotonic() - t0, digests


def count_chunks(port, codec, context):
    with socket.create_connection(('127.0.0.1', port), timeout=5) as s:
        for c in range(100000):
            s.sendall(request(codec, context, c, 1))
            kind, _ = read_reply(s, time.monotonic() + 10)
            if kind != CHUNK_REPLY:
                return c
    raise RuntimeError('no end of chunks')


def slowloris(port, n, stop, counts):
    peers = [None] * n
    while not stop.is_set():
        for i in range(n):
            if stop.is_set():
                break
            s = peers[i]
            try:
                if s is None:
                    s = socket.create_connection(('127.0.0.1', port), timeout=0.5)
                    s.sendall(MAGIC[:3])
                    s.setblocking(False)
                    peers[i] = s
                    counts['slowloris_connects'] += 1
                elif select.select([s], [], [], 0)[0]:
                    data = s.recv(4096)
                    if data[:4] == MAGIC:
                        counts['slowloris_told'] += 1
                    s.close()
                    peers[i] = None
            except OSError:
                if s is not None:
                    s.close()
                peers[i] = None
        time.sleep(0.02)
    for s in peers:
        if s is not None:
            s.close()


def flood(port, n, every_s, stop, counts):
    held = []
    while not stop.is_set():
        try:
            held.append(socket.create_connection(('127.0.0.1', port), timeout=0.5))
            counts['flood_connects'] += 1
            if len(held) > n:
                held.pop(0).close()
        except OSError:
            counts['flood_failed'] += 1
        time.sleep(every_s)
    for s in held:
        s.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('cli')
    ap.add_argument('--clients', type=int, default=16)
    ap.add_argument('--slowloris', type=int, default=200)
    ap.add_argument('--flood', type=int, default=400)
    ap.add_argument('--flood-every', type=float, default=2, help='ms between flood connects')
    ap.add_argument('--seconds', type=float, default=20)
    ap.add_argument('--bandwidth', default='320Mbit')
    ap.add_argument('--deadline', type=float, default=2.0)
    ap.add_argument('--tokens', type=int, default=128)
    a = ap.parse_args()
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 8192)), hard))

    with tempfile.TemporaryDirectory() as tmp:
        kv, kvc = os.path.join(tmp, 'kv.h5'), os.path.join(tmp, 'kv.kvc')
        subprocess.run([a.cli, 'synth', '--out', kv, '--tokens', str(a.tokens)], check=True, capture_output=True)
        subprocess.run([a.cli, 'encode', kv, '--out', kvc, '--codec', 'fp16', '--chunk-tokens', '16'], check=True,
                       capture_output=True)
        server = subprocess.Popen([a.cli, 'serve', '--store', kvc, '--bandwidth', a.bandwidth, '--port', '0',
                                   '--json'], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        port = context = codec = None
        for line in server.stderr:
            m = re.match(r'serve: listening on [\d.]+:(\d+)', line)
            if m:
                port = int(m.group(1))
            m = re.match(r'serve:\s+([0-9a-f]{16}):(\w+)', line)
            if m:
                context, codec = m.group(1), CODEC_IDS[m.group(2)]
                break
        threading.Thread(target=lambda: server.stderr.read(), daemon=True).start()
        if port is None or context is None:
            sys.exit('error: serve did not report its port and context')
        chunks = count_chunks(port, codec, context)
        calm_s, reference = fetch_all(port, codec, context, chunks, 30)

        stop = threading.Event()
        counts = dict(slowloris_connects=0, slowloris_told=0, flood_connects=0, flood_failed=0)
        attackers = [threading.Thread(target=slowloris, args=(port, a.slowloris, stop, counts)),
                     threading.Thread(target=flood, args=(port, a.flood, a.flood_every / 1000, stop, counts))]
        for t in attackers:
            t.start()
        time.sleep(1.0)  # the table fills before the clients come

        lock = threading.Lock()
        runs, failures = [], []
        until = time.monotonic() + a.seconds

        def client(c):
            while time.monotonic() < until:
                try:
                    took, digests = fetch_all(port, codec, context, chunks, a.deadline)
                    ok = digests == reference
                    with lock:
                        runs.append((c, took, ok))
                        if not ok:
                            failures.append('client %d: bytes differ' % c)
                except Exception as e:  # a refused or reset connection, a missed deadline
                    with lock:
                        runs.append((c, None, False))
                        failures.append('client %d: %s' % (c, e))
                    time.sleep(0.05)

        clients = [threading.Thread(target=client, args=(c,)) for c in range(a.clients)]
        for t in clients:
            t.start()
        for t in clients:
            t.join()
        stop.set()
        for t in attackers:
            t.join()
        server.terminate()
        out, _ = server.communicate(timeout=30)
        try:
            stats = json.loads(out)
        except ValueError:
            stats = None

    hits = sum(1 for _, took, ok in runs if ok and took is not None and took <= a.deadline)
    times = sorted(took for _, took, ok in runs if took is not None)
    per_client = [sum(1 for c2, took, ok in runs if c2 == c and ok) / max(1, sum(1 for c2, _, _ in runs if c2 == c))
                  for c in range(a.clients)]
    print(json.dumps({
        'clients': a.clients, 'slowloris': a.slowloris, 'flood': a.flood, 'flood_every_ms': a.flood_every,
        'seconds': a.seconds,
        'bandwidth': a.bandwidth, 'deadline_s': a.deadline, 'chunks': chunks, 'calm_run_s': round(calm_s, 4),
        'runs': len(runs), 'hits': hits, 'hit_rate': round(hits / max(1, len(runs)), 4),
        'worst_client_hit_rate': round(min(per_client), 4),
        'run_s_median': round(times[len(times) // 2], 4) if times else None,
        'run_s_max': round(times[-1], 4) if times else None,
        'attackers': counts, 'server': stats, 'first_failures': failures[:5]}, indent=1))


if __name__ == '__main__':
    main()
