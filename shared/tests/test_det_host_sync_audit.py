"""Static audit of host reads in the det paths (docs/architecture.md, CUDA graphs): every
call in a det package's source, or in the cake-core modules they run, that can read device
values on the host (``.item()``, ``.tolist()``, ``.cpu()``, ``.numpy()``, ``nonzero``,
``synchronize()``, ``.to("cpu")``, ``.any()`` / ``.all()`` under ``bool``,
``repeat_interleave``) is listed below with why it is there. A new one fails this test
until it is classified: a ``"sync"`` site stops a CUDA-graph capture that reaches it (and
drains the GPU's queue in eager mode); a ``"host"`` site touches CPU tensors only; a
``"reference"`` site is not on a det path. Docstrings and comments are not read. The CUDA
tests (``tests/test_<family>_cuda_graph.py``) check the captures themselves.
"""

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]

PATTERN = re.compile(r"\.item\(|\.tolist\(|\.cpu\(|\.numpy\(|\bnonzero\b|synchronize\(|"
                     r"\.to\(\s*[\"']cpu|\.any\(\)|\.all\(\)|repeat_interleave\(")

#: cake-core modules outside the det paths (tools, manifests, names; KCP's process-group
#: exchanges have their own collectives and are audited with the KCP packages, not here)
CORE_SKIP = {"testing.py", "bench.py", "build.py", "legacy.py", "legacy_checks.py", "names.py",
             "naming.py", "families.py", "cake_build.py"}

LM = "packages/cake-lm-head-loss-det-train/src/cake_lm_head_loss_det_train/api.py"
MOE = "packages/cake-moe-grouped-det-gemm/src/cake_moe_grouped_det_gemm/api.py"
CONV = "packages/cake-causal-conv1d-det-train/src/cake_causal_conv1d_det_train/api.py"
CORE = "packages/cake-core/src/cake_core/"
MOE_CPU = ("host", "offs / m_sizes on the CPU only (on a GPU the check returns before: the "
           "kernels clamp the offsets on the device)")
CU_MISS = ("sync", "check_cu_seqlens reads cu_seqlens back on an offsets-cache miss only: the "
           "first use of a tensor (version); warm up before a capture")

#: (file, code line stripped) -> (kind, why)
SITES = {
    (LM, "if bool(bad.any()):"): (
        "sync", "_check_labels with plan.check_labels = 1 (the rule's on the CPU only; the "
        "CUDA rule's 0 reads no label values)"),
    (MOE, "if bool((v < 0).any()) or bool((v > M).any()):"): MOE_CPU,
    (MOE, 'raise ValueError(f"offs: values must lie in [0, M={M}], got {v.tolist()}")'): MOE_CPU,
    (MOE, "if bool((v[1:] < v[:-1]).any()):"): MOE_CPU,
    (MOE, 'raise ValueError(f"offs: must be non-decreasing, got {v.tolist()}")'): MOE_CPU,
    (MOE, "if bool((v < 0).any()):"): MOE_CPU,
    (MOE, 'raise ValueError(f"m_sizes: values must be >= 0, got {v.tolist()}")'): MOE_CPU,
    (CONV, "seq = torch.repeat_interleave(torch.arange(per_seq.numel(), dtype=torch.int64), "
           "per_seq)"): ("host", "the block table, built from the CPU offsets"),
    (CORE + "checks.py", 'v = t.detach().to("cpu", torch.int64)'): CU_MISS,
    (CORE + "checks.py", "if bool((d < 0).any()):"): ("host", "on the CPU copy of cu_seqlens"),
    (CORE + "checks.py", "i = int(torch.nonzero(d < 0)[0])"): (
        "host", "on the CPU copy, for the error message"),
    (CORE + "varlen.py", 'return cu_seqlens.detach().to("cpu", torch.int64)'): CU_MISS,
    (CORE + "varlen.py", "seq = torch.repeat_interleave(torch.arange(per_seq.numel()), "
                         "per_seq)"): ("host", "chunk_tables, on the CPU offsets"),
    (CORE + "layer_utils.py", "if bool(mask.all()):"): (
        "sync", "the layers' unpad with an attention_mask: reads the mask (padded batches "
        "cannot be captured; pass cu_seqlens instead)"),
    (CORE + "layer_utils.py", "keep = mask.reshape(-1).nonzero().squeeze(1)"): (
        "sync", "the layers' unpad: the kept rows' count sizes the output"),
    (CORE + "linear_attention.py", "q = q.repeat_interleave(group, dim=2)"): (
        "reference", "delta_rule_reference"),
    (CORE + "linear_attention.py", "k = k.repeat_interleave(group, dim=2)"): (
        "reference", "delta_rule_reference"),
    (CORE + "linear_attention.py", "cu = [int(x) for x in cu_seqlens.tolist()]"): (
        "reference", "delta_rule_reference"),
}


def _files():
    for p in sorted(ROOT.glob("packages/cake-*-det-*/src/*/**/*.py")):
        if "-kcp" in p.relative_to(ROOT).parts[1] or \
                p.name in ("reference.py", "queries.py", "cake_build.py"):
            continue
        yield p
    for p in sorted((ROOT / "packages/cake-core/src/cake_core").glob("*.py")):
        if p.name not in CORE_SKIP and not p.name.startswith("kcp"):
            yield p


def _docstring_lines(tree) -> set:
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) \
                and isinstance(node.value.value, str):
            lines.update(range(node.lineno, node.end_lineno + 1))
    return lines


def _found() -> dict:
    found = {}
    for p in _files():
        src = p.read_text(encoding="utf-8")
        docs = _docstring_lines(ast.parse(src))
        rel = p.relative_to(ROOT).as_posix()
        for i, line in enumerate(src.splitlines(), 1):
            code = line.split("#")[0].strip()
            if i not in docs and PATTERN.search(code):
                found.setdefault((rel, code), []).append(i)
    return found


def test_every_host_read_in_a_det_path_is_classified():
    found = _found()
    new = [f"{f}:{lines[0]}: {code}" for (f, code), lines in found.items()
           if (f, code) not in SITES]
    gone = [f"{f}: {code}" for f, code in SITES if (f, code) not in found]
    assert not new, "unclassified host reads (add them to SITES with a kind and why):\n" + \
        "\n".join(new)
    assert not gone, "SITES lists lines no longer in the source:\n" + "\n".join(gone)


def test_sites_have_a_known_kind():
    assert {kind for kind, _ in SITES.values()} <= {"sync", "host", "reference"}
