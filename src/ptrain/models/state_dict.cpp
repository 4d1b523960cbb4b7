#include "ptrain/models/state_dict.h"

#include <map>
#include <sstream>

#include "ptrain/core/error.h"
#include "ptrain/io/pth.h"
#include "ptrain/io/safetensors.h"

namespace ptrain::models {

namespace {

void collect(const torch::nn::Module& module, const std::string& prefix, io::NamedTensors& out) {
  for (const auto& item : module.named_parameters(/*recurse=*/false)) {
    if (item.value().defined()) out.emplace_back(prefix + item.key(), item.value().detach());
  }
  for (const auto& item : module.named_buffers(/*recurse=*/false)) {
    if (item.value().defined()) out.emplace_back(prefix + item.key(), item.value().detach());
  }
  for (const auto& child : module.named_children()) collect(*child.value(), prefix + child.key() + ".", out);
}

std::string shape_text(const torch::Tensor& t) {
  std::ostringstream text;
  text << t.sizes();
  return text.str();
}

enum class Format { Pth, Safetensors };

Format format_of(const std::string& path) {
  const auto dot = path.find_last_of('.');
  const auto slash = path.find_last_of('/');
  std::string ext = (dot == std::string::npos || (slash != std::string::npos && dot < slash)) ? "" : path.substr(dot);
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  if (ext == ".pth" || ext == ".pt") return Format::Pth;
  if (ext == ".safetensors") return Format::Safetensors;
  throw Error(path + ": unknown weights format '" + ext + "'; use .pth, .pt or .safetensors");
}

bool starts_with(const std::string& text, const std::string& prefix) { return text.rfind(prefix, 0) == 0; }

// One line for the two mix-ups that produce a key error for every tensor: a ptrain training checkpoint
// given as weights, and a state dict saved from a DistributedDataParallel or DataParallel wrapper.
std::string key_mismatch_hint(const io::NamedTensors& given, const io::NamedTensors& expected,
                              const std::string& source_name) {
  if (given.empty()) return "the file holds no tensors";
  std::map<std::string, bool> wanted;
  for (const auto& [key, tensor] : expected) wanted[key] = true;
  size_t checkpoint_like = 0, wrapped = 0, unwrapped_match = 0;
  for (const auto& [key, tensor] : given) {
    if (starts_with(key, "model/") || starts_with(key, "optimizer/") || starts_with(key, "progress/")) ++checkpoint_like;
    if (starts_with(key, "module.")) {
      ++wrapped;
      if (wanted.count(key.substr(7))) ++unwrapped_match;
    }
  }
  if (checkpoint_like == given.size())
    return "it is a ptrain training checkpoint, not a weights file: continue it with --resume " + source_name;
  if (wrapped == given.size())
    return "every key starts with 'module.' (a state dict of a DistributedDataParallel or DataParallel wrapper" +
           std::string(unwrapped_match > 0 ? ", and without the prefix " + std::to_string(unwrapped_match) + " of " +
                                                 std::to_string(expected.size()) + " keys match"
                                           : "") +
           "): save model.module.state_dict() instead, or strip the prefix";
  return "";
}

}  // namespace

io::NamedTensors state_dict(const torch::nn::Module& module) {
  io::NamedTensors out;
  collect(module, "", out);
  return out;
}

void load_state_dict(torch::nn::Module& module, const io::NamedTensors& tensors, const std::string& source_name) {
  const auto targets = state_dict(module);
  std::map<std::string, const torch::Tensor*> given;
  std::vector<std::string> problems;
  for (const auto& [key, tensor] : tensors) {
    if (!given.emplace(key, &tensor).second) problems.push_back("duplicate key " + key);
  }
  std::map<std::string, bool> expected;
  for (const auto& [key, target] : targets) {
    expected[key] = true;
    const auto found = given.find(key);
    if (found == given.end()) {
      problems.push_back("missing key " + key + " (expected shape " + shape_text(target) + ")");
    } else if (found->second->sizes() != target.sizes()) {
      problems.push_back("shape mismatch for " + key + ": expected " + shape_text(target) + ", found " +
                         shape_text(*found->second));
    }
  }
  for (const auto& [key, tensor] : tensors) {
    if (expected.count(key) == 0) problems.push_back("unexpected key " + key + " (shape " + shape_text(tensor) + ")");
  }
  if (!problems.empty()) {
    const std::string hint = key_mismatch_hint(tensors, targets, source_name);
    if (!hint.empty()) throw Error("cannot load weights from " + source_name + ": " + hint);
    std::string message = "cannot load weights from " + source_name + ": " + std::to_string(problems.size()) +
                          " problem" + (problems.size() > 1 ? "s" : "") + ":";
    constexpr size_t kListed = 12;
    for (size_t i = 0; i < problems.size() && i < kListed; ++i) message += "\n  " + problems[i];
    if (problems.size() > kListed) message += "\n  ... and " + std::to_string(problems.size() - kListed) + " more";
    throw Error(message);
  }
  for (const auto& [key, tensor] : tensors) {
    check(!tensor.is_floating_point() || torch::isfinite(tensor).all().item<bool>(),
          "cannot load weights from " + source_name + ": tensor " + key +
              " holds NaN or infinite values (a corrupt file, or weights of a diverged run)");
  }
  torch::NoGradGuard no_grad;
  for (const auto& [key, target] : targets) {
    // copy_ converts dtype and device into the target, so the module stays where it was.
    target.copy_(*given.at(key));
  }
}

void load_weights(torch::nn::Module& module, const std::string& path) {
  const auto tensors = format_of(path) == Format::Pth ? io::read_pth(path) : io::read_safetensors(path);
  load_state_dict(module, tensors, path);
}

void save_weights(const torch::nn::Module& module, const std::string& path) { write_weights(path, state_dict(module)); }

void write_weights(const std::string& path, const io::NamedTensors& tensors) {
  const auto format = format_of(path);
  if (format == Format::Pth) {
    io::write_pth(path, tensors);
  } else {
    io::write_safetensors(path, tensors);
  }
}

}  // namespace ptrain::models
