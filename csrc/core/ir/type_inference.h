// Fills in dtypes the exporter left out of value_info (Constant outputs, shape arithmetic), so
// every value in an imported graph is typed before the verifier and autodiff see it.
#pragma once

#include "csrc/core/ir/graph.h"

namespace torch_ort {

// Infers the dtype of each node output whose dtype is undefined, in topological order.
// Throws VerifyError naming the node when an output's dtype cannot be determined.
void infer_missing_dtypes(Graph& g);

}  // namespace torch_ort
