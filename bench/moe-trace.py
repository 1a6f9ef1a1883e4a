#!/usr/bin/env python3
"""moe-trace.py - reads the block timeline of the MoE TMA kernel (path 5) and says where its
time goes: when the tiles were issued and landed, how long the arithmetic after a landing
took, and how many bytes landed in each microsecond after the router released the kernel.

The timeline comes from a diagnostic build (never a normal one):

    cmake -S . -B build-trace -DGPTOSS_CUDA=ON -DGPTOSS_STATIC_DEPS=ON \\
          -DCMAKE_CUDA_FLAGS=-DGPTOSS_MOE_TRACE && cmake --build build-trace --target gptoss
    GPTOSS_MOE_TRACE_FILE=/tmp/t.bin build-trace/gptoss bench --random-weights 120b -p 16 -n 32 -r 1
    bench/moe-trace.py /tmp/t.bin

Usage: moe-trace.py FILE [--tile-bytes N] [--bandwidth GBPS] [--back K]
  --tile-bytes  bytes of one tile (codes + scales; 24480 for the gpt-oss widths, 2880)
  --bandwidth   the copy bandwidth the floor is taken at (default 2980 GB/s, an H100)
  --back        which gate_up launch to show, counted from the last complete one (default 20)
Times are in ns. Stdlib only.
"""
import struct
import sys

RING = 1 << 18


def load(path):
    with open(path, 'rb') as f:
        total = struct.unpack('<Q', f.read(8))[0]
        raw = f.read()
    recs = []
    for i in range(min(RING, len(raw) // 48)):
        m, start, wait, issue, land, end = struct.unpack_from('<6Q', raw, 48 * i)
        if start == 0:
            continue
        recs.append(dict(seq=m >> 32, gate_up=m & 1, pair=(m >> 1) & 0x7f, tile=(m >> 8) & 0xffff,
                         sm=(m >> 24) & 0xff, start=start, wait=wait, issue=issue, land=land, end=end))
    recs.sort(key=lambda r: r['seq'])
    return total, recs


def launches(recs):
    """Consecutive records of one kind (gate_up, down) form one launch."""
    out, cur = [], []
    for r in recs:
        if cur and r['gate_up'] != cur[-1]['gate_up']:
            out.append(cur)
            cur = []
        cur.append(r)
    if cur:
        out.append(cur)
    return out[1:-1]  # the first and last may be cut by the ring or the process's end


def pct(values, p):
    v = sorted(values)
    return v[min(len(v) - 1, int(p * len(v)))]


def spread(values):
    return 'p10 %d  p50 %d  p90 %d  max %d' % (pct(values, .1), pct(values, .5), pct(values, .9), max(values))


def show(blocks, name, tile_bytes, gbps):
    release = min(r['wait'] for r in blocks)  # the first block past the PDL wait
    last_end = max(r['end'] for r in blocks)
    sms = len(set(r['sm'] for r in blocks))
    floor = len(blocks) * tile_bytes / gbps
    print('%s: %d blocks on %d SMs; release -> last end %d ns, floor %.0f ns (x%.2f)' %
          (name, len(blocks), sms, last_end - release, floor, (last_end - release) / floor))
    print('  issued  (from release): ' + spread([r['issue'] - release for r in blocks]))
    print('  landed  (from release): ' + spread([r['land'] - release for r in blocks]))
    print('  copy    (land - issue): ' + spread([r['land'] - r['issue'] for r in blocks]))
    print('  compute (end - land)  : ' + spread([r['end'] - r['land'] for r in blocks]))
    lo = min(min(r['land'] for r in blocks), release)
    buckets = [0] * ((max(r['land'] for r in blocks) - lo) // 1000 + 1)
    for r in blocks:
        buckets[(r['land'] - lo) // 1000] += 1
    print('  GB/s landing in each us from %+d ns: %s' %
          (lo - release, ' '.join(str(int(c * tile_bytes / 1000)) for c in buckets)))


def main(argv):
    if len(argv) < 2 or argv[1] in ('-h', '--help'):
        print(__doc__)
        return 0 if len(argv) >= 2 else 2
    opts = {'--tile-bytes': 24480.0, '--bandwidth': 2980.0, '--back': 20}
    args = argv[2:]
    while args:
        if args[0] not in opts or len(args) < 2:
            print('moe-trace.py: unknown option or missing value: %s' % args[0], file=sys.stderr)
            return 2
        opts[args[0]] = type(opts[args[0]])(args[1])
        args = args[2:]
    try:
        total, recs = load(argv[1])
    except (OSError, struct.error) as e:
        print('moe-trace.py: cannot read %s: %s' % (argv[1], e), file=sys.stderr)
        return 1
    runs = launches(recs)
    gate_ups = [i for i, run in enumerate(runs) if run[0]['gate_up'] and i + 1 < len(runs)]
    if not gate_ups:
        print('moe-trace.py: no complete gate_up + down launch in %s (%d records)' % (argv[1], len(recs)),
              file=sys.stderr)
        return 1
    print('%d blocks traced, the last %d kept; %d launches complete' % (total, len(recs), len(runs)))
    i = gate_ups[max(0, len(gate_ups) - opts['--back'])]
    show(runs[i], 'gate_up', opts['--tile-bytes'], opts['--bandwidth'])
    show(runs[i + 1], 'down', opts['--tile-bytes'], opts['--bandwidth'])
    release = min(r['wait'] for r in runs[i])
    print('gate_up release -> down last end: %d ns' % (max(r['end'] for r in runs[i + 1]) - release))
    spans = sorted(max(r['end'] for r in runs[j + 1]) - min(r['wait'] for r in runs[j]) for j in gate_ups)
    print('over %d layers: gate_up release -> down last end, median %d ns' % (len(spans), spans[len(spans) // 2]))
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
