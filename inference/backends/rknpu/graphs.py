"""The dense prefill block of one decoder layer as ONNX graphs, for rknn-toolkit2 to compile.

A layer's dense block is cut where the CPU must step in (attention over the KV cache):

- ``qkv``: x [T, H] (the attention-normed rows) → q [T, Nq], k [T, Nk], v [T, Nv]; a layer whose keys
  are its values (Gemma 4's full attention, K = V) has no v projection, and its graph no v output;
- ``o``: o [T, A] (attention output), h [T, H] (the residual) → h + o·Woᵀ (the MoE architectures:
  Qwen3-MoE, OLMoE, whose post-attention norm feeds the router on the CPU);
- ``o_norm``: o [T, A], h [T, H] → h + rms_norm(o·Woᵀ) · norm (Gemma 4, whose post-attention norm is on
  the projection, before the residual add);
- ``o_mlp``: o [T, A] (attention output), h [T, H] (the residual) →
  h2 = h + o·Woᵀ; h2 + down(act(gate·n) × up·n) with n = rms_norm(h2) (Llama-style layers);
- ``mlp``: x [T, H] → down(act(gate·x) × up·x), act silu or gelu (tanh): the dense MLP beside the
  routed experts of Gemma 4's layers (its norms around it stay on the CPU).

T is the prefill chunk: a graph is compiled for one static shape. Weights become float32 initializers
(dequantized from the store); rknn-toolkit2 rounds them to fp16 or quantizes them to w8a8 itself.

This module needs only numpy and `onnx`: it runs in the rknn-toolkit2 venv (`.venv-rknn`, made by
`scripts/setup --test`) as well as in the engine's, and imports nothing else from the project.
"""

from __future__ import annotations

import numpy as np

# each kind's input names, in order, and the most outputs a kind has, in order
INPUTS = {"qkv": ["x"], "o": ["o", "h"], "o_norm": ["o", "h"], "o_mlp": ["o", "h"], "mlp": ["x"]}
OUTPUTS = {"qkv": ["q", "k", "v"], "o": ["out"], "o_norm": ["out"], "o_mlp": ["out"], "mlp": ["out"]}
RESIDUAL = ("o", "o_norm", "o_mlp")  # the kinds whose output is the residual h plus what the block adds
OPSET = 13  # rknn-toolkit2 2.5 accepts opsets up to 19; 13 has everything used here


def _helpers():
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    return onnx, TensorProto, helper, numpy_helper


def _weight_t(name: str, w: np.ndarray):
    """A [out, in] weight as the [in, out] initializer that MatMul wants."""
    _, _, _, numpy_helper = _helpers()
    return numpy_helper.from_array(np.ascontiguousarray(np.asarray(w, np.float32).T), name)


def output_names(kind: str, job) -> list[str]:
    """A graph's outputs, in order: a qkv graph has v only when its job (a mapping of its weights,
    `w<name>`) has a v weight; K = V layers have none."""
    return [n for n in OUTPUTS[kind] if kind != "qkv" or "w" + n in job]


def qkv_graph(wq: np.ndarray, wk: np.ndarray, wv: np.ndarray | None, rows: int):
    """x [rows, H] → q, k and (when wv is given) v; weights [out, H] float32. Returns an onnx ModelProto."""
    onnx, TensorProto, helper, _ = _helpers()
    H = wq.shape[1]
    weights = {"q": wq, "k": wk, **({} if wv is None else {"v": wv})}
    nodes, outs = [], []
    for name, w in weights.items():
        nodes.append(helper.make_node("MatMul", ["x", f"w{name}"], [name]))
        outs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, [rows, w.shape[0]]))
    graph = helper.make_graph(
        nodes,
        "qkv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, H])],
        outs,
        initializer=[_weight_t("w" + n, w) for n, w in weights.items()],
    )
    return _model(graph)


def o_graph(wo: np.ndarray, rows: int):
    """(o [rows, A], h [rows, H]) → h + o·Woᵀ [rows, H]: the attention output projected onto the residual."""
    onnx, TensorProto, helper, _ = _helpers()
    graph = helper.make_graph(
        _o_nodes(helper, "out"),
        "o",
        _o_inputs(helper, TensorProto, wo, rows),
        _o_output(helper, TensorProto, wo, rows),
        initializer=[_weight_t("wo", wo)],
    )
    return _model(graph)


def o_norm_graph(wo: np.ndarray, norm: np.ndarray, eps: float, rows: int):
    """(o [rows, A], h [rows, H]) → h + rms_norm(o·Woᵀ) · norm [rows, H]: Gemma 4's normed projection."""
    onnx, TensorProto, helper, _ = _helpers()
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["o", "wo"], ["attn"]),  # [T, H]
            *_rms_norm_nodes(helper, "attn", "n"),
            helper.make_node("Add", ["h", "n"], ["out"]),
        ],
        "o_norm",
        _o_inputs(helper, TensorProto, wo, rows),
        _o_output(helper, TensorProto, wo, rows),
        initializer=[_weight_t("wo", wo), *_rms_norm_constants(norm, eps)],
    )
    return _model(graph)


