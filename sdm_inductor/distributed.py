"""DTensor support for the ``torch.ops.sdm`` ops: streams split across ranks.

``import sdm_inductor.distributed`` registers it. SDM streams are independent (spec
section 2), so the op splits along streams with no communication inside it: each rank
runs the op on its own streams and the bank rows those streams own.

Modes
-----
On every dimension of the device mesh the write/read ops run in one of three modes,
chosen from the placements of the DTensors that come in:

==========  =====================================  ==========================================
mode        inputs                                 outputs
==========  =====================================  ==========================================
streams     bank Shard(0) (rows), every [P, T, *]  readings Shard(0), final bank Shard(0),
            input Shard(0) (streams)               every gradient Shard(0)
columns     bank Shard(1), v Shard(2), the rest    readings Shard(2), final bank Shard(1);
            Replicate                              grads of k_val, beta, g, q_val Partial
replicate   everything Replicate                   everything Replicate
==========  =====================================  ==========================================

"streams" is chosen when the bank or any [P, T, *] input is Shard(0) on that mesh
dimension, "columns" when the bank is Shard(1) or ``v`` Shard(2) (spec section 3: every
column of the readings and of the final bank depends only on the same column of the bank
and of ``v``), "replicate" otherwise. Inputs placed otherwise are redistributed to the
mode (DTensor's own ``redistribute``: a Replicate bank is sliced locally, a ``v`` sharded
over time is moved by all-to-all, Partial inputs are reduced). Where a mode cannot be
computed locally it falls back to "replicate", which is always correct: "streams" needs
per-stream bank rows (``slots_per_stream > 0``; a shared bank lets a stream write any row)
and a stream count divisible by the shards; "columns" needs ``hd`` divisible by the shards
and snapshots without per-row scales (``snapshot_quant`` "none" or "bf16": fp8/int4 scale
each row over all its columns). The in-place ``write_read_`` cannot move its bank: a bank
placement that its mode cannot use is refused with an error naming ``bank``. The backward
follows the placement of ``saved_rows``, which the forward produced in its own mode.

Indices
-------
Indices stay what they are in one process: global bank rows, stream ``p`` owning rows
``[p*sph, (p+1)*sph)``. On a rank whose bank shard starts at global row ``r0``, the local
op gets ``k_idx - r0`` and ``q_idx - r0``: rows of its own shard, with its own streams
numbered from 0, which is exactly the layout the op checks. So a DTensor call and a
one-process call with ``full_tensor()`` of every argument give the same result; an index
outside its stream's rows is refused on the rank that holds it, and the error says which
shard and by how much the indices were rebased. The shard's position is read from the
process's rank when the op runs (``sdm::stream_shard_index``), never baked in while
tracing: torch.compile caches a graph under a key without the rank, and ranks on one host
share that cache.

The rebase is data-dependent per rank, which a pure sharding rule
(``register_sharding``: the same op on the local shards) cannot express. DTensor's own
loss-parallel ``nll_loss`` (class targets rebased into a class-sharded input) does it the
way it is done here: a handler in ``DTensor._op_dispatcher._custom_op_handlers``, which
both torch 2.11 and 2.13 consult before sharding propagation, in eager mode and under
``torch.compile`` (the handler runs while AOTAutograd traces the DTensor subclass). Inside
it, the DTensor work is public calls (``redistribute``, ``to_local``, ``from_local``); the
private pieces are the handler table itself and ``_disable_current_modes`` (to read the
mesh's rank layout while tracing). The layout helpers ``split_heads`` / ``merge_heads`` /
``expand_bank`` need no rebase and get plain ``register_sharding`` rules.

``saved_rows`` / ``saved_scales`` are opaque storage of the backward: in "streams" mode
each rank's block holds its own streams in the order of its own local op (chunk-major),
so their global view is not the one-process layout; only ``write_read_backward`` reads
them, on the same shards.

FSDP2 (``fully_shard``) needs nothing from this module: it all-gathers parameters into
plain tensors before the forward, so the ops see ordinary tensors on each rank (each
rank's own batch, hence its own streams and expanded bank).
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

if not dist.is_available():  # pragma: no cover - builds without torch.distributed
    raise ImportError("sdm_inductor.distributed needs a torch build with torch.distributed")

from torch.distributed.tensor import DTensor, Partial, Placement, Replicate, Shard
from torch.distributed.tensor.experimental import register_sharding

from . import ops  # noqa: F401  (defines torch.ops.sdm)
from .validation import SDMArgumentError, _fail

__all__ = ["STREAMS", "COLUMNS", "REPLICATE", "plan", "stream_shard_index"]

STREAMS, COLUMNS, REPLICATE = "streams", "columns", "replicate"

_sdm = torch.ops.sdm

# Tensor dim holding the bank columns (hd) of each tensor argument / output, for the
# "columns" mode; tensors not listed are Replicate there (their gradients Partial).
_COLUMN_DIM = {"bank": 1, "grad_final": 1, "final_bank": 1, "v": 2, "grad_readings": 2,
               "saved_rows": 2}

# Outputs of each op: (name, column dim, or "partial" for a gradient summed over columns,
# or None for Replicate) in "columns" mode.
_OUTPUTS = {
    "write_read": (("readings", 2), ("final", 1), ("saved_rows", 2), ("saved_scales", None)),
    "write_read_": (("readings", 2),),
    "write_read_backward": (("d_bank", 1), ("d_kval", "partial"), ("d_v", 2),
                            ("d_beta", "partial"), ("d_g", "partial"), ("d_qval", "partial")),
}

# The argument whose placement decides the mode, and whether it may be redistributed.
_ANCHOR = {"write_read": ("bank", True), "write_read_": ("bank", False),
           "write_read_backward": ("saved_rows", False)}

# Tensors with the bank's rows on dim 0 (the others have streams on dim 0).
_BANK_ROWS = {"bank", "grad_final", "final_bank"}


# ---------------------------------------------------------------- mode choice

def _bind(op, args, kwargs) -> dict:
    """All arguments of an sdm op by name, defaults filled in."""
    out = {}
    for i, a in enumerate(op._schema.arguments):
        if i < len(args):
            out[a.name] = args[i]
        elif a.name in kwargs:
            out[a.name] = kwargs[a.name]
        elif a.has_default_value():
            out[a.name] = a.default_value
        else:
            raise TypeError(f"sdm: {op}: missing argument '{a.name}'")
    return out


def _tensors(bound: dict) -> dict:
    return {k: v for k, v in bound.items() if isinstance(v, torch.Tensor)}


def _mesh_of(opname: str, tensors: dict):
    """The common mesh; every tensor argument must be a DTensor on it."""
    mesh = None
    for name, t in tensors.items():
        if isinstance(t, DTensor):
            mesh = t.device_mesh if mesh is None else mesh
    for name, t in tensors.items():
        if not isinstance(t, DTensor):
            _fail(name, f"a DTensor like the other arguments of sdm::{opname} (mix of DTensor "
                  "and torch.Tensor; wrap it with DTensor.from_local or distribute_tensor)",
                  "a torch.Tensor")
        if t.device_mesh != mesh:
            _fail(name, f"a DTensor on the mesh of the other arguments ({mesh})", t.device_mesh)
    return mesh


def _wanted(opname: str, tensors: dict, d: int) -> str:
    """The mode the placements on mesh dim ``d`` ask for."""
    anchor, _ = _ANCHOR[opname]
    pa = tensors[anchor].placements[d]
    if opname == "write_read_backward":
        # the forward's mode, read off its saved rows
        return STREAMS if pa == Shard(0) else COLUMNS if pa == Shard(2) else REPLICATE
    if opname == "write_read_":
        # the bank is advanced in place: its placement decides
        return STREAMS if pa == Shard(0) else COLUMNS if pa == Shard(1) else REPLICATE
    if any(t.placements[d] == Shard(0) for t in tensors.values()):
        return STREAMS
    if pa == Shard(1) or tensors["v"].placements[d] == Shard(2):
        return COLUMNS
    return REPLICATE


def plan(opname: str, bound: dict, mesh) -> list[str]:
    """The mode of each mesh dim for a call of ``sdm::<opname>`` (see the module doc)."""
    tensors = _tensors(bound)
    anchor, movable = _ANCHOR[opname]
    k_idx, bank_rows = tensors["k_idx"], tensors[anchor if anchor in _BANK_ROWS else "grad_final"]
    P, S, hd = k_idx.shape[0], bank_rows.shape[0], bank_rows.shape[1]
    sph = bound.get("slots_per_stream", None)
    quant = bound.get("snapshot_quant", "none")
    stream_shards = col_shards = 1
    modes = []
    for d in range(mesh.ndim):
        n = mesh.size(d)
        mode, why = _wanted(opname, tensors, d), ""
        if mode == STREAMS and n > 1:
            # backward: the forward already checked; its saved rows fix the mode
            owned = sph is None or 0 < sph < S
            if opname != "write_read_backward" and not (owned and P % (stream_shards * n) == 0):
                mode, why = REPLICATE, (
                    "streams need per-stream bank rows (slots_per_stream > 0; a shared bank lets "
                    f"a stream write any row) and {P} streams splitting evenly over the shards")
            else:
                stream_shards *= n
        elif mode == COLUMNS and n > 1:
            if opname != "write_read_backward" and (
                    hd % (col_shards * n) or quant not in ("none", "bf16")):
                mode, why = REPLICATE, (
                    f"columns need hd = {hd} divisible by the shards and snapshot_quant "
                    "'none' or 'bf16'")
            else:
                col_shards *= n
        if not movable and tensors[anchor].placements[d] != _placement(anchor, mode):
            _fail(anchor, f"on mesh dim {d} {_placement(anchor, mode)} for sdm::{opname} (mode "
                  f"'{mode}'{'; ' + why if why else ''}; '{anchor}' cannot be redistributed here)",
                  tensors[anchor].placements[d])
        modes.append(mode)
    return modes


def _placement(name: str, mode: str) -> Placement:
    if mode == STREAMS:
        return Shard(0)
    if mode == COLUMNS and name in _COLUMN_DIM:
        return Shard(_COLUMN_DIM[name])
    return Replicate()


def _out_placement(col, mode: str) -> Placement:
    if mode == STREAMS:
        return Shard(0)
    if mode == COLUMNS:
        return Partial() if col == "partial" else Shard(col) if col is not None else Replicate()
    return Replicate()


# ---------------------------------------------------------------- the handler

def _flat(nested) -> list[int]:
    return [x for item in nested for x in _flat(item)] if isinstance(nested, list) else [nested]


def _mesh_ranks(mesh) -> list[int]:
    """Global ranks of the mesh, row-major: the same list on every rank."""
    # ``mesh.mesh`` is a view built by tensor ops; under a tracing mode (fake tensors
    # while torch.compile traces) those would be traced too: read it outside any mode.
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        return _flat(mesh.mesh.tolist())


@torch.library.custom_op("sdm::stream_shard_index", mutates_args=())
def stream_shard_index(like: torch.Tensor, mesh_ranks: list[int], mesh_shape: list[int],
                       dims: list[int]) -> torch.Tensor:
    """This process's shard index over the mesh dims ``dims`` (mesh-dim order, DTensor's
    default for Shard(0) on several dims), as a 0-d int64 tensor on ``like``'s device.

    Read from the process's rank when the graph runs, not when it is traced: a compiled
    graph is cached under a key that holds no rank, so ranks may share one artifact."""
    flat = mesh_ranks.index(dist.get_rank())
    coord = []
    for size in reversed(mesh_shape):
        flat, c = divmod(flat, size)
        coord.insert(0, c)
    index = 0
    for d in dims:
        index = index * mesh_shape[d] + coord[d]
    return torch.tensor(index, dtype=torch.int64, device=like.device)


@stream_shard_index.register_fake
def _(like, mesh_ranks, mesh_shape, dims):
    return like.new_empty((), dtype=torch.int64)


def _stream_dims(modes) -> list[int]:
    return [d for d, mode in enumerate(modes) if mode == STREAMS]


def _global_shape(local: torch.Tensor, placements, mesh):
    shape = list(local.shape)
    for d, p in enumerate(placements):
        if isinstance(p, Shard):
            shape[p.dim] *= mesh.size(d)
    return torch.Size(shape)


def _wrap(local: torch.Tensor, mesh, placements) -> DTensor:
    shape = _global_shape(local, placements, mesh)
    stride = tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))
    return DTensor.from_local(local, mesh, placements, run_check=False, shape=shape, stride=stride)


def _handler(op_call, args, kwargs):
    """Run an sdm write/read op on DTensors: redistribute to the planned modes, rebase the
    indices to this rank's bank shard, run the local op, wrap the outputs."""
    opname = op_call._schema.name.split("::")[1]
    bound = _bind(op_call, args, kwargs)
    tensors = _tensors(bound)
    mesh = _mesh_of(opname, tensors)
    modes = plan(opname, bound, mesh)
    local = dict(bound)
    for name, t in tensors.items():
        want = [_placement(name, m) for m in modes]
        if list(t.placements) != want:
            # below autograd already (the op's autograd wraps this call): nothing to record.
            # Detached, because torch 2.11 would detach_ the output in place, an op its
            # DTensor has no rule for.
            t = t.detach().redistribute(mesh, want)
        local[name] = t.to_local()
    dims = _stream_dims(modes)
    n_shards = math.prod(mesh.size(d) for d in dims)
    rows = local["bank" if "bank" in local else "grad_final"].shape[0]
    if n_shards > 1:
        # bank rows of this shard start at shard * rows: indices become rows of the shard
        shard = stream_shard_index(local["k_idx"], _mesh_ranks(mesh), list(mesh.shape),
                                   dims)
        offset = shard.to(local["k_idx"].dtype) * rows
        local["k_idx"] = local["k_idx"] - offset
        local["q_idx"] = local["q_idx"] - offset
    try:
        out = op_call(*local.values())
    except SDMArgumentError as e:
        if n_shards == 1:
            raise
        coord = mesh.get_coordinate()
        shard = 0
        for d in dims:
            shard = shard * mesh.size(d) + coord[d]
        P = local["k_idx"].shape[0]
        raise SDMArgumentError(
            f"{e} [DTensor stream shard {shard} of {n_shards}: global streams "
            f"[{shard * P}, {(shard + 1) * P}), bank rows [{shard * rows}, {(shard + 1) * rows}); "
            f"positions and indices above are local, indices rebased by -{shard * rows}]") from e
    outs = (out,) if isinstance(out, torch.Tensor) else tuple(out)
    specs = _OUTPUTS[opname]
    wrapped = tuple(_wrap(o, mesh, [_out_placement(col, m) for m in modes])
                    for o, (_, col) in zip(outs, specs))
    return wrapped[0] if isinstance(out, torch.Tensor) else wrapped


