"""Training steps of a transformers Qwen3-Next model: patched with cake against unpatched (and
Liger), the same initial weights and batches, each run in its own process.

    python packages/cake-transformers/benchmarks/bench_cake_transformers.py \
        [--size 100m|tiny] [--steps 50] [--batch 2] [--seq 4096] \
        [--runs cake,cake,hf,hf,liger] [--out result.json] [--profile N] [--sync-debug]
        [--host-profile]

Runs (each a fresh process, so class patches and kernel caches do not leak between them):

- ``cake``: ``apply_cake_kernels_to_qwen3_next(model)`` (every piece on);
- ``hf``: the unpatched model; transformers takes FLA's ``chunk_gated_delta_rule`` when
  ``import fla`` works in that process (its fast path), else its torch code; FLA 0.6 hands
  that call on to FlashQLA on Hopper where ``flash_qla`` is importable (``FLA_FLASH_QLA=0``
  keeps FLA's own Triton kernels);
- ``liger``: ``apply_liger_kernel_to_qwen3_next(model=model)`` over the unpatched model
  (Liger's RMSNorm, SwiGLU experts and fused linear cross entropy; FLA as in ``hf``).
- ``cake-graph`` (and ``hf-graph``, ``liger-graph``; CUDA only): the same model with the whole
  training step (forward, backward, ``AdamW(capturable=True).step()``) captured once in a
  CUDA graph and replayed per batch, as PyTorch's whole-network capture does: the host issues
  one replay per step instead of every launch. Three warm-up steps on a side stream compile
  the kernels and create the optimizer's state, then the capture; the weights and the
  optimizer's state are put back to their initial values before the first timed step, so the
  losses start where the eager runs' do. A run whose step cannot be captured (a host sync or
  an upload inside it) fails with the capture's error: expected of ``liger-graph``, whose fused
  linear cross entropy reads the count of non-ignored labels on the host (``.item()``).

Each run: the initial ``state_dict`` written once by this process, AdamW (lr 3e-4;
``capturable=True`` on CUDA in every run, so a graphed run does the arithmetic of its eager
run and the two can be compared bit for bit), batches of
byte tokens from one seeded generator (a 64-token motif repeated, so the loss can fall), bf16
weights on CUDA (fp32 on a CPU, where the kernels run through Triton's interpreter). Reported
per run: the loss of every step, tokens/s over the steps after the first ``--warmup`` (the
first ones compile), peak CUDA memory, and a sha256 of the final weights; then which runs
repeat bitwise (losses and weights) and the loss gap of each run to the first ``hf`` run.
``--profile N``: N more steps under ``torch.profiler`` per run, its kernels by self time (where
the step's time goes); ``--sync-debug``: the host syncs of one step (CUDA's sync debug mode)
and where each happened; ``--host-profile``: cProfile of two steps (the host's hot functions).
Each run also reports host ms per step (until the step is issued) beside wall ms: where they
are close, the GPU waits for Python.

``--size 100m`` (129M parameters): hidden 1024, 8 layers (3 linear attention : 1 full
attention), 32 experts top-4 (width 64) with a shared expert (width 512), linear heads 8 q/k x
16 v of dim 128, attention 8 q / 2 kv heads of dim 256 (Qwen3-Next's head dims). ``--size
tiny``: a 2-layer model for a CPU smoke run.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time

SIZES = {
    "100m": dict(hidden_size=1024, num_hidden_layers=8, num_attention_heads=8,
                 num_key_value_heads=2, head_dim=256, linear_num_key_heads=8,
                 linear_num_value_heads=16, linear_key_head_dim=128, linear_value_head_dim=128,
                 num_experts=32, num_experts_per_tok=4, moe_intermediate_size=64,
                 shared_expert_intermediate_size=512, intermediate_size=512),
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=64, linear_num_key_heads=2,
                 linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
                 num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                 shared_expert_intermediate_size=32, intermediate_size=64),
}


def make_config(size: str, seq: int):
    from transformers import Qwen3NextConfig

    kw = dict(SIZES[size])
    n = kw["num_hidden_layers"]
    types = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(n)]
    if "full_attention" not in types:  # the tiny model: one of each
        types[-1] = "full_attention"
    return Qwen3NextConfig(vocab_size=256, layer_types=types, max_position_embeddings=seq,
                           hidden_act="silu", attention_dropout=0.0, output_router_logits=False,
                           tie_word_embeddings=False, use_cache=False, **kw)


def batches(steps: int, batch: int, seq: int, seed: int = 0):
    import torch

    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        motif = torch.randint(0, 256, (batch, 64), generator=g)
        x = motif.repeat(1, -(-seq // 64))[:, :seq].clone()
        noise = torch.rand(x.shape, generator=g) < 0.1  # some tokens not predictable
        x[noise] = torch.randint(0, 256, (int(noise.sum()),), generator=g)
        yield x


def weights_sha(model) -> str:
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().contiguous().view(-1).view(__import__("torch").uint8).cpu().numpy()
                 .tobytes())
    return h.hexdigest()[:16]


def _step(model, opt, x):
    loss = model(input_ids=x, labels=x).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def graphed_step(model, opt, batch: int, seq: int, dev: str):
    """The whole training step captured in one CUDA graph: returns ``step(x) -> loss`` that
    copies ``x`` into the captured input and replays. Warm-up (3 steps on a side stream, the
    stream the capture then uses), capture, then the weights and the optimizer's state back
    to their values before the warm-up."""
    import torch

    static_x = torch.zeros(batch, seq, dtype=torch.long, device=dev)
    params = list(model.parameters())
    # kept on the host: a device copy would add the weights' size to the run's peak memory
    start = [p.detach().to("cpu", copy=True) for p in params]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            _step(model, opt, static_x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)  # the captured backward allocates the grads in the pool
    with torch.cuda.graph(graph, stream=side):
        static_loss = model(input_ids=static_x, labels=static_x).loss
        static_loss.backward()
        opt.step()
    torch.cuda.synchronize()
    with torch.no_grad():  # the captured addresses stay; their values go back
        for p, p0 in zip(params, start, strict=True):
            p.copy_(p0)
        for state in opt.state.values():
            for v in state.values():
                if torch.is_tensor(v):
                    v.zero_()
    torch.cuda.synchronize()

    def step(x):
        static_x.copy_(x, non_blocking=True)
        graph.replay()
        return static_loss

    return step


def profile_steps(step, dev: str, a) -> str:
    """torch.profiler over ``a.profile`` more steps: the kernels (CUDA) or ops (CPU) with the
    most self time, as a table."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev == "cuda" else [])
    with profile(activities=acts) as prof:
        for x in batches(a.profile, a.batch, a.seq, seed=1):
            step(x.to(dev))
        if dev == "cuda":
            torch.cuda.synchronize()
    key = "self_device_time_total" if dev == "cuda" else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=30, max_name_column_width=60)


