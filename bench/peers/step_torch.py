"""PyTorch's time for bench_distill_step's step, in the same session: the same Llama-style student (6 x 512,
8 heads, d_ff 1376, vocab 50257, tied head, RMSNorm, adjacent-pair RoPE, SwiGLU), batch 16 x 512, bf16 autocast
over f32 master weights, offline top-64 KD (teacher-probability-weighted cross-entropy over the K ids) + 0.5 CE,
clip 1.0, fused AdamW; eager and torch.compile, SDPA (flash) attention. A comparison peer, never part of retort.
--teacher times what bench_distill_step --mode teacher times instead: a bf16 model's forward without autograd,
the head's top-K log-probs and the summed CE (SmolLM2-135M's shape: --teacher --layers 30 --d-model 576
--heads 9 --kv-heads 3 --d-ff 1536 --vocab 49152 --context 1024 --batch 32).

  python3 bench/peers/step_torch.py [--batch 16] [--steps 10] [--warmup 3] [--no-compile] [--teacher]
"""
import argparse
import sys
import time

try:
    import torch
    import torch.nn.functional as F
except ImportError as e:
    print(f"step_torch: skipped ({e})")
    sys.exit(0)

ap = argparse.ArgumentParser()
ap.add_argument("--layers", type=int, default=6)
ap.add_argument("--d-model", type=int, default=512)
ap.add_argument("--heads", type=int, default=8)
ap.add_argument("--kv-heads", type=int, default=0)
ap.add_argument("--teacher", action="store_true")
ap.add_argument("--d-ff", type=int, default=1376)
ap.add_argument("--vocab", type=int, default=50257)
ap.add_argument("--context", type=int, default=512)
ap.add_argument("--batch", type=int, default=16)
ap.add_argument("--k", type=int, default=64)
ap.add_argument("--steps", type=int, default=10)
ap.add_argument("--warmup", type=int, default=3)
ap.add_argument("--no-compile", action="store_true")
a = ap.parse_args()
if not torch.cuda.is_available():
    print("step_torch: skipped (no GPU)")
    sys.exit(0)
dev = "cuda"
hd = a.d_model // a.heads
kvh = a.kv_heads or a.heads


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        d = a.d_model
        self.n1, self.n2 = torch.nn.RMSNorm(d, eps=1e-5), torch.nn.RMSNorm(d, eps=1e-5)
        self.qkv = torch.nn.Linear(d, (a.heads + 2 * kvh) * hd, bias=False)
        self.o = torch.nn.Linear(d, d, bias=False)
        self.gate_up = torch.nn.Linear(d, 2 * a.d_ff, bias=False)
        self.down = torch.nn.Linear(a.d_ff, d, bias=False)

    def forward(self, x, cos, sin):
        B, T, d = x.shape
        q, k, v = self.qkv(self.n1(x)).view(B, T, a.heads + 2 * kvh, hd).split([a.heads, kvh, kvh], 2)

        def rope(t):  # adjacent pairs (2i, 2i+1)
            n = t.shape[2]
            t2 = t.float().reshape(B, T, n, hd // 2, 2)
            x0, x1 = t2[..., 0], t2[..., 1]
            return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), -1).view(B, T, n, hd).to(t.dtype)

        q, k = rope(q), rope(k)
        att = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                                             enable_gqa=kvh != a.heads)
        x = x + self.o(att.transpose(1, 2).reshape(B, T, d))
        g, u = self.gate_up(self.n2(x)).chunk(2, -1)
        return x + self.down(F.silu(g) * u)


class Student(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(a.vocab, a.d_model)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(a.layers))
        self.norm = torch.nn.RMSNorm(a.d_model, eps=1e-5)
        inv = 10000.0 ** (-torch.arange(0, hd, 2, device=dev).float() / hd)
        ang = torch.arange(a.context, device=dev).float()[:, None] * inv[None, :]
        self.register_buffer("cos", ang.cos()[None, :, None, :], persistent=False)
        self.register_buffer("sin", ang.sin()[None, :, None, :], persistent=False)

    def forward(self, ids, labels, t_ids, t_lp):
        x = self.emb(ids)
        for b in self.blocks:
            x = b(x, self.cos, self.sin)
        logits = (self.norm(x) @ self.emb.weight.t()).float().view(-1, a.vocab)
        lsm = logits.log_softmax(-1)
        ce = F.nll_loss(lsm, labels.view(-1))
        kd = -(t_lp.exp() * lsm.gather(1, t_ids)).sum(-1).mean()
        return 0.5 * ce + 0.5 * kd


    def teacher(self, ids, labels):
        x = self.emb(ids)
        for b in self.blocks:
            x = b(x, self.cos, self.sin)
        logits = (self.norm(x) @ self.emb.weight.t()).float().view(-1, a.vocab)
        lsm = logits.log_softmax(-1)
        top = lsm.topk(a.k, -1)
        return top.values, top.indices, F.nll_loss(lsm, labels.view(-1), reduction="sum")


def run_teacher(compiled):
    torch.manual_seed(0)
    model = Student().to(dev).to(torch.bfloat16).eval()
    fwd = torch.compile(model.teacher) if compiled else model.teacher
    N = a.batch * a.context
    ids = torch.randint(0, a.vocab, (a.batch, a.context), device=dev)

    def step():
        with torch.no_grad():
            vals, idx, nll = fwd(ids, ids)
        return vals.cpu(), idx.cpu(), nll.item()  # what teacher-cache reads back each batch

    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / a.steps
    name = "torch.compile" if compiled else "torch eager"
    print(f"{name:14} {N / dt:10.0f} tokens/s {dt * 1e3:8.2f} ms/batch  peak "
          f"{torch.cuda.max_memory_allocated() / 2**30:.2f} GiB (teacher forward, top-{a.k} + CE)", flush=True)


def run(compiled):
    torch.manual_seed(0)
    model = Student().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
    fwd = torch.compile(model) if compiled else model
    N = a.batch * a.context
    ids = torch.randint(0, a.vocab, (a.batch, a.context), device=dev)
    labels = torch.randint(0, a.vocab, (a.batch, a.context), device=dev)
    t_ids = torch.stack([torch.randperm(a.vocab, device=dev)[: a.k] for _ in range(8)]).repeat(N // 8, 1)
    t_lp = torch.randn(N, a.k, device=dev).log_softmax(-1)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(ids, labels, t_ids, t_lp)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / a.steps
    name = "torch.compile" if compiled else "torch eager"
    print(f"{name:14} {N / dt:10.0f} tokens/s {dt * 1e3:8.2f} ms/step  peak {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB"
          f"  loss {loss.item():.4f}", flush=True)


print(f"step_torch: {torch.cuda.get_device_name()}, torch {torch.__version__}, L{a.layers} d{a.d_model} T{a.context} "
      f"V{a.vocab} B{a.batch} K{a.k}")
go = run_teacher if a.teacher else run
go(False)
if not a.no_compile:
    go(True)
