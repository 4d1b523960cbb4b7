# cuBLASLt FP8 GEMMs (torch._scaled_mm, tensorwise scales) against bf16 GEMMs for GPT shapes: a linear's
# forward and its two backward products, with and without the casts done by eager PyTorch ops.
import torch, time
torch.manual_seed(0)
dev = 'cuda'
E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2
def bench(f, n=50):
    for _ in range(5): f()
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(n): f()
    torch.cuda.synchronize(); return (time.perf_counter() - t) / n * 1e3
def cast(x, dt):
    amax = x.abs().amax().float().clamp(min=1e-12)
    scale = torch.finfo(dt).max / amax
    return (x.float() * scale).clamp(-torch.finfo(dt).max, torch.finfo(dt).max).to(dt), scale.reciprocal()
for (M, K, N) in [(8192, 1280, 3840), (8192, 1280, 1280), (8192, 1280, 5120), (8192, 5120, 1280), (8192, 1600, 6400), (8192, 6400, 1600), (16384, 768, 3072)]:
    x = torch.randn(M, K, device=dev, dtype=torch.bfloat16); w = torch.randn(N, K, device=dev, dtype=torch.bfloat16)
    g = torch.randn(M, N, device=dev, dtype=torch.bfloat16)
    def bf16():  # fwd + 2 bwd gemms
        y = x @ w.t(); gx = g @ w; gw = g.t() @ x
    xf, sx = cast(x, E4); wf, sw = cast(w, E4); gf, sg = cast(g, E5)
    gT = gf.t().contiguous(); xT = xf.t().contiguous(); wT = wf.t().contiguous()
    def fp8_gemms():
        y = torch._scaled_mm(xf, wf.t(), scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16)
        gx = torch._scaled_mm(gf, wT.t(), scale_a=sg, scale_b=sw, out_dtype=torch.bfloat16)
        gw = torch._scaled_mm(gT, xT.t(), scale_a=sg, scale_b=sx, out_dtype=torch.bfloat16)
    def fp8_all():
        xf, sx = cast(x, E4); wf, sw = cast(w, E4); gf, sg = cast(g, E5)
        gT = gf.t().contiguous(); xT = xf.t().contiguous(); wT = wf.t().contiguous()
        y = torch._scaled_mm(xf, wf.t(), scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16)
        gx = torch._scaled_mm(gf, wT.t(), scale_a=sg, scale_b=sw, out_dtype=torch.bfloat16)
        gw = torch._scaled_mm(gT, xT.t(), scale_a=sg, scale_b=sx, out_dtype=torch.bfloat16)
    a, b, c = bench(bf16), bench(fp8_gemms), bench(fp8_all)
    y0 = (x.float() @ w.float().t()); y8 = torch._scaled_mm(xf, wf.t(), scale_a=sx, scale_b=sw, out_dtype=torch.float32)
    rel = ((y8 - y0).norm() / y0.norm()).item()
    print(f"M{M} K{K} N{N}: bf16 {a:.3f} ms  fp8 gemms {b:.3f} ({a/b:.2f}x)  fp8+eager casts {c:.3f} ({a/c:.2f}x)  fwd rel err {rel:.4f}")
