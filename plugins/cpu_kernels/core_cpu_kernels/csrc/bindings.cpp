// The Python module core_cpu_kernels._C: one binding per kernel.

#include <torch/extension.h>

#include "kernels.h"

// The kernels run without the GIL: they touch tensors only, and another Python thread (the
// engine's scheduler under async scheduling) runs while a step's kernels do.
const auto kNoGil = py::call_guard<py::gil_scoped_release>();

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode_attention", &paged_decode_attention, kNoGil,
        "Decode attention over a paged KV cache, FP8 ones read as stored * k_scale / v_scale "
        "(writes into out)",
        py::arg("out"), py::arg("query"), py::arg("kv_cache"), py::arg("block_table"),
        py::arg("seq_lens"), py::arg("scale"), py::arg("sliding_window"),
        py::arg("k_scale") = 1.0, py::arg("v_scale") = 1.0);
  m.def("mla_decode_attention", &mla_decode_attention, kNoGil,
        "Multi-head latent attention decode over a paged latent cache (writes into out)");
  m.def("paged_prefill_attention", &paged_prefill_attention, kNoGil,
        "Causal prefill attention of chunks over a paged KV cache, FP8 ones read as stored * "
        "k_scale / v_scale (writes into out)",
        py::arg("out"), py::arg("query"), py::arg("kv_cache"), py::arg("block_table"),
        py::arg("query_start_loc"), py::arg("seq_lens"), py::arg("scale"),
        py::arg("sliding_window"), py::arg("k_scale") = 1.0, py::arg("v_scale") = 1.0);
  m.def("rms_norm", &rms_norm, kNoGil, "core::rms_norm on contiguous-row CPU tensors");
  m.def("fused_add_rms_norm", &fused_add_rms_norm, kNoGil,
        "core::fused_add_rms_norm on contiguous-row CPU tensors");
  m.def("silu_and_mul", &silu_and_mul, kNoGil, "core::silu_and_mul on [T, 2I] CPU tensors");
  m.def("fused_moe", &fused_moe, kNoGil,
        "core::fused_moe on CPU tensors: the routed slots grouped by expert, one GEMV pass "
        "over each expert's weights");
  m.def("rotary_embedding", &rotary_embedding, kNoGil,
        "core::rotary_embedding in place on [T, heads, D] CPU tensors");
  m.def("quant_linear", &quant_linear, kNoGil,
        "core::quant_linear with the kernels of one vector ISA (\"\": the widest available)",
        py::arg("x"), py::arg("qweight"), py::arg("scales"), py::arg("mins"), py::arg("bits"),
        py::arg("isa") = "", py::arg("int8_x") = false, py::arg("prefill") = "",
        py::arg("strips") = py::none(), py::arg("interleaved") = py::none(),
        py::arg("batch_invariant") = false);
  m.def("quant_linear_interleaved", &quant_linear_interleaved, kNoGil,
        "A packed weight in the interleaved layout, for quant_linear's interleaved GEMV",
        py::arg("qweight"), py::arg("scales"), py::arg("mins"), py::arg("bits"),
        py::arg("isa") = "");
  m.def("quant_linear_strips", &quant_linear_strips, kNoGil,
        "A quantized weight dequantized once to bf16 strips, for quant_linear's strips",
        py::arg("qweight"), py::arg("scales"), py::arg("mins"), py::arg("bits"),
        py::arg("isa") = "");
  m.def("quant_linear_has_strips", &quant_linear_has_strips,
        "Whether an ISA multiplies quant_linear's strips (has bf16 dot products)",
        py::arg("isa") = "");
  m.def("quant_linear_isas", &quant_linear_isas,
        "The vector ISAs quant_linear can use on this CPU, widest (the default) first");
  m.def("quant_linear_prefill", &quant_linear_prefill,
        "How an ISA multiplies prefill-sized bf16 x: \"int8\" (measured faster) or \"bf16\"",
        py::arg("isa") = "");
  m.def("dense_linear", &dense_linear, kNoGil,
        "core::linear's GEMV with the kernels of one vector ISA (\"\": the widest available)",
        py::arg("x"), py::arg("weight"), py::arg("bias") = py::none(), py::arg("isa") = "");
  m.def("dense_linear_isas", &dense_linear_isas,
        "The vector ISAs dense_linear can use on this CPU, widest (the default) first");
  m.def("fp8_linear", &fp8_linear, kNoGil,
        "core::fp8_linear on the FP8 weight with the kernels of one vector ISA (\"\": the "
        "widest available)",
        py::arg("x"), py::arg("weight"), py::arg("scales"), py::arg("block_k"),
        py::arg("isa") = "", py::arg("batch_invariant") = false);
  py::class_<DecodeLayers>(m, "DecodeLayers",
                           "Plain decoder layers gathered once, called for each step of "
                           "decode rows (layer_stack.py)")
      .def(py::init<std::vector<torch::Tensor>, std::vector<int64_t>, std::vector<double>,
                    std::vector<double>, std::vector<int64_t>, std::vector<int64_t>, int64_t,
                    const std::vector<torch::Tensor>&>(),
           py::arg("tensors"), py::arg("bits"), py::arg("eps"), py::arg("scales"),
           py::arg("windows"), py::arg("heads"), py::arg("block_size"), py::arg("watched"))
      .def("stale", &DecodeLayers::stale,
           "Whether a watched tensor was written in place since")
      .def("__call__", &DecodeLayers::operator(), kNoGil, py::arg("hidden"),
           py::arg("positions"), py::arg("block_table"), py::arg("seq_lens"),
           py::arg("key_rows"), py::arg("isa"), py::arg("int8_x"));
  m.def("fp8_linear_isas", &fp8_linear_isas,
        "The vector ISAs fp8_linear can use on this CPU, widest (the default) first");
}
