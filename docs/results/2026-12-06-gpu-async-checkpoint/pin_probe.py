# How fast this host pins GPT-2 large's 9.4 GB of checkpoint staging memory, four ways: PyTorch's pinned
# allocation, cudaHostAlloc alone, and anonymous memory touched by 8 threads then registered (cudaHostRegister)
# whole or in 8 pieces at once. Run: python3 pin_probe.py [GB]
import ctypes, glob, mmap, os, sys, threading, time
import torch

GB = float(sys.argv[1]) if len(sys.argv) > 1 else 9.4
n = int(GB * 1e9) // 4096 * 4096
torch.cuda.init()
torch.zeros(1, device="cuda")
libs = sorted(glob.glob(os.path.join(os.path.dirname(torch.__file__), "..", "nvidia", "*", "lib", "libcudart.so*")))
rt = ctypes.CDLL(libs[0]) if libs else ctypes.CDLL("libcudart.so")
libc = ctypes.CDLL("libc.so.6")
libc.memset.restype = ctypes.c_void_p
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
PORTABLE = 1


def timed(label, fn):
    t = time.perf_counter(); out = fn(); print(f"{label}: {time.perf_counter() - t:.2f} s ({GB:.1f} GB)", flush=True); return out


x = timed("torch.empty(pin_memory=True)", lambda: torch.empty(n, dtype=torch.uint8, pin_memory=True))
del x
p = ctypes.c_void_p()
timed("cudaHostAlloc portable", lambda: rt.cudaHostAlloc(ctypes.byref(p), ctypes.c_size_t(n), PORTABLE))
timed("cudaFreeHost", lambda: rt.cudaFreeHost(p))


def touched(threads=8):
    m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    base = ctypes.addressof(ctypes.c_char.from_buffer(m))
    step = n // threads // 4096 * 4096
    ts = [threading.Thread(target=libc.memset, args=(base + i * step, 0, step if i < threads - 1 else n - i * step))
          for i in range(threads)]
    [t.start() for t in ts]; [t.join() for t in ts]
    return m, base


def register(base, size):
    rc = rt.cudaHostRegister(ctypes.c_void_p(base), ctypes.c_size_t(size), PORTABLE)
    assert rc == 0, rc


m, base = timed("mmap + 8 threads touching", touched)
timed("cudaHostRegister whole", lambda: register(base, n))
timed("cudaHostUnregister", lambda: rt.cudaHostUnregister(ctypes.c_void_p(base)))
step = n // 8 // 4096 * 4096
pieces = [(base + i * step, step if i < 7 else n - 7 * step) for i in range(8)]
def parallel():
    ts = [threading.Thread(target=register, args=piece) for piece in pieces]
    [t.start() for t in ts]; [t.join() for t in ts]
timed("cudaHostRegister in 8 pieces at once", parallel)
dev = torch.empty(n, dtype=torch.uint8, device="cuda")
host = torch.frombuffer(m, dtype=torch.uint8)
torch.cuda.synchronize(); t = time.perf_counter(); host[: pieces[1][1]].copy_(dev[: pieces[1][1]], non_blocking=True); torch.cuda.synchronize()
print(f"copy of one registered piece: {pieces[1][1] / (time.perf_counter() - t) / 1e9:.1f} GB/s", flush=True)
