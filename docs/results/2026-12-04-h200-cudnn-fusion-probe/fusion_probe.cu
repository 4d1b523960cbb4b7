// Does cuDNN (backend graph API) fuse ResNet-50's batch norm into its convolutions on this GPU, and at what
// cost? For each ResNet-50 shape at batch N (NHWC, fp16 and bf16): the fastest engine of
//   conv        y = conv(x, w)
//   conv+stats  y = conv(x, w), sum and sum of squares of y per channel (genstats in the epilogue)
//   sbr+conv+stats  the same with relu(x * scale + bias) applied to x in the prologue
//   wgrad       dw = wgrad(x, dy)
//   sbr+wgrad   dw = wgrad(relu(x * scale + bias), dy)
// timed over 20 runs each, and the fused outputs checked against the plain conv run on the prologue applied by
// a plain kernel.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cudnn.h>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <memory>
#include <string>
#include <vector>
#include <algorithm>
#include <cstring>
#include <stdexcept>

#define CK(x) check_cudnn((x), #x, __LINE__)
#define CC(x) check_cuda((x), #x, __LINE__)
static void check_cudnn(cudnnStatus_t s, const char* what, int line) {
  if (s != CUDNN_STATUS_SUCCESS) {
    char msg[1024];
    cudnnGetLastErrorString(msg, sizeof msg);
    throw std::runtime_error(std::string(what) + " line " + std::to_string(line) + ": " +
                             cudnnGetErrorString(s) + " " + msg);
  }
}
static void check_cuda(cudaError_t s, const char* what, int line) {
  if (s != cudaSuccess) {
    fprintf(stderr, "%s line %d: %s\n", what, line, cudaGetErrorString(s));
    exit(1);
  }
}

struct Desc {
  cudnnBackendDescriptor_t d = nullptr;
  explicit Desc(cudnnBackendDescriptorType_t t) { CK(cudnnBackendCreateDescriptor(t, &d)); }
  ~Desc() { if (d) cudnnBackendDestroyDescriptor(d); }
  Desc(const Desc&) = delete;
  template <class T>
  Desc& set(cudnnBackendAttributeName_t n, cudnnBackendAttributeType_t t, const T& v) {
    CK(cudnnBackendSetAttribute(d, n, t, 1, &v));
    return *this;
  }
  template <class T>
  Desc& set_array(cudnnBackendAttributeName_t n, cudnnBackendAttributeType_t t, const std::vector<T>& v) {
    CK(cudnnBackendSetAttribute(d, n, t, (int64_t)v.size(), v.data()));
    return *this;
  }
  Desc& finalize() { CK(cudnnBackendFinalize(d)); return *this; }
};
using DescPtr = std::shared_ptr<Desc>;

static DescPtr tensor(int64_t uid, std::vector<int64_t> dims_nchw, cudnnDataType_t dt, bool is_virtual) {
  // NHWC strides for [N, C, H, W] dims
  int64_t n = dims_nchw[0], c = dims_nchw[1], h = dims_nchw[2], w = dims_nchw[3];
  std::vector<int64_t> strides = {c * h * w, 1, c * w, c};
  auto t = std::make_shared<Desc>(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  int64_t align = 16;
  t->set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, dt)
      .set_array(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, dims_nchw)
      .set_array(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, strides)
      .set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, uid)
      .set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, align)
      .set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, is_virtual)
      .finalize();
  (void)n;
  return t;
}

static DescPtr pointwise_desc(cudnnPointwiseMode_t mode) {
  auto p = std::make_shared<Desc>(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
  cudnnDataType_t f = CUDNN_DATA_FLOAT;
  p->set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, mode).set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, f);
  p->finalize();
  return p;
}

