// CIFAR-10 in its original binary release (cifar-10-batches-bin).
#pragma once

#include <string>

#include "ptrain/data/dataset.h"

namespace ptrain::data {

// Reads data_batch_1.bin .. data_batch_5.bin (train) or test_batch.bin from dir: 3073-byte records of one
// label byte followed by the 1024 R, 1024 G and 1024 B bytes of a 32x32 image. Class names come from
// batches.meta.txt when present, else the 10 standard names.
Dataset load_cifar10_binary(const std::string& dir, bool train);

}  // namespace ptrain::data
