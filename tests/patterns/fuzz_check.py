"""Differential check of generated token-loop programs (``fuzz_programs``) against eager,
and the table of outcomes: ``python tests/patterns/fuzz_check.py [N] [SEED] [--inductor]``.

Each program is traced by Dynamo, rewritten by the torch-level pass and the rewritten
graph run eagerly (explain level: no Inductor codegen), or with ``--inductor`` compiled
by the full ``torch.compile`` (the passes installed by import; ~10 s a program on two
cores), then compared with the program run eagerly. Outcomes: rewritten or left alone (with the reason), crash (eager runs, the
rewritten program raises), mismatch (results differ beyond the dtype's tolerance).
"""
from __future__ import annotations

import re
import sys
import traceback
from collections import Counter
from dataclasses import dataclass

import torch

import sdm_inductor
from sdm_inductor.patterns import Report
from sdm_inductor.patterns.torch_frontend import rewrite_dynamo_graph

import fuzz_programs as FP

TOL = {"float32": dict(atol=2e-4, rtol=2e-4), "bfloat16": dict(atol=6e-2, rtol=6e-2)}


@dataclass
class Outcome:
    spec: FP.Spec
    rewritten: bool
    reasons: list
    crash: str | None = None
    mismatch: str | None = None
    tokens: tuple = ()      # tokens of each rewritten chain
    torch_fails: str | None = None   # torch.compile fails on it without the rewrites too

    @property
    def wrongly_rewritten(self) -> bool:
        """A mutant became an op. A whole-bank decay between tokens leaves each token an
        SDM step of its own: rewriting those one token at a time is right."""
        if self.positive or not self.rewritten:
            return False
        return not (self.spec.mutation == "whole_bank_decay" and set(self.tokens) == {1})

    @property
    def positive(self) -> bool:
        return self.spec.mutation is None


def _tuple(x):
    return x if isinstance(x, tuple) else (x,)


def compare(out, ref, dtype: str):
    for a, b in zip(_tuple(out), _tuple(ref)):
        torch.testing.assert_close(a.float(), b.float(), **TOL[dtype])


def explain_run(fn, kwargs):
    """(result, report) of ``fn`` traced by Dynamo, rewritten, run eagerly."""
    report = Report()

    def backend(gm, example_inputs):
        report.extend(rewrite_dynamo_graph(gm.graph))
        return gm.forward

    out = torch.compile(fn, backend=backend, fullgraph=False)(**kwargs)
    return out, report


def inductor_run(fn, kwargs):
    """(result, report) of ``fn`` under the full ``torch.compile``."""
    torch._dynamo.reset()
    out = torch.compile(fn)(**kwargs)
    return out, sdm_inductor.patterns.last_report()


def check(spec: FP.Spec, runner=explain_run) -> Outcome:
    fn = FP.build(spec)
    d = FP.inputs(spec)
    ref = fn(**FP.copies(spec, d))
    try:
        out, report = runner(fn, FP.copies(spec, d))
    except Exception:       # noqa: BLE001 - counted and shown with the program
        crash = traceback.format_exc(limit=-3)
        if runner is inductor_run:
            try:
                with sdm_inductor.rewrites(False):
                    runner(fn, FP.copies(spec, d))
            except Exception as e:  # noqa: BLE001 - torch's own failure, not the rewrite's
                return Outcome(spec, False, [], torch_fails=f"{type(e).__name__}: {str(e).splitlines()[0]}")
        return Outcome(spec, False, [], crash=crash)
    o = Outcome(spec, bool(report.rewritten), [r.reason for r in report.rejected],
                tokens=tuple(c.tokens for c in report.rewritten))
    try:
        compare(out, ref, spec.bank_dtype)
    except AssertionError as e:
        o.mismatch = str(e)
    return o


