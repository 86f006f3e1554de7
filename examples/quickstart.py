"""The explicit op on a small bank: readings, the advanced bank, a gradient.

    python examples/quickstart.py            # P=2 streams of T=100 tokens
    python examples/quickstart.py --small    # CI size

One call of ``sdm_inductor.write_read`` (``torch.ops.sdm.write_read`` underneath) runs
every token of every stream through the recurrence of docs/spec.md section 1, chunked
(section 3), and is checked here against the plain token loop.
"""
from __future__ import annotations

import argparse

import torch

import sdm_inductor
from sdm_inductor.reference import sdm_write_read_reference


def distinct_slots(P, T, k, slots_per_stream, device):
    """k distinct rows per token, inside the stream's own rows [p*sps, (p+1)*sps)."""
    local = torch.rand(P, T, slots_per_stream, device=device).argsort(-1)[..., :k]
    return local + (torch.arange(P, device=device) * slots_per_stream).view(P, 1, 1)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", action="store_true", help="CI size")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    dev = torch.device(args.device)
    P, T, hd, sps, W, R = (2, 20, 8, 32, 4, 4) if args.small else (2, 100, 16, 256, 8, 8)

    # a bank of P streams x sps rows; stream p owns rows [p*sps, (p+1)*sps)
    bank = (0.1 * torch.randn(P * sps, hd, device=dev)).requires_grad_()
    k_idx = distinct_slots(P, T, W, sps, dev)                     # where each token writes
    k_val = torch.softmax(torch.randn(P, T, W, device=dev), -1).requires_grad_()
    v = torch.randn(P, T, hd, device=dev).requires_grad_()         # what it writes
    beta = torch.rand(P, T, device=dev).requires_grad_()           # write strength
    g = (-0.1 * torch.rand(P, T, 1, device=dev)).requires_grad_()  # log-decay of written rows
    q_idx = distinct_slots(P, T, R, sps, dev)                     # where it reads
    q_val = torch.softmax(torch.randn(P, T, R, device=dev), -1).requires_grad_()
    inputs = (bank, k_idx, k_val, v, beta, g, q_idx, q_val)
    print(f"bank {list(bank.shape)} ({P} streams x {sps} rows, hd={hd}); {T} tokens per stream, "
          f"{W} write / {R} read slots per token; device {dev}")

    readings, final = sdm_inductor.write_read(*inputs, chunk_size=16, slots_per_stream=sps)
    print(f"readings {list(readings.shape)}, first token of stream 0: {readings[0, 0, :4].tolist()}")
    rows = (final != bank).any(-1).sum().item()
    print(f"advanced bank: {rows} of {P * sps} rows changed; launch: {sdm_inductor.last_dispatch()}")

    # a gradient: d loss / d (initial bank, values, gates, ...) through the whole sequence
    loss = readings.square().mean() + final.square().mean()
    loss.backward()
    print(f"loss {loss.item():.5f}; |d loss/d bank| = {bank.grad.norm():.4e}, "
          f"|d loss/d v| = {v.grad.norm():.4e}, |d loss/d g| = {g.grad.norm():.4e}")

    # the same thing as the plain token loop of spec section 1
    grads_op = [t.grad.clone() for t in (bank, k_val, v, beta, g, q_val)]
    for t in (bank, k_val, v, beta, g, q_val):
        t.grad = None
    ref_readings, ref_final = sdm_write_read_reference(*inputs)
    (ref_readings.square().mean() + ref_final.square().mean()).backward()
    err = lambda a, b: ((a - b).norm() / b.norm()).item()
    print(f"vs the token loop: readings rel err {err(readings, ref_readings):.2e}, "
          f"bank {err(final, ref_final):.2e}, d bank {err(grads_op[0], bank.grad):.2e}, "
          f"d v {err(grads_op[2], v.grad):.2e}")
    worst = max(err(readings, ref_readings), err(final, ref_final), err(grads_op[0], bank.grad))
    if worst >= 1e-4:
        raise SystemExit(f"MISMATCH: worst relative error {worst:.2e} against the token loop")
    print("OK: the op matches the token loop")
    return worst


if __name__ == "__main__":
    main()
