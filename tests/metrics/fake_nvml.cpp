// Scripted NVML for tests: two devices, "Fake GPU 0" (PCI 0000:3B:00.0, utilisation 40 %) and
// "Fake GPU 1" (0000:86:00.0, 80 %); used memory of device i grows by 1 MiB per query from (i+1) GiB;
// driver "999.99". Only the entry points ptrain binds are exported.
#include <cstdio>
#include <cstring>
#include <strings.h>

namespace {
struct FakeDevice {
  const char* name;
  const char* pci;
  unsigned utilization;
  unsigned long long memory_queries;
};
FakeDevice devices[2] = {{"Fake GPU 0", "0000:3B:00.0", 40, 0}, {"Fake GPU 1", "0000:86:00.0", 80, 0}};
constexpr int kSuccess = 0, kInvalidArgument = 2, kNotFound = 6, kInsufficientSize = 7;
struct Utilization { unsigned gpu, memory; };
struct Memory { unsigned long long total, free, used; };
}  // namespace

extern "C" {
// Each initialisation restarts the memory script, so that tests are independent of each other.
int nvmlInit_v2() {
  for (auto& d : devices) d.memory_queries = 0;
  return kSuccess;
}
int nvmlShutdown() { return kSuccess; }
const char* nvmlErrorString(int) { return "fake error"; }
int nvmlDeviceGetCount_v2(unsigned* count) {
  *count = 2;
  return kSuccess;
}
int nvmlDeviceGetHandleByIndex_v2(unsigned index, FakeDevice** device) {
  if (index >= 2) return kInvalidArgument;
  *device = &devices[index];
  return kSuccess;
}
int nvmlDeviceGetHandleByPciBusId_v2(const char* pci, FakeDevice** device) {
  for (auto& d : devices) {
    if (strcasecmp(pci, d.pci) == 0) {
      *device = &d;
      return kSuccess;
    }
  }
  return kNotFound;
}
int nvmlDeviceGetIndex(FakeDevice* device, unsigned* index) {
  *index = static_cast<unsigned>(device - devices);
  return kSuccess;
}
int nvmlDeviceGetUtilizationRates(FakeDevice* device, Utilization* u) {
  u->gpu = device->utilization;
  u->memory = device->utilization / 2;
  return kSuccess;
}
int nvmlDeviceGetMemoryInfo(FakeDevice* device, Memory* m) {
  const unsigned long long gib = 1ull << 30, index = static_cast<unsigned long long>(device - devices);
  m->total = 80 * gib;
  m->used = (index + 1) * gib + (device->memory_queries++) * (1ull << 20);
  m->free = m->total - m->used;
  return kSuccess;
}
int nvmlDeviceGetName(FakeDevice* device, char* name, unsigned length) {
  if (std::strlen(device->name) + 1 > length) return kInsufficientSize;
  std::strcpy(name, device->name);
  return kSuccess;
}
int nvmlSystemGetDriverVersion(char* version, unsigned length) {
  return std::snprintf(version, length, "999.99") < static_cast<int>(length) ? kSuccess : kInsufficientSize;
}
}
