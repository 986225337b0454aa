// Shape rules of our gradient ops whose output shapes the gradient builder declares when it emits
// them: a gradient has the shape of the input it differentiates (GradCtx::set_grad, ours_multi's
// `like` values), so there is nothing to infer — only the declaration to keep. The run-time check
// (Engine.check_shapes, tests/python/test_shapes.py) holds those declarations to the real tensors.
#include "csrc/core/ir/graph.h"
#include "csrc/core/shapes/shape_rules.h"

namespace torch_ort {
namespace {

void declared_by_gradient_builder(ShapeCtx&) {}
// An ATen operator carried by name: the core knows nothing of its semantics, so its results keep
// the shapes the exporter recorded (or stay unknown); never an error.
void opaque_aten_op(ShapeCtx&) {}

}  // namespace

// Indexing family: (dY, shape_of(X), ...) or one output per forward input.
REGISTER_SHAPE_RULE_IN(kOurDomain, "GatherGrad", declared_by_gradient_builder);
REGISTER_SHAPE_RULE_IN(kOurDomain, "GatherElementsGrad", declared_by_gradient_builder);
REGISTER_SHAPE_RULE_IN(kOurDomain, "GatherNDGrad", declared_by_gradient_builder);
REGISTER_SHAPE_RULE_IN(kOurDomain, "SliceGrad", declared_by_gradient_builder);
REGISTER_SHAPE_RULE_IN(kOurDomain, "ConcatGrad", declared_by_gradient_builder);
REGISTER_SHAPE_RULE_IN(kOurDomain, "SplitGrad", declared_by_gradient_builder);
REGISTER_SHAPE_RULE_IN(kOurDomain, "TileGrad", declared_by_gradient_builder);
REGISTER_SHAPE_RULE_IN(kOurDomain, "MinMaxGrad", declared_by_gradient_builder);
// NN family.
REGISTER_SHAPE_RULE_IN(kOurDomain, "LayerNormalizationGrad", declared_by_gradient_builder);
REGISTER_SHAPE_RULE_IN(kOurDomain, "LayerNormalizationScaleGrad", declared_by_gradient_builder);
REGISTER_SHAPE_RULE_IN(kOurDomain, "GeluGrad", declared_by_gradient_builder);
REGISTER_SHAPE_RULE_IN(kOurDomain, "ErfGrad", declared_by_gradient_builder);
REGISTER_SHAPE_RULE_IN(kOurDomain, "EmbeddingGrad", declared_by_gradient_builder);
REGISTER_SHAPE_RULE_IN(kOurDomain, "CrossEntropyLossGrad", declared_by_gradient_builder);
// ATen fallback (aten_op.h): ATenOpGrad's outputs are declared like its inputs.
REGISTER_SHAPE_RULE_IN(kOurDomain, "ATenOp", opaque_aten_op);
REGISTER_SHAPE_RULE_IN(kOurDomain, "PythonOp", opaque_aten_op);  // shapes from the Function's probe run
REGISTER_SHAPE_RULE_IN(kOurDomain, "ATenOpGrad", declared_by_gradient_builder);
// CNN family.
REGISTER_SHAPE_RULE_IN(kOurDomain, "ConvGrad", declared_by_gradient_builder);
REGISTER_SHAPE_RULE_IN(kOurDomain, "ConvTransposeGrad", declared_by_gradient_builder);
REGISTER_SHAPE_RULE_IN(kOurDomain, "MaxPoolGrad", declared_by_gradient_builder);
REGISTER_SHAPE_RULE_IN(kOurDomain, "AveragePoolGrad", declared_by_gradient_builder);
REGISTER_SHAPE_RULE_IN(kOurDomain, "GlobalMaxPoolGrad", declared_by_gradient_builder);
REGISTER_SHAPE_RULE_IN(kOurDomain, "BatchNormalizationGrad", declared_by_gradient_builder);

}  // namespace torch_ort