static DescPtr pointwise_op(DescPtr pw, DescPtr x, DescPtr b, DescPtr y) {
  auto op = std::make_shared<Desc>(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
  op->set(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, pw->d)
      .set(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, x->d);
  if (b) op->set(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, b->d);
  op->set(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, y->d).finalize();
  return op;
}

static DescPtr conv_desc(int64_t pad, int64_t stride) {
  auto c = std::make_shared<Desc>(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  cudnnDataType_t f = CUDNN_DATA_FLOAT;
  cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  int64_t dims = 2;
  c->set(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, f)
      .set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, mode)
      .set(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, dims)
      .set_array(CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, std::vector<int64_t>{1, 1})
      .set_array(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, std::vector<int64_t>{stride, stride})
      .set_array(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, std::vector<int64_t>{pad, pad})
      .set_array(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, std::vector<int64_t>{pad, pad})
      .finalize();
  return c;
}

struct Shape {
  const char* name;
  int64_t c, k, h, r, stride, count;  // input channels, output channels, input size, filter size, stride, uses
};

enum class Variant { conv, conv_stats, sbr_conv_stats, wgrad, sbr_wgrad };
static const char* variant_name(Variant v) {
  switch (v) {
    case Variant::conv: return "conv";
    case Variant::conv_stats: return "conv+stats";
    case Variant::sbr_conv_stats: return "sbr+conv+stats";
    case Variant::wgrad: return "wgrad";
    case Variant::sbr_wgrad: return "sbr+wgrad";
  }
  return "?";
}

enum Uid : int64_t { X = 1, W, Y, S, B, SUM, SQSUM, DY, DW, T1, T2, T3 };

struct Graph {
  std::vector<DescPtr> keep;
  DescPtr op_graph;
};

static Graph build(cudnnHandle_t handle, Variant v, const Shape& s, int64_t n, cudnnDataType_t dt) {
  Graph g;
  int64_t pad = s.r / 2, p = (s.h + 2 * pad - s.r) / s.stride + 1;
  auto x = tensor(X, {n, s.c, s.h, s.h}, dt, false);
  auto w = tensor(W, {s.k, s.c, s.r, s.r}, dt, false);
  auto y = tensor(Y, {n, s.k, p, p}, dt, false);
  auto cd = conv_desc(pad, s.stride);
  g.keep = {x, w, y, cd};
  std::vector<cudnnBackendDescriptor_t> ops;
  DescPtr conv_in = x;
  if (v == Variant::sbr_conv_stats || v == Variant::sbr_wgrad) {
    auto sc = tensor(S, {1, s.c, 1, 1}, dt, false), bi = tensor(B, {1, s.c, 1, 1}, dt, false);
    auto t1 = tensor(T1, {n, s.c, s.h, s.h}, CUDNN_DATA_FLOAT, true);
    auto t2 = tensor(T2, {n, s.c, s.h, s.h}, CUDNN_DATA_FLOAT, true);
    auto t3 = tensor(T3, {n, s.c, s.h, s.h}, CUDNN_DATA_FLOAT, true);
    auto mul = pointwise_desc(CUDNN_POINTWISE_MUL), add = pointwise_desc(CUDNN_POINTWISE_ADD),
         relu = pointwise_desc(CUDNN_POINTWISE_RELU_FWD);
    auto o1 = pointwise_op(mul, x, sc, t1), o2 = pointwise_op(add, t1, bi, t2), o3 = pointwise_op(relu, t2, nullptr, t3);
    g.keep.insert(g.keep.end(), {sc, bi, t1, t2, t3, mul, add, relu, o1, o2, o3});
    ops.insert(ops.end(), {o1->d, o2->d, o3->d});
    conv_in = t3;
  }
  float alpha = 1.f, beta = 0.f;
  if (v == Variant::wgrad || v == Variant::sbr_wgrad) {
    auto dy = tensor(DY, {n, s.k, p, p}, dt, false);
    auto dw = tensor(DW, {s.k, s.c, s.r, s.r}, dt, false);
    auto op = std::make_shared<Desc>(CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR);
    op->set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X, CUDNN_TYPE_BACKEND_DESCRIPTOR, conv_in->d)
        .set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY, CUDNN_TYPE_BACKEND_DESCRIPTOR, dy->d)
        .set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW, CUDNN_TYPE_BACKEND_DESCRIPTOR, dw->d)
        .set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, cd->d)
        .set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA, CUDNN_TYPE_FLOAT, alpha)
        .set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA, CUDNN_TYPE_FLOAT, beta)
        .finalize();
    g.keep.insert(g.keep.end(), {dy, dw, op});
    ops.push_back(op->d);
  } else {
    auto op = std::make_shared<Desc>(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR);
    op->set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, CUDNN_TYPE_BACKEND_DESCRIPTOR, conv_in->d)
        .set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, CUDNN_TYPE_BACKEND_DESCRIPTOR, w->d)
        .set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, CUDNN_TYPE_BACKEND_DESCRIPTOR, y->d)
        .set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, cd->d)
        .set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_FLOAT, alpha)
        .set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_TYPE_FLOAT, beta)
        .finalize();
    g.keep.push_back(op);
    ops.push_back(op->d);
    if (v != Variant::conv) {
      auto sum = tensor(SUM, {1, s.k, 1, 1}, CUDNN_DATA_FLOAT, false);
      auto sq = tensor(SQSUM, {1, s.k, 1, 1}, CUDNN_DATA_FLOAT, false);
      auto gs = std::make_shared<Desc>(CUDNN_BACKEND_OPERATION_GEN_STATS_DESCRIPTOR);
      cudnnGenStatsMode_t mode = CUDNN_GENSTATS_SUM_SQSUM;
      cudnnDataType_t f = CUDNN_DATA_FLOAT;
      gs->set(CUDNN_ATTR_OPERATION_GENSTATS_MODE, CUDNN_TYPE_GENSTATS_MODE, mode)
          .set(CUDNN_ATTR_OPERATION_GENSTATS_MATH_PREC, CUDNN_TYPE_DATA_TYPE, f)
          .set(CUDNN_ATTR_OPERATION_GENSTATS_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, y->d)
          .set(CUDNN_ATTR_OPERATION_GENSTATS_SUMDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, sum->d)
          .set(CUDNN_ATTR_OPERATION_GENSTATS_SQSUMDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, sq->d)
          .finalize();
      g.keep.insert(g.keep.end(), {sum, sq, gs});
      ops.push_back(gs->d);
    }
  }
  g.op_graph = std::make_shared<Desc>(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  g.op_graph->set_array(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, ops)
      .set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, handle)
      .finalize();
  return g;
}

