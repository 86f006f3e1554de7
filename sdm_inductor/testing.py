"""Random valid sdm inputs and error measures, shared by tests and benchmarks."""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

__all__ = ["SDMInputs", "make_inputs", "rel_err", "reference_outputs", "FLOAT_INPUTS",
           "undo_log_rows_used", "with_gates", "gated_reference", "check_strided_banks",
           "Sm90Target", "quick_interpreter", "FunctionalWriteRead"]

# positions of the differentiable inputs in SDMInputs
FLOAT_INPUTS = (0, 2, 3, 4, 5, 7)


class SDMInputs(NamedTuple):
    bank: Tensor
    k_idx: Tensor
    k_val: Tensor
    v: Tensor
    beta: Tensor
    g: Tensor
    q_idx: Tensor
    q_val: Tensor

    def to(self, *args, **kwargs) -> "SDMInputs":
        return SDMInputs(*(t.to(*args, **kwargs) if t.is_floating_point() else t for t in self))

    def leaves(self, requires_grad: bool = True) -> "SDMInputs":
        """Fresh leaf copies; float inputs require grad."""
        return SDMInputs(*(t.detach().clone().requires_grad_(requires_grad and i in FLOAT_INPUTS)
                           for i, t in enumerate(self)))


def make_inputs(P: int = 1, T: int = 16, W: int = 4, R: int = 4, hd: int = 8,
                slots_per_stream: int = 64, *, per_write_gate: bool = False,
                repeats: bool = False, dtype=torch.float32,
                index_dtype=torch.int64, device="cpu", seed: int | None = None,
                gate_scale: float = 1.0) -> SDMInputs:
    """Random inputs in the op's [P, T, *] layout.

    Streams own rows ``[p * slots_per_stream, (p + 1) * slots_per_stream)`` of one bank of
    ``P * slots_per_stream`` rows: disjoint, so the same inputs also serve a shared-bank
    call (``slots_per_stream=0, shared_bank=True``). Write slots are distinct per token
    unless ``repeats``, which makes some tokens write a slot twice.
    """
    gen = torch.Generator().manual_seed(seed if seed is not None else torch.seed() % (2**31))
    sph = slots_per_stream
    if W > sph:
        raise ValueError(f"W={W} distinct slots need slots_per_stream >= W, got {sph}")
    base = (torch.arange(P) * sph).view(P, 1, 1)
    k_idx = torch.rand(P, T, sph, generator=gen).argsort(-1)[..., :W] + base
    if repeats and W > 1 and T > 0:
        k_idx[:, ::2, -1] = k_idx[:, ::2, 0]
    q_idx = torch.randint(0, sph, (P, T, R), generator=gen) + base
    if R > 1 and T > 0:  # read some just-written slots: the in-chunk interactions
        q_idx[..., 0] = k_idx[..., 0]
    k_val = torch.randn(P, T, W, generator=gen).softmax(-1)
    q_val = torch.randn(P, T, R, generator=gen)
    v = torch.randn(P, T, hd, generator=gen)
    beta = torch.rand(P, T, generator=gen)
    g = -torch.rand(P, T, W if per_write_gate else 1, generator=gen) * gate_scale
    bank = torch.randn(P * sph, hd, generator=gen)
    ins = SDMInputs(bank.to(dtype), k_idx.to(index_dtype), k_val.to(dtype), v.to(dtype),
                    beta, g, q_idx.to(index_dtype), q_val.to(dtype))
    return SDMInputs(*(t.to(device) for t in ins))


class FunctionalWriteRead(torch.nn.Module):
    """``(bank, k_idx, k_val, v, beta, g, q_idx, q_val) -> (readings, final bank)``: one
    functional ``sdm::write_read`` that saves nothing, the module that exports and
    AOTInductor packages of the bare op are built from."""

    def __init__(self, chunk_size: int, slots_per_stream: int):
        super().__init__()
        self.chunk_size, self.slots_per_stream = chunk_size, slots_per_stream

    def forward(self, bank, k_idx, k_val, v, beta, g, q_idx, q_val):
        return torch.ops.sdm.write_read(bank, k_idx, k_val, v, beta, g, q_idx, q_val,
                                        chunk_size=self.chunk_size,
                                        slots_per_stream=self.slots_per_stream,
                                        save_for_backward=False)[:2]


