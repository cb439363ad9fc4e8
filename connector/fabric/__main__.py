"""`python -m pdfleet.connector.fabric`: the pod's fabric preflight (an init container).

Writes the verdict as JSON to --result (read by the engine's connector) and to the
termination message (read by the operator from the pod status), prints it, exits 0.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pdfleet.connector.fabric.probe import run_probe


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pdfleet.connector.fabric", description=__doc__)
    parser.add_argument("--want", choices=("rdma", "any"), default="any")
    parser.add_argument("--min-gbps", type=float, default=0.0)
    parser.add_argument("--mib", type=int, default=8)
    parser.add_argument("--result", type=Path, default=None)
    parser.add_argument("--termination-log", type=Path, default=Path("/dev/termination-log"))
    args = parser.parse_args(argv)
    verdict, _ = run_probe(want=args.want, min_gbps=args.min_gbps, mib=args.mib)
    text = verdict.to_json()
    for path in (args.result, args.termination_log):
        if path is not None:
            try:
                path.write_text(text)  # to_json keeps to the kubelet's 4 KiB
            except OSError:
                pass  # not in a pod (no /dev/termination-log): stdout still has it
    print(text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
