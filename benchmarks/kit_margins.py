"""How much of the conformance kit's derived error bound each kernel uses, per op and dtype (1.0 = at the bound).

    python benchmarks/kit_margins.py [--platform cpu] [--seeds 3] [--ops rms_norm,linear] [--tiny]

Runs every check of the platform's kernels (contiguous inputs, fixed and drawn cases) and prints, per (kernel,
dtype), the largest fraction of the row bound used: the margin behind the kit's ENVELOPE and ROUNDINGS constants
(engine/core/testing/oracle.py). ``--tiny`` keeps to the fixed cases (CI runs it so).
"""

from __future__ import annotations

import argparse
import time

import torch


def margins(platform_name: str, seeds: list[int], op_names=None, tiny: bool = False) -> dict:
    from engine.core import plugins
    from engine.core.ops import registry as ops_registry
    from engine.core.testing import conformance as kit
    from engine.core.testing.oracle import bound_used, widen

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
                if check.impl is op.reference_impl or not kit._derived(op, check.dtype):
                    continue
                gen = torch.Generator().manual_seed(seed)
                args = op.make_inputs(dict(check.case.params), check.dtype, device, gen)
                if check.impl.verdict(args) is not None:
                    continue
                ref_args = tuple(a.contiguous() if isinstance(a, torch.Tensor) else a for a in kit._clone(args))
                want = kit._outputs(op, ref_args, op.reference(*ref_args))
                oracle_args = widen(kit._clone(ref_args), check.dtype)
                oracle = kit._outputs(op, oracle_args, op.reference(*oracle_args))
                impl_args = kit._clone(args)
                got = kit._outputs(op, impl_args, check.impl.fn(*impl_args))
                scale = float(op.error_scale(*ref_args)) if op.error_scale is not None else 0.0
                outputs = zip(got, want, oracle, strict=True)
                used = max((bound_used(g, w, o, scale, op.accumulation_roundoff) for g, w, o in outputs
                            if g.is_floating_point() and g.element_size() > 1), default=0.0)
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
