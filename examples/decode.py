"""Token-by-token generation with the decode cache equals the full forward.

    python examples/decode.py            # 2 SDM layers, a 16-token prompt, 48 new tokens
    python examples/decode.py --small    # CI size

Each :class:`SparseDeltaMemory` keeps its advanced bank in an :class:`SDMCache`; a decode
step is the same op on T=1 starting from that bank, so generation costs one token of
work per step instead of re-running the whole prefix. The generated sequence is then run
through the model in one full forward and the logits compared position by position.

The times printed are of warm runs: generation and the full forward each run once first
(the first call of each shape compiles the Triton kernels on CUDA and warms the
allocator), then again under the clock, with the device synchronized before each reading.
"""
from __future__ import annotations

import argparse
import time

import torch
from torch import nn

from sdm_inductor.nn import SparseDeltaMemory


class TinyLM(nn.Module):
    def __init__(self, vocab: int, d_model: int, layers: int, **sdm_kwargs):
        super().__init__()
        self.emb = nn.Embedding(vocab, d_model)
        self.blocks = nn.ModuleList(SparseDeltaMemory(d_model, **sdm_kwargs) for _ in range(layers))
        self.norms = nn.ModuleList(nn.LayerNorm(d_model) for _ in range(layers))
        self.head = nn.Linear(d_model, vocab)

    def new_caches(self):
        return [block.new_cache() for block in self.blocks]

    def forward(self, tokens, caches=None):
        h = self.emb(tokens)
        for i, (norm, block) in enumerate(zip(self.norms, self.blocks)):
            h = h + block(norm(h), cache=None if caches is None else caches[i])
        return self.head(h)


def _now(dev) -> float:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return time.perf_counter()


@torch.no_grad()
def generate(model, prompt, new_tokens: int):
    """Greedy decoding: the prompt in one call, then one token per call. Returns the
    whole sequence, the logits that chose each next token, and the seconds spent in the
    prompt call and in the decode steps."""
    dev = prompt.device
    caches = model.new_caches()
    t0 = _now(dev)
    logits = [model(prompt, caches)]
    seq = [prompt, logits[-1][:, -1:].argmax(-1)]
    t1 = _now(dev)
    for _ in range(new_tokens - 1):
        logits.append(model(seq[-1], caches))
        seq.append(logits[-1].argmax(-1))
    t2 = _now(dev)
    # logits: every position but the last
    return torch.cat(seq, 1), torch.cat(logits, 1), t1 - t0, t2 - t1


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", action="store_true", help="CI size")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    dev = torch.device(args.device)
    vocab, d, layers, prompt_len, new = (32, 32, 2, 5, 12) if args.small else (256, 128, 2, 16, 48)
    model = TinyLM(vocab, d, layers, num_heads=4, slots_per_head=256 if not args.small else 64,
                   top_k=8 if not args.small else 4, output_gate=True).to(dev).eval()
    with torch.no_grad():  # a random bank makes the readings matter from the first token
        for block in model.blocks:
            block.memory.normal_()
    prompt = torch.randint(0, vocab, (2, prompt_len), device=dev)

    def full(seq):
        with torch.no_grad():
            return model(seq[:, :-1])  # every position that chose a next token

    full(generate(model, prompt, new)[0])   # warm-up: kernels compiled for every shape
    seq, step_logits, t_prompt, t_steps = generate(model, prompt, new)
    t0 = _now(dev)
    full_logits = full(seq)
    t_full = _now(dev) - t0

    err = ((step_logits - full_logits).norm() / full_logits.norm()).item()
    # the greedy choices from the full forward (positions from the prompt's last token on)
    same = torch.equal(full_logits[:, prompt_len - 1:].argmax(-1), seq[:, prompt_len:])
    print(f"{layers} SDM layers, batch 2, prompt {prompt_len} + {new} generated tokens, device {dev}")
    print(f"generated (batch 0): {seq[0, prompt_len:].tolist()}")
    print(f"warm times: prompt ({prompt_len} tokens, one call) {1e3 * t_prompt:.1f} ms; "
          f"decode with cache {1e3 * t_steps / (new - 1):.2f} ms per token ({new - 1} steps); "
          f"one full forward of all {seq.shape[1] - 1} positions {1e3 * t_full:.1f} ms")
    print(f"cached decode vs full forward: logits rel err {err:.2e}, same greedy tokens: {same}")
    if err > 1e-5 or not same:
        raise SystemExit("MISMATCH between cached decoding and the full forward")
    print("OK: decoding with the cache equals the full forward")
    return err


if __name__ == "__main__":
    main()
