#!/usr/bin/env python3
"""Where the time of a traced run went: reads a Chrome trace that `ptrain train --profile-out` wrote (Kineto's
format on CUDA builds, the legacy profiler's event list on CPU builds) and prints, per traced step, the span,
the time the GPU was busy (the union of its kernels' intervals) and idle between them, and the kernels or
operators that took the most time, grouped into families (convolution, matrix multiply, normalisation,
elementwise, reductions, optimizer, copies, attention, loss, collectives). Where kernels ran on several CUDA streams (the data-parallel
strategies' reductions and all-gathers on streams of their own), the account of the overlap: per stream its busy
time, how much of it ran while the compute stream (the busiest) was busy too, and how much ran alone, with the
compute stream idle: communication the step waited for.

  python3 scripts/trace_summary.py trace.json [--steps N] [--top 25]
"""
import argparse
import collections
import json
import re
import sys

# First match wins. Inductor names a fused kernel after every op in it (a batch norm's backward often carries
# "convolution_backward"), and ptrain's own kernels have short names: both are placed before the generic rules.
FAMILIES = [
    ("collective", r"nccl|allreduce|all_reduce|reducescatter|allgather"),
    ("attention", r"flash|fmha|attention|sdpa|softmax_warp"),
    ("pooling", r"max_pool|avg_pool"),
    ("normalization", r"^triton_\w*(batch_norm|layer_norm)|ptrain::kernels::cuda::.*::(stats_|apply_kernel|"
                      r"backward_(reduce|finalize|apply|rows|columns)_kernel|forward_kernel|columns_finalize)"),
    ("loss", r"ptrain::kernels::cuda::.*cross_entropy"),
    ("convolution", r"conv|cudnn|implicit_gemm|xmma_fprop|xmma_dgrad|xmma_wgrad|fprop|dgrad|wgrad|winograd"),
    ("matmul", r"gemm|cutlass|sm90_xmma|cublas|nvjet|matmul|addmm|\bmm\b|bmm"),
    ("normalization", r"batch_norm|batchnorm|bn_fw|bn_bw|layer_norm|layernorm|welford|norm_"),
    ("optimizer", r"multi_tensor|fused_adam|fused_sgd|foreach|_amp_"),
    ("loss", r"cross_entropy|log_softmax|nll_loss|softmax"),
    ("copy", r"memcpy|memset|copy|cast|to_copy|contiguous|transpose"),
    ("reduction", r"reduce|sum|argmax|max_|norm"),
    ("elementwise", r"elementwise|vectorized|unrolled|relu|gelu|add|mul|threshold|where|fill"),
]


# Shorter gaps between kernels are launch latency, which a busy GPU hides.
GAP_US = 5.0


def family(name):
    lowered = name.lower()
    for fam, pattern in FAMILIES:
        if re.search(pattern, lowered):
            return fam
    return "other"


def union_length(intervals):
    total, end = 0.0, None
    start = None
    for b, e in sorted(intervals):
        if end is None or b > end:
            if end is not None:
                total += end - start
            start, end = b, e
        else:
            end = max(end, e)
    if end is not None:
        total += end - start
    return total


def merged(intervals):
    out = []
    for b, e in sorted(intervals):
        if out and b <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([b, e])
    return out


def intersection_length(a, b):
    """Length of the intersection of two merged interval lists."""
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def idle_gaps(intervals, longer_than):
    """The stretches between merged intervals longer than `longer_than`: how many, and their total length. Inside a
    captured step, where the host launches nothing, they are the GPU waiting on dependencies between streams."""
    spans = merged(intervals)
    gaps = [b - e for (_, e), (b, _) in zip(spans, spans[1:]) if b - e > longer_than]
    return len(gaps), sum(gaps)


def moves_data(event):
    """Collectives, and the driver's copy kernels and copies: NCCL runs a one-rank group's collectives as device
    copies (memcpy32_post, memcpy128 inside a CUDA graph), so at world size 1 they are the collectives."""
    name = str(event.get("name", ""))
    return event.get("cat") == "gpu_memcpy" or name.startswith("memcpy") or family(name) == "collective"


def interval_of(event):
    return float(event["ts"]), float(event["ts"]) + float(event["dur"])


def data_movement(kernels):
    """(busy, alone, by_name): the time collectives and device copies ran, and the part of it no other kernel ran
    beside on any stream: what the step waited for; by_name: the same pair per kernel name, busiest first. Unlike
    the per-stream account, it holds where a captured step's graph spreads its compute over several streams."""
    other = merged([interval_of(e) for e in kernels if not moves_data(e)])
    names = collections.defaultdict(list)
    for e in kernels:
        if moves_data(e):
            names[str(e.get("name", "?"))].append(interval_of(e))
    def account(intervals):
        spans = merged(intervals)
        busy = sum(e - b for b, e in spans)
        return busy, busy - intersection_length(spans, other)
    by_name = sorted(((name, *account(iv)) for name, iv in names.items()), key=lambda row: -row[1])
    busy, alone = account([iv for ivs in names.values() for iv in ivs])
    return busy, alone, by_name


