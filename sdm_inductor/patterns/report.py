"""What the rewrites did: rewritten chains and rejected candidates, readable as text."""
from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Report", "RewrittenChain", "RejectedChain"]


@dataclass
class RewrittenChain:
    where: str          # file:line of the loop's first write (of the scan call for a scan)
    tokens: int         # chain length in tokens
    form: str           # "unrolled loop" / "scan" / "decode step", plus the front-end
    op: str             # the op it became
    distinct: str       # how distinct write slots are known ("runtime check" when not)

    def __str__(self):
        return (f"rewritten: {self.form} of {self.tokens} token(s) at {self.where} -> {self.op} "
                f"[write slots: {self.distinct}]")


@dataclass
class RejectedChain:
    where: str
    tokens: int
    reason: str

    def __str__(self):
        return f"left alone: {self.tokens} token step(s) at {self.where}: {self.reason}"


@dataclass
class Report:
    rewritten: list = field(default_factory=list)
    rejected: list = field(default_factory=list)
    graphs: int = 0

    def extend(self, other: "Report") -> None:
        self.rewritten += other.rewritten
        self.rejected += other.rejected
        self.graphs += other.graphs

    def __str__(self):
        head = (f"sdm rewrites: {len(self.rewritten)} chain(s) rewritten, "
                f"{len(self.rejected)} candidate(s) left alone, {self.graphs} graph(s) seen")
        return "\n".join([head] + ["  " + str(x) for x in self.rewritten + self.rejected])

    def __bool__(self):
        return True
