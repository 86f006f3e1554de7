"""Run the recognizer on one graph and rewrite what it accepts (both front-ends)."""
from __future__ import annotations

import logging

import torch.fx as fx

from .canonical import Reject
from .interpret import Analysis
from .report import RejectedChain, Report, RewrittenChain
from .rewrite import remove_dead_code, check_chain, rewrite_chain
from .safety import guarded

__all__ = ["rewrite_graph"]

log = logging.getLogger(__name__)

# Rewriting one bank can make another recognisable (a layer whose inputs are an earlier
# layer's readings): re-analyse a few times while something changes.
_MAX_ROUNDS = 4


def _needs_grad(an: Analysis, chain) -> bool:
    fe = an.fe
    for n in chain.nodes:
        if fe.requires_grad(n):
            return True
    return fe.requires_grad(chain.bank.root)


def _loop_body(graph: fx.Graph, level: str) -> bool:
    """A higher-order op's body (Dynamo gives only top-level placeholders a ``grapharg``):
    its single token step on an input is one iteration of a loop the parent graph holds,
    rewritten there as a whole (scan), not here one token at a time."""
    phs = [n for n in graph.nodes if n.op == "placeholder"]
    return level == "torch" and bool(phs) and not any("grapharg" in n.meta for n in phs)


def _rewrite_one(an: Analysis, chain, level: str, grad: bool):
    """Rewrite ``chain``; the reason as a string when it is left alone."""
    try:
        before, move = check_chain(an, chain)
        rewrite_chain(an, chain, before, move, aten_level=(level == "aten"), needs_grad=grad)
    except Reject as e:
        return str(e)
    return None


def rewrite_graph(graph: fx.Graph, frontend, level: str) -> Report:
    report = Report(graphs=1)
    if not frontend.write_targets(graph):
        return report       # no row writes: no bank, nothing to analyse (most graphs)
    body = _loop_body(graph, level)
    rejected: dict = {}
    failed: set = set()     # loops whose rewrite raised (the graph was put back): not retried
    for _ in range(_MAX_ROUNDS):
        try:
            an = Analysis(graph, frontend).run()
            chains, rej = an.chains()
            chains = [c for c in chains if c.where not in failed]
        except Exception as e:      # noqa: BLE001 - the graph is untouched: compile it as written
            report.rejected.append(RejectedChain("graph", 0, f"recognizer error, graph left as written: {e!r}"))
            log.warning("sdm rewrites: recognizer error, graph left as written: %r", e)
            break
        for r in rej:
            rejected[r.root] = r
        done, broken = 0, False
        for chain in chains:
            if body and chain.length == 1 and chain.bank.root.op == "placeholder":
                continue
            grad = _needs_grad(an, chain)
            result, err = guarded(graph, f"rewriting the token loop at {chain.where}",
                                  _rewrite_one, an, chain, level, grad)
            if err is not None:
                # the graph is the one before this chain (new node objects): analyse again
                rejected[("error", chain.where)] = RejectedChain(
                    chain.where, chain.length, f"rewrite error, left as written: {err!r}")
                failed.add(chain.where)
                broken = True
                break
            if isinstance(result, str):
                rejected[chain.bank.root] = RejectedChain(chain.where, chain.length, result)
                continue
            rejected.pop(chain.bank.root, None)
            form = "decode step" if chain.length == 1 else "unrolled loop"
            op = "sdm.write_read_" if (chain.bank.inplace_root and chain.bank.root.op in
                                       ("placeholder", "get_attr") and not grad) else "sdm.write_read"
            report.rewritten.append(RewrittenChain(chain.where, chain.length, f"{form} ({level})",
                                                   op, chain.distinct or "runtime check"))
            done += 1
        if broken:
            rejected = {k: v for k, v in rejected.items()
                        if not (isinstance(k, fx.Node) and k._erased)}
            continue
        if not done:
            break
        remove_dead_code(graph)
    report.rejected += [RejectedChain(r.where, r.tokens, r.reason) for r in rejected.values()]
    if report.rewritten and graph.owning_module is not None:
        graph.lint()
        graph.owning_module.recompile()
    return report