def stream_of(event):
    args = event.get("args") or {}
    return args.get("stream", event.get("tid"))


def stream_account(kernels):
    """Per CUDA stream: kernels, busy time, families, and (other than the compute stream, the busiest) the time it
    ran beside the compute stream's kernels and the time it ran alone. Times in the trace's microseconds."""
    by_stream = collections.defaultdict(list)
    for e in kernels:
        by_stream[stream_of(e)].append(e)
    streams = []
    for stream, events in by_stream.items():
        intervals = merged([interval_of(e) for e in events])
        families = collections.Counter()
        for e in events:
            families[family(str(e.get("name", "?")))] += float(e["dur"])
        streams.append({"stream": stream, "kernels": len(events), "intervals": intervals,
                        "busy": sum(e - b for b, e in intervals), "families": families})
    streams.sort(key=lambda s: -s["busy"])
    compute = streams[0]
    compute["compute"] = True
    for s in streams[1:]:
        s["compute"] = False
        s["beside_compute"] = intersection_length(s["intervals"], compute["intervals"])
        s["alone"] = s["busy"] - s["beside_compute"]
    return streams


def print_stream_account(streams, steps, per_step):
    print("\nstreams (ms" + (" a step" if per_step else "") + "): the busiest is taken for the compute stream")
    for s in streams:
        fams = ", ".join(f"{f} {us / 1000 / steps:.2f}" for f, us in s["families"].most_common(3))
        line = (f"  stream {s['stream']}{' (compute)' if s['compute'] else ''}: {s['kernels'] / steps:.0f} kernels "
                f"({fams}), busy {s['busy'] / 1000 / steps:.2f}")
        if not s["compute"]:
            share = 100 * s["beside_compute"] / max(1e-9, s["busy"])
            line += (f"; beside compute {s['beside_compute'] / 1000 / steps:.2f} ({share:.0f}%), alone with compute "
                     f"idle {s['alone'] / 1000 / steps:.2f}")
        print(line)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--steps", type=int, default=0, help="divide totals by this many steps (per-step figures)")
    args = parser.parse_args()
    with open(args.trace) as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    complete = [e for e in events if e.get("ph") == "X" and "dur" in e]
    kernels = [e for e in complete if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    steps = max(1, args.steps)
    if not complete:
        print("no complete events in", args.trace)
        return 1
    begin = min(float(e["ts"]) for e in complete)
    end = max(float(e["ts"]) + float(e["dur"]) for e in complete)
    print(f"trace {args.trace}: {len(complete)} events, span {(end - begin) / 1000 / steps:.2f} ms"
          + (" a step" if args.steps else ""))
    if kernels:
        busy = union_length([interval_of(e) for e in kernels])
        k_begin = min(float(e["ts"]) for e in kernels)
        k_end = max(float(e["ts"]) + float(e["dur"]) for e in kernels)
        print(f"GPU: {len(kernels) / steps:.0f} kernels, busy {busy / 1000 / steps:.2f} ms of "
              f"{(k_end - k_begin) / 1000 / steps:.2f} ms ({100 * busy / max(1e-9, k_end - k_begin):.0f}%)"
              + (" a step" if args.steps else ""))
        count, idle = idle_gaps([interval_of(e) for e in kernels], GAP_US)
        print(f"GPU idle between kernels: {count / steps:.0f} gaps over {GAP_US:.0f} us, {idle / 1000 / steps:.2f} ms"
              + (" a step" if args.steps else ""))
        moving, alone, by_name = data_movement(kernels)
        if moving > 0:
            print(f"collectives and device copies: {moving / 1000 / steps:.2f} ms"
                  + (" a step" if args.steps else "") + f", {alone / 1000 / steps:.2f} ms of it with no other kernel "
                  "running (" + ", ".join(f"{name[:40]} {b / 1000 / steps:.2f}, alone {a / 1000 / steps:.2f}"
                                         for name, b, a in by_name[:3]) + ")")
        rows = kernels
        streams = stream_account(kernels)
        if len(streams) > 1:
            print_stream_account(streams, steps, args.steps)
    else:
        print("no GPU kernels in the trace: CPU operators (self time not separated from children)")
        rows = [e for e in complete if not str(e.get("name", "")).startswith("ProfilerStep")]
    by_family = collections.Counter()
    by_name = collections.Counter()
    counts = collections.Counter()
    for e in rows:
        name = str(e.get("name", "?"))
        by_family[family(name)] += float(e["dur"])
        by_name[name] += float(e["dur"])
        counts[name] += 1
    total = sum(by_family.values())
    print("\nby family (ms" + (" a step" if args.steps else "") + "):")
    for fam, us in by_family.most_common():
        print(f"  {fam:14s} {us / 1000 / steps:9.2f}  {100 * us / total:5.1f}%")
    print(f"\ntop {args.top} (ms" + (" a step" if args.steps else "") + ", calls):")
    for name, us in by_name.most_common(args.top):
        print(f"  {us / 1000 / steps:9.3f} {counts[name] // steps:6d}  {name[:140]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
