"""How much of the conformance kit's derived error bound each kernel uses, per op and dtype (1.0 = at the bound).

    python benchmarks/kit_margins.py [--platform cpu] [--seeds 3] [--ops rms_norm,linear] [--tiny]

Runs every check of the platform's kernels (contiguous inputs, fixed and drawn cases) and prints, per (kernel,
dtype), the largest fraction of the row bound used: the margin behind the kit's ENVELOPE and ROUNDINGS constants
(engine/core/testing/oracle.py). ``--tiny`` keeps to the fixed cases (CI runs it so).
"""

from __future__ import annotations

import argparse
import time


def margins(platform_name: str, seeds: list[int], op_names=None, tiny: bool = False) -> dict:
    from engine.core import plugins
    from engine.core.ops import registry as ops_registry
    from engine.core.testing import conformance as kit
    from engine.core.testing.oracle import bound_used

    platform = plugins.select(plugins.discover(), platform_name).platform_cls()
    registry = plugins.build_registry(platform)
    before = ops_registry._ACTIVE
    ops_registry.set_active_registry(registry)
    device = platform.device()
    worst: dict = {}
    try:
        for seed in seeds:
            for check in kit.collect_checks(registry, op_names, strided=False, seed=None if tiny else seed,
                                            budget=kit.budget_for(device)):
                op = check.op
                if check.impl is op.reference_impl:
                    continue
                try:
                    out = kit.evaluate(check, device, seed)
                except kit.Unsupported:
                    continue
                if out.oracle is None:  # an exact op: bit for bit, no bound to use
                    continue
                used = max((bound_used(g, w, o, out.term_scale, op.accumulation_roundoff)
                            for _, g, w, o in out.floating()), default=0.0)
                key = (op.name, check.impl.qualname, kit.dtype_name(check.dtype))
                if used >= worst.get(key, (0.0, ""))[0]:
                    worst[key] = (used, check.case.name)
    finally:
        ops_registry.set_active_registry(before)
    return worst


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--platform", default=None)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--ops", default=None)
    ap.add_argument("--tiny", action="store_true")
    args = ap.parse_args(argv)
    t0 = time.time()
    worst = margins(args.platform, list(range(1, args.seeds + 1)), args.ops.split(",") if args.ops else None,
                    args.tiny)
    print(f"{'op':<26} {'kernel':<34} {'dtype':<9} {'bound used':>10}  worst case")
    for (op, impl, dtype), (used, case) in sorted(worst.items()):
        print(f"{op:<26} {impl:<34} {dtype:<9} {used:>10.3f}  {case}")
    print(f"({len(worst)} kernel x dtype pairs, {args.seeds} seeds, {time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
