"""This checkout against another commit or checkout, on the same store, side by side in one run.

`--against REF` checks REF out as a `git worktree` in a temporary directory and builds its kernels there
(`setup.py build_ext --inplace`, with this venv's Python); `--against DIR` takes another checkout as it
is (its kernels built in place if they are missing). Each side is a child process that opens the store
with the same engine options, warms up with one untimed prompt, and then serves one measurement per
round (`rounds.py`: a prompt of fresh random ids, then generated tokens), both loaded at once and taking
turns A B, B A, …, so the machine's drift falls on both alike. A is the other tree, B this checkout.
Printed: every round, then decode tok/s, prefill tok/s and TTFT medians with B/A and the spread of the
per-round ratios, and whether both sides gave the same first token (they should, bit for bit).

    .venv/bin/python benchmarks/compare.py ~/.local/share/rkmojo/models/smollm2-135m-instruct --against HEAD~1
    .venv/bin/python benchmarks/compare.py /work/stores/gemma4-26b-a4b-uniform --against main \\
        --memory-budget 4G --cgroup-memory 4G --prompt-tokens 128 --decode-tokens 16 --rounds 6

Engine options (`--memory-budget`, `--expert-slots`, `--threads`, …) are `EngineConfig`'s, given to both
sides; an option the other tree does not know ends its child with the engine's own error.
`--cgroup-memory` puts each child in a cgroup-v1 memory group of that size (root). Both engines are
loaded at once: the machine needs the memory of both.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import rounds

KERNELS = "inference/kernels"


def build(tree: Path) -> None:
    """The tree's kernels compiled in place, with this venv's Python and the tree's setup.py: its native
    build only (RKMOJO_ARCH_FLAGS set to the native choice skips the avx2 and scalar ones, a third of
    the time; so RKMOJO_KERNELS=avx2|scalar finds no build on that side).

    Raises:
        SystemExit: the build failed (its output shown).
    """
    print(f"building {tree}'s kernels …", flush=True)
    native = "-march=native" if platform.machine().lower() in ("x86_64", "amd64") else "-mcpu=native"
    cmd = [sys.executable, "setup.py", "build_ext", "--inplace"]
    env = {**os.environ, "RKMOJO_ARCH_FLAGS": native}
    r = subprocess.run(cmd, cwd=tree, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise SystemExit(f"{tree}: `{' '.join(cmd)}` failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")


@contextlib.contextmanager
def other_tree(against: str):
    """The tree to compare with: a directory as it is, or a worktree of a git ref, removed afterwards."""
    given = Path(against).expanduser()
    if given.is_dir():
        tree = given.resolve()
        if not any((tree / KERNELS).glob("_rkkernels.*")):
            build(tree)
        yield tree, against
        return
    rev = subprocess.run(["git", "rev-parse", "--short", against], cwd=rounds.ROOT, capture_output=True, text=True)
    if rev.returncode != 0:
        raise SystemExit(f"--against {against}: neither a directory nor a git ref of {rounds.ROOT}")
    with tempfile.TemporaryDirectory(prefix="rkmojo-compare-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(tree), against], cwd=rounds.ROOT, check=True)
        try:
            build(tree)
            yield tree, f"{against} ({rev.stdout.strip()})"
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=rounds.ROOT, check=False)


def main() -> int:
    from inference import options
    from inference.bench.cgroup import MemoryCgroup, children_die_with_us
    from inference.engine import EngineConfig

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("store")
    p.add_argument("--against", required=True, help="a git ref (checked out in a temporary worktree) or a directory")
    p.add_argument("--rounds", type=int, default=6, help="rounds; each runs both sides once, the order alternating")
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--decode-tokens", type=int, default=32)
    p.add_argument("--cgroup-memory", help="each child in a memory cgroup of this size (root), e.g. 4G")
    p.add_argument("--json", help="write every round and the summary here")
    options.add_flags(p.add_argument_group("engine options, both sides"), EngineConfig)
    a = p.parse_args()
    try:
        opts = options.from_flags(EngineConfig, a)
    except ValueError as e:
        p.error(str(e))
    work = {"store": a.store, "options": opts, "prompt_tokens": a.prompt_tokens, "decode_tokens": a.decode_tokens}

    with children_die_with_us(), other_tree(a.against) as (tree, name), contextlib.ExitStack() as stack:
        sides = {"A": (name, tree), "B": (f"this checkout ({rounds.ROOT})", None)}
        kids, groups = {}, {}
        for side, (label, src) in sides.items():  # loaded one after the other: each load reads the disk
            if a.cgroup_memory:
                groups[side] = stack.enter_context(MemoryCgroup(a.cgroup_memory))
            enter = groups[side].enter if side in groups else None
            kids[side] = stack.enter_context(contextlib.closing(rounds.Child(side, **work, src=src, preexec_fn=enter)))
            ready = kids[side].ready
            print(f"{side}: {label}; engine from {ready['inference']}, opened in {ready['open_s']:.1f} s", flush=True)
        rows = []
        for k in range(a.rounds):
            turn = rounds.order(k, ("A", "B"))
            got = {side: kids[side].ask(1000 + k) for side in turn}
            rows.append(got)
            cells = "  |  ".join(
                f"{s} decode {got[s]['decode_tok_s']:.2f} tok/s, prefill {got[s]['prefill_tok_s']:.1f} tok/s, "
                f"TTFT {got[s]['ttft_s']:.3f} s"
                for s in ("A", "B")
            )
            print(f"round {k} ({' '.join(turn)}): {cells}", flush=True)
        use = {side: g.usage() for side, g in groups.items()}

    s = rounds.summary(rows, "A", "B")
    rounds.print_summary(s, "A", "B", len(rows))
    same = {(r["A"]["first_token"], r["B"]["first_token"]) for r in rows}
    print(f"first token the same on both sides in every round: {all(x == y for x, y in same)}")
    for side, u in use.items():
        print(
            f"{side}'s cgroup: peak {u['max_usage_bytes'] / 2**30:.2f} of {u['limit_bytes'] / 2**30:.2f} GiB, "
            f"limit hit {u['failcnt']} times, OOM kills {u['oom_kills']}"
        )
    if a.json:
        Path(a.json).write_text(json.dumps({"args": vars(a), "A": name, "rounds": rows, "summary": s}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
