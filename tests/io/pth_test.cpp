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

// torch.load's default from PyTorch 2.6: only OrderedDict, _rebuild_tensor_v2 and the storage types may
// appear in the pickle. Views (an offset, strides) must come back with their own values.
TEST(Pth, TorchLoadWeightsOnlyReadsWhatWeWrite) {
  TempDir dir;
  const auto path = dir.file("weights_only.pt");
  auto tensors = expected_tensors();
  const auto halves = (torch::arange(20, torch::kFloat) * 0.5).to(torch::kHalf).view({4, 5});
  const auto quarters = (torch::arange(12, torch::kFloat) * 0.25).to(torch::kBFloat16).view({3, 4});
  tensors.emplace_back("offset", torch::arange(10, torch::kFloat).slice(0, 3, 8));
  tensors.emplace_back("strided_f16", halves.slice(0, 1).slice(1, 0, 5, 2));
  tensors.emplace_back("column_bf16", quarters.select(1, 1));
  ptrain::io::write_pth(path, tensors);
  const auto oracle = run_oracle("pth_oracle.py", "check-weights-only " + path);
  EXPECT_EQ(oracle.exit_code, 0) << oracle.output;
  expect_same_tensors(ptrain::io::read_pth(path), tensors);
}

// The archive layout of Python's torch.save: archive/data.pkl, archive/data/<key>, archive/version, and
// the byteorder record PyTorch 2.x writes.
TEST(Pth, WritesTorchSaveArchiveLayout) {
  TempDir dir;
  const auto path = dir.file("layout.pt");
  ptrain::io::write_pth(path, expected_tensors());
  const auto bytes = read_bytes(path);
  for (const std::string record : {"archive/data.pkl", "archive/byteorder", "archive/version", "archive/data/0",
                                   "archive/data/12"}) {
    EXPECT_NE(bytes.find(record), std::string::npos) << record;
  }
  EXPECT_EQ(bytes.find("restore_type_tag"), std::string::npos);
}

// Files written by earlier ptrain versions (LibTorch's torch::pickle_save of a typed dict) still load.
TEST(Pth, ReadsFilesOfTorchPickleSave) {
  TempDir dir;
  const auto path = dir.file("pickle_save.pt");
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& [key, tensor] : expected_tensors()) dict.insert(key, tensor);
  const std::vector<char> bytes = torch::pickle_save(c10::IValue(dict));
  write_bytes(path, std::string(bytes.begin(), bytes.end()));
  expect_same_tensors(ptrain::io::read_pth(path), expected_tensors());
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
