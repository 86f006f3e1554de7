"""How the compiled graph computes ``sdm::write_read``, ``sdm::write_read_gated``,
``sdm::write_read_`` and ``sdm::write_read_backward``.

Each op is rewritten while AOTDispatcher functionalizes the graph (see ``_rules``):

1. The dtype casts the eager op does inside its body (k_val, v, q_val to the bank dtype;
   beta, g to fp32) are hoisted into the graph, where Inductor fuses them into the
   kernels that produce those tensors instead of paying a pass of their own.
2. Where Inductor should emit the kernels (``EMIT_KERNELS``; a device with Triton
   kernels, ``TRITON_DEVICES``: CUDA), the op becomes the matching ``torch.library.triton_op``;
   that op decomposes into its body in the same functionalization, so Inductor sees the
   ``wrap_triton`` kernels and launches them from its own output code (AOTInductor
   packages carry them). A traced call launches one kernel per walk, whose compilation
   serves every ``T``: the queue walks (the step walks' items in one launch), forward
   and backward; small shapes (and fp8 / int4 undo logs backward) the column walks. A
   training graph's forward hands its Phase 1 and ``v - r0`` to its backward as graph
   values (``_Handed``), so the backward recomputes neither.
3. Otherwise (CPU; CUDA under ``torch.compile`` by default) the op stays one extern call
   of the eager implementation per op call: on CUDA the step walks, launches per chunk
   that a graph of fixed launches cannot hold (docs/design.md, Lowerings), or for small
   shapes the column walks (``kernels.runtime.launch.column_suits``). A functional
   call that saves nothing for a backward becomes ``clone`` + ``sdm::write_read_``:
   Inductor reinplaces the clone, so the copy of the bank that the eager op makes
   internally fuses with whatever produced the bank (e.g. the ``expand_bank`` of a
   learned bank) instead of being a second full pass.
"""
from __future__ import annotations

import os

import torch
import torch._inductor.config
from torch._inductor.virtualized import V
from torch.fx.experimental.symbolic_shapes import statically_known_true

from .. import gates, kept, ops
from . import _rules

# op name -> name of the triton_op (in torch.ops.sdm) that implements it on these devices
TRITON_OPS = {
    "write_read": "triton_write_read",
    "write_read_gated": "triton_write_read_gated",
    "write_read_": "triton_write_read_",
    "write_read_backward": "triton_write_read_backward",
}
TRITON_DEVICES = ("cuda",)

# Which compiled graphs launch the CUDA kernels from their own code. "aot" (default):
# AOTInductor packages (self-contained: no Python needed to run them), while torch.compile
# calls the eager implementation, because the emitted call is the slower one at A and in
# training: 1.047x / 1.058x the extern call's time at A and 0.989x / 1.031x at B on an H100
# (no-grad / training, C=128, static shapes; under dynamic=True the walks learn from a
# guard that rows are 16-aligned (HD16) and Phase 1 sorts as a static graph does, under
# guards on the sizes). Its queue walks trail the eager step walks (docs/performance.md,
# "Traced walks").
# "always": torch.compile's output code launches them too. "never": AOTInductor packages
# call the eager implementation as well, through AOTInductor's proxy executor (the loading
# process runs Python with sdm_inductor imported, as CPU packages always need): at A a
# package then takes 1.04x the eager call's time no-grad, 1.13x with the kernels in it
# (H100, measured with the register caps dropped from the output code; docs/performance.md,
# "What users call"). SDM_INDUCTOR_EMIT_KERNELS sets it.
EMIT_MODES = ("aot", "always", "never")
EMIT_KERNELS = os.environ.get("SDM_INDUCTOR_EMIT_KERNELS", "aot")

# Before AOTInductor writes its C++ wrapper it runs every kernel of the graph once
# (``triton.autotune_at_compile_time``, on by default for AOT) to compile and tune it. By
# default each kernel gets made-up buffers there: random floats, zero integers, and for the
# outputs of ops that are not Triton kernels (Phase 1's sorts) never computed values. Phase
# 1's and the walks' kernels index rows through such buffers (a sort's permutation, run
# starts), so on made-up data they read and write out of bounds: an illegal memory access
# during the build (8 of 20 builds of examples/export_aoti.py on an H200), or device memory
# overwritten without an error. With ``autotune_with_sample_inputs`` Inductor runs the
# graph on the example inputs once and gives each user-defined kernel the arguments it got
# there (at the cost of a copy of the example inputs during the build). It changes only
# graphs that hold user-defined Triton kernels; set it back to False after import to opt out.
torch._inductor.config.triton.autotune_with_sample_inputs = True


