#include "ptrain/io/pth.h"

#include <gtest/gtest.h>

#include "expected_tensors.h"
#include "ptrain/core/error.h"
#include "test_support.h"

namespace {

using ptrain::testing::error_message;
using ptrain::testing::expect_same_tensors;
using ptrain::testing::expected_tensors;
using ptrain::testing::read_bytes;
using ptrain::testing::run_oracle;
using ptrain::testing::TempDir;
using ptrain::testing::write_bytes;

std::string read_error(const std::string& path) {
  return error_message<ptrain::Error>([&] { ptrain::io::read_pth(path); });
}

TEST(Pth, RoundTripKeepsOrderDtypesAndValues) {
  TempDir dir;
  const auto path = dir.file("t.pth");
  ptrain::io::write_pth(path, expected_tensors());
  expect_same_tensors(ptrain::io::read_pth(path), expected_tensors());
}

TEST(Pth, ReadsTorchSaveOfPython) {
  TempDir dir;
  const auto path = dir.file("python.pth");
  const auto oracle = run_oracle("pth_oracle.py", "write " + path);
  ASSERT_EQ(oracle.exit_code, 0) << oracle.output;
  expect_same_tensors(ptrain::io::read_pth(path), expected_tensors());
}

TEST(Pth, ReadsStateDictNestedInTrainingCheckpoint) {
  TempDir dir;
  const auto path = dir.file("nested.pth");
  const auto oracle = run_oracle("pth_oracle.py", "write-nested " + path);
  ASSERT_EQ(oracle.exit_code, 0) << oracle.output;
  expect_same_tensors(ptrain::io::read_pth(path), expected_tensors());
}

TEST(Pth, TorchLoadOfPythonReadsWhatWeWrite) {
  TempDir dir;
  const auto path = dir.file("cpp.pth");
  ptrain::io::write_pth(path, expected_tensors());
  const auto oracle = run_oracle("pth_oracle.py", "check " + path);
  EXPECT_EQ(oracle.exit_code, 0) << oracle.output;
}

TEST(Pth, NonTensorEntryAndNonDictAreNamed) {
  TempDir dir;
  const auto mixed = dir.file("mixed.pth");
  auto oracle = run_oracle("pth_oracle.py", "write-mixed " + mixed);
  ASSERT_EQ(oracle.exit_code, 0) << oracle.output;
  auto message = read_error(mixed);
  EXPECT_NE(message.find(mixed), std::string::npos) << message;
  EXPECT_NE(message.find("'epoch'"), std::string::npos) << message;

  const auto list = dir.file("list.pth");
  oracle = run_oracle("pth_oracle.py", "write-list " + list);
  ASSERT_EQ(oracle.exit_code, 0) << oracle.output;
  message = read_error(list);
  EXPECT_NE(message.find(list), std::string::npos) << message;
  EXPECT_NE(message.find("expected a dict"), std::string::npos) << message;
}

TEST(Pth, MissingTruncatedAndNonZipFilesAreNamed) {
  TempDir dir;
  const auto missing = dir.file("absent.pth");
  EXPECT_NE(read_error(missing).find(missing), std::string::npos);

  const auto text = dir.file("text.pth");
  write_bytes(text, "this is not a checkpoint");
  auto message = read_error(text);
  EXPECT_NE(message.find(text), std::string::npos) << message;
  EXPECT_NE(message.find("not a PyTorch zip checkpoint"), std::string::npos) << message;

  const auto cut = dir.file("cut.pth");
  ptrain::io::write_pth(cut, expected_tensors());
  const auto whole = read_bytes(cut);
  for (size_t keep : {whole.size() / 2, whole.size() - 30}) {
    write_bytes(cut, whole.substr(0, keep));
    message = read_error(cut);
    EXPECT_NE(message.find(cut), std::string::npos) << "keeping " << keep << " bytes: " << message;
  }
}

}  // namespace
