#include "ptrain/kernels/cudnn/conv_stats_graph.h"

#include <cudnn.h>

#include <map>
#include <memory>
#include <stdexcept>
#include <tuple>
#include <vector>

namespace ptrain::kernels::cudnn {

namespace {

std::string status_message(cudnnStatus_t status) {
  char detail[512] = {0};
  cudnnGetLastErrorString(detail, sizeof detail);
  std::string out = cudnnGetErrorString(status);
  if (detail[0]) out += std::string(" (") + detail + ")";
  return out;
}

void check(cudnnStatus_t status, const char* what) {
  if (status != CUDNN_STATUS_SUCCESS) throw std::runtime_error(std::string("cuDNN ") + what + ": " + status_message(status));
}

// One backend descriptor, destroyed with its owner.
class Descriptor {
 public:
  explicit Descriptor(cudnnBackendDescriptorType_t type) { check(cudnnBackendCreateDescriptor(type, &d_), "create"); }
  ~Descriptor() {
    if (d_) cudnnBackendDestroyDescriptor(d_);
  }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  cudnnBackendDescriptor_t get() const { return d_; }
  template <class T>
  Descriptor& set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, const T& value) {
    check(cudnnBackendSetAttribute(d_, name, type, 1, &value), "set attribute");
    return *this;
  }
  template <class T>
  Descriptor& set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, const std::vector<T>& values) {
    check(cudnnBackendSetAttribute(d_, name, type, static_cast<int64_t>(values.size()), values.data()),
          "set attribute");
    return *this;
  }
  Descriptor& finalize(const char* what) {
    check(cudnnBackendFinalize(d_), what);
    return *this;
  }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};
using DescriptorPtr = std::shared_ptr<Descriptor>;

enum Uid : int64_t { kX = 1, kW, kY, kScale, kShift, kSum, kSumOfSquares, kScaled, kShifted, kActivated };

cudnnDataType_t cudnn_dtype(Dtype dtype) { return dtype == Dtype::kHalf ? CUDNN_DATA_HALF : CUDNN_DATA_BFLOAT16; }

// [n, c, h, w] with NHWC strides.
DescriptorPtr nhwc_tensor(int64_t uid, int64_t n, int64_t c, int64_t h, int64_t w, cudnnDataType_t dtype,
                          bool is_virtual) {
  auto t = std::make_shared<Descriptor>(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  const int64_t alignment = 16;
  t->set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, dtype)
      .set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, std::vector<int64_t>{n, c, h, w})
      .set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, std::vector<int64_t>{c * h * w, 1, c * w, c})
      .set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, uid)
      .set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, alignment)
      .set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, is_virtual)
      .finalize("tensor descriptor");
  return t;
}

DescriptorPtr pointwise(std::vector<DescriptorPtr>& keep, cudnnPointwiseMode_t mode, const DescriptorPtr& x,
                        const DescriptorPtr& b, const DescriptorPtr& y) {
  auto math = std::make_shared<Descriptor>(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
  math->set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, mode)
      .set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, CUDNN_DATA_FLOAT)
      .finalize("pointwise descriptor");
  auto op = std::make_shared<Descriptor>(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
  op->set(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, math->get())
      .set(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, x->get());
  if (b) op->set(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, b->get());
  op->set(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, y->get()).finalize("pointwise operation");
  keep.push_back(math);
  keep.push_back(op);
  return op;
}

struct Plan {
  ConvStatsPlanInfo info;
  DescriptorPtr plan;
};