def count_syncs(step, dev: str, a) -> list[str]:
    """Host syncs in one step, as ``torch.cuda.set_sync_debug_mode('warn')`` reports them:
    where each happened (file:line of the Python caller) and the message."""
    import warnings

    import torch

    x = next(batches(1, a.batch, a.seq, seed=2)).to(dev)
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step(x)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return [f"{os.path.relpath(m.filename)}:{m.lineno}: {str(m.message)[:100]}" for m in w]


def host_profile(step, dev: str, a) -> str:
    """cProfile of two more steps: the Python functions with the most own time (where the
    host's share of a step goes: wrappers, launchers, torch dispatch)."""
    import cProfile
    import io
    import pstats

    xs = [x.to(dev) for x in batches(2, a.batch, a.seq, seed=3)]
    pr = cProfile.Profile()
    pr.enable()
    for x in xs:
        step(x)
    pr.disable()
    buf = io.StringIO()
    pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(35)
    return buf.getvalue()


def child(a) -> None:
    import torch

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    fast = "none"
    graph = a.child.endswith("-graph")
    impl = a.child.removesuffix("-graph")
    if impl in ("hf", "liger"):
        try:
            import fla.ops.common.chunk_o as fla_chunk_o

            fla_chunk_o.TRITON_ABOVE_3_7_1 = True  # FLA's Hopper backward guard (Triton 3.6)
            fast = "fla " + __import__("fla").__version__
            if importlib.util.find_spec("flash_qla") is not None and \
                    os.environ.get("FLA_FLASH_QLA", "1") != "0":
                # FLA >= 0.6 hands bf16 K = V = 128 calls to FlashQLA on Hopper
                fast += " (FlashQLA dispatch)"
        except ImportError:
            fast = "torch (fla not importable)"
    from transformers import Qwen3NextForCausalLM

    cfg = make_config(a.size, a.seq)
    torch.manual_seed(0)
    model = Qwen3NextForCausalLM(cfg)
    model.load_state_dict(torch.load(a.init, weights_only=True))
    model.to(dev, dtype).train()
    if impl == "cake":
        from cake_transformers import apply_cake_kernels_to_qwen3_next

        apply_cake_kernels_to_qwen3_next(model)
    elif impl == "liger":
        from liger_kernel.transformers import apply_liger_kernel_to_qwen3_next

        apply_liger_kernel_to_qwen3_next(model=model)
    # capturable on CUDA in every run: eager and graphed runs do the same optimizer arithmetic
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, capturable=dev == "cuda")
    losses, times, host = [], [], []
    if dev == "cuda":
        torch.cuda.reset_peak_memory_stats()
    capture_s = None
    if graph:
        t = time.perf_counter()
        step = graphed_step(model, opt, a.batch, a.seq, dev)
        capture_s = time.perf_counter() - t
    else:
        def step(x):
            return _step(model, opt, x)
    for x in batches(a.steps, a.batch, a.seq):
        x = x.to(dev)
        if dev == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        loss = step(x)
        host.append(time.perf_counter() - t)  # the step issued: the host's share
        if dev == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
        losses.append(float(loss))
    timed = times[a.warmup:] or times
    timed_host = host[a.warmup:] or host
    profile = syncs = hprof = None
    wsha = weights_sha(model)  # after the steps above, before any profiled ones
    if a.profile:
        profile = profile_steps(step, dev, a)
    if a.sync_debug and dev == "cuda":
        syncs = count_syncs(step, dev, a)
    if a.host_profile:
        hprof = host_profile(step, dev, a)
    res = dict(impl=a.child, linear_attention_path=fast if impl != "cake" else "cake",
               capture_s=capture_s,
               losses=losses, loss_bits=hashlib.sha256(
                   json.dumps([float(v).hex() for v in losses]).encode()).hexdigest()[:16],
               weights_sha=wsha,
               tokens_per_s=a.batch * a.seq * len(timed) / sum(timed),
               first_step_s=times[0],
               wall_ms_per_step=1e3 * sum(timed) / len(timed),
               host_ms_per_step=1e3 * sum(timed_host) / len(timed_host),
               peak_mem_gib=(torch.cuda.max_memory_allocated() / 2**30 if dev == "cuda"
                             else None), profile=profile, host_syncs=syncs,
               host_syncs_per_step=None if syncs is None else len(syncs), host_profile=hprof)
    with open(a.result, "w") as f:
        json.dump(res, f)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", choices=sorted(SIZES), default="100m")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--runs", default="cake,cake,hf,hf,liger")
    p.add_argument("--timeout", type=float, default=None, help="seconds per run")
    p.add_argument("--out")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="after the timed steps, N steps under torch.profiler: top kernels")
    p.add_argument("--sync-debug", action="store_true",
                   help="count the host syncs of one step (CUDA)")
    p.add_argument("--host-profile", action="store_true",
                   help="after the timed steps, cProfile two steps: the host's hot functions")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--init", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        return child(a)
    import torch

    graphed = [r for r in a.runs.split(",") if r.endswith("-graph")]
    if graphed and not torch.cuda.is_available():
        p.error(f"--runs {','.join(graphed)}: a CUDA graph needs a CUDA device")
    import transformers
    from transformers import Qwen3NextForCausalLM

    torch.manual_seed(0)
    model = Qwen3NextForCausalLM(make_config(a.size, a.seq))
    n_params = sum(t.numel() for t in model.parameters())
    tmp = tempfile.mkdtemp(prefix="cake_tf_bench_")
    init = os.path.join(tmp, "init.pt")
    torch.save(model.state_dict(), init)
    del model
    env = dict(torch=torch.__version__, transformers=transformers.__version__,
               device=torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu")
    print(json.dumps(dict(size=a.size, params=n_params, steps=a.steps, batch=a.batch,
                          seq=a.seq, **env)), flush=True)
    results = []
    for i, impl in enumerate(a.runs.split(",")):
        out = os.path.join(tmp, f"run{i}.json")
        cmd = [sys.executable, __file__, "--child", impl, "--init", init, "--result", out,
               "--size", a.size, "--steps", str(a.steps), "--warmup", str(a.warmup),
               "--batch", str(a.batch), "--seq", str(a.seq), "--profile", str(a.profile)]
        cmd += ["--sync-debug"] * a.sync_debug + ["--host-profile"] * a.host_profile
        t = time.perf_counter()
        try:
            r = subprocess.run(cmd, timeout=a.timeout, capture_output=True, text=True)
        except subprocess.TimeoutExpired:
            print(f"run {i} {impl}: timed out after {a.timeout} s", flush=True)
            continue
        if r.returncode != 0:
            print(f"run {i} {impl}: failed\n{r.stderr[-3000:]}", flush=True)
            continue
        with open(out) as f:
            res = json.load(f)
        res["wall_s"] = time.perf_counter() - t
        results.append(res)
        print(f"run {i} {impl:11s} path {res['linear_attention_path']:28s} "
              f"tok/s {res['tokens_per_s']:10.0f}  first step {res['first_step_s']:6.1f} s  "
              f"peak {res['peak_mem_gib'] or 0:6.2f} GiB  loss {res['losses'][0]:.4f} -> "
              f"{res['losses'][-1]:.4f}  loss bits {res['loss_bits']}  weights "
              f"{res['weights_sha']}", flush=True)
        print(f"run {i} {impl}: ms per step: wall {res['wall_ms_per_step']:.1f}, host "
              f"{res['host_ms_per_step']:.1f} (issuing the step; near wall: the GPU waits)")
        if res.get("capture_s") is not None:
            print(f"run {i} {impl}: warm-up and capture of the step's CUDA graph "
                  f"{res['capture_s']:.1f} s")
        if res.get("host_syncs") is not None:
            print(f"run {i} {impl}: host syncs in one step: {len(res['host_syncs'])}\n  " +
                  "\n  ".join(res["host_syncs"][:12]))
        if res.get("host_profile"):
            print(f"run {i} {impl}: host profile of 2 steps\n{res['host_profile']}")
        if res.get("profile"):
            print(f"run {i} {impl}: profile of {a.profile} steps\n{res['profile']}", flush=True)
    by = {}
    for r in results:
        by.setdefault(r["impl"], []).append(r)
    for impl, rs in by.items():
        if len(rs) > 1:
            same = all(r["loss_bits"] == rs[0]["loss_bits"] and
                       r["weights_sha"] == rs[0]["weights_sha"] for r in rs[1:])
            print(f"{impl}: {len(rs)} runs, losses and final weights bitwise identical: {same}")
    for impl, rs in by.items():
        eager = by.get(impl.removesuffix("-graph"))
        if impl.endswith("-graph") and eager:
            same = (rs[0]["loss_bits"] == eager[0]["loss_bits"] and
                    rs[0]["weights_sha"] == eager[0]["weights_sha"])
            print(f"{impl} against eager {impl.removesuffix('-graph')}: losses and final "
                  f"weights bitwise identical: {same}")
    if by.get("hf"):
        ref = by["hf"][0]["losses"]
        for r in results:
            gap = max(abs(x - y) for x, y in zip(r["losses"], ref, strict=True))
            print(f"{r['impl']}: max |loss - hf loss| over the steps {gap:.3e}; tok/s / hf "
                  f"{r['tokens_per_s'] / by['hf'][0]['tokens_per_s']:.3f}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(dict(size=a.size, params=n_params, steps=a.steps, batch=a.batch,
                           seq=a.seq, env=env, runs=results), f, indent=1)


if __name__ == "__main__":
    main()