def rel_err(a: Tensor, b: Tensor) -> float:
    """||a - b|| / ||b|| in float64 (NaN never passes)."""
    a, b = a.detach().double(), b.detach().double()
    if not torch.isfinite(a).all():
        return float("inf")
    den = b.norm()
    return float((a - b).norm() / (den if den > 0 else 1.0))


def reference_outputs(ins: SDMInputs, grad_out=None, compute_dtype=torch.float64):
    """Oracle readings, final bank and (with ``grad_out = (dy, dM)``) the six gradients."""
    from .reference import sdm_write_read_reference

    leaves = ins.to(compute_dtype).leaves(grad_out is not None)
    y, M = sdm_write_read_reference(*leaves, compute_dtype=compute_dtype)
    if grad_out is None:
        return y.detach(), M.detach(), None
    dy, dM = grad_out
    loss = (y * dy.to(compute_dtype)).sum() + (M * dM.to(compute_dtype)).sum()
    grads = torch.autograd.grad(loss, [leaves[i] for i in FLOAT_INPUTS], allow_unused=True)
    grads = tuple(torch.zeros_like(leaves[i]) if g is None else g
                  for i, g in zip(FLOAT_INPUTS, grads))
    return y.detach(), M.detach(), grads


def with_gates(ins: SDMInputs, value: float, every: int = 5) -> SDMInputs:
    """``ins`` with the gates of every ``every``-th token, and of a run of two tokens in
    the last stream, set to ``value`` (e.g. ``-inf``: a full forget)."""
    g = ins.g.clone()
    g[:, ::every] = value
    g[-1, 1:3] = value
    return ins._replace(g=g)


def gated_reference(ins: SDMInputs, raw, grad_out=None, compute_dtype=torch.float64):
    """Oracle of ``sdm::write_read_gated``: ``gates.torch_gates(*raw)`` (``raw = (b_raw,
    a_raw, A_log, dt_bias)``) into the token loop, in ``compute_dtype``. Returns readings,
    final bank and (with ``grad_out = (dy, dM)``) the gradients of (bank, k_val, v, q_val,
    *raw)."""
    from .gates import torch_gates
    from .reference import sdm_write_read_reference

    need = grad_out is not None
    x = [t.detach().to(compute_dtype).requires_grad_(need)
         for t in (ins.bank, ins.k_val, ins.v, ins.q_val, *raw)]
    beta, g = torch_gates(*x[4:])
    y, M = sdm_write_read_reference(x[0], ins.k_idx, x[1], x[2], beta.to(compute_dtype),
                                    g.to(compute_dtype), ins.q_idx, x[3],
                                    compute_dtype=compute_dtype)
    if not need:
        return y.detach(), M.detach(), None
    dy, dM = grad_out
    loss = (y * dy.to(compute_dtype)).sum() + (M * dM.to(compute_dtype)).sum()
    return y.detach(), M.detach(), torch.autograd.grad(loss, x)


_AOTI_CONTROL: dict[str, str | None] = {}

_AOTI_LOAD = """
import sys, torch
torch._inductor.aoti_load_package(sys.argv[1])(torch.randn(4, 8, device=sys.argv[2]))
"""


def aoti_runtime_failure(device: str) -> str | None:
    """Why this torch build cannot load AOTInductor packages on ``device`` in a fresh
    process, or None when it can. The control is a plain ``nn.Linear`` package, nothing of
    SDM in it: tests use it to tell a defect of the toolchain (seen on the H200 image,
    torch 2.11+cu130: every package, plain or not, CPU or CUDA, dies with SIGSEGV in
    ``AOTIModelPackageLoader``) from a defect of this library. On that image the packages
    built by its default ``CXX`` (a wrapper script) crash; ``CXX=/usr/bin/g++`` builds a
    CPU package that loads."""
    if device not in _AOTI_CONTROL:
        import os
        import subprocess
        import sys
        import tempfile
        model = torch.nn.Linear(8, 8).to(device).eval()
        with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
            path = os.path.join(tmp, "control.pt2")
            ep = torch.export.export(model, (torch.randn(4, 8, device=device),))
            torch._inductor.aoti_compile_and_package(ep, package_path=path)
            res = subprocess.run([sys.executable, "-c", _AOTI_LOAD, path, device],
                                 capture_output=True, text=True, timeout=300)
        _AOTI_CONTROL[device] = None if res.returncode == 0 else (
            f"torch {torch.__version__} cannot load even a plain nn.Linear AOTInductor package "
            f"on {device} in a fresh process (exit {res.returncode}; C++ compiler "
            f"{os.environ.get('CXX', 'default')}): a toolchain defect")
    return _AOTI_CONTROL[device]