// The operation graph of the fusion, then the first engine config of cuDNN's heuristics (mode A, else the
// fallback list) that finalizes into a plan.
Plan build_plan(cudnnHandle_t handle, const ConvStatsShape& s) {
  std::vector<DescriptorPtr> keep;
  const cudnnDataType_t io = cudnn_dtype(s.dtype);
  auto x = nhwc_tensor(kX, s.n, s.c, s.h, s.w, io, false);
  auto w = nhwc_tensor(kW, s.k, s.c, s.r, s.r, io, false);
  auto y = nhwc_tensor(kY, s.n, s.k, s.out_h(), s.out_w(), io, false);
  auto sum = nhwc_tensor(kSum, 1, s.k, 1, 1, CUDNN_DATA_FLOAT, false);
  auto sum_of_squares = nhwc_tensor(kSumOfSquares, 1, s.k, 1, 1, CUDNN_DATA_FLOAT, false);
  keep.insert(keep.end(), {x, w, y, sum, sum_of_squares});
  std::vector<cudnnBackendDescriptor_t> ops;
  DescriptorPtr conv_input = x;
  if (s.prologue) {
    auto scale = nhwc_tensor(kScale, 1, s.c, 1, 1, io, false);
    auto shift = nhwc_tensor(kShift, 1, s.c, 1, 1, io, false);
    auto scaled = nhwc_tensor(kScaled, s.n, s.c, s.h, s.w, CUDNN_DATA_FLOAT, true);
    auto shifted = nhwc_tensor(kShifted, s.n, s.c, s.h, s.w, CUDNN_DATA_FLOAT, true);
    auto activated = nhwc_tensor(kActivated, s.n, s.c, s.h, s.w, CUDNN_DATA_FLOAT, true);
    keep.insert(keep.end(), {scale, shift, scaled, shifted, activated});
    ops.push_back(pointwise(keep, CUDNN_POINTWISE_MUL, x, scale, scaled)->get());
    ops.push_back(pointwise(keep, CUDNN_POINTWISE_ADD, scaled, shift, shifted)->get());
    ops.push_back(pointwise(keep, CUDNN_POINTWISE_RELU_FWD, shifted, nullptr, activated)->get());
    conv_input = activated;
  }
  auto conv = std::make_shared<Descriptor>(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  const int64_t spatial_dims = 2;
  conv->set(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, CUDNN_DATA_FLOAT)
      .set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, CUDNN_CROSS_CORRELATION)
      .set(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, spatial_dims)
      .set(CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, std::vector<int64_t>{1, 1})
      .set(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, std::vector<int64_t>{s.stride, s.stride})
      .set(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, std::vector<int64_t>{s.padding, s.padding})
      .set(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, std::vector<int64_t>{s.padding, s.padding})
      .finalize("convolution descriptor");
  const float alpha = 1.f, beta = 0.f;
  auto fprop = std::make_shared<Descriptor>(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR);
  fprop->set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, CUDNN_TYPE_BACKEND_DESCRIPTOR, conv_input->get())
      .set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, CUDNN_TYPE_BACKEND_DESCRIPTOR, w->get())
      .set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, CUDNN_TYPE_BACKEND_DESCRIPTOR, y->get())
      .set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, conv->get())
      .set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_FLOAT, alpha)
      .set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_TYPE_FLOAT, beta)
      .finalize("convolution forward operation");
  auto genstats = std::make_shared<Descriptor>(CUDNN_BACKEND_OPERATION_GEN_STATS_DESCRIPTOR);
  genstats->set(CUDNN_ATTR_OPERATION_GENSTATS_MODE, CUDNN_TYPE_GENSTATS_MODE, CUDNN_GENSTATS_SUM_SQSUM)
      .set(CUDNN_ATTR_OPERATION_GENSTATS_MATH_PREC, CUDNN_TYPE_DATA_TYPE, CUDNN_DATA_FLOAT)
      .set(CUDNN_ATTR_OPERATION_GENSTATS_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, y->get())
      .set(CUDNN_ATTR_OPERATION_GENSTATS_SUMDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, sum->get())
      .set(CUDNN_ATTR_OPERATION_GENSTATS_SQSUMDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, sum_of_squares->get())
      .finalize("genstats operation");
  keep.insert(keep.end(), {conv, fprop, genstats});
  ops.push_back(fprop->get());
  ops.push_back(genstats->get());
  Descriptor graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  graph.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, ops)
      .set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, handle)
      .finalize("operation graph");

  Plan out;
  out.info.why_not = "no engine config";
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    Descriptor heuristics(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    heuristics.set(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, graph.get())
        .set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, mode);
    cudnnStatus_t status = cudnnBackendFinalize(heuristics.get());
    int64_t count = 0;
    if (status == CUDNN_STATUS_SUCCESS)
      status = cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                        0, &count, nullptr);
    if (status != CUDNN_STATUS_SUCCESS) {
      out.info.why_not = status_message(status);
      continue;
    }
    std::vector<DescriptorPtr> configs;
    std::vector<cudnnBackendDescriptor_t> raw;
    for (int64_t i = 0; i < count; ++i) {
      configs.push_back(std::make_shared<Descriptor>(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
      raw.push_back(configs.back()->get());
    }
    int64_t got = 0;
    if (count == 0 || cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                               CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, raw.data()) !=
                          CUDNN_STATUS_SUCCESS)
      continue;
    for (int64_t i = 0; i < got; ++i) {
      auto plan = std::make_shared<Descriptor>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      plan->set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, handle)
          .set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, raw[i]);
      status = cudnnBackendFinalize(plan->get());
      if (status != CUDNN_STATUS_SUCCESS) {
        out.info.why_not = status_message(status);
        continue;
      }
      int64_t one = 0, workspace = 0;
      check(cudnnBackendGetAttribute(plan->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &one,
                                     &workspace),
            "workspace size");
      out.plan = plan;
      out.info.supported = true;
      out.info.why_not.clear();
      out.info.workspace_bytes = static_cast<size_t>(workspace);
      Descriptor engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
      cudnnBackendDescriptor_t engine_raw = engine.get();
      if (cudnnBackendGetAttribute(raw[i], CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &one,
                                   &engine_raw) == CUDNN_STATUS_SUCCESS) {
        cudnnBackendGetAttribute(engine_raw, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &one,
                                 &out.info.engine);
        cudnnBackendBehaviorNote_t notes[8];
        int64_t note_count = 0;
        if (cudnnBackendGetAttribute(engine_raw, CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE, 8,
                                     &note_count, notes) == CUDNN_STATUS_SUCCESS)
          for (int64_t j = 0; j < note_count; ++j)
            out.info.runtime_compiled |= notes[j] == CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION;
        cudnnBackendNumericalNote_t numerical[16];
        int64_t numerical_count = 0;
        if (cudnnBackendGetAttribute(engine_raw, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE, 16,
                                     &numerical_count, numerical) == CUDNN_STATUS_SUCCESS)
          for (int64_t j = 0; j < numerical_count; ++j)
            out.info.nondeterministic |= numerical[j] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC;
      }
      return out;
    }
  }
  return out;
}