def triton_op(name: str, device: torch.device):
    """The triton_op for ``name`` on ``device``, or None (no kernels for that device,
    or ``sdm_inductor.kernels`` did not register them: no triton)."""
    if device.type not in TRITON_DEVICES:
        return None
    qualname = TRITON_OPS[name]
    if not hasattr(torch.ops.sdm, qualname):
        return None
    return getattr(torch.ops.sdm, qualname).default


def emitted(name: str, device: torch.device):
    """The triton_op whose kernels the graph being compiled launches from its own code
    (``EMIT_KERNELS``), or None: the op stays an extern call."""
    if EMIT_KERNELS not in EMIT_MODES:
        raise ValueError(f"sdm_inductor: EMIT_KERNELS (SDM_INDUCTOR_EMIT_KERNELS) must be one "
                         f"of {', '.join(map(repr, EMIT_MODES))}, got {EMIT_KERNELS!r}")
    if EMIT_KERNELS == "never" or (EMIT_KERNELS == "aot" and not V.aot_compilation):
        return None
    return triton_op(name, device)


class _Handed:
    """What an emitted forward hands to its emitted backward (Phase 1's plan and ``v - r0``,
    which the backward would otherwise recompute), as values of the graph being traced. The
    rule of the forward offers it to the op's autograd context (``kept.keep_for_backward``),
    as an eager forward offers its ``Kept``; the backward's rule passes it to the backward's
    triton_op, so AOTAutograd saves those values for the backward graph like any other
    activation."""

    def __init__(self, tensors):
        self.tensors = list(tensors)


def _emit_forward(kernel, args, save: bool):
    """The forward's triton_op on ``args``: its four outputs, what it hands over offered to
    the backward."""
    readings, final, rows, scales, handed = kernel(*args)
    if save and len(handed):
        kept.keep_for_backward(readings, _Handed(handed))
    return readings, final, rows, scales


def _cast_inputs(dtype, k_val, v, beta, g, q_val):
    """The eager op's casts, as graph ops (no-ops when the dtypes already match)."""
    return k_val.to(dtype), v.to(dtype), beta.float(), g.float(), q_val.to(dtype)


def _write_read_rule(mode, op, types, args, kwargs):
    (bank, k_idx, k_val, v, beta, g, q_idx, q_val, chunk_size, slots_per_stream, shared_bank,
     snapshot_quant, grad_bank_fp32, save) = _rules.bound_args(op, args, kwargs)
    with mode:
        k_val, v, beta, g, q_val = _cast_inputs(bank.dtype, k_val, v, beta, g, q_val)
        kernel = emitted("write_read", bank.device)
        if kernel is not None:
            return _emit_forward(kernel, (bank, k_idx, k_val, v, beta, g, q_idx, q_val,
                                          chunk_size, snapshot_quant, save), save)
        if not save:
            final = bank.clone(memory_format=torch.contiguous_format)   # as eager
            readings = torch.ops.sdm.write_read_(final, k_idx, k_val, v, beta, g, q_idx, q_val,
                                                 chunk_size, slots_per_stream, shared_bank)
            rows, dtype, scales = ops._saved_shapes(bank, k_idx, chunk_size, snapshot_quant,
                                                    False)
            return (readings, final, bank.new_empty(rows, dtype=dtype),
                    bank.new_empty(scales, dtype=torch.float32))
    args = (bank, k_idx, k_val, v, beta, g, q_idx, q_val, chunk_size, slots_per_stream,
            shared_bank, snapshot_quant, grad_bank_fp32, save)
    return mode.__torch_dispatch__(op, types, args, {})