def undo_log_rows_used(k_idx: Tensor, C: int) -> Tensor:
    """Mask ``[NC * P * C, W]`` of the undo-log rows a saving call fills (the rest of
    ``saved_rows`` is unspecified; ``quant.UndoLog``): in segment (chunk c, stream p) the
    start of each slot's run among the chunk's write entries sorted by slot, each slot
    counted once per token (indices in range assumed)."""
    P, T, W = k_idx.shape
    NC = -(-T // C)
    used = torch.zeros(NC * P, C * W, dtype=torch.bool)
    for c in range(NC):
        for p in range(P):
            # one entry per (token, distinct slot), in slot order
            ents = torch.cat([row.unique() for row in k_idx[p, c * C:(c + 1) * C].cpu()])
            slots, counts = ents.sort().values.unique_consecutive(return_counts=True)
            used[c * P + p, (torch.cumsum(counts, 0) - counts)] = True
    return used.view(NC * P * C, W).to(k_idx.device)


def check_strided_banks(ins: SDMInputs, C: int, tol: float) -> None:
    """Banks whose rows are not contiguous, a column slice of a wider tensor and a
    transposed tensor, through ``sdm::write_read_`` (readings and bank; the columns beside
    the slice untouched) and ``sdm::write_read`` with autograd (readings, final bank and
    the bank's gradient, which reaches only the slice's columns) against the oracle."""
    P = ins.k_idx.shape[0]
    S, hd = ins.bank.shape
    gen = torch.Generator().manual_seed(3)
    dy = torch.randn(ins.v.shape, generator=gen).to(ins.v)
    dM = torch.randn(ins.bank.shape, generator=gen).to(ins.bank)
    y_ref, M_ref, g_ref = reference_outputs(ins, (dy, dM))
    rest = tuple(ins)[1:]

    def layouts():
        wide = torch.cat([ins.bank, torch.randn(S, 3, generator=gen).to(ins.bank)], 1)
        yield "column slice", wide, lambda t: t[:, :hd]
        yield "transposed", ins.bank.t().contiguous(), lambda t: t.t()

    def close(what, got, want):
        err = rel_err(got, want)
        assert err <= tol, f"{what}: relative error {err:.2e} > {tol:.0e}"

    for name, whole, view in layouts():
        base = whole.clone()
        bank = view(base)
        y = torch.ops.sdm.write_read_(bank, *rest, C, S // P)
        close(f"{name}, in place: readings", y, y_ref)
        close(f"{name}, in place: bank", bank, M_ref)
        if name == "column slice":
            assert torch.equal(base[:, hd:], whole[:, hd:]), f"{name}: columns beside it written"
        leaf = whole.clone().requires_grad_(True)
        y, M, _, _ = torch.ops.sdm.write_read(view(leaf), *rest, C, S // P)
        close(f"{name}, functional: readings", y, y_ref)
        close(f"{name}, functional: final bank", M, M_ref)
        loss = (y.float() * dy.float()).sum() + (M.float() * dM.float()).sum()
        (grad,) = torch.autograd.grad(loss, leaf)
        close(f"{name}: bank gradient", view(grad), g_ref[0])
        if name == "column slice":
            assert not grad[:, hd:].any(), f"{name}: gradient beside the slice"


class Sm90Target:
    """A Triton driver stand-in that reports an sm_90 GPU (an H100 / H200): torch's mutation
    analysis of user kernels asks the active driver for its target, so traces that record
    the CUDA kernels can run without a GPU (set it as ``triton.runtime.driver``'s active
    driver for the trace)."""

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget
        return GPUTarget("cuda", 90, 32)


def quick_interpreter(overflow_checks: bool = False) -> None:
    """Triton's interpreter (``TRITON_INTERPRET=1``) as the kernel tests run it: the
    language patched once per launch (``_patch_language_once_per_launch``), numpy dtypes
    looked up instead of rebuilt (``_np_dtypes_once``), tuple types made when asked for
    (``_lazy_tuple_types``), block types and tensor shapes shared (``_shared_block_types``)
    and, unless ``overflow_checks``, no int32 overflow checks (``_no_overflow_checks``).
    None changes what a kernel computes; together they take more than half off the tests'
    time under the interpreter."""
    _patch_language_once_per_launch()
    _np_dtypes_once()
    _lazy_tuple_types()
    _shared_block_types()
    if not overflow_checks:
        _no_overflow_checks()


def _lazy_tuple_types() -> None:
    """Make a ``tl.tuple``'s type (``tuple_type``, with its name string) when it is asked
    for instead of when the tuple is made. Every tensor the interpreter makes keeps its shape
    as a ``tl.tuple`` whose type nothing reads: building it took about a quarter of the
    kernel tests' time (the step walk case 137 -> 103 s). A type given to the tuple, or set
    later (``_setitem``), is kept as given. Where the interpreter's internals differ from
    Triton 3.6's, nothing is changed."""
    try:
        from triton.language import core
        tup, tuple_type, type_for = core.tuple, core.tuple_type, core._type_for_tuple_values
    except (ImportError, AttributeError):
        return
    if "type" in vars(tup):   # made lazy already (or not Triton 3.6's tuple)
        return

    def init(self, args, type=None):
        self.values = list(args)
        if type is not None and not isinstance(type, tuple_type):
            type = tuple_type(type)   # (a list of types, as ASTFunction.deserialize passes)
        self.__dict__["_type"] = type

    def get_type(self):
        t = self.__dict__.get("_type")
        if t is None:
            t = self.__dict__["_type"] = type_for(self.values)
        return t

    def set_type(self, t):
        self.__dict__["_type"] = t

    tup.__init__ = init
    tup.type = property(get_type, set_type)


def _shared_block_types() -> None:
    """One ``tl.block_type`` per element type and shape, and one shape (a tuple of
    ``constexpr`` sizes) and size per type for all the tensors of that type. The interpreter
    makes a new block type for the result of every op (its shape checked, its name
    formatted) and a new shape for every tensor; with one object per type, operands of
    equal types skip the broadcast's shape comparison too. Together ~25 % of the kernel
    tests' time (CPU time of one case on one core: the queue walk case 108 -> 82 s, the step
    walk case 87 -> 61 s). Types compare by value, so one object serves every equal type;
    nothing mutates a type or a tensor's shape. Where the interpreter's internals differ
    from Triton 3.6's, nothing is changed."""
    try:
        from triton.language import core
        from triton.language.semantic import TritonSemantic as semantic
        bt, tensor, constexpr = core.block_type, core.tensor, core.constexpr
        pointer, broadcast_any = core.pointer_type, semantic.broadcast_impl_value
    except (ImportError, AttributeError):
        return
    if "__new__" in vars(bt):
        return
    made, init = {}, bt.__init__
    sizes = {}   # id of a type in ``made`` -> the shape and size of its tensors

    def type_key(t):   # (a pointer type compares by its fields but has no hash)
        if isinstance(t, pointer):
            return (type_key(t.element_ty), t.address_space, t.const)
        return t

    def new(cls, element_ty=None, shape=None):
        if cls is not bt or shape is None:   # (a subclass; or a copy, which sets the fields)
            return object.__new__(cls)
        key = (type_key(element_ty), tuple(getattr(n, "value", n) for n in shape))
        got = made.get(key)
        if got is None:
            got = made[key] = object.__new__(cls)
            init(got, element_ty, shape)
            sizes[id(got)] = (core.tuple([constexpr(n) for n in got.shape]),
                              constexpr(got.numel))   # (kept alive by ``made``)
        return got

    def init_once(self, element_ty, shape):
        if "name" not in vars(self):
            init(self, element_ty, shape)

    def tensor_init(self, handle, type):
        self.handle = handle
        got = sizes.get(id(type)) if type.__class__ is bt else None
        if got is None:
            shape = type.shape if type.is_block() else ()
            got = (core.tuple([constexpr(n) for n in shape]), constexpr(math.prod(shape)))
        self.shape, self.numel = got
        self.type = type
        self.dtype = type.scalar

    def broadcast(self, lhs, rhs):   # (one object per type: equal types need nothing)
        if lhs.type is rhs.type:
            return lhs, rhs
        return broadcast_any(self, lhs, rhs)

    bt.__new__ = new
    bt.__init__ = init_once
    tensor.__init__ = tensor_init
    semantic.broadcast_impl_value = broadcast


def _np_dtypes_once() -> None:
    """The interpreter's ``_get_np_dtype`` (the numpy dtype of a Triton type, asked for at
    every op) builds a table of 20 numpy dtypes at each call; here each Triton dtype's
    answer is kept after its first call (~10 % of the kernel tests' time). A block's answer
    is its element's, a pointer's uint64, as in the original. Where the interpreter's
    internals differ from Triton 3.6's, nothing is changed."""
    try:
        import numpy as np
        from triton.runtime import interpreter as interp
        tl, get = interp.tl, interp._get_np_dtype
    except (ImportError, AttributeError):
        return
    if getattr(get, "_kept", False):
        return
    kept, u64 = {}, np.dtype(np.uint64)

    def np_dtype(tt):
        if isinstance(tt, tl.block_type):
            tt = tt.element_ty
        if isinstance(tt, tl.pointer_type):
            return u64
        got = kept.get(tt)
        if got is None:
            got = kept[tt] = get(tt)
        return got

    np_dtype._kept = True
    interp._get_np_dtype = np_dtype


def _no_overflow_checks() -> None:
    """Switch off the interpreter's check of every 32-bit integer add, sub and mul for
    overflow (Triton's ``sanitize_overflow``: each such op is redone in int64 and compared
    with the int32 bounds, ~20 % of the kernel tests' time). Compiled kernels make the check
    only in debug builds. At the tests' sizes every valid index and offset is far below
    2**31; the tests that feed out-of-range indices keep the checks. Where the
    interpreter's internals differ from Triton 3.6's, nothing is changed."""
    try:
        from triton.runtime import interpreter as interp
        builder, options = interp.interpreter_builder, interp.InterpreterOptions
    except (ImportError, AttributeError):
        return
    if getattr(builder.options, "sanitize_overflow", False):
        builder.options = options(sanitize_overflow=False)


def _patch_language_once_per_launch() -> None:
    """Make Triton's interpreter (``TRITON_INTERPRET=1``) patch ``triton.language`` once per
    kernel launch instead of again at every call of a ``@triton.jit`` helper.

    The interpreter swaps the language's builtins for numpy versions when a launch starts
    and again, with a scan of every member of the modules (~1 ms), at each helper call,
    though the launch has already patched the same modules; that second patch changes
    nothing (the members it looks for are already swapped) and takes about 30 % of the
    kernel tests' time. Here a helper's call skips it when the running launch patched
    every language module the helper sees. Where the interpreter's internals differ from
    Triton 3.6's, nothing is changed."""
    import inspect

    try:
        from triton.runtime import interpreter as interp
        patch, call = interp._patch_lang, interp.GridExecutor.__call__
        empty_scope, tl = interp._LangPatchScope, interp.tl
    except (ImportError, AttributeError):
        return
    if getattr(patch, "_once_per_launch", False):
        return
    patched = [None]   # the language modules the running launch has patched (None: no launch)

    seen = {}   # id of a helper's globals -> (the globals, the language modules among them)

    def modules(fn) -> frozenset:
        g = fn.__globals__
        got = seen.get(id(g))
        if got is None or got[0] is not g:   # (a module's names are bound at its import)
            got = seen[id(g)] = (g, frozenset(id(v) for v in g.values()
                                              if inspect.ismodule(v) and v in (tl, tl.core)))
        return got[1]

    def patch_once(fn):
        done = patched[0]
        if done is not None and modules(fn) <= done:
            return empty_scope()
        scope = patch(fn)
        if done is not None:
            patched[0] = done | modules(fn)
        return scope

    def launch(self, *args, **kwargs):
        prior, patched[0] = patched[0], frozenset()
        try:
            return call(self, *args, **kwargs)
        finally:
            patched[0] = prior

    patch_once._once_per_launch = True
    interp._patch_lang = patch_once
    interp.GridExecutor.__call__ = launch
