#include "ptrain/models/model.h"

#include "ptrain/core/error.h"

namespace ptrain::models {

std::shared_ptr<Model> Model::make_replica() const {
  throw Error("model '" + name() + "' cannot make replicas of itself, which --strategy dp needs");
}

}  // namespace ptrain::models
