// Numeric gradient cases of the CNN family: Conv, ConvTranspose, the pools, BatchNormalization
// and our BatchNormTraining, alone and as a small CNN (run by test_gradients.cc's checker, with
// static and symbolic shapes). Sizes stay tiny: every input element costs two graph evaluations.
#include "tests/cpp/grad_cases.h"

namespace torch_ort::gradcheck {
namespace {

const std::string kSameUpper = "SAME_UPPER", kSameLower = "SAME_LOWER";

ValueId bn_training(Graph& g, std::vector<ValueId> ins, Attributes a = {}) {  // our domain: no add_node
  std::vector<ValueId> outs;
  for (int i = 0; i < 5; ++i) outs.push_back(g.new_value("bn_out", DType::kUndefined, Shape::unknown()));
  g.nodes.push_back(Node{kOurDomain, "BatchNormTraining", g.unique_node_name("/bn"), std::move(ins), outs, std::move(a)});
  return outs[0];  // running statistics are buffers (no gradient); outputs 3, 4 feed backward
}

std::vector<Case> cnn_cases() {
  std::vector<Case> c = {
      // Conv: X (N, C, D...), W (M, C/group, k...), B (M)
      {"Conv_2d_bias", "Conv", {G({1, 2, 4, 4}), G({3, 2, 2, 2}), G({3})}},
      {"Conv_group_stride_dilation_pads", "Conv", {G({1, 4, 5, 5}), G({2, 2, 2, 2}), G({2})},
       A({{"group", I{2}}, {"strides", Dims{2, 1}}, {"dilations", Dims{1, 2}}, {"pads", Dims{1, 0, 0, 1}}})},
      {"Conv_1d_same_upper", "Conv", {G({2, 2, 5}), G({2, 2, 2}), Omit()}, A({{"auto_pad", kSameUpper}})},
      {"Conv_1d_same_lower_strided", "Conv", {G({1, 2, 6}), G({2, 2, 3})}, A({{"auto_pad", kSameLower}, {"strides", Dims{2}}})},
      {"Conv_3d", "Conv", {G({1, 1, 3, 3, 3}), G({2, 1, 2, 2, 2}), G({2})}, A({{"pads", Dims{1, 0, 0, 0, 1, 0}}})},
      {"Conv_weights_only", "Conv", {N({1, 2, 4, 3}), G({2, 2, 2, 2}), N({2})}},
      // ConvTranspose: W (C, M/group, k...)
      {"ConvTranspose_output_padding_group", "ConvTranspose", {G({1, 2, 3, 3}), G({2, 1, 3, 3}), G({2})},
       A({{"group", I{2}}, {"strides", Dims{2, 2}}, {"pads", Dims{1, 1, 1, 1}}, {"output_padding", Dims{1, 1}}})},
      {"ConvTranspose_asymmetric_pads", "ConvTranspose", {G({1, 2, 3, 2}), G({2, 2, 2, 3})},
       A({{"strides", Dims{2, 1}}, {"pads", Dims{1, 0, 0, 2}}})},
      {"ConvTranspose_1d_output_shape", "ConvTranspose", {G({2, 1, 4}), G({1, 2, 3}), G({2})},
       A({{"strides", Dims{2}}, {"output_shape", Dims{8}}})},
      // Pools (overlapping windows: one input is the max of several outputs)
      {"MaxPool_overlapping", "MaxPool", {G({1, 2, 5, 5})}, A({{"kernel_shape", Dims{3, 3}}, {"strides", Dims{2, 2}}})},
      {"MaxPool_pads_dilation_ceil", "MaxPool", {G({1, 1, 6, 5})},
       A({{"kernel_shape", Dims{2, 2}}, {"strides", Dims{2, 2}}, {"pads", Dims{1, 1, 1, 1}}, {"dilations", Dims{2, 1}}, {"ceil_mode", I{1}}})},
      {"MaxPool_1d", "MaxPool", {G({2, 2, 7})}, A({{"kernel_shape", Dims{3}}, {"strides", Dims{2}}})},
      {"MaxPool_same_upper", "MaxPool", {G({1, 1, 5, 4})}, A({{"kernel_shape", Dims{2, 3}}, {"strides", Dims{2, 2}}, {"auto_pad", kSameUpper}})},
      {"MaxPool_3d", "MaxPool", {G({1, 1, 3, 4, 3})}, A({{"kernel_shape", Dims{2, 2, 2}}})},
      {"AveragePool_exclude_pad_ceil", "AveragePool", {G({1, 2, 5, 5})},
       A({{"kernel_shape", Dims{3, 3}}, {"strides", Dims{2, 2}}, {"pads", Dims{1, 1, 1, 1}}, {"ceil_mode", I{1}}})},
      {"AveragePool_count_include_pad", "AveragePool", {G({1, 1, 4, 5})},
       A({{"kernel_shape", Dims{2, 3}}, {"pads", Dims{1, 1, 1, 1}}, {"count_include_pad", I{1}}})},
      {"AveragePool_asymmetric", "AveragePool", {G({1, 1, 5, 4})},
       A({{"kernel_shape", Dims{2, 2}}, {"strides", Dims{2, 2}}, {"pads", Dims{0, 1, 1, 0}}})},
      {"AveragePool_1d", "AveragePool", {G({2, 1, 6})}, A({{"kernel_shape", Dims{2}}, {"strides", Dims{2}}})},
      {"GlobalAveragePool_2d", "GlobalAveragePool", {G({2, 3, 3, 2})}},
      {"GlobalMaxPool_2d", "GlobalMaxPool", {G({2, 2, 3, 3})}},
      {"GlobalMaxPool_1d", "GlobalMaxPool", {G({1, 3, 5})}},
      // ONNX BatchNormalization: the statistics are non-differentiable inputs
      {"BatchNormalization_inference", "BatchNormalization", {G({2, 3, 2, 2}), G({3}), G({3}), N({3}), W({3})},
       A({{"epsilon", 1e-3f}})},
  };
  c.push_back({"BatchNormalization_training_mode", "BatchNormalization", {G({3, 2, 2}), G({2}), G({2}), N({2}), W({2})}, {}, 1,
               [](Graph& g, const std::vector<ValueId>& in) {
                 return std::vector<ValueId>{add_node(g, "BatchNormalization", in, A({{"training_mode", I{1}}}), 3)[0]};
               }});
  c.push_back({"BatchNormTraining_affine_running_stats", "com.torch_ort::BatchNormTraining",
               {G({2, 3, 2, 2}), G({3}), G({3}), N({3}), W({3})}, {}, 1,
               [](Graph& g, const std::vector<ValueId>& in) {
                 return std::vector<ValueId>{bn_training(g, in, A({{"momentum", 0.1f}, {"epsilon", 1e-5f}}))};
               }});
  c.push_back({"BatchNormTraining_no_affine", "com.torch_ort::BatchNormTraining", {G({4, 2, 3})}, {}, 1,
               [](Graph& g, const std::vector<ValueId>& in) { return std::vector<ValueId>{bn_training(g, in)}; }});
  // Conv -> BatchNormTraining -> Relu -> MaxPool -> GlobalAveragePool -> Flatten -> Gemm -> loss:
  // the small CNN of tests/python/test_cnn.py, every weight trainable.
  c.push_back({"CNN_classifier", "Conv",
               {N({2, 1, 5, 5}), G({2, 1, 2, 2}), G({2}), P({2}), G({2}), N({2}), W({2}), G({3, 2}), G({3}),
                L({2}, {0, 2})},
               {}, 1, [](Graph& g, const std::vector<ValueId>& in) {
                 ValueId h = add1(g, "Conv", {in[0], in[1], in[2]}, A({{"pads", Dims{1, 1, 1, 1}}}));
                 h = add1(g, "Relu", {bn_training(g, {h, in[3], in[4], in[5], in[6]})});
                 h = add1(g, "MaxPool", {h}, A({{"kernel_shape", Dims{2, 2}}, {"strides", Dims{2, 2}}}));
                 h = add1(g, "Flatten", {add1(g, "GlobalAveragePool", {h})});
                 ValueId logits = add1(g, "Gemm", {h, in[7], in[8]}, A({{"transB", I{1}}}));
                 return std::vector<ValueId>{add1(g, "SoftmaxCrossEntropyLoss", {logits, in[9]})};
               }});
  return c;
}

REGISTER_GRAD_CASES(cnn_cases());

}  // namespace
}  // namespace torch_ort::gradcheck
