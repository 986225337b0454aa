// The op-traits registry declared by ir/op_traits.h: every family's lines (ops/<family>.cc,
// families.h) in one index, built on first use.
#include "csrc/core/ir/op_traits.h"

#include <map>
#include <stdexcept>
#include <utility>

#include "csrc/core/ops/families.h"

namespace torch_ort {
namespace {

using Key = std::pair<std::string, std::string>;  // (domain, op), domain "" for ai.onnx

const std::map<Key, OpTraits>& index() {
  static const std::map<Key, OpTraits> idx = [] {
    std::map<Key, OpTraits> m;
    for (auto* family : {&ops::elementwise_ops, &ops::shape_ops, &ops::index_ops, &ops::reduce_ops,
                         &ops::linalg_ops, &ops::cnn_ops, &ops::nn_ops, &ops::attention_ops,
                         &ops::fused_ops, &ops::random_ops, &ops::aten_ops, &ops::transfer_ops}) {
      for (OpEntry& e : family()) {
        Key key{std::string(e.domain), std::string(e.op_type)};
        if ((e.traits.random || e.traits.opaque) && e.traits.recomputable)
          throw std::logic_error("ops/: " + key.second + " is random or opaque, so it cannot be recomputable");
        if (!m.emplace(key, std::move(e.traits)).second)
          throw std::logic_error("ops/: two entries for " + key.first + "::" + key.second);
      }
    }
    return m;
  }();
  return idx;
}

}  // namespace

const OpTraits* find_op(std::string_view domain, std::string_view op_type) {
  auto it = index().find(Key{std::string(domain), std::string(op_type)});
  return it == index().end() ? nullptr : &it->second;
}

const OpTraits& op_traits(const Node& n) {
  static const OpTraits kNoTraits;
  const OpTraits* t = find_op(n.domain, n.op_type);
  return t ? *t : kNoTraits;
}

std::vector<std::string> op_traits_ops() {
  std::vector<std::string> out;
  for (const auto& [key, _] : index()) out.push_back(key.first + "::" + key.second);
  return out;
}

}  // namespace torch_ort