struct Plan {
  DescPtr plan;
  int64_t workspace = 0, engine = -1;
  bool runtime_compiled = false;
};

// Every engine config the heuristics offer (mode A, then the fallback list), as finalized plans.
static std::vector<Plan> plans(cudnnHandle_t handle, const Graph& g, int max_plans) {
  std::vector<Plan> out;
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    Desc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    heur.set(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, g.op_graph->d)
        .set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, mode);
    if (cudnnBackendFinalize(heur.d) != CUDNN_STATUS_SUCCESS) continue;
    int64_t count = 0;
    if (cudnnBackendGetAttribute(heur.d, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count,
                                 nullptr) != CUDNN_STATUS_SUCCESS)
      continue;
    std::vector<DescPtr> cfgs;
    std::vector<cudnnBackendDescriptor_t> raw;
    for (int64_t i = 0; i < count; ++i) {
      cfgs.push_back(std::make_shared<Desc>(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
      raw.push_back(cfgs.back()->d);
    }
    int64_t got = 0;
    if (count == 0 || cudnnBackendGetAttribute(heur.d, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                               count, &got, raw.data()) != CUDNN_STATUS_SUCCESS)
      continue;
    for (int64_t i = 0; i < got && (int)out.size() < max_plans; ++i) {
      Plan p;
      p.plan = std::make_shared<Desc>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      cudnnBackendSetAttribute(p.plan->d, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
      cudnnBackendSetAttribute(p.plan->d, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                               &raw[i]);
      if (cudnnBackendFinalize(p.plan->d) != CUDNN_STATUS_SUCCESS) continue;
      int64_t one = 0;
      cudnnBackendGetAttribute(p.plan->d, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &one,
                               &p.workspace);
      Desc engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
      cudnnBackendDescriptor_t ed = engine.d;
      if (cudnnBackendGetAttribute(raw[i], CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &one, &ed) ==
          CUDNN_STATUS_SUCCESS) {
        cudnnBackendGetAttribute(ed, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &one, &p.engine);
        cudnnBackendBehaviorNote_t notes[8];
        int64_t nn = 0;
        if (cudnnBackendGetAttribute(ed, CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE, 8, &nn, notes) ==
            CUDNN_STATUS_SUCCESS)
          for (int64_t j = 0; j < nn; ++j) p.runtime_compiled |= notes[j] == CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION;
      }
      out.push_back(p);
    }
    if (!out.empty()) break;
  }
  return out;
}

static void execute(cudnnHandle_t handle, const Plan& p, const std::vector<int64_t>& uids, std::vector<void*> ptrs,
                    void* workspace) {
  Desc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  pack.set_array(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, uids)
      .set_array(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, ptrs)
      .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, workspace)
      .finalize();
  CK(cudnnBackendExecute(handle, p.plan->d, pack.d));
}

// ---- plain kernels for the references ----
template <class T> __device__ float to_f(T v);
template <> __device__ float to_f(__half v) { return __half2float(v); }
template <> __device__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
template <class T> __device__ T from_f(float v);
template <> __device__ __half from_f(float v) { return __float2half(v); }
template <> __device__ __nv_bfloat16 from_f(float v) { return __float2bfloat16(v); }

