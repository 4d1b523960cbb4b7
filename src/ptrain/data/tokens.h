// Token datasets for language models: samples are int64 sequences of T tokens, labelled with the token that
// follows each position (the sequence shifted by one), as Dataset's token form holds them.
#pragma once

#include <cstdint>
#include <string>

#include "ptrain/data/dataset.h"

namespace ptrain::data {

// n sequences of seq_len tokens in 0..vocab-1 from a fixed first-order Markov chain: every token has four
// successors (drawn once from chain_seed), followed with probabilities 0.6, 0.2, 0.1 and 0.1; the first token is
// uniform. A model that learns the chain reaches a loss of about 1.09 nats per token (from ln(vocab) at chance)
// and a next-token accuracy of about 0.6. The sequences are deterministic in seed; train and test splits
// share chain_seed and differ in seed.
Dataset make_synthetic_tokens(int64_t n, int64_t seq_len, int64_t vocab, uint64_t seed, uint64_t chain_seed = 1234);

// The probability of each of a token's four successors in make_synthetic_tokens.
constexpr double kSyntheticTokenSuccessorProbabilities[4] = {0.6, 0.2, 0.1, 0.1};

// `spec` is "N:T:V" (empty: "20000:64:256"); seq_len > 0 replaces T. The test split holds N / 5 sequences.
// Malformed specs throw ptrain::Error naming --data-path and the expected format.
Dataset open_synthetic_tokens(const std::string& spec, int64_t seq_len, bool train);

// The bytes of a text file as tokens (vocabulary 256): consecutive windows of seq_len + 1 bytes overlapping by
// one (inputs are a window's first seq_len bytes, labels its last seq_len), over the first 90% of the file for
// train and the last 10% for test. seq_len 0 means 256. Throws ptrain::Error naming the path when the file is
// missing or too short to give each split one window (and then --seq-len too).
Dataset load_text_tokens(const std::string& path, int64_t seq_len, bool train);

}  // namespace ptrain::data
