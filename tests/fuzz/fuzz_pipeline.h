// The stages the fuzzer drives (tests/fuzz/fuzz_model_loading.cc), shared with the GoogleTest
// that replays tests/fuzz/regressions and the seed corpus in every build (test_fuzz_regressions.cc).
#pragma once

#include <string_view>

#include "csrc/core/compile.h"
#include "csrc/core/ir/onnx_io.h"
#include "csrc/core/ir/verifier.h"

namespace torch_ort::fuzz {

// The engine's build (core::compile, as Engine::Engine calls it), verifying after every pass;
// every float input requires grad and every recompute plan of level 1 is on.
inline void compile_like_the_engine(std::string_view bytes) {
  core::CompileOptions options;
  options.training = true;
  options.every_float_input_requires_grad = true;
  options.memory_opt_level = 1;
  options.verify_after_each_pass = true;
  const core::Compiled c = core::compile(bytes, options);
  verify(c.forward);

  // What DebugOptions(save_onnx=True) writes must verify and load back.
  const Graph exportable = as_exportable_graph(*c.training);
  verify(exportable);
  Graph back = import_onnx(export_onnx(exportable));
  topological_sort(back);
  verify(back);
}

}  // namespace torch_ort::fuzz