template <class T>
__global__ void fill_random(T* p, int64_t n, uint32_t seed, float lo, float hi) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    uint32_t h = (uint32_t)i * 2654435761u ^ seed;
    h ^= h >> 13; h *= 0x5bd1e995u; h ^= h >> 15;
    p[i] = from_f<T>(lo + (hi - lo) * (h & 0xffffff) / 16777216.f);
  }
}
template <class T>
__global__ void sbr(const T* x, const T* s, const T* b, T* out, int64_t n, int64_t c) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t ch = i % c;
    out[i] = from_f<T>(fmaxf(to_f(x[i]) * to_f(s[ch]) + to_f(b[ch]), 0.f));
  }
}
template <class T>
__global__ void channel_sums(const T* y, int64_t rows, int64_t c, float* sum, float* sq) {
  int64_t ch = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (ch >= c) return;
  double a = 0, q = 0;
  for (int64_t r = 0; r < rows; ++r) { float v = to_f(y[r * c + ch]); a += v; q += (double)v * v; }
  sum[ch] = (float)a; sq[ch] = (float)q;
}
template <class T>
__global__ void max_diff(const T* a, const T* b, int64_t n, float* out) {
  float m = 0;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    m = fmaxf(m, fabsf(to_f(a[i]) - to_f(b[i])));
  atomicMax((int*)out, __float_as_int(m));  // non-negative floats order as ints
}

struct Timed {
  float ms = -1;
  int64_t engine = -1;
  bool rtc = false;
  int tried = 0;
};

