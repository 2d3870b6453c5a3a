"""Compile a store's dense-block graphs for rk3588, measure each on the simulator, export the `.rknn` files.

Run in the rknn-toolkit2 venv by `rkmojo npu build` (`build.py`), never in the engine's:

    .venv-rknn/bin/python inference/backends/rknpu/export.py JOB_DIR OUT_DIR

JOB_DIR/plan.json: {"graphs": [{"name", "kind", "precisions", "job"}], "w8a8_max_error"}. Each graph's
job (an .npz) holds its weights and constants as for `simulate.py`, the calibration inputs `in_<name>`
[S, T, ...], held-out inputs `held_<name>` and the CPU's outputs for them `want_<name>`.

Per graph, the precisions are tried in order; a precision is kept when the simulated held-out error
(relative L2 against the CPU layer code; o, o_norm and o_mlp on what the block adds to the residual) is within its
bound: w8a8 within `w8a8_max_error`, fp16 always (it is the fallback). The simulator only runs graphs
built in the same process, so each is built, exported and measured in one go. OUT_DIR gets per graph
`<name>.rknn`, the ONNX that was compiled as `<name>.onnx` (its metadata names the precision: the
tests' rknnlite stand-in evaluates it), and `result.json`: the toolkit's version and per graph the
precision kept and the error of every precision tried.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import sys
import tempfile

import numpy as np

from graphs import RESIDUAL
from simulate import INPUTS, build_onnx, check, compiled, output_names, run, samples_of

PRECISION_KEY = "rkmojo.precision"  # ONNX metadata of the kept graph
LINE = "rkmojo: "  # our lines on stdout, among the toolkit's own


def error(kind: str, job: dict, got: dict[str, np.ndarray]) -> float:
    """The worst relative L2 error over the graph's outputs against the CPU's."""
    errs = []
    for n in output_names(kind, job):
        want, out = job["want_" + n], got[n]
        if kind in RESIDUAL:  # the block adds to the residual h: measure what it adds
            want, out = want - job["held_h"], out - job["held_h"]
        errs.append(float(np.linalg.norm(out - want) / max(np.linalg.norm(want), 1e-30)))
    return max(errs)


def export_graph(spec: dict, job: dict, out_dir: str, w8a8_max_error: float) -> dict:
    import onnx

    kind, names = spec["kind"], INPUTS[spec["kind"]]
    calib, held = samples_of(job, "in_", names), samples_of(job, "held_", names)
    model = build_onnx(job, calib[0][0].shape[0])
    tried = {}
    for precision in spec["precisions"]:
        with tempfile.TemporaryDirectory() as tmp:
            rknn = compiled(model, calib, names, precision, tmp)
            path = os.path.join(out_dir, f"{spec['name']}.{precision}.rknn")
            check(rknn.export_rknn(path), "export_rknn")
            check(rknn.init_runtime(), "init_runtime (simulator)")
            tried[precision] = error(kind, job, run(rknn, output_names(kind, job), held))
            rknn.release()
        if precision in (spec["precisions"][-1], "fp16") or tried[precision] <= w8a8_max_error:
            break
        os.unlink(path)
    os.rename(path, os.path.join(out_dir, spec["name"] + ".rknn"))
    onnx.helper.set_model_props(model, {PRECISION_KEY: precision})
    onnx.save(model, os.path.join(out_dir, spec["name"] + ".onnx"))
    return {"precision": precision, "error": tried[precision], "tried": tried}


def main(job_dir: str, out_dir: str) -> None:
    with open(os.path.join(job_dir, "plan.json")) as f:
        plan = json.load(f)
    results = {}
    for spec in plan["graphs"]:
        job = dict(np.load(os.path.join(job_dir, spec["job"])))
        results[spec["name"]] = r = export_graph(spec, job, out_dir, plan["w8a8_max_error"])
        tried = ", ".join(f"{p} {e:.2e}" for p, e in r["tried"].items())
        print(f"{LINE}{spec['name']}: {r['precision']} ({tried})", flush=True)
    with open(os.path.join(out_dir, "result.json"), "w") as f:
        json.dump({"toolkit": importlib.metadata.version("rknn-toolkit2"), "graphs": results}, f)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
