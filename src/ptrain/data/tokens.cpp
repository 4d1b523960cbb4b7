#include "ptrain/data/tokens.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <vector>

#include "ptrain/core/error.h"
#include "ptrain/data/synthetic.h"

namespace ptrain::data {

namespace {

constexpr const char* kDefaultSyntheticTokens = "20000:64:256";
constexpr int64_t kDefaultTextSeqLen = 256;
constexpr double kTextTrainFraction = 0.9;

// A sequence of T + 1 tokens per row -> inputs (first T) and labels (last T).
Dataset from_sequences(const torch::Tensor& sequences, int64_t vocab, const std::string& description) {
  const int64_t t = sequences.size(1) - 1;
  Dataset ds;
  ds.images = sequences.narrow(1, 0, t).contiguous();
  ds.labels = sequences.narrow(1, 1, t).contiguous();
  ds.vocab_size = vocab;
  ds.description = description;
  return ds;
}

int64_t parse_field(const std::string& text, const std::string& spec, const char* what) {
  const auto value = positive_field(text);
  check(value.has_value(),
        "--data-path '" + spec + "' of synthetic-tokens: " + what + " '" + text +
            "' is not a positive integer (format N:T:V, sequences:tokens per sequence:vocabulary, e.g. " +
            kDefaultSyntheticTokens + ")");
  return *value;
}

}  // namespace

Dataset make_synthetic_tokens(int64_t n, int64_t seq_len, int64_t vocab, uint64_t seed, uint64_t chain_seed) {
  check(n > 0 && seq_len > 0, "synthetic tokens: sequences and length must be positive, got " + std::to_string(n) +
                                  " x " + std::to_string(seq_len));
  check(vocab >= 2, "synthetic tokens: the vocabulary needs at least 2 tokens, got " + std::to_string(vocab));
  constexpr int64_t kSuccessors = 4;
  auto chain_gen = at::detail::createCPUGenerator(chain_seed);
  const auto successors = torch::randint(vocab, {vocab, kSuccessors}, chain_gen, torch::kInt64);

  auto gen = at::detail::createCPUGenerator(seed);
  auto sequences = torch::empty({n, seq_len + 1}, torch::kInt64);
  sequences.select(1, 0).copy_(torch::randint(vocab, {n}, gen, torch::kInt64));
  // Which successor each step takes: u in [0, 1) against the cumulative probabilities 0.6, 0.8, 0.9.
  const auto u = torch::rand({n, seq_len}, gen, torch::kDouble);
  double cumulative = 0;
  auto choice = torch::zeros({n, seq_len}, torch::kInt64);
  for (int64_t k = 0; k + 1 < kSuccessors; ++k) {
    cumulative += kSyntheticTokenSuccessorProbabilities[k];
    choice += u.ge(cumulative).to(torch::kInt64);
  }
  const auto flat_successors = successors.flatten();
  for (int64_t t = 1; t <= seq_len; ++t) {
    const auto previous = sequences.select(1, t - 1);
    sequences.select(1, t).copy_(flat_successors.index_select(0, previous * kSuccessors + choice.select(1, t - 1)));
  }
  return from_sequences(sequences, vocab,
                        "synthetic-tokens (" + std::to_string(n) + " sequences of " + std::to_string(seq_len) +
                            " tokens, vocabulary " + std::to_string(vocab) + ", seed " + std::to_string(seed) + ")");
}

Dataset open_synthetic_tokens(const std::string& spec_text, int64_t seq_len, bool train) {
  const std::string spec = spec_text.empty() ? kDefaultSyntheticTokens : spec_text;
  std::vector<std::string> fields;
  std::stringstream stream(spec);
  for (std::string field; std::getline(stream, field, ':');) fields.push_back(field);
  if (!spec.empty() && spec.back() == ':') fields.push_back("");
  check(fields.size() == 3, "--data-path '" + spec +
                                "' of synthetic-tokens: expected N:T:V (sequences:tokens per sequence:vocabulary), "
                                "e.g. " + kDefaultSyntheticTokens);
  const int64_t n = parse_field(fields[0], spec, "N");
  const int64_t t = seq_len > 0 ? seq_len : parse_field(fields[1], spec, "T");
  if (seq_len > 0) parse_field(fields[1], spec, "T");  // still well-formed
  const int64_t vocab = parse_field(fields[2], spec, "V");
  check(vocab >= 2, "--data-path '" + spec + "' of synthetic-tokens: the vocabulary V needs at least 2 tokens");
  return make_synthetic_tokens(train ? n : std::max<int64_t>(n / 5, 1), t, vocab, train ? 1 : 2);
}

Dataset load_text_tokens(const std::string& path, int64_t seq_len, bool train) {
  check(!path.empty(), "dataset text: --data-path must name a UTF-8 text file");
  check(std::filesystem::is_regular_file(path), "dataset text: --data-path " + path + ": no such file");
  std::ifstream in(path, std::ios::binary);
  check(in.good(), "dataset text: --data-path " + path + ": cannot open the file");
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const int64_t t = seq_len > 0 ? seq_len : kDefaultTextSeqLen;
  const auto size = static_cast<int64_t>(bytes.size());
  const auto split = static_cast<int64_t>(static_cast<double>(size) * kTextTrainFraction);
  const int64_t begin = train ? 0 : split, end = train ? split : size;
  // Windows of t + 1 bytes starting every t bytes.
  const int64_t windows = (end - begin - 1) / t;
  check(windows >= 1, "dataset text: --data-path " + path + " has " + std::to_string(size) + " bytes, too few for one " +
                          std::to_string(t + 1) + "-byte window in its " + (train ? "first 90% (train" : "last 10% (test") +
                          " split); give a longer file or a smaller --seq-len");
  auto all = torch::empty({end - begin}, torch::kUInt8);
  std::memcpy(all.data_ptr<uint8_t>(), bytes.data() + begin, static_cast<size_t>(end - begin));
  const auto sequences = all.to(torch::kInt64).narrow(0, 0, windows * t + 1).unfold(0, t + 1, t).contiguous();
  return from_sequences(sequences, 256,
                        "text " + path + " (" + (train ? "train" : "test") + ": " + std::to_string(end - begin) +
                            " bytes in " + std::to_string(windows) + " windows of " + std::to_string(t) + " tokens)");
}

}  // namespace ptrain::data