template <class T>
static void run_shape(cudnnHandle_t handle, const Shape& s, int64_t n, cudnnDataType_t dt, const char* dtname) {
  int64_t pad = s.r / 2, p = (s.h + 2 * pad - s.r) / s.stride + 1;
  int64_t nx = n * s.c * s.h * s.h, nw = s.k * s.c * s.r * s.r, ny = n * s.k * p * p;
  T *x, *w, *y, *y_ref, *sc, *bi, *xa, *dy, *dw, *dw_ref;
  float *sum, *sq, *sum_ref, *sq_ref, *diff;
  CC(cudaMalloc(&x, nx * sizeof(T))); CC(cudaMalloc(&xa, nx * sizeof(T)));
  CC(cudaMalloc(&w, nw * sizeof(T))); CC(cudaMalloc(&dw, nw * sizeof(T))); CC(cudaMalloc(&dw_ref, nw * sizeof(T)));
  CC(cudaMalloc(&y, ny * sizeof(T))); CC(cudaMalloc(&y_ref, ny * sizeof(T))); CC(cudaMalloc(&dy, ny * sizeof(T)));
  CC(cudaMalloc(&sc, s.c * sizeof(T))); CC(cudaMalloc(&bi, s.c * sizeof(T)));
  CC(cudaMalloc(&sum, s.k * 4)); CC(cudaMalloc(&sq, s.k * 4)); CC(cudaMalloc(&sum_ref, s.k * 4));
  CC(cudaMalloc(&sq_ref, s.k * 4)); CC(cudaMalloc(&diff, 4));
  fill_random<<<1024, 256>>>(x, nx, 1, -2.f, 2.f);
  fill_random<<<1024, 256>>>(w, nw, 2, -0.05f, 0.05f);
  fill_random<<<1024, 256>>>(dy, ny, 3, -1.f, 1.f);
  fill_random<<<64, 256>>>(sc, s.c, 4, 0.5f, 1.5f);
  fill_random<<<64, 256>>>(bi, s.c, 5, -0.5f, 0.5f);
  sbr<<<2048, 256>>>(x, sc, bi, xa, nx, s.c);
  void* ws = nullptr;
  size_t ws_size = 0;
  cudaEvent_t e0, e1;
  CC(cudaEventCreate(&e0)); CC(cudaEventCreate(&e1));

  Timed t[5];
  for (int vi = 0; vi < 5; ++vi) {
    Variant v = (Variant)vi;
    try {
      Graph g = build(handle, v, s, n, dt);
      auto ps = plans(handle, g, 12);
      t[vi].tried = (int)ps.size();
      std::vector<int64_t> uids;
      std::vector<void*> ptrs;
      bool fwd = v == Variant::conv || v == Variant::conv_stats || v == Variant::sbr_conv_stats;
      bool with_sbr = v == Variant::sbr_conv_stats || v == Variant::sbr_wgrad;
      if (fwd) { uids = {X, W, Y}; ptrs = {x, w, y}; }
      else { uids = {X, DY, DW}; ptrs = {x, dy, dw}; }
      if (v == Variant::conv_stats || v == Variant::sbr_conv_stats) {
        uids.insert(uids.end(), {SUM, SQSUM}); ptrs.insert(ptrs.end(), {sum, sq});
      }
      if (with_sbr) { uids.insert(uids.end(), {S, B}); ptrs.insert(ptrs.end(), {sc, bi}); }
      for (auto& pl : ps) {
        if ((size_t)pl.workspace > ws_size) {
          if (ws) CC(cudaFree(ws));
          ws_size = pl.workspace;
          CC(cudaMalloc(&ws, ws_size));
        }
        try {
          execute(handle, pl, uids, ptrs, ws);  // warm-up
          CC(cudaDeviceSynchronize());
          CC(cudaEventRecord(e0));
          for (int i = 0; i < 20; ++i) execute(handle, pl, uids, ptrs, ws);
          CC(cudaEventRecord(e1));
          CC(cudaEventSynchronize(e1));
          float ms;
          CC(cudaEventElapsedTime(&ms, e0, e1));
          ms /= 20;
          if (t[vi].ms < 0 || ms < t[vi].ms) { t[vi].ms = ms; t[vi].engine = pl.engine; t[vi].rtc = pl.runtime_compiled; }
        } catch (std::exception& ex) {
          printf("  %s %s engine %ld: %s\n", dtname, variant_name(v), (long)pl.engine, ex.what());
        }
      }
      if (t[vi].ms < 0) continue;
      // Re-run the fastest and check it.
      for (auto& pl : ps)
        if (pl.engine == t[vi].engine) { execute(handle, pl, uids, ptrs, ws); break; }
      CC(cudaDeviceSynchronize());
      if (v == Variant::sbr_conv_stats || v == Variant::conv_stats) {
        // Reference: the plain conv (variant 0's fastest plan) on xa (or x), then plain channel sums.
        Graph g0 = build(handle, Variant::conv, s, n, dt);
        auto p0 = plans(handle, g0, 1);
        execute(handle, p0.at(0), {X, W, Y}, {v == Variant::sbr_conv_stats ? (void*)xa : (void*)x, w, y_ref}, ws);
        channel_sums<<<(s.k + 127) / 128, 128>>>(y, n * p * p, s.k, sum_ref, sq_ref);
        CC(cudaMemset(diff, 0, 4));
        max_diff<<<1024, 256>>>(y, y_ref, ny, diff);
        float d, yabs;
        CC(cudaMemcpy(&d, diff, 4, cudaMemcpyDeviceToHost));
        CC(cudaMemset(diff, 0, 4));
        T* zeros; CC(cudaMalloc(&zeros, ny * sizeof(T))); CC(cudaMemset(zeros, 0, ny * sizeof(T)));
        max_diff<<<1024, 256>>>(y_ref, zeros, ny, diff);
        CC(cudaMemcpy(&yabs, diff, 4, cudaMemcpyDeviceToHost));
        CC(cudaFree(zeros));
        std::vector<float> a(s.k), b(s.k), c(s.k), e(s.k);
        CC(cudaMemcpy(a.data(), sum, s.k * 4, cudaMemcpyDeviceToHost));
        CC(cudaMemcpy(b.data(), sum_ref, s.k * 4, cudaMemcpyDeviceToHost));
        CC(cudaMemcpy(c.data(), sq, s.k * 4, cudaMemcpyDeviceToHost));
        CC(cudaMemcpy(e.data(), sq_ref, s.k * 4, cudaMemcpyDeviceToHost));
        double ds = 0, dq = 0;
        for (int64_t i = 0; i < s.k; ++i) {
          ds = std::max(ds, std::fabs(a[i] - b[i]) / (std::fabs(b[i]) + std::sqrt(e[i]) + 1e-6));
          dq = std::max(dq, std::fabs(c[i] - e[i]) / (std::fabs(e[i]) + 1e-6));
        }
        printf("  check %s %s: max |y - y_ref| %.4g (max |y_ref| %.4g); sums rel %.3g, squares rel %.3g\n", dtname,
               variant_name(v), d, yabs, ds, dq);
      }
      if (v == Variant::sbr_wgrad) {
        Graph g0 = build(handle, Variant::wgrad, s, n, dt);
        auto p0 = plans(handle, g0, 1);
        execute(handle, p0.at(0), {X, DY, DW}, {xa, dy, dw_ref}, ws);
        CC(cudaDeviceSynchronize());
        float d, dabs;
        CC(cudaMemset(diff, 0, 4));
        max_diff<<<1024, 256>>>(dw, dw_ref, nw, diff);
        CC(cudaMemcpy(&d, diff, 4, cudaMemcpyDeviceToHost));
        T* zeros; CC(cudaMalloc(&zeros, nw * sizeof(T))); CC(cudaMemset(zeros, 0, nw * sizeof(T)));
        CC(cudaMemset(diff, 0, 4));
        max_diff<<<1024, 256>>>(dw_ref, zeros, nw, diff);
        CC(cudaMemcpy(&dabs, diff, 4, cudaMemcpyDeviceToHost));
        CC(cudaFree(zeros));
        printf("  check %s sbr+wgrad: max |dw - dw_ref| %.4g (max |dw_ref| %.4g)\n", dtname, d, dabs);
      }
    } catch (std::exception& ex) {
      printf("  %s %s: not built: %s\n", dtname, variant_name(v), ex.what());
    }
  }
  printf("%-6s %-18s x%-2ld", dtname, s.name, (long)s.count);
  for (int vi = 0; vi < 5; ++vi) {
    if (t[vi].ms < 0) printf(" | %s: none of %d", variant_name((Variant)vi), t[vi].tried);
    else printf(" | %s %.1f us (eng %ld%s, %d plans)", variant_name((Variant)vi), t[vi].ms * 1000, (long)t[vi].engine,
                t[vi].rtc ? " rtc" : "", t[vi].tried);
  }
  printf("\n");
  // Element passes a separate batch-norm apply (read x, write xa) and statistics (read y) cost, for scale.
  printf("         bytes: x %.1f MB, y %.1f MB\n", nx * sizeof(T) / 1e6, ny * sizeof(T) / 1e6);
  fflush(stdout);
  for (void* q : {(void*)x, (void*)xa, (void*)w, (void*)dw, (void*)dw_ref, (void*)y, (void*)y_ref, (void*)dy, (void*)sc,
                  (void*)bi, (void*)sum, (void*)sq, (void*)sum_ref, (void*)sq_ref, (void*)diff})
    CC(cudaFree(q));
  if (ws) CC(cudaFree(ws));
}