def _rms_norm_nodes(helper, x: str, out: str) -> list:
    """rms_norm(x) · norm over the last axis, reading initializers norm and eps."""
    return [
        helper.make_node("Mul", [x, x], [x + "_sq"]),
        helper.make_node("ReduceMean", [x + "_sq"], [x + "_ms"], axes=[-1], keepdims=1),  # [T, 1]
        helper.make_node("Add", [x + "_ms", "eps"], [x + "_mse"]),
        helper.make_node("Sqrt", [x + "_mse"], [x + "_rms"]),
        helper.make_node("Div", [x, x + "_rms"], [x + "_n"]),
        helper.make_node("Mul", [x + "_n", "norm"], [out]),
    ]


def _rms_norm_constants(norm: np.ndarray, eps: float) -> list:
    _, _, _, numpy_helper = _helpers()
    return [
        numpy_helper.from_array(np.asarray(norm, np.float32).reshape(-1), "norm"),
        numpy_helper.from_array(np.array([eps], np.float32), "eps"),
    ]


def _o_nodes(helper, out: str) -> list:
    return [helper.make_node("MatMul", ["o", "wo"], ["attn"]), helper.make_node("Add", ["h", "attn"], [out])]


def _o_inputs(helper, TensorProto, wo: np.ndarray, rows: int) -> list:
    H, A = wo.shape
    return [
        helper.make_tensor_value_info("o", TensorProto.FLOAT, [rows, A]),
        helper.make_tensor_value_info("h", TensorProto.FLOAT, [rows, H]),
    ]


def _o_output(helper, TensorProto, wo: np.ndarray, rows: int) -> list:
    return [helper.make_tensor_value_info("out", TensorProto.FLOAT, [rows, wo.shape[0]])]


def o_mlp_graph(
    wo: np.ndarray,
    norm: np.ndarray,
    gate: np.ndarray,
    up: np.ndarray,
    down: np.ndarray,
    eps: float,
    act: str,
    rows: int,
):
    """(o [rows, A], h [rows, H]) → the layer's output [rows, H] (Llama-style residuals)."""
    onnx, TensorProto, helper, _ = _helpers()
    nodes = [
        *_o_nodes(helper, "h2"),  # [T, H]
        *_rms_norm_nodes(helper, "h2", "n"),
        *_mlp_nodes(helper, act, "n", "mlp"),  # [T, H]
        helper.make_node("Add", ["h2", "mlp"], ["out"]),
    ]
    graph = helper.make_graph(
        nodes,
        "o_mlp",
        _o_inputs(helper, TensorProto, wo, rows),
        _o_output(helper, TensorProto, wo, rows),
        initializer=[
            _weight_t("wo", wo),
            *_rms_norm_constants(norm, eps),
            _weight_t("wgate", gate),
            _weight_t("wup", up),
            _weight_t("wdown", down),
            *_activation_constants(act),
        ],
    )
    return _model(graph)


def mlp_graph(gate: np.ndarray, up: np.ndarray, down: np.ndarray, act: str, rows: int):
    """x [rows, H] → down(act(gate·x) × up·x) [rows, H]."""
    onnx, TensorProto, helper, _ = _helpers()
    H = gate.shape[1]
    graph = helper.make_graph(
        _mlp_nodes(helper, act, "x", "out"),
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, H])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [rows, down.shape[0]])],
        initializer=[
            _weight_t("wgate", gate),
            _weight_t("wup", up),
            _weight_t("wdown", down),
            *_activation_constants(act),
        ],
    )
    return _model(graph)


def _mlp_nodes(helper, act: str, x: str, out: str) -> list:
    """down(act(x·gate) × x·up), reading initializers wgate, wup, wdown."""
    return [
        helper.make_node("MatMul", [x, "wgate"], ["g"]),  # [T, F]
        helper.make_node("MatMul", [x, "wup"], ["u"]),
        *_activation(helper, act, "g", "ag"),
        helper.make_node("Mul", ["ag", "u"], ["gu"]),
        helper.make_node("MatMul", ["gu", "wdown"], [out]),
    ]


GELU_C = (0.7978845608028654, 0.044715)  # √(2/π) and the cubic term, as models/base.gelu_tanh


def _activation(helper, act: str, x: str, out: str) -> list:
    if act == "silu":  # x · sigmoid(x)
        return [helper.make_node("Sigmoid", [x], [x + "_s"]), helper.make_node("Mul", [x, x + "_s"], [out])]
    if act in ("gelu_pytorch_tanh", "gelu_tanh"):  # ½x(1 + tanh(√(2/π)(x + 0.044715x³)))
        m = lambda a, b, o: helper.make_node("Mul", [a, b], [o])  # noqa: E731
        return [
            m(x, x, "x2"),
            m("x2", x, "x3"),
            m("x3", "gelu_b", "bx3"),
            helper.make_node("Add", [x, "bx3"], ["inner"]),
            m("inner", "gelu_a", "ain"),
            helper.make_node("Tanh", ["ain"], ["t"]),
            helper.make_node("Add", ["t", "one"], ["t1"]),
            m(x, "t1", "xt"),
            m("xt", "half", out),
        ]
    raise ValueError(f"activation {act!r} has no NPU graph yet; the layer stays on the CPU")


def _activation_constants(act: str) -> list:
    if act == "silu":
        return []
    _, _, _, numpy_helper = _helpers()
    c = {"gelu_a": GELU_C[0], "gelu_b": GELU_C[1], "one": 1.0, "half": 0.5}
    return [numpy_helper.from_array(np.array([v], np.float32), k) for k, v in c.items()]


def _model(graph):
    onnx, _, helper, _ = _helpers()
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model
