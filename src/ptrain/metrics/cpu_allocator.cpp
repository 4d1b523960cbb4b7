#include "ptrain/metrics/cpu_allocator.h"

#include <atomic>
#include <mutex>
#include <unordered_map>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include "ptrain/core/error.h"
#include "ptrain/core/torch_compat.h"

namespace ptrain::metrics {

namespace {

std::atomic<int64_t> g_allocated{0};
std::atomic<int64_t> g_peak{0};

void raise_peak(int64_t now) {
  int64_t peak = g_peak.load(std::memory_order_relaxed);
  while (now > peak && !g_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

// Allocations keep data == context, as LibTorch's own CPU allocator does: raw_allocate() and code that
// checks for a "simple" data pointer rely on it. So sizes are kept beside, keyed by address.
std::mutex g_sizes_mutex;
std::unordered_map<void*, int64_t>* g_sizes = new std::unordered_map<void*, int64_t>();  // leaked: see below
c10::DeleterFnPtr g_inner_deleter = nullptr;

void free_counted(void* data) {
  {
    std::lock_guard<std::mutex> lock(g_sizes_mutex);
    const auto it = g_sizes->find(data);
    if (it != g_sizes->end()) {
      g_allocated.fetch_sub(it->second, std::memory_order_relaxed);
      g_sizes->erase(it);
    }
  }
  g_inner_deleter(data);
}

class CountingCpuAllocator final : public compat::CpuAllocatorBase {
 public:
  explicit CountingCpuAllocator(c10::Allocator* inner) : inner_(inner) {}

  c10::DataPtr allocate(size_t bytes) PTRAIN_ALLOCATE_CONST override {
    void* data = inner_->raw_allocate(bytes);
    if (data != nullptr) {
      {
        std::lock_guard<std::mutex> lock(g_sizes_mutex);
        (*g_sizes)[data] = static_cast<int64_t>(bytes);
      }
      raise_peak(g_allocated.fetch_add(static_cast<int64_t>(bytes), std::memory_order_relaxed) +
                 static_cast<int64_t>(bytes));
    }
    return {data, data, &free_counted, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &free_counted; }

 private:
  c10::Allocator* inner_;
};

}  // namespace

void install_cpu_allocation_counter() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Leaked on purpose: tensors freed during static destruction still call into it.
    c10::Allocator* inner = c10::GetCPUAllocator();
    g_inner_deleter = inner->raw_deleter();
    check(g_inner_deleter != nullptr, "the CPU allocator offers no raw deleter to count allocations with");
    static auto* counting = new CountingCpuAllocator(inner);
    c10::SetCPUAllocator(counting, /*priority=*/100);
  });
}

int64_t cpu_allocated_bytes() { return g_allocated.load(std::memory_order_relaxed); }
int64_t cpu_peak_allocated_bytes() { return g_peak.load(std::memory_order_relaxed); }
void reset_cpu_allocator_peak() { g_peak.store(g_allocated.load(std::memory_order_relaxed), std::memory_order_relaxed); }

}  // namespace ptrain::metrics