int main(int argc, char** argv) {
  int64_t n = argc > 1 ? atoll(argv[1]) : 128;
  const char* only = argc > 2 ? argv[2] : "both";
  printf("cuDNN %zu (headers %d), batch %ld\n", cudnnGetVersion(), CUDNN_VERSION, (long)n);
  cudnnHandle_t handle;
  CK(cudnnCreate(&handle));
  // ResNet-50 (torchvision, stride on the 3x3) at 224 px: the convolutions whose input is a batch norm + ReLU
  // (conv2, conv3 of each bottleneck), and the others (conv1, downsample) for the statistics alone.
  std::vector<Shape> shapes = {
      {"s1.conv2 3x3 64", 64, 64, 56, 3, 1, 3},        {"s1.conv3 1x1 64>256", 64, 256, 56, 1, 1, 3},
      {"s1.conv1 1x1 256>64", 256, 64, 56, 1, 1, 2},   {"s2.conv2 3x3/2 128", 128, 128, 56, 3, 2, 1},
      {"s2.conv2 3x3 128", 128, 128, 28, 3, 1, 3},     {"s2.conv3 1x1 128>512", 128, 512, 28, 1, 1, 4},
      {"s2.conv1 1x1 512>128", 512, 128, 28, 1, 1, 3}, {"s3.conv2 3x3/2 256", 256, 256, 28, 3, 2, 1},
      {"s3.conv2 3x3 256", 256, 256, 14, 3, 1, 5},     {"s3.conv3 1x1 256>1024", 256, 1024, 14, 1, 1, 6},
      {"s4.conv2 3x3/2 512", 512, 512, 14, 3, 2, 1},   {"s4.conv2 3x3 512", 512, 512, 7, 3, 1, 2},
      {"s4.conv3 1x1 512>2048", 512, 2048, 7, 1, 1, 3},
  };
  for (auto& s : shapes) {
    if (strcmp(only, "bf16") != 0) run_shape<__half>(handle, s, n, CUDNN_DATA_HALF, "fp16");
    if (strcmp(only, "fp16") != 0) run_shape<__nv_bfloat16>(handle, s, n, CUDNN_DATA_BFLOAT16, "bf16");
  }
  cudnnDestroy(handle);
  return 0;
}
