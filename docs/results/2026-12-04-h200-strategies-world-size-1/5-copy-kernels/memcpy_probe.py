# Which copy kernel a device copy becomes inside a CUDA graph, by how it is issued: PyTorch's copy_, a one-rank NCCL
# all-gather and reduce-scatter, and cudaMemcpyAsync with kind Default and DeviceToDevice (ctypes).
import ctypes, glob, os, sys
import torch, torch.distributed as dist
os.environ.setdefault("MASTER_ADDR", "127.0.0.1"); os.environ.setdefault("MASTER_PORT", "29561")
dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda:0"))
n = 7087872  # one GPT-2 block's float32 parameters
src = torch.randn(n, device="cuda"); dst = torch.empty_like(src)
lib = None
for pat in ["nvidia/**/libcudart.so*", "../nvidia/**/libcudart.so*"]:
    hits = sorted(glob.glob(os.path.join(os.path.dirname(torch.__file__), pat), recursive=True))
    if hits: lib = ctypes.CDLL(hits[0]); print("cudart:", hits[0]); break
def raw(kind):
    s = torch.cuda.current_stream().cuda_stream
    rc = lib.cudaMemcpyAsync(ctypes.c_void_p(dst.data_ptr()), ctypes.c_void_p(src.data_ptr()), ctypes.c_size_t(n * 4), ctypes.c_int(kind), ctypes.c_void_p(s))
    assert rc == 0, rc
variants = {
    "torch copy_": lambda: dst.copy_(src),
    "nccl all_gather (1 rank)": lambda: dist.all_gather_into_tensor(dst, src),
    "nccl reduce_scatter (1 rank)": lambda: dist.reduce_scatter_tensor(dst, src),
}
if lib is not None:
    variants["cudaMemcpyAsync Default"] = lambda: raw(4)
    variants["cudaMemcpyAsync DeviceToDevice"] = lambda: raw(3)
graphs = {}
for name, fn in variants.items():
    fn(); torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    graphs[name] = g
torch.cuda.synchronize()
from torch.profiler import profile, ProfilerActivity
for name, g in graphs.items():
    for mode in ("eager", "graph"):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                (g.replay() if mode == "graph" else variants[name]())
            torch.cuda.synchronize()
        ev = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        desc = sorted({(e.name[:40]) for e in ev})
        us = sum(e.device_time for e in ev) / 3 if ev and hasattr(ev[0], "device_time") else sum(e.cuda_time for e in ev) / 3
        print(f"{name:32s} {mode:5s} {desc} {us:.1f} us")
dist.destroy_process_group()
