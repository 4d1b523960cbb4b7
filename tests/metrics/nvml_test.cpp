#include "ptrain/metrics/nvml.h"

#include <gtest/gtest.h>

#include <cstdlib>

using ptrain::metrics::Nvml;

TEST(Nvml, MissingLibraryIsUnavailableAndAnswersNothing) {
  setenv("PTRAIN_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1", 1);
  EXPECT_EQ(Nvml::library_path_from_environment(), "/nonexistent/libnvidia-ml.so.1");
  Nvml nvml(Nvml::library_path_from_environment());
  unsetenv("PTRAIN_NVML_LIBRARY");
  EXPECT_FALSE(nvml.available());
  EXPECT_NE(nvml.unavailable_reason().find("/nonexistent/libnvidia-ml.so.1"), std::string::npos)
      << nvml.unavailable_reason();
  EXPECT_FALSE(nvml.utilization_percent(0));
  EXPECT_FALSE(nvml.memory_used_bytes(0));
  EXPECT_FALSE(nvml.memory_total_bytes(0));
  EXPECT_FALSE(nvml.device_name(0));
  EXPECT_FALSE(nvml.driver_version());
  EXPECT_FALSE(nvml.index_for_pci_bus_id("0000:3B:00.0"));
  EXPECT_TRUE(nvml.devices().empty());
}

TEST(Nvml, DefaultLibraryName) {
  unsetenv("PTRAIN_NVML_LIBRARY");
  EXPECT_EQ(Nvml::library_path_from_environment(), "libnvidia-ml.so.1");
  setenv("PTRAIN_NVML_LIBRARY", "", 1);
  EXPECT_EQ(Nvml::library_path_from_environment(), "libnvidia-ml.so.1");
  unsetenv("PTRAIN_NVML_LIBRARY");
}

// The process-wide instance reads the variable on first use; a child process gets a fresh one.
TEST(Nvml, InstanceHonoursTheEnvironmentOverride) {
  EXPECT_EXIT(
      {
        setenv("PTRAIN_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1", 1);
        const auto& nvml = Nvml::instance();
        const bool names_path = nvml.unavailable_reason().find("/nonexistent") != std::string::npos;
        std::exit(!nvml.available() && names_path ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(Nvml, ALibraryWithoutTheSymbolsIsUnavailable) {
  Nvml nvml("libz.so.1");
  EXPECT_FALSE(nvml.available());
  EXPECT_NE(nvml.unavailable_reason().find("nvmlInit_v2"), std::string::npos) << nvml.unavailable_reason();
}

TEST(Nvml, ReadsEveryQueryThroughTheLibrary) {
  Nvml nvml(PTRAIN_FAKE_NVML);
  ASSERT_TRUE(nvml.available()) << nvml.unavailable_reason();
  EXPECT_EQ(nvml.unavailable_reason(), "");
  EXPECT_EQ(nvml.utilization_percent(0), 40u);
  EXPECT_EQ(nvml.utilization_percent(1), 80u);
  EXPECT_FALSE(nvml.utilization_percent(2));
  EXPECT_FALSE(nvml.utilization_percent(-1));
  EXPECT_EQ(nvml.memory_total_bytes(1), 80ull << 30);
  EXPECT_EQ(nvml.device_name(1), "Fake GPU 1");
  EXPECT_EQ(nvml.driver_version(), "999.99");
  EXPECT_EQ(nvml.index_for_pci_bus_id("0000:86:00.0"), 1);
  EXPECT_EQ(nvml.index_for_pci_bus_id("0000:3b:00.0"), 0);
  EXPECT_FALSE(nvml.index_for_pci_bus_id("0000:01:00.0"));
  const auto devices = nvml.devices();
  ASSERT_EQ(devices.size(), 2u);
  EXPECT_EQ(devices[0].nvml_index, 0);
  EXPECT_EQ(devices[0].name, "Fake GPU 0");
  EXPECT_EQ(devices[0].memory_total_bytes, 80ull << 30);
}

// On a machine with an NVIDIA driver: the real library answers plausibly.
TEST(Nvml, RealLibraryWhenPresent) {
  Nvml nvml("libnvidia-ml.so.1");
  if (!nvml.available()) GTEST_SKIP() << "no NVML here: " << nvml.unavailable_reason();
  const auto devices = nvml.devices();
  ASSERT_FALSE(devices.empty());
  EXPECT_FALSE(devices[0].name.empty());
  EXPECT_GT(devices[0].memory_total_bytes, 0u);
  const auto util = nvml.utilization_percent(0);
  ASSERT_TRUE(util);
  EXPECT_LE(*util, 100u);
  EXPECT_TRUE(nvml.driver_version());
}
