# The ResNet stem (7x7 stride-2 conv, 3 -> 64) as cuDNN runs it on channels-last bf16, against the same conv
# written as a 4x4 stride-1 conv over a 2x2 space-to-depth of the input (12 channels, padded to 16).
import torch, torch.nn.functional as F, sys
torch.backends.cudnn.benchmark = True
N = int(sys.argv[1]) if len(sys.argv) > 1 else 128
dt = {'bf16': torch.bfloat16, 'fp16': torch.float16, 'fp32': torch.float32, 'tf32': torch.float32}[sys.argv[2] if len(sys.argv) > 2 else 'bf16']
MODE = sys.argv[2] if len(sys.argv) > 2 else 'bf16'
cl = torch.channels_last
def orig(x, w): return F.conv2d(x, w, stride=2, padding=3)
def s2d(x, w, cpad=16):
    n = x.shape[0]
    xp = F.pad(x, (4, 2, 4, 2)).contiguous()
    xs = xp.view(n, 3, 115, 2, 115, 2).permute(0, 3, 5, 1, 2, 4).reshape(n, 12, 115, 115)
    wp = F.pad(w, (1, 0, 1, 0)).view(64, 3, 4, 2, 4, 2).permute(0, 3, 5, 1, 2, 4).reshape(64, 12, 4, 4)
    if cpad > 12:
        xs = F.pad(xs, (0, 0, 0, 0, 0, cpad - 12)); wp = F.pad(wp, (0, 0, 0, 0, 0, cpad - 12))
    return F.conv2d(xs.contiguous(memory_format=cl), wp.contiguous(memory_format=cl))
# numerics in fp32 (TF32 off)
torch.backends.cudnn.allow_tf32 = False
x = torch.randn(8, 3, 224, 224, device='cuda').contiguous(memory_format=cl)
w = torch.randn(64, 3, 7, 7, device='cuda')
a, b = orig(x, w), s2d(x, w)
print('fp32 max abs diff', (a - b).abs().max().item(), 'max', a.abs().max().item(), b.shape, b.is_contiguous(memory_format=cl))
def timeit(fn, reps=20):
    for _ in range(3): fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(reps): fn()
    e.record(); torch.cuda.synchronize()
    return s.elapsed_time(e) / reps * 1000
torch.backends.cudnn.allow_tf32 = MODE == 'tf32'
x = torch.randn(N, 3, 224, 224, device='cuda', dtype=dt).contiguous(memory_format=cl)
w = torch.randn(64, 3, 7, 7, device='cuda', dtype=dt, requires_grad=True)
wc = w.detach().contiguous(memory_format=cl).requires_grad_()
for name, fn, ww in [('orig', orig, wc), ('s2d16', s2d, w), ('s2d12', lambda x, w: s2d(x, w, 12), w)]:
    gy = torch.randn_like(fn(x, ww))
    fwd = timeit(lambda: fn(x, ww))
    def fb():
        y = fn(x, ww); y.backward(gy)
    both = timeit(fb)
    print(f'{name}: forward {fwd:.1f} us, forward+backward(weight) {both:.1f} us')
torch.backends.cudnn.allow_tf32 = MODE == 'tf32'
print(MODE)
if False:
  prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
  with prof:
    for fn, ww in [(orig, wc), (s2d, w)]:
        y = fn(x, ww); y.backward(gy); torch.cuda.synchronize()
  print(prof.key_averages().table(sort_by='cuda_time_total', row_limit=14, max_name_column_width=70))