def _write_read_gated_rule(mode, op, types, args, kwargs):
    """CUDA: the gated triton_op where the kernels are emitted, else the op as one extern
    call (either way the prep kernel computes the gates from the raw inputs). Elsewhere:
    the gates as graph ops (Inductor fuses them with their producers) and
    ``sdm::write_read``, which its own rule then rewrites."""
    (bank, k_idx, k_val, v, b_raw, a_raw, A_log, dt_bias, q_idx, q_val, chunk_size,
     slots_per_stream, shared_bank, snapshot_quant, grad_bank_fp32,
     save) = _rules.bound_args(op, args, kwargs)
    with mode:
        dt = bank.dtype
        k_val, v, q_val = k_val.to(dt), v.to(dt), q_val.to(dt)
        kernel = emitted("write_read_gated", bank.device)
        if kernel is not None:
            return _emit_forward(kernel, (bank, k_idx, k_val, v, b_raw, a_raw, A_log, dt_bias,
                                          q_idx, q_val, chunk_size, snapshot_quant, save), save)
        if triton_op("write_read_gated", bank.device) is None:
            beta, g = gates.torch_gates(b_raw, a_raw, A_log, dt_bias)
            return torch.ops.sdm.write_read(bank, k_idx, k_val, v, beta, g, q_idx, q_val,
                                            chunk_size, slots_per_stream, shared_bank,
                                            snapshot_quant, grad_bank_fp32, save)
    # one extern call whose prep kernel computes the gates (no pass of their own)
    args = (bank, k_idx, k_val, v, b_raw, a_raw, A_log, dt_bias, q_idx, q_val, chunk_size,
            slots_per_stream, shared_bank, snapshot_quant, grad_bank_fp32, save)
    return mode.__torch_dispatch__(op, types, args, {})


def _write_read_inplace_rule(mode, op, types, args, kwargs):
    (bank, k_idx, k_val, v, beta, g, q_idx, q_val, chunk_size, slots_per_stream,
     shared_bank) = _rules.bound_args(op, args, kwargs)
    with mode:
        k_val, v, beta, g, q_val = _cast_inputs(bank.dtype, k_val, v, beta, g, q_val)
        offset = bank.storage_offset()
        if isinstance(offset, torch.SymInt) and not statically_known_true(offset == 0):
            # a view at a symbolic offset written in place: Inductor lowers that offset
            # to 0 (no lowering of sym_storage_offset, pytorch/pytorch#198068) and the
            # op would write the first rows of the storage; compute into a new bank
            # and copy it into the view
            readings, final = torch.ops.sdm.write_read(
                bank, k_idx, k_val, v, beta, g, q_idx, q_val, chunk_size, slots_per_stream,
                shared_bank, "none", False, False)[:2]
            bank.copy_(final)
            return readings
        kernel = emitted("write_read_", bank.device)
        if kernel is not None:
            return kernel(bank, k_idx, k_val, v, beta, g, q_idx, q_val, chunk_size)
    args = (bank, k_idx, k_val, v, beta, g, q_idx, q_val, chunk_size, slots_per_stream,
            shared_bank)
    return mode.__torch_dispatch__(op, types, args, {})


def _backward_rule(mode, op, types, args, kwargs):
    (grad_readings, grad_final, final_bank, saved_rows, saved_scales, k_idx, k_val, v, beta, g,
     q_idx, q_val, chunk_size, snapshot_quant, grad_bank_fp32) = _rules.bound_args(op, args, kwargs)
    with mode:
        k_val, v, beta, g, q_val = _cast_inputs(grad_final.dtype, k_val, v, beta, g, q_val)
        args = (grad_readings, grad_final, final_bank, saved_rows, saved_scales, k_idx, k_val, v,
                beta, g, q_idx, q_val, chunk_size, snapshot_quant, grad_bank_fp32)
        kernel = emitted("write_read_backward", grad_final.device)
        if kernel is not None:
            # the op's autograd formula (ops._backward) makes its forward's offer current
            offer = kept.kept_for_backward()
            return kernel(*args, offer.tensors if isinstance(offer, _Handed) else [])
    return mode.__torch_dispatch__(op, types, args, {})


_rules.register("sdm::write_read", _write_read_rule)
_rules.register("sdm::write_read_gated", _write_read_gated_rule)
_rules.register("sdm::write_read_", _write_read_inplace_rule)
_rules.register("sdm::write_read_backward", _backward_rule)
