"""``python -m gpuformer_lib.gpu_suite``: see the package's docstring."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _print(text: str) -> None:
    print(text, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpuformer_lib.gpu_suite",
                                     description="Measure what each chapter rests on, on this GPU.")
    parser.add_argument("--list", action="store_true", help="list the items by chapter with their caps, and stop")
    parser.add_argument("--budget", type=float, default=300.0, metavar="SECONDS",
                        help="the whole run's time; items whose cap would not fit are skipped (default 300)")
    parser.add_argument("--out", type=Path, default=None, metavar="DIR",
                        help="where the device's folder of results goes (default bench_results/gpu)")
    parser.add_argument("--commit", default=None, metavar="SHA",
                        help="the course's commit, where the tree has no .git (default: git rev-parse HEAD)")
    parser.add_argument("--only", default=None, metavar="KEYS", help="comma-separated item keys (see --list)")
    parser.add_argument("--pause-during", default=None, help=argparse.SUPPRESS)  # for the kill test
    args = parser.parse_args(argv)
    if not args.budget > 0:
        parser.error(f"--budget must be a positive number of seconds, got {args.budget}")

    from gpuformer_lib.gpu_suite.core import ordered_items

    if args.list:
        items = ordered_items()
        for it in items:
            extra = (" (needs %d GPUs)" % it.min_gpus if it.min_gpus > 1 else "") + (" [heavy]" if it.heavy else "")
            print(f"{it.chapter_key}  {it.key:34s} cap {it.cap_s:5.0f} s  (about {it.expect_s:3.0f} s)  {it.title}{extra}")
        one_gpu = [it for it in items if it.min_gpus == 1]
        print(f"{len(items)} items; on one GPU about {sum(it.expect_s for it in one_gpu):.0f} s expected (estimates "
              f"until a run on this device is recorded), {sum(it.cap_s for it in one_gpu):.0f} s at most (the caps)")
        return 0

    from gpuformer_lib.gpu_suite.runner import run

    only = [k.strip() for k in args.only.split(",") if k.strip()] if args.only else None
    return run(budget_s=args.budget, out=args.out, commit=args.commit, only=only, pause_during=args.pause_during,
               echo=_print)


if __name__ == "__main__":
    sys.exit(main())