using PlanKey = std::tuple<int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, bool>;

struct ThreadState {
  std::map<int, cudnnHandle_t> handles;  // per device; cuDNN handles are not to be shared across threads
  std::map<PlanKey, Plan> plans;
  ~ThreadState() {
    plans.clear();
    for (auto& [device, handle] : handles) cudnnDestroy(handle);
  }
};

ThreadState& thread_state() {
  thread_local ThreadState state;
  return state;
}

int current_device() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) throw std::runtime_error("cuDNN conv_stats: no current CUDA device");
  return device;
}

cudnnHandle_t handle_for(int device) {
  auto& handles = thread_state().handles;
  auto it = handles.find(device);
  if (it != handles.end()) return it->second;
  cudnnHandle_t handle = nullptr;
  check(cudnnCreate(&handle), "create handle");
  handles.emplace(device, handle);
  return handle;
}

const Plan& plan_for(const ConvStatsShape& s) {
  const int device = current_device();
  const PlanKey key{device, s.n, s.c, s.h, s.w, s.k, s.r, s.stride, s.padding, static_cast<int>(s.dtype), s.prologue};
  auto& plans = thread_state().plans;
  auto it = plans.find(key);
  if (it == plans.end()) {
    Plan plan;
    try {
      plan = build_plan(handle_for(device), s);
    } catch (const std::runtime_error& e) {
      plan.info.supported = false;
      plan.info.why_not = e.what();
    }
    if (!plan.info.supported) plan.info.why_not = "cuDNN has no engine for it: " + plan.info.why_not;
    it = plans.emplace(key, std::move(plan)).first;
  }
  return it->second;
}

}  // namespace

ConvStatsPlanInfo conv_stats_plan(const ConvStatsShape& shape) { return plan_for(shape).info; }

void conv_stats(const ConvStatsShape& shape, const void* x, const void* w, const void* scale, const void* shift,
                void* y, float* sum, float* sum_of_squares, void* workspace, cudaStream_t stream) {
  const Plan& plan = plan_for(shape);
  if (!plan.info.supported) throw std::runtime_error(plan.info.why_not);
  cudnnHandle_t handle = handle_for(current_device());
  check(cudnnSetStream(handle, stream), "set stream");
  std::vector<int64_t> uids{kX, kW, kY, kSum, kSumOfSquares};
  std::vector<void*> pointers{const_cast<void*>(x), const_cast<void*>(w), y, sum, sum_of_squares};
  if (shape.prologue) {
    uids.insert(uids.end(), {kScale, kShift});
    pointers.insert(pointers.end(), {const_cast<void*>(scale), const_cast<void*>(shift)});
  }
  Descriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, uids)
      .set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, pointers)
      .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, workspace)
      .finalize("variant pack");
  check(cudnnBackendExecute(handle, plan.plan->get(), pack.get()), "execute conv_stats");
}

}  // namespace ptrain::kernels::cudnn
