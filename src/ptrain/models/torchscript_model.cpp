#include "ptrain/models/torchscript_model.h"

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/passes/shape_analysis.h>
#include <torch/csrc/jit/python/update_graph_executor_opt.h>

#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "ptrain/core/error.h"
#include "ptrain/core/text.h"
#include "ptrain/models/activation_checkpoint.h"

namespace ptrain::models {

namespace jit = torch::jit;

namespace {

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

// The interpreter's errors end with the operator's own message, after a TorchScript traceback.
std::string interpreter_error(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  std::string text = c10_error ? c10_error->what_without_backtrace() : e.what();
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  const auto marker = text.rfind("RuntimeError: ");
  if (marker != std::string::npos) return first_line(text.substr(marker + 14));
  const auto last = text.rfind('\n');
  return last == std::string::npos ? text : text.substr(last + 1);
}

std::string join_path(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

std::string shape_text(at::IntArrayRef sizes) {
  std::ostringstream out;
  out << sizes;
  return out.str();
}

// "__torch__.torch.nn.modules.container.___torch_mangle_3.Sequential" -> "Sequential": the class name, as
// --wrap-types names it.
std::string class_name(const jit::Module& module) { return module.type()->name()->name(); }

// One submodule of the scripted module, holding the very tensors the module holds (same TensorImpl), so
// that ptrain's strategies move, flatten and shard them in place under the names state_dict() gives them.
class ScriptedSubmodule : public torch::nn::Module {
 public:
  explicit ScriptedSubmodule(std::string type_name) : torch::nn::Module(std::move(type_name)) {}
  void to(torch::Device device, torch::Dtype dtype, bool non_blocking) override {
    to_floating_point(*this, device, dtype, non_blocking);
  }
  void to(torch::Dtype dtype, bool non_blocking) override { to_floating_point(*this, c10::nullopt, dtype, non_blocking); }
  void to(torch::Device device, bool non_blocking) override { torch::nn::Module::to(device, non_blocking); }
};

// Registers module's parameters, buffers and submodules on holder, recursively; a tensor that appears
// twice (tied weights) is registered once, under its first name. Returns the holders by path.
void mirror(const jit::Module& module, torch::nn::Module& holder, const std::string& prefix,
            std::unordered_set<const void*>& seen, std::map<std::string, std::shared_ptr<torch::nn::Module>>& by_path) {
  for (const auto& p : module.named_parameters(/*recurse=*/false)) {
    if (!seen.insert(p.value.unsafeGetTensorImpl()).second) continue;
    holder.register_parameter(p.name, p.value, p.value.requires_grad());
  }
  for (const auto& b : module.named_buffers(/*recurse=*/false)) {
    if (!seen.insert(b.value.unsafeGetTensorImpl()).second) continue;
    holder.register_buffer(b.name, b.value);
  }
  for (const auto& child : module.named_children()) {
    auto proxy = std::make_shared<ScriptedSubmodule>(class_name(child.value));
    holder.register_module(child.name, proxy);
    const std::string path = join_path(prefix, child.name);
    by_path[path] = proxy;
    mirror(child.value, *proxy, path, seen, by_path);
  }
}

jit::Module submodule_at(const jit::Module& root, const std::string& path) {
  jit::Module m = root;
  std::stringstream parts(path);
  std::string part;
  while (!path.empty() && std::getline(parts, part, '.')) m = m.attr(part).toModule();
  return m;
}

bool is_module_type(const c10::TypePtr& type) {
  const auto cls = type->cast<c10::ClassType>();
  return cls != nullptr && cls->is_module();
}

// The graph a prim::CallMethod or prim::CallFunction node runs, for walks that look into what a block calls;
// nullptr for any other node, or a callee without a graph.
const jit::Graph* called_graph(const jit::Node* node) {
  if (node->kind() == c10::prim::CallMethod) {
    if (const auto cls = node->input(0)->type()->cast<c10::ClassType>()) {
      if (auto* method = cls->findMethod(node->s(c10::attr::name))) {
        if (auto* graph_function = jit::tryToGraphFunction(*method)) return graph_function->graph().get();
      }
    }
  } else if (node->kind() == c10::prim::CallFunction) {
    if (const auto fn = node->input(0)->type()->cast<c10::FunctionType>()) {
      if (auto* graph_function = jit::tryToGraphFunction(*fn->function())) return graph_function->graph().get();
    }
  }
  return nullptr;
}

// Operators that draw random numbers: a recomputation in backward would draw others. Looks through the
// methods and functions the block calls.
bool draws_random_numbers(const jit::Block* block, std::string* op, int depth = 0) {
  static const std::set<std::string> random_ops = {
      "aten::dropout", "aten::dropout_", "aten::feature_dropout", "aten::feature_dropout_", "aten::alpha_dropout",
      "aten::alpha_dropout_", "aten::feature_alpha_dropout", "aten::feature_alpha_dropout_", "aten::bernoulli",
      "aten::bernoulli_", "aten::rand", "aten::rand_like", "aten::randn", "aten::randn_like", "aten::randint",
      "aten::randint_like", "aten::randperm", "aten::normal", "aten::normal_", "aten::uniform_", "aten::multinomial",
      "aten::rrelu", "aten::rrelu_", "aten::native_dropout"};
  if (depth > 64) return false;
  for (const auto* node : block->nodes()) {
    const std::string kind = node->kind().toQualString();
    if (random_ops.count(kind)) {
      *op = kind;
      return true;
    }
    const jit::Graph* callee = called_graph(node);
    if (callee != nullptr && draws_random_numbers(callee->block(), op, depth + 1)) return true;
    for (const auto* inner : node->blocks()) {
      if (draws_random_numbers(inner, op, depth + 1)) return true;
    }
  }
  return false;
}

// Batch norms and dropouts whose training flag the graph holds as a constant: what torch.jit.trace records
// (the mode the module was in when traced), where torch.jit.script reads the module's `training` attribute.
struct RecordedModes {
  int batch_norm_train = 0, batch_norm_eval = 0, dropout_train = 0, dropout_eval = 0;
};

void count_recorded_modes(const jit::Block* block, RecordedModes& modes, int depth = 0) {
  // The operator and the index of its training argument.
  static const std::map<std::string, size_t> mode_ops = {
      {"aten::batch_norm", 5},      {"aten::dropout", 2},          {"aten::dropout_", 2},
      {"aten::feature_dropout", 2}, {"aten::feature_dropout_", 2}, {"aten::alpha_dropout", 2},
      {"aten::alpha_dropout_", 2},  {"aten::feature_alpha_dropout", 2}, {"aten::feature_alpha_dropout_", 2}};
  if (depth > 64) return;
  for (const auto* node : block->nodes()) {
    const auto op = mode_ops.find(node->kind().toQualString());
    if (op != mode_ops.end() && node->inputs().size() > op->second) {
      const auto flag = jit::toIValue(node->input(op->second));
      if (flag && flag->isBool()) {
        const bool batch_norm = op->first == "aten::batch_norm";
        (flag->toBool() ? (batch_norm ? modes.batch_norm_train : modes.dropout_train)
                        : (batch_norm ? modes.batch_norm_eval : modes.dropout_eval))++;
      }
    }
    const jit::Graph* callee = called_graph(node);
    if (callee != nullptr) count_recorded_modes(callee->block(), modes, depth + 1);
    for (const auto* inner : node->blocks()) count_recorded_modes(inner, modes, depth + 1);
  }
}

std::string counted(int n, const std::string& what) {
  return std::to_string(n) + " " + what + (n == 1 ? "" : "s");
}

// Empty when the module's batch norms and dropouts follow train() and eval(), as scripted ones do.
std::string recorded_mode_text(const std::string& path, const RecordedModes& m) {
  std::vector<std::string> problems;
  if (m.batch_norm_train + m.dropout_train > 0) {
    std::string fixed;
    if (m.batch_norm_train > 0) fixed = counted(m.batch_norm_train, "batch norm") + " on batch statistics";
    if (m.dropout_train > 0) fixed += (fixed.empty() ? "" : " and ") + counted(m.dropout_train, "dropout") + " on";
    problems.push_back("was traced in training mode: its graph keeps " + fixed +
                       " in evaluation too, so ptrain's test accuracy is not that of model.eval()");
  }
  if (m.batch_norm_eval + m.dropout_eval > 0) {
    std::string fixed;
    if (m.batch_norm_eval > 0)
      fixed = counted(m.batch_norm_eval, "batch norm") + " on running statistics (frozen: never updated)";
    if (m.dropout_eval > 0) fixed += (fixed.empty() ? "" : " and ") + counted(m.dropout_eval, "dropout") + " off";
    problems.push_back("was traced in eval mode: its graph keeps " + fixed + " while training too");
  }
  if (problems.empty()) return "";
  std::string text = path + " ";
  for (size_t i = 0; i < problems.size(); ++i) text += (i ? "; and it " : "") + problems[i];
  return text + ". torch.jit.trace records the mode the module was in; export with torch.jit.script(model), whose "
                "batch norm and dropout follow train() and eval(), or trace in the mode the export will be used in";
}

// Thrown inside the splitter when the forward is not a chain of submodule calls.
struct NotAChain {
  std::string reason;
};

// A stretch of the forward graph cut out as a graph of its own: (root module, x) -> tensor. It starts at
// a unit's call (the first also holds what comes before it) and runs up to the next unit's call.
struct Segment {
  std::shared_ptr<jit::Graph> graph;
  jit::Value* self = nullptr;
  jit::Value* input = nullptr;
  std::string unit;          // path of the submodule it calls
  bool has_call = false;
  bool reads_state = false;  // its computation besides the call reads a parameter or buffer
  std::unordered_map<std::string, jit::Value*> materialized;  // per path: the module or attribute value
};

// What a value of the source graphs stands for while the splitter walks them.
struct Binding {
  enum Kind { Module, Constant, Attr, Live } kind = Live;
  std::string path;                 // Module: its path; Attr: the attribute's full path
  std::string owner;                // Attr: the module holding it
  std::string field;                // Attr
  bool tensor = false;              // Attr: a parameter or buffer
  jit::Node* constant = nullptr;    // Constant: the node to clone
  int segment = -1;                 // Live
  jit::Value* value = nullptr;      // Live: the value in that segment's graph
};

using Env = std::unordered_map<const jit::Value*, Binding>;

class Splitter {
 public:
  Splitter(jit::Module root, std::map<std::string, bool>& expandable_cache)
      : root_(std::move(root)), expandable_(expandable_cache) {}

  // Cuts root's forward into segments; throws NotAChain.
  std::vector<Segment> run(const std::string& root_path) {
    root_path_ = root_path;
    const auto method = root_.find_method("forward");
    if (!method) throw NotAChain{"it has no forward method"};
    const auto& graph = *method->graph();
    if (graph.inputs().size() != 2) throw NotAChain{"its forward takes more than one input"};
    new_segment();
    Env env;
    Binding x;
    x.kind = Binding::Live;
    x.segment = 0;
    x.value = segments_[0].input;
    const auto out = walk(graph, "", {x});
    if (units_.empty()) throw NotAChain{"its forward calls no submodule"};
    if (out.kind != Binding::Live || out.segment != current()) throw NotAChain{"its output is not computed from its input"};
    segments_.back().graph->registerOutput(out.value);
    check_accesses();
    for (auto& s : segments_) {
      jit::EraseShapeInformation(s.graph);
      s.graph->lint();
    }
    return std::move(segments_);
  }

 private:
  int current() const { return static_cast<int>(segments_.size()) - 1; }

  void new_segment() {
    Segment s;
    s.graph = std::make_shared<jit::Graph>();
    s.self = s.graph->addInput("self")->setType(root_.type());
    s.input = s.graph->addInput("x")->setType(c10::TensorType::get());
    segments_.push_back(std::move(s));
  }

  // Paths here are relative to root_ (root_path_ prefixes them in messages and unit names).
  std::string full(const std::string& path) const { return join_path(root_path_, path); }
  std::string shown(const std::string& path) const { return path.empty() ? "the module itself" : "'" + full(path) + "'"; }

  jit::Value* module_value(Segment& s, const std::string& path) {
    if (path.empty()) return s.self;
    auto it = s.materialized.find(path);
    if (it != s.materialized.end()) return it->second;
    const auto dot = path.rfind('.');
    jit::Value* parent = module_value(s, dot == std::string::npos ? "" : path.substr(0, dot));
    jit::Value* v = s.graph->insertGetAttr(parent, dot == std::string::npos ? path : path.substr(dot + 1));
    s.materialized[path] = v;
    return v;
  }

  // The binding as a value of the current segment; a value computed in an earlier segment is not
  // available there, which is what makes the forward no chain.
  jit::Value* materialize(const Binding& b, const jit::Value* source) {
    auto& s = segments_.back();
    switch (b.kind) {
      case Binding::Module:
        accessed_.insert(b.path);
        return module_value(s, b.path);
      case Binding::Constant: {
        const std::string key = "#constant" + std::to_string(reinterpret_cast<uintptr_t>(b.constant));
        auto it = s.materialized.find(key);
        if (it != s.materialized.end()) return it->second;
        auto* clone = s.graph->insertNode(s.graph->createClone(b.constant, [](jit::Value* v) { return v; }));
        return s.materialized[key] = clone->output();
      }
      case Binding::Attr: {
        accessed_.insert(b.path);
        if (b.tensor) s.reads_state = true;
        auto it = s.materialized.find(b.path);
        if (it != s.materialized.end()) return it->second;
        return s.materialized[b.path] = s.graph->insertGetAttr(module_value(s, b.owner), b.field);
      }
      case Binding::Live:
        if (b.segment != current()) {
          throw NotAChain{"a value computed before " + shown(segments_[static_cast<size_t>(b.segment) + 1].unit) +
                          " (" + (source->hasDebugName() ? "%" + source->debugName() : std::string("a temporary")) +
                          ") is used after it"};
        }
        return b.value;
    }
    return nullptr;
  }

  // Module paths used by a node's blocks through values bound outside them (a free variable that is a
  // module, or an attribute read from one).
  void note_block_accesses(const jit::Block* block, const Env& env, std::unordered_map<const jit::Value*, std::string>& inner) {
    for (const auto* node : block->nodes()) {
      if (node->kind() == c10::prim::SetAttr) throw NotAChain{"its forward assigns a module attribute"};
      const auto module_path_of = [&](const jit::Value* v) -> const std::string* {
        auto it = inner.find(v);
        if (it != inner.end()) return &it->second;
        auto outer = env.find(v);
        if (outer != env.end() && outer->second.kind == Binding::Module) return &outer->second.path;
        return nullptr;
      };
      if (node->kind() == c10::prim::GetAttr) {
        if (const auto* path = module_path_of(node->input(0))) {
          const std::string child = join_path(*path, node->s(c10::attr::name));
          if (is_module_type(node->output()->type())) {
            inner[node->output()] = child;
          } else {
            accessed_.insert(child);
          }
          continue;
        }
      }
      for (const auto* input : node->inputs()) {
        if (const auto* path = module_path_of(input)) accessed_.insert(*path);
      }
      for (const auto* b : node->blocks()) note_block_accesses(b, env, inner);
    }
  }

  // Any node that is not a unit's call: cloned into the current segment.
  void glue(const jit::Node* node, Env& env) {
    if (node->kind() == c10::prim::SetAttr) throw NotAChain{"its forward assigns a module attribute"};
    for (const auto* out : node->outputs()) {
      if (is_module_type(out->type())) throw NotAChain{"its forward computes a module value"};
    }
    std::unordered_map<const jit::Value*, std::string> inner;
    for (const auto* b : node->blocks()) note_block_accesses(b, env, inner);
    auto& s = segments_.back();
    auto* clone = s.graph->createClone(const_cast<jit::Node*>(node), [&](jit::Value* v) {
      auto it = env.find(v);
      if (it == env.end()) throw NotAChain{"its graph uses a value the splitter does not know"};
      return materialize(it->second, v);
    });
    s.graph->insertNode(clone);
    for (size_t i = 0; i < node->outputs().size(); ++i) {
      Binding b;
      b.kind = Binding::Live;
      b.segment = current();
      b.value = clone->output(i);
      env[node->output(i)] = b;
    }
  }

  // A unit's call: the current segment ends with the call's input, and a new one starts with it (the
  // first unit joins the first segment, which then holds what came before it).
  Binding unit_call(const jit::Node* call, const std::string& path, const Binding& argument, const jit::Value* source) {
    if (!units_.insert(path).second) throw NotAChain{shown(path) + " is called more than once"};
    if (argument.kind != Binding::Live) throw NotAChain{"the input of " + shown(path) + " is not computed from the model's input"};
    jit::Value* x = materialize(argument, source);
    if (segments_.back().has_call) {
      segments_.back().graph->registerOutput(x);
      new_segment();
      x = segments_.back().input;
    }
    auto& s = segments_.back();
    s.has_call = true;
    s.unit = path;
    jit::Value* module = module_value(s, path);
    auto* clone = s.graph->createClone(const_cast<jit::Node*>(call), [&](jit::Value* v) {
      return v == call->input(0) ? module : x;
    });
    s.graph->insertNode(clone);
    Binding out;
    out.kind = Binding::Live;
    out.segment = current();
    out.value = clone->output();
    return out;
  }

  bool expandable(const std::string& path) {
    auto it = expandable_.find(full(path));
    if (it != expandable_.end()) return it->second;
    bool result = false;
    const jit::Module module = submodule_at(root_, path);
    if (module.named_children().size() > 0) {
      try {
        Splitter inner(module, expandable_);
        inner.run(full(path));
        result = true;
      } catch (const NotAChain&) {
      }
    }
    expandable_[full(path)] = result;
    return result;
  }

  // Walks one method's graph with `self` the module at owner_path and the other inputs bound to args;
  // returns the binding of its single output.
  Binding walk(const jit::Graph& graph, const std::string& owner_path, const std::vector<Binding>& args) {
    if (++depth_ > 64) throw NotAChain{"its methods call each other too deeply"};
    Env env;
    Binding self;
    self.kind = Binding::Module;
    self.path = owner_path;
    env[graph.inputs()[0]] = self;
    if (graph.inputs().size() != args.size() + 1) throw NotAChain{"a method's arguments do not match its call"};
    for (size_t i = 0; i < args.size(); ++i) env[graph.inputs()[i + 1]] = args[i];
    const auto lookup = [&](const jit::Value* v) -> const Binding& {
      auto it = env.find(v);
      if (it == env.end()) throw NotAChain{"its graph uses a value the splitter does not know"};
      return it->second;
    };
    for (const auto* node : graph.nodes()) {
      const auto kind = node->kind();
      if (kind == c10::prim::Constant && node->inputs().empty()) {
        Binding b;
        b.kind = Binding::Constant;
        b.constant = const_cast<jit::Node*>(node);
        env[node->output()] = b;
        continue;
      }
      if (kind == c10::prim::GetAttr && lookup(node->input(0)).kind == Binding::Module) {
        const std::string owner = lookup(node->input(0)).path;
        const std::string field = node->s(c10::attr::name);
        Binding b;
        if (is_module_type(node->output()->type())) {
          b.kind = Binding::Module;
          b.path = join_path(owner, field);
        } else {
          b.kind = Binding::Attr;
          b.owner = owner;
          b.field = field;
          b.path = join_path(owner, field);
          b.tensor = node->output()->type()->isSubtypeOf(*c10::TensorType::get());
        }
        env[node->output()] = b;
        continue;
      }
      if (kind == c10::prim::CallMethod && lookup(node->input(0)).kind == Binding::Module) {
        const std::string target = lookup(node->input(0)).path;
        const std::string method = node->s(c10::attr::name);
        std::vector<Binding> call_args;
        for (size_t i = 1; i < node->inputs().size(); ++i) call_args.push_back(lookup(node->input(i)));
        if (node->outputs().size() != 1) throw NotAChain{"a method call returns several values"};
        const jit::Module callee = submodule_at(root_, target);
        if (target == owner_path || (method == "forward" && expandable(target))) {
          env[node->output()] = walk(*callee.get_method(method).graph(), target, call_args);
          continue;
        }
        const bool tensor_in_out = node->inputs().size() == 2 &&
                                   node->input(1)->type()->isSubtypeOf(*c10::TensorType::get()) &&
                                   node->output()->type()->isSubtypeOf(*c10::TensorType::get());
        if (method == "forward" && tensor_in_out) {
          env[node->output()] = unit_call(node, target, call_args[0], node->input(1));
          continue;
        }
      }
      glue(node, env);
    }
    const auto outputs = graph.outputs();
    if (outputs.size() != 1) throw NotAChain{"a method returns several values"};
    --depth_;
    return lookup(outputs[0]);
  }

  // A unit's parameters must be used by its call alone: ZeRO-3 frees them once the call is over.
  void check_accesses() const {
    for (const auto& unit : units_) {
      for (const auto& path : accessed_) {
        const bool inside = path == unit || path.rfind(unit + ".", 0) == 0;
        const bool around = unit.rfind(path + ".", 0) == 0 || path.empty();
        if (inside || around) {
          throw NotAChain{shown(path) + (inside ? " is used outside the call of " + shown(unit)
                                                 : " is used as a whole beside the call of " + shown(unit))};
        }
      }
    }
  }

  jit::Module root_;
  std::string root_path_;
  std::map<std::string, bool>& expandable_;
  std::vector<Segment> segments_;
  std::set<std::string> units_;
  std::set<std::string> accessed_;
  int depth_ = 0;
};

void check_is_torchscript_archive(const std::string& path) {
  std::ifstream stream(path, std::ios::binary);
  check(stream.good(), "--model " + path + ": cannot open the file");
  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> archive;
  try {
    archive = std::make_unique<caffe2::serialize::PyTorchStreamReader>(&stream);
  } catch (const c10::Error& e) {
    throw Error("--model " + path + ": not a TorchScript archive (expected the zip file torch.jit.save writes: " +
                first_line(e.what_without_backtrace()) + ")");
  }
  if (!archive->hasRecord("constants.pkl")) {
    throw Error("--model " + path +
                ": a torch.save file (a state dict or a pickled module), not a TorchScript archive; export the "
                "module with torch.jit.script(model).save(path) (or torch.jit.trace), or give these weights to "
                "--weights of a zoo model");
  }
}

void check_forward_signature(const std::string& path, const jit::Module& module) {
  const auto forward = module.find_method("forward");
  check(forward.has_value(), "--model " + path + ": the module has no forward method");
  const auto& schema = forward->function().getSchema();
  const auto& args = schema.arguments();
  size_t required = 0;
  for (size_t i = 1; i < args.size(); ++i) {
    if (!args[i].default_value().has_value()) ++required;
  }
  const bool tensor_in = args.size() >= 2 && required <= 1 && args[1].type()->isSubtypeOf(*c10::TensorType::get());
  const bool tensor_out = schema.returns().size() == 1 && schema.returns()[0].type()->isSubtypeOf(*c10::TensorType::get());
  std::ostringstream signature;
  signature << schema;
  check(tensor_in && tensor_out, "--model " + path + ": forward is " + signature.str() +
                                     "; ptrain trains a forward that takes one tensor (the batch) and returns one "
                                     "tensor of logits");
}

}  // namespace

struct TorchScriptModel::Graphs {
  struct Unit {
    std::string name;
    std::shared_ptr<torch::nn::Module> holder;
    std::unique_ptr<jit::GraphFunction> function;
    std::string not_checkpointed;  // why, or empty
  };
  std::vector<Unit> units;
  std::string units_note;
  std::string recorded_mode_warning;
};

bool is_torchscript_path(const std::string& name) {
  // A name longer than its suffix: ".pt" alone names no file.
  return (name.size() > 3 && ends_with(name, ".pt")) || (name.size() > 4 && ends_with(name, ".pth"));
}

TorchScriptModel::TorchScriptModel(std::string path, jit::Module module)
    : path_(std::move(path)), module_(std::move(module)), graphs_(std::make_shared<Graphs>()) {
  std::unordered_set<const void*> seen;
  std::map<std::string, std::shared_ptr<torch::nn::Module>> by_path;
  mirror(module_, *this, "", seen, by_path);
  torch::nn::Module::train(module_.is_training());
  RecordedModes modes;
  count_recorded_modes(module_.get_method("forward").graph()->block(), modes);
  graphs_->recorded_mode_warning = recorded_mode_text(path_, modes);

  std::map<std::string, bool> expandable;
  std::vector<Segment> segments;
  try {
    segments = Splitter(module_, expandable).run("");
  } catch (const NotAChain& e) {
    graphs_->units_note = "the forward of " + path_ + " is not a chain of submodule calls (" + e.reason +
                          "), so it has no units: zero3 and fsdp gather it whole";
  } catch (const c10::Error& e) {
    graphs_->units_note = "ptrain could not cut the forward of " + path_ + " into units (" +
                          first_line(e.what_without_backtrace()) + "), so it has none: zero3 and fsdp gather it whole";
  }
  for (size_t i = 0; i < segments.size(); ++i) {
    auto& s = segments[i];
    Graphs::Unit unit;
    unit.name = s.unit;
    unit.holder = by_path.at(s.unit);
    std::string op;
    if (draws_random_numbers(s.graph->block(), &op)) {
      unit.not_checkpointed = s.unit + " (" + op + ")";
    } else if (s.reads_state) {
      unit.not_checkpointed = s.unit + " (reads parameters outside it)";
    }
    unit.function = std::make_unique<jit::GraphFunction>(
        c10::QualifiedName("__ptrain__.unit" + std::to_string(i)), s.graph, nullptr);
    graphs_->units.push_back(std::move(unit));
  }
}

std::shared_ptr<TorchScriptModel> TorchScriptModel::load(const std::string& path, const ScriptInput& input) {
  check_is_torchscript_archive(path);
  jit::Module module;
  try {
    module = jit::load(path, torch::kCPU);
  } catch (const c10::Error& e) {
    throw Error("--model " + path + ": cannot load the TorchScript archive: " + first_line(e.what_without_backtrace()));
  }
  check_forward_signature(path, module);
  // The interpreter runs the graph op by op through the dispatcher, as eager PyTorch runs a module
  // (see the header); the optimising executor would fuse and differentiate parts of it on its own.
  jit::setGraphExecutorOptimize(false);
  auto model = std::shared_ptr<TorchScriptModel>(new TorchScriptModel(path, module));

  // A probe forward on two samples of the data's shape, in eval mode so that nothing (batch statistics)
  // changes.
  std::vector<int64_t> shape{2};
  shape.insert(shape.end(), input.sample_shape.begin(), input.sample_shape.end());
  const auto probe = input.tokens ? torch::zeros(shape, torch::kInt64) : torch::zeros(shape);
  const bool was_training = model->is_training();
  torch::Tensor logits;
  try {
    torch::NoGradGuard no_grad;
    model->train(false);
    logits = model->forward(probe);
    model->train(was_training);
  } catch (const std::exception& e) {
    model->train(was_training);
    throw Error("--model " + path + ": forward fails on a batch of shape " + shape_text(shape) + " (" +
                (input.tokens ? "int64 tokens" : "float images") + " of " + input.data_description +
                "): " + interpreter_error(e));
  }
  if (input.tokens) {
    check(logits.dim() == 3 && logits.size(0) == 2 && logits.size(1) == shape[1] && logits.size(2) >= input.classes,
          "--model " + path + ": forward returns shape " + shape_text(logits.sizes()) + " for tokens of shape " +
              shape_text(shape) + "; expected logits [2, " + std::to_string(shape[1]) + ", V] with V at least the " +
              std::to_string(input.classes) + " tokens of " + input.data_description);
  } else {
    check(logits.dim() == 2 && logits.size(0) == 2 && logits.size(1) == input.classes,
          "--model " + path + ": forward returns shape " + shape_text(logits.sizes()) + " for images of shape " +
              shape_text(shape) + "; expected logits [2, " + std::to_string(input.classes) + "] for the " +
              std::to_string(input.classes) + " classes of " + input.data_description);
  }
  check(logits.is_floating_point(), "--model " + path + ": forward returns " +
                                        std::string(c10::toString(logits.scalar_type())) + " values, not logits");
  return model;
}

// The interpreter reports an operator's failure as a std::runtime_error carrying the TorchScript traceback;
// it goes on as the c10::Error the operator raised (the trainer reads those, out-of-memory ones included),
// naming the file.
template <typename Body>
torch::Tensor rethrowing_interpreter_errors(const std::string& path, Body&& body) {
  try {
    return body();
  } catch (const c10::Error&) {
    throw;
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    TORCH_CHECK(false, path, ": ", interpreter_error(e));
  }
}

torch::Tensor TorchScriptModel::forward(torch::Tensor x) {
  return rethrowing_interpreter_errors(path_, [&] { return module_.forward({std::move(x)}).toTensor(); });
}

void TorchScriptModel::set_activation_checkpointing(bool on) {
  if (on) {
    check(!graphs_->units.empty(), "--activation-checkpointing recomputes a model unit by unit, but " + units_note());
    bool any = false;
    for (const auto& unit : graphs_->units) any = any || unit.not_checkpointed.empty();
    check(any, "--activation-checkpointing: no unit of " + path_ + " can be recomputed: " + checkpointing_note());
  }
  checkpointing_ = on;
}

std::shared_ptr<Model> TorchScriptModel::make_replica() const {
  auto replica = std::shared_ptr<TorchScriptModel>(new TorchScriptModel(path_, module_.clone()));
  replica->checkpointing_ = checkpointing_;
  replica->train(is_training());
  return replica;
}

std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> TorchScriptModel::units() {
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> result;
  for (const auto& unit : graphs_->units) result.emplace_back(unit.name, unit.holder);
  return result;
}

torch::Tensor TorchScriptModel::forward_unit(size_t index, torch::Tensor x) {
  check(index < graphs_->units.size(), "TorchScriptModel::forward_unit: index " + std::to_string(index) +
                                           " is beyond the " + std::to_string(graphs_->units.size()) + " units");
  auto& unit = graphs_->units[index];
  const auto run = [this, &unit](const torch::Tensor& in) {
    return rethrowing_interpreter_errors(path_, [&] {
      jit::Stack stack{c10::IValue(module_._ivalue()), in};
      unit.function->run(stack);
      return stack.back().toTensor();
    });
  };
  if (checkpointing_ && unit.not_checkpointed.empty() && is_training() && torch::GradMode::is_enabled()) {
    return checkpoint(run, x, *unit.holder);
  }
  return run(x);
}

void TorchScriptModel::train(bool on) {
  torch::nn::Module::train(on);
  module_.train(on);
}

void TorchScriptModel::to(torch::Device device, torch::Dtype dtype, bool non_blocking) {
  to_floating_point(*this, device, dtype, non_blocking);
}
void TorchScriptModel::to(torch::Dtype dtype, bool non_blocking) {
  to_floating_point(*this, c10::nullopt, dtype, non_blocking);
}
void TorchScriptModel::to(torch::Device device, bool non_blocking) { torch::nn::Module::to(device, non_blocking); }

const std::string& TorchScriptModel::units_note() const { return graphs_->units_note; }

const std::string& TorchScriptModel::recorded_mode_warning() const { return graphs_->recorded_mode_warning; }

std::string TorchScriptModel::checkpointing_note() const {
  std::string note;
  for (const auto& unit : graphs_->units) {
    if (!unit.not_checkpointed.empty()) note += (note.empty() ? "" : ", ") + unit.not_checkpointed;
  }
  return note.empty() ? "" : "not recomputed: " + note;
}

torch::jit::Module& TorchScriptModel::script_module() { return module_; }

}  // namespace ptrain::models
