// The safetensors format (https://github.com/huggingface/safetensors): what Hugging Face checkpoints and
// ptrain's own weight exports use. Debian ships no C++ safetensors library, so this is our own
// implementation of the (small, fully specified) format on top of nlohmann-json.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <string_view>

#include "ptrain/io/named_tensors.h"

namespace ptrain::io {

// Tensors in file order (by data offset, which is the order write_safetensors was given), on the CPU.
// Dtypes F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL. When metadata is given it receives "__metadata__".
// Throws ptrain::Error naming path for a missing or malformed file.
NamedTensors read_safetensors(const std::string& path, std::map<std::string, std::string>* metadata = nullptr);

// The "__metadata__" of path alone, read from its header without the tensors (nor the checksum, which
// covers them: read_safetensors verifies it). Throws ptrain::Error naming path as read_safetensors does.
std::map<std::string, std::string> read_safetensors_metadata(const std::string& path);

// Written atomically (see atomic_file.h). Tensors on any device and of any layout are stored contiguous
// from the CPU; duplicate names and dtypes outside the list above are refused with ptrain::Error.
// With checksum, the metadata gets "ptrain_checksum": a CRC-32 of the header and the data, which
// read_safetensors verifies whenever a file has one (a mismatch is a ptrain::Error naming the file).
// before_rename: write_file_atomically's test seam. before_reading, when given, is called with each span of
// tensor bytes before anything reads it, from the thread that will (possibly several at once): tensors whose
// bytes are still arriving (a copy from the device in flight) are written as they arrive. threads: the
// threads that write the file (BodyThenHead::threads; 0: by its size). Returns the checksum's text ("crc32:...")
// as stored, or "" without one.
std::string write_safetensors(const std::string& path, const NamedTensors& tensors,
                              const std::map<std::string, std::string>& metadata = {}, bool checksum = false,
                              const std::function<void()>& before_rename = {},
                              const std::function<void(std::string_view)>& before_reading = {}, size_t threads = 0);

}  // namespace ptrain::io
