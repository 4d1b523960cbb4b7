// The IDX format of MNIST and Fashion-MNIST.
#pragma once

#include <string>

#include "ptrain/data/dataset.h"

namespace ptrain::data {

// Reads an IDX image file (magic 2051: N x rows x cols, big-endian dims) and an IDX label file (magic 2049: N),
// each gzipped or plain. Images come out N x 1 x rows x cols; classes are "0".."max label".
Dataset load_idx_gz(const std::string& images_path, const std::string& labels_path);

// The four files under dir as Debian's dataset-fashion-mnist names them (train-images-idx3-ubyte.gz,
// train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz; the same names without
// .gz are accepted too), with the Fashion-MNIST class names.
Dataset load_fashion_mnist(const std::string& dir, bool train);

// MNIST under the same file names, with the digits as class names.
Dataset load_mnist(const std::string& dir, bool train);

}  // namespace ptrain::data
