"""`rkmojo bench`: decode and prefill speed of a store against the bounds measured in the same run.

- `run`: the orchestration (child processes, the optional memory cgroup), the table and the JSON;
- `measure`: timed prefill and decode runs of an opened engine, by token ids;
- `bounds`: the read bandwidth with the engine's own reader, page-cache warm-up;
- `paired`: each timed run against the disk measured right after it;
- `cachesim`: the routing trace, its replay through the engine's `LayerCache`, Belady's optimum;
- `cgroup`: a cgroup-v1 memory limit around a child process (also a wrapper script);
- `concurrent`: `--concurrent`, N conversations stepped together against one alone.
"""

from .measure import Workload
from .run import EFFICIENCY_FORMULA, REQUIRED_FIELDS, BenchOptions, run_bench

__all__ = ["BenchOptions", "Workload", "run_bench", "REQUIRED_FIELDS", "EFFICIENCY_FORMULA"]
