# Per-call durations of ptrain's batch-norm kernels in one profiled step, in launch order, with their grids.
import json, lzma, sys, re
path = sys.argv[1]
opener = lzma.open if path.endswith('.xz') else open
events = json.load(opener(path, 'rt'))
events = events.get('traceEvents', events)
k = [e for e in events if e.get('cat') == 'kernel']
k.sort(key=lambda e: e['ts'])
t0 = k[0]['ts']
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 1
n = len(k) // steps
for e in k[:n]:
    name = e['name']
    m = re.search(r'cuda::\(anonymous namespace\)::(\w+)<', name)
    short = m.group(1) if m else name[:60]
    a = e.get('args', {})
    print(f"{e['ts']-t0:10.1f} {e['dur']:8.1f} {short:40s} grid={a.get('grid')} block={a.get('block')}")
