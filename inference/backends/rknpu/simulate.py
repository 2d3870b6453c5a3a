"""Compile a layer's dense-block graphs with rknn-toolkit2 for rk3588 and run them on its simulator.

Run in the rknn-toolkit2 venv (never in the engine's: the toolkit pins old numpy/protobuf/onnx):

    .venv-rknn/bin/python inference/backends/rknpu/simulate.py JOB.npz OUT.npz

JOB.npz holds `kind` ("qkv", "o", "o_norm", "o_mlp" or "mlp"), `precision` ("fp16" or "w8a8"), the graph's weights (see
`graphs.py`; a qkv job without `wv` is a K = V layer's), the inputs `in_<name>` [S, T, ...] (S samples, also the w8a8 calibration set) and for
o_norm `norm` and `eps`, for o_mlp `eps` and `act`, for mlp `act`. OUT.npz gets `out_<name>` [S, T, ...]. The simulator only runs graphs built in
the same process, so build and run are one step.
"""

from __future__ import annotations

import os
import sys
import tempfile

import numpy as np

import graphs  # this directory is sys.path[0] when run as a script

from graphs import INPUTS, output_names


def build_onnx(job, rows: int):
    if str(job["kind"]) == "qkv":
        return graphs.qkv_graph(job["wq"], job["wk"], job.get("wv"), rows)
    if str(job["kind"]) == "o":
        return graphs.o_graph(job["wo"], rows)
    if str(job["kind"]) == "o_norm":
        return graphs.o_norm_graph(job["wo"], job["norm"], float(job["eps"]), rows)
    if str(job["kind"]) == "mlp":
        return graphs.mlp_graph(job["gate"], job["up"], job["down"], str(job["act"]), rows)
    return graphs.o_mlp_graph(
        job["wo"], job["norm"], job["gate"], job["up"], job["down"], float(job["eps"]), str(job["act"]), rows
    )


def compiled(model, samples: list, names: list[str], precision: str, tmp: str):
    """An RKNN object holding `model` (an onnx ModelProto) compiled for rk3588 in `precision`, the
    samples (lists of arrays, one per input) its w8a8 calibration set; ready for init_runtime/export."""
    import onnx
    from rknn.api import RKNN

    model_path = os.path.join(tmp, "graph.onnx")
    onnx.save(model, model_path)
    dataset = os.path.join(tmp, "dataset.txt")
    with open(dataset, "w") as f:
        for s, sample in enumerate(samples):
            paths = []
            for n, a in zip(names, sample):
                paths.append(os.path.join(tmp, f"{n}_{s}.npy"))
                np.save(paths[-1], a)
            f.write(" ".join(paths) + "\n")
    rknn = RKNN(verbose=False)
    rknn.config(
        target_platform="rk3588", quantized_dtype="w8a8", quantized_method="channel", quantized_algorithm="normal"
    )
    check(
        rknn.load_onnx(model=model_path, inputs=names, input_size_list=[list(a.shape) for a in samples[0]]),
        "load_onnx",
    )
    check(rknn.build(do_quantization=precision == "w8a8", dataset=dataset), "build")
    return rknn


def samples_of(job: dict, prefix: str, names: list[str]) -> list[list[np.ndarray]]:
    """[sample][input] float32 arrays from the job's `<prefix><name>` [S, T, ...] entries."""
    return [
        [np.ascontiguousarray(job[prefix + n][s], np.float32) for n in names]
        for s in range(job[prefix + names[0]].shape[0])
    ]


def run(rknn, names: list[str], samples: list) -> dict[str, np.ndarray]:
    """The simulator's outputs `names` (the graph's, in order) → [S, T, ...], for graphs built in this process."""
    outs = {n: [] for n in names}
    for sample in samples:
        got = rknn.inference(inputs=sample)
        if got is None or len(got) != len(names):
            sys.exit(f"rknn-toolkit2: inference gave {None if got is None else len(got)} outputs, want {names}")
        for n, y in zip(names, got):
            outs[n].append(np.asarray(y, np.float32).reshape(sample[0].shape[0], -1))
    return {n: np.stack(v) for n, v in outs.items()}


def main(job_path: str, out_path: str) -> None:
    job = dict(np.load(job_path))
    kind, precision = str(job["kind"]), str(job["precision"])
    samples = samples_of(job, "in_", INPUTS[kind])
    with tempfile.TemporaryDirectory() as tmp:
        rknn = compiled(build_onnx(job, samples[0][0].shape[0]), samples, INPUTS[kind], precision, tmp)
        check(rknn.init_runtime(), "init_runtime (simulator)")
        outs = run(rknn, output_names(kind, job), samples)
        rknn.release()
    np.savez(out_path, **{"out_" + n: v for n, v in outs.items()})


def check(ret: int, step: str) -> None:
    if ret != 0:
        sys.exit(f"rknn-toolkit2: {step} failed with {ret}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
