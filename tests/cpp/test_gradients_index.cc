// Numeric gradient cases of the indexing family: Gather*, Slice, Concat, Split, Tile, Pad, Trilu,
// CastLike and Max/Min (run by test_gradients.cc's checker, static and symbolic shapes).
#include "tests/cpp/grad_cases.h"

namespace torch_ort::gradcheck {
namespace {

// (The oracle holds ints as doubles, so INT64_MAX-style "to the end" bounds are left to the
// Python parity rows; a large finite bound clamps the same way.)
// A 0-d int64 initializer (Gather's scalar index, Trilu's k).
ValueId scalar_int(Graph& g, int64_t v) {
  ValueId id = g.new_value("scalar", DType::kInt64, Shape::of({}));
  g.initializers[id] = TensorData::from_int64s({v}, /*scalar=*/true);
  return id;
}

std::vector<Case> index_cases() {
  std::vector<Case> c = {
      // Gather: repeated and negative indices must sum into one row.
      {"Gather_axis0_repeated_negative", "Gather", {G({5, 3}), L({4}, {1, -1, 1, 0})}},
      {"Gather_axis1_2d_indices", "Gather", {G({2, 5, 3}), L({2, 2}, {4, 0, -1, 4})}, A({{"axis", I{1}}})},
      {"Gather_axis_neg1", "Gather", {G({2, 4}), K({3, 3, 0})}, A({{"axis", I{-1}}})},
      {"GatherElements_axis1_repeated", "GatherElements", {G({3, 4}), L({3, 2}, {0, 3, 3, -1, 1, 1})}, A({{"axis", I{1}}})},
      {"GatherElements_axis0_smaller", "GatherElements", {G({3, 4}), L({2, 3}, {2, 0, -3, 2, 2, 1})}},
      {"GatherND_rows_repeated", "GatherND", {G({3, 4, 2}), L({3, 2}, {0, 1, 2, -1, 0, 1})}},
      {"GatherND_whole_rows", "GatherND", {G({3, 4}), L({2, 2, 1}, {2, 0, 2, -3})}},
      {"GatherND_batch_dims1", "GatherND", {G({2, 3, 4}), L({2, 2, 1}, {0, 2, 1, 1})}, A({{"batch_dims", I{1}}})},
      // Slice: constant and run-time bounds, clamping, negative and >1 steps, an empty result.
      {"Slice_two_axes_step2", "Slice", {G({4, 6}), K({1, -4}), K({3, 100}), K({0, 1}), K({1, 2})}},
      {"Slice_negative_step", "Slice", {G({5, 4}), K({-1}), K({-100}), K({0}), K({-2})}},
      {"Slice_reverse_all", "Slice", {G({3, 4}), K({1000}), K({-1000}), K({1}), K({-1})}},
      {"Slice_runtime_bounds", "Slice", {G({4, 6}), L({1}, {-3}), L({1}, {1000}), L({1}, {1})}},
      {"Slice_default_axes", "Slice", {G({4, 6}), K({1, 0}), K({3, -1})}},
      {"Slice_empty", "Slice", {G({4, 3}), K({3}), K({1})}},
      // Concat: one input gets no gradient (its ConcatGrad output is omitted).
      {"Concat_axis1_one_frozen", "Concat", {G({2, 1}), G({2, 3}), N({2, 2})}, A({{"axis", I{1}}})},
      {"Concat_axis_neg2", "Concat", {G({2, 3}), G({1, 3})}, A({{"axis", I{-2}}})},
      // Split: sizes as an input, num_outputs (uneven), equal split by output count.
      {"Split_sizes_input", "Split", {G({2, 7}), K({2, 5})}, A({{"axis", I{1}}}), 2},
      {"Split_num_outputs_uneven", "Split", {G({7, 2})}, A({{"num_outputs", I{3}}}), 3},
      {"Split_by_output_count", "Split", {G({6, 2})}, {}, 3},
      {"Tile_2d", "Tile", {G({2, 3}), K({2, 3})}},
      {"Tile_3d_ones", "Tile", {G({2, 1, 3}), K({1, 4, 1})}},
      // Pad (constant mode): padding, cropping (negative pads), a value, selected axes.
      {"Pad_both_sides", "Pad", {G({2, 3}), K({1, 0, 2, 1})}},
      {"Pad_crop_and_pad", "Pad", {G({4, 5}), K({-1, 2, 0, -2})}},
      {"Pad_value_axes", "Pad", {G({2, 3, 4}), K({1, 2}), S(0.5), K({-1})}},
      {"Trilu_upper", "Trilu", {G({3, 4})}},
      {"Trilu_lower_k_neg1", "Trilu", {G({2, 3, 4}), K({-1})}, A({{"upper", I{0}}})},
      {"Max_broadcast", "Max", {G({3, 4}), G({4})}},
      {"Max_one_input", "Max", {G({3})}},
      {"Min_three_one_frozen", "Min", {G({3, 4}), G({3, 1}), N({4})}},
  };
  c.push_back({"Gather_scalar_index", "Gather", {G({4, 3})}, {}, 1, [](Graph& g, const std::vector<ValueId>& in) {
    return std::vector<ValueId>{add1(g, "Gather", {in[0], scalar_int(g, 2)})};
  }});
  // Three reads of one weight by index (repeats across and within reads): their GatherGrads add
  // into one buffer, each into the previous one's result.
  c.push_back({"Gather_three_reads_of_one_weight", "Gather", {G({5, 3})}, {}, 1, [](Graph& g, const std::vector<ValueId>& in) {
    ValueId a = add1(g, "Gather", {in[0], scalar_int(g, 2)});
    ValueId b = add1(g, "Gather", {in[0], scalar_int(g, 4)});
    ValueId c = add1(g, "Gather", {in[0], scalar_int(g, 2)});
    return std::vector<ValueId>{add1(g, "Add", {add1(g, "Mul", {a, b}), c})};
  }});
  c.push_back({"Trilu_scalar_k", "Trilu", {G({4, 4})}, {}, 1, [](Graph& g, const std::vector<ValueId>& in) {
    return std::vector<ValueId>{add1(g, "Trilu", {in[0], scalar_int(g, 1)})};
  }});
  // Only output 1 of a Split is read: outputs 0 and 2 get zero gradients.
  c.push_back({"Split_middle_output_only", "Split", {G({2, 7}), K({2, 3, 2})}, {}, 1, [](Graph& g, const std::vector<ValueId>& in) {
    return std::vector<ValueId>{add_node(g, "Split", {in[0], in[1]}, A({{"axis", I{1}}}), 3)[1]};
  }});
  // Ties split dY equally: d/dx max(x, x) = 1, and max(x, relu(x)) ties wherever x > 0.
  c.push_back({"Max_tie_same_input", "Max", {G({3, 4})}, {}, 1, [](Graph& g, const std::vector<ValueId>& in) {
    return std::vector<ValueId>{add1(g, "Max", {in[0], in[0]})};
  }});
  c.push_back({"Min_tie_with_relu", "Min", {G({3, 4})}, {}, 1, [](Graph& g, const std::vector<ValueId>& in) {
    ValueId neg = add1(g, "Neg", {in[0]});
    return std::vector<ValueId>{add1(g, "Min", {neg, add1(g, "Neg", {add1(g, "Relu", {in[0]})})})};
  }});
  // CastLike to float and back through the gradient; `like` only lends its dtype.
  for (const bool to_float : {true, false}) {
    c.push_back({to_float ? "CastLike_to_float" : "CastLike_same_dtype", "CastLike", {G({3, 4})}, {}, 1,
                 [to_float](Graph& g, const std::vector<ValueId>& in) {
                   const DType dt = to_float ? DType::kFloat : DType::kDouble;
                   ValueId like = g.new_value("like", dt, Shape::of({}));
                   g.initializers[like] = TensorData::scalar_float(dt, 0.0);
                   return std::vector<ValueId>{add1(g, "CastLike", {in[0], like})};
                 }});
  }
  // Embedding-style: one weight gathered twice (fan-out) and by a 2-D index batch.
  c.push_back({"Gather_embedding_fanout", "Gather", {G({6, 3}), L({2, 3}, {5, 0, 5, 1, 1, -1})}, {}, 1,
               [](Graph& g, const std::vector<ValueId>& in) {
                 ValueId e = add1(g, "Gather", {in[0], in[1]});
                 return std::vector<ValueId>{add1(g, "Mul", {e, add1(g, "Gather", {in[0], in[1]})})};
               }});
  // Padding elimination's moves (rows 0, 2, 3, 5 of a (2, 3, ...) batch, gathered and put back)
  // and the run-time checks that pass their first input through.
  const auto our_op = [](const char* op) {
    return [op](Graph& g, const std::vector<ValueId>& in) {
      const ValueId out = g.new_value(std::string(op) + "_out", DType::kUndefined, Shape::unknown());
      g.nodes.push_back(Node{kOurDomain, op, g.unique_node_name(std::string("/") + op), in, {out}, {}});
      return std::vector<ValueId>{out};
    };
  };
  c.push_back({"PackRows_kept_rows", "com.torch_ort::PackRows", {G({2, 3, 2}), L({4}, {0, 2, 3, 5})}, {}, 1,
               our_op("PackRows")});
  c.push_back({"PadRows_kept_rows", "com.torch_ort::PadRows", {G({4, 2}), L({4}, {0, 2, 3, 5}), K({2, 3})}, {}, 1,
               our_op("PadRows")});
  c.push_back({"PaddingMaskCheck_passes_through", "com.torch_ort::PaddingMaskCheck",
               {G({2, 1, 3, 3}), L({4}, {0, 2, 3, 5}), L({2, 3}, {1, 1, 1, 1, 1, 1})}, {}, 1,
               our_op("PaddingMaskCheck")});
  c.push_back({"DecisionCheck_holds", "com.torch_ort::DecisionCheck", {G({3, 2}), L({}, {1})}, {}, 1,
               our_op("DecisionCheck")});
  return c;
}

REGISTER_GRAD_CASES(index_cases());

}  // namespace
}  // namespace torch_ort::gradcheck
