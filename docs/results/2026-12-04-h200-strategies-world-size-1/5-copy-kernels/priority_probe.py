# Do graph-captured device copies on a side stream overlap matrix multiplies better when the multiplies' stream has
# the higher priority? PyTorch instantiates graphs with cudaGraphInstantiateFlagUseNodePriority, so each kernel node
# keeps the priority of the stream it was captured on.
import torch
torch.manual_seed(0)
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16); b = torch.randn_like(a); c = torch.empty_like(a)
src = torch.randn(7087872 * 4, device="cuda"); dst = torch.empty_like(src)  # 113 MB
lo, hi = torch.cuda.Stream.priority_range() if hasattr(torch.cuda.Stream, "priority_range") else (0, -1)
print("priority range (least, greatest):", lo, hi)
def build(n_mm, n_copy, prio_compute, prio_copy):
    sc = torch.cuda.Stream(priority=prio_compute); sx = torch.cuda.Stream(priority=prio_copy)
    with torch.cuda.stream(sc):
        torch.mm(a, b, out=c); dst.copy_(src)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=sc):
        cur = torch.cuda.current_stream()
        sx.wait_stream(cur)
        with torch.cuda.stream(sx):
            for _ in range(n_copy): dst.copy_(src)
        for _ in range(n_mm): torch.mm(a, b, out=c)
        cur.wait_stream(sx)
    return g, sc
def timed(g, s, reps=20):
    with torch.cuda.stream(s):
        g.replay(); torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(reps): g.replay()
        e1.record(); torch.cuda.synchronize()
    return e0.elapsed_time(e1) / reps
for label, args in [("multiplies alone", (10, 0, 0, 0)), ("copies alone", (0, 40, 0, 0)),
                    ("both, same priority", (10, 40, 0, 0)), ("both, multiplies high", (10, 40, hi, lo)),
                    ("both, copies high", (10, 40, lo, hi)), ("both, same priority again", (10, 40, 0, 0))]:
    g, s = build(*args)
    print(f"{label:28s} {timed(g, s):7.3f} ms")