for _op in (_sdm.write_read.default, _sdm.write_read_.default, _sdm.write_read_backward.default):
    DTensor._op_dispatcher._custom_op_handlers[_op] = _handler


def _gated_handler(op_call, args, kwargs):
    """``write_read_gated`` on DTensors: its gates are elementwise per stream, so it runs as
    the torch gates (DTensor's own rules) feeding ``write_read`` and that op's handler. The
    op's backward is ``write_read_backward`` plus torch ops, which DTensor already runs."""
    from .gates import torch_gates
    bound = _bind(op_call, args, kwargs)
    beta, g = torch_gates(bound.pop("b_raw"), bound.pop("a_raw"), bound.pop("A_log"),
                          bound.pop("dt_bias"))
    names = [a.name for a in _sdm.write_read.default._schema.arguments]
    bound.update(beta=beta, g=g)
    return _sdm.write_read.default(*(bound[n] for n in names))


DTensor._op_dispatcher._custom_op_handlers[_sdm.write_read_gated.default] = _gated_handler


# ---------------------------------------------------------------- layout helpers

def _divisible(x, dim: int, by: int) -> bool:
    return x.shape[dim] % (x.mesh.size() * by) == 0


@register_sharding(_sdm.split_heads.default)
def _split_heads_sharding(x, num_heads):
    """``b t (h k) -> (b h) t k``: batch shards become stream shards; time stays time."""
    rules = [([Replicate()], [Replicate(), None]), ([Shard(1)], [Shard(1), None])]
    if _divisible(x, 0, 1):
        rules.append(([Shard(0)], [Shard(0), None]))
    return rules


@register_sharding(_sdm.merge_heads.default)
def _merge_heads_sharding(x, num_heads):
    """``(b h) t k -> b t (h k)``: stream shards of whole batches become batch shards."""
    rules = [([Replicate()], [Replicate(), None]), ([Shard(1)], [Shard(1), None])]
    if _divisible(x, 0, num_heads):
        rules.append(([Shard(0)], [Shard(0), None]))
    return rules


@register_sharding(_sdm.expand_bank.default)
def _expand_bank_sharding(bank, batch):
    """``[S, hd] -> [batch*S, hd]``: column shards stay column shards. A row-sharded bank
    would need each rank to expand its own batches: it is replicated first (its gradient,
    a sum over the batch, comes back through the ops DTensor already knows)."""
    return [([Replicate()], [Replicate(), None]), ([Shard(1)], [Shard(1), None])]
