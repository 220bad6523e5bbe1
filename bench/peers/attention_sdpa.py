"""PyTorch's scaled_dot_product_attention (flash backend) at bench_attention's shapes, bf16, causal: forward
and backward medians with CUDA events, the same FLOP count. Runs where PyTorch and a GPU are; a comparison
peer only, never part of retort."""
import sys

try:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
except ImportError as e:
    print(f"attention_sdpa: skipped ({e})")
    sys.exit(0)

if not torch.cuda.is_available():
    print("attention_sdpa: skipped (no GPU)")
    sys.exit(0)


def median_ms(fn, reps=9):
    for _ in range(2):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[len(times) // 2]


print(f"{'torch SDPA flash bf16 causal':28} {'fwd ms':>9} {'fwd TF/s':>9} {'bwd ms':>9} {'bwd TF/s':>9} {'f+b ms':>9}")
# The shapes, then SmolLM2-135M's (9 query heads reading 3 kv heads).
for B, T, H, D, KV in [(32, 512, 8, 64, 8), (32, 512, 8, 128, 8), (8, 2048, 8, 64, 8), (8, 2048, 8, 128, 8),
                       (32, 2048, 8, 64, 8), (32, 2048, 8, 128, 8), (32, 1024, 9, 64, 3)]:
    # [B, H, T, D] views of [B, T, H, D] storage, the layout a model's projections give.
    q, k, v = (torch.randn(B, T, n, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2).requires_grad_()
               for n in (H, KV, KV))
    g = torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        gqa = {"enable_gqa": True} if KV != H else {}
        if gqa:
            try:
                torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, **gqa)
            except RuntimeError:  # a flash backend without grouped-query support: repeat the kv heads
                k, v = (x.detach().repeat_interleave(H // KV, dim=1).requires_grad_() for x in (k, v))
                gqa = {}
        fwd = median_ms(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, **gqa))

        def both():
            o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, **gqa)
            o.backward(g)

        fb = median_ms(both)
    flops = 4.0 * B * H * T * T * D / 2.0
    bwd = fb - fwd
    name = f"B{B} T{T} H{H} D{D}" + ("" if KV == H else " KV3")
    print(f"{name:28} {fwd:9.3f} {flops / fwd / 1e9:9.1f} {bwd:9.3f} {2.5 * flops / bwd / 1e9:9.1f} "
          f"{fb:9.3f}", flush=True)