def check_grads(spec: FP.Spec, runner=explain_run):
    """Gradients of a random loss of ``spec``'s outputs with respect to every float input,
    rewritten against eager: ``(checked, difference)``. Not checked: eager autograd itself
    refuses the program (an in-place write over rows the step read). The difference is a
    description of the first gradient that differs, or None. A gradient one side leaves
    undefined and the other gives as zeros is equal."""
    fn = FP.build(spec)
    d = FP.inputs(spec)

    def run(call):
        kw = FP.copies(spec, d)
        leaves = {k: t.requires_grad_() for k, t in kw.items() if t.is_floating_point()}
        # in-place programs write their bank: differentiate through a copy of each leaf
        out = call(**{k: (t.clone() if k in leaves else t) for k, t in kw.items()})
        gen = torch.Generator().manual_seed(spec.seed)
        loss = sum((o.float() * torch.randn(o.shape, generator=gen)).sum() for o in _tuple(out))
        grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
        return dict(zip(leaves, grads))

    try:
        ref = run(fn)
    except RuntimeError:
        return False, None
    got = run(lambda **kw: runner(fn, kw)[0])
    for name, want in ref.items():
        have = got[name]
        if want is None or have is None:
            one = want if have is None else have
            if one is not None and one.any():
                return True, f"grad {name}: defined on one side only"
            continue
        try:
            torch.testing.assert_close(have, want, **TOL[spec.bank_dtype])
        except AssertionError as e:
            return True, f"grad {name}: {e}"
    return True, None


def reason_key(reason: str) -> str:
    """A reason without its token number, locations and node names (for counting)."""
    reason = re.sub(r"^token \d+: ", "", reason)
    reason = re.sub(r"\(<?[^()]*:\d+>?\)", "", reason)
    reason = re.sub(r"\b[a-z_]+_\d+\b", "#", reason)
    return reason.strip()[:110]


def failures(outcomes) -> list:
    """Outcomes that break the contract: crashes, mismatches, mutants made one op."""
    return [o for o in outcomes if o.crash or o.mismatch or o.wrongly_rewritten]


def describe(o: Outcome) -> str:
    what = ("crash" if o.crash else "mismatch" if o.mismatch else
            "mutant rewritten" if o.wrongly_rewritten else
            "mutant rewritten token by token" if o.rewritten else "positive left alone")
    detail = o.crash or o.mismatch or "; ".join(o.reasons)
    return f"{what}: {o.spec.short()}\n{FP.source(o.spec)}{detail}\n"


def table(outcomes) -> str:
    lines = []
    for title, group in (("positives", [o for o in outcomes if o.positive]),
                         ("mutations", [o for o in outcomes if not o.positive])):
        n = len(group)
        rw = sum(o.rewritten for o in group)
        lines.append(f"{title}: generated {n}, rewritten {rw} ({100.0 * rw / max(n, 1):.1f}%), "
                     f"left alone {n - rw}, crashes {sum(bool(o.crash) for o in group)}, "
                     f"mismatches {sum(bool(o.mismatch) for o in group)}"
                     + (f", torch.compile fails without the rewrites too {k}"
                        if (k := sum(bool(o.torch_fails) for o in group)) else ""))
        reasons = Counter(reason_key(o.reasons[0]) if o.reasons else "(no reason)"
                          for o in group if not o.rewritten and not o.crash and not o.torch_fails)
        for why, k in reasons.most_common():
            lines.append(f"    {k:4d}  left alone: {why}")
        if title == "mutations":
            by = Counter((o.spec.mutation, o.rewritten) for o in group)
            for m in FP.MUTATIONS:
                lines.append(f"    {m:24s} generated {by[(m, False)] + by[(m, True)]:3d}, "
                             f"rewritten {by[(m, True)]}")
    return "\n".join(lines)


def main(argv):
    runner = inductor_run if "--inductor" in argv else explain_run
    argv = [a for a in argv if a != "--inductor"]
    n = int(argv[1]) if len(argv) > 1 else 500
    seed = int(argv[2]) if len(argv) > 2 else 0
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    outcomes = []
    for spec in FP.programs(n, seed):
        outcomes.append(check(spec, runner))
        torch._dynamo.reset()
    print(table(outcomes))
    bad = failures(outcomes)
    for o in bad[:10]:
        print(describe(o))
    left = [o for o in outcomes if o.positive and not o.rewritten and not o.crash and not o.torch_fails]
    for o in left[:int(argv[3]) if len(argv) > 3 else 0]:
        print(describe(o))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
