// TensorBoard event files, written by ptrain itself: Debian packages no TensorBoard or TensorFlow C++ writer,
// and its protobuf compiler would add a build dependency for three small messages. An event file is a
// TFRecord stream: each record is its length (uint64, little-endian), the masked CRC-32C of those 8 bytes,
// the data, and the masked CRC-32C of the data; each record's data is one serialised tensorflow.Event.
// The first event says file_version "brain.Event:2"; then each holds wall_time, step and a Summary of
// simple_value scalars, which `tensorboard --logdir DIR` plots by tag.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace ptrain::metrics {

// CRC-32C (Castagnoli), as TFRecord frames its records, and the mask TFRecord applies to it (a CRC stored
// beside the data it covers is rotated and offset, so that a CRC of CRCs is not trivially zero).
uint32_t crc32c(const void* data, size_t size);
uint32_t masked_crc32c(const void* data, size_t size);

using Scalars = std::vector<std::pair<std::string, double>>;

class TensorBoardWriter {
 public:
  // Creates dir (and its parents) and in it a new file events.out.tfevents.<unix seconds>.<host>.<pid>, as
  // PyTorch's SummaryWriter names them, starting with the file_version event. Throws ptrain::Error naming
  // flag and dir when it cannot.
  TensorBoardWriter(const std::string& dir, const std::string& flag, double wall_time);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One event of simple_value scalars (TensorBoard keeps them as float32), flushed to the file at once: a
  // run that crashes later keeps what was logged.
  void add_scalars(int64_t step, double wall_time, const Scalars& scalars);
  // A SessionLog START at `step`: TensorBoard drops the events of an earlier run at this step and after, the
  // steps a resumed run trains again.
  void add_restart(int64_t step, double wall_time);

  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& event);

  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace ptrain::metrics
