#include "ptrain/cli/verify.h"

#include "ptrain/core/error.h"
#include "ptrain/train/checkpoint.h"

namespace ptrain::cli {

namespace {

// The first tensor holding a NaN or an infinity, or "".
std::string first_non_finite(const train::Checkpoint& c) {
  for (const auto* section : {&c.model, &c.optimizer, &c.scaler}) {
    for (const auto& [name, tensor] : *section) {
      if (tensor.is_floating_point() && !torch::isfinite(tensor).all().item<bool>()) return name;
    }
  }
  return "";
}

// A rank or part file alone: every floating-point tensor it holds is finite.
void require_finite(const io::NamedTensors& tensors) {
  for (const auto& [name, tensor] : tensors) {
    check(!tensor.is_floating_point() || torch::isfinite(tensor).all().item<bool>(),
          "tensor '" + name + "' holds NaN or infinite values (a diverged run)");
  }
}

// "FILE: ok, ..." of a rank file of a sharded checkpoint, checked for what it is: a shard file alone holds
// no step or model, which only the checkpoint beside it and every rank file together make up.
std::string verify_shard(const std::string& file) {
  const train::ShardFile shard = train::load_shard(file);
  require_finite(shard.tensors);
  return "ok, rank file " + std::to_string(shard.rank) + " of " + std::to_string(shard.ranks) + " of a sharded " +
         "checkpoint, " + std::to_string(shard.tensors.size()) + " tensors";
}

// "FILE: ok, ..." of a part file of a checkpoint, which alone holds some of its tensors and nothing of where
// the run stood.
std::string verify_part(const std::string& file) {
  const train::PartFile part = train::load_part(file);
  require_finite(part.tensors);
  return "ok, part file " + std::to_string(part.part) + " of " + std::to_string(part.parts) + " of a checkpoint, " +
         std::to_string(part.tensors.size()) + " tensors";
}

}  // namespace

int verify_checkpoints(const std::vector<std::string>& files, std::ostream& out) {
  int failed = 0;
  for (const auto& file : files) {
    try {
      if (train::named_as_shard(file)) {
        out << file << ": " << verify_shard(file) << std::endl;
        continue;
      }
      if (train::named_as_part(file)) {
        out << file << ": " << verify_part(file) << std::endl;
        continue;
      }
      const train::Checkpoint c = train::load_checkpoint(file);
      const std::string bad = first_non_finite(c);
      check(bad.empty(), "tensor '" + bad + "' holds NaN or infinite values (a diverged run)");
      out << file << ": ok, step " << c.position.global_step << " (epoch " << c.position.epoch + 1 << ", micro-batch "
          << c.position.micro_batch << "), " << c.model.size() << " model tensors"
          << (c.shards > 0 ? ", " + std::to_string(c.shards) + " shard files" : "")
          << (c.parts > 0 ? ", " + std::to_string(c.parts) + " part files" : "") << ", weights "
          << train::weights_digest(c) << std::endl;
    } catch (const std::exception& e) {
      ++failed;
      // The loader's messages already begin with the file's name.
      std::string why = e.what();
      if (why.rfind(file + ": ", 0) == 0) why = why.substr(file.size() + 2);
      out << file << ": error: " << why.substr(0, why.find('\n')) << std::endl;
    }
  }
  return failed;
}

}  // namespace ptrain::cli
