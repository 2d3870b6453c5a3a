"""Child process of `rkmojo bench`: `python -m inference.bench ROLE SPEC.json OUT.json`."""

import json
import sys
from pathlib import Path

from ..errors import RkmojoError
from .run import CHILDREN, BenchOptions


def main(argv: list[str]) -> int:
    role, spec, out = argv
    s = json.loads(Path(spec).read_text())
    try:
        result = CHILDREN[role](Path(s["store"]), BenchOptions.from_dict(s["options"]))
    except RkmojoError as e:
        print(f"rkmojo bench ({role}): error: {e}", file=sys.stderr)
        return 1
    Path(out).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
