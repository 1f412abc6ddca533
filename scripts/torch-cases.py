#!/usr/bin/env python3
"""Writes the project's own PyTorch-produced cases into tests/torch-cases/.

The shared golden cases (tests/golden/, copied unchanged) pin down PyTorch's default
single-tensor optimizers. These cases pin down what they leave out: `fused=True`, whose
arithmetic differs (PyTorch's opmath precision: float64 for float64, float32 for the 16-bit
formats, with its multiply-adds rounded once and one rounding per stored tensor; AdamW on the
16-bit formats with beta1 on both sides of 0.5 over odd tails), and its constructor errors. They use the golden format (kind `local_optimizer`, see
tests/golden/README.md) so that the golden runner checks them on both backends, with
tolerances tight enough that the single-tensor arithmetic fails them.

`--single-tensor` writes only the single-tensor cases (`foreach=False`, the golden cases'
path): float32 and float64 SGD with zero tolerance, which pin down that PyTorch rounds each
`add(alpha=)` once (a fused multiply-add) in the vector body and the tail alike, and an Adam
trajectory found by scripts/torch-fuzz.py whose update cancels almost all of the parameter
(`betas[1] = 0`), where computing the lerp with two roundings leaves the golden tolerance.
The fused cases depend on the host PyTorch ran on (the vector widths), so a run that is only
adding these leaves them as they are.

`--fused-nan` writes only the fused AMSGrad cases with NaN gradients (`fused_nan_cases`),
whose sizes give the same answer on AVX2, Arm and AVX-512 hosts. `--foreach` writes only the
cases of `foreach=True` on the 16-bit formats (`foreach_cases`), `--vector-body` only the
16-bit single-tensor cases whose sizes have a vector body and a tail (`vector_body_cases`).

Run it with the PyTorch peer's interpreter (never in CI):

    /work/torchenv/bin/python scripts/torch-cases.py \
        [--single-tensor | --fused-nan | --foreach | --vector-body]
"""

import json
import math
import pathlib
import socket

import torch

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "torch-cases"
SOURCE = f"torch {torch.__version__}, CPU, single process"
# Below one unit in the last place of each 16-bit format, so a single rounding that differs
# from PyTorch's fails the case.
TOLERANCE = {
    "float32": {"rtol": 1e-6, "atol": 1e-7},
    "float16": {"rtol": 2e-4, "atol": 1e-7},
    "bfloat16": {"rtol": 1.5e-3, "atol": 1e-7},
    "float64": {"rtol": 1e-12, "atol": 1e-12},
}
DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
}
# float64 cases: PyTorch's fused kernels compute float64 in float64, so float32 arithmetic
# (about 1e-8 away) fails them; PyTorch's fused multiply-adds stay well inside.
TOLERANCE_F64 = dict(TOLERANCE, float64={"rtol": 1e-14, "atol": 1e-15})
# A size with a vector body and a scalar tail, a matrix, and a 0-d tensor.
SHAPES = [[37], [3, 33], []]
# Vector bodies with odd tails (PyTorch's fused kernels step 32 16-bit, 16 float32 or 8
# float64 elements at a time on AVX-512, then finish element by element) and a 3-d tensor.
TAIL_SHAPES = [[37], [67], [131], [2, 3, 35]]
STEPS = 5


def free_port():
    """A free TCP port on 127.0.0.1 (the random-case scripts' process groups and RPC)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def tensor_json(t):
    data = [float(x) for x in t.detach().to(torch.float64).flatten().tolist()]
    data = [x if math.isfinite(x) else str(x) for x in data]
    return {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape), "data": data}


def state_json(value):
    if torch.is_tensor(value):
        return tensor_json(value)
    return value


def envelope(name, description, optimizer, options, initial, grads, expected,
             tolerance=TOLERANCE, source=None):
    """One case in the golden format (tests/golden/README.md, kind `local_optimizer`)."""
    path = next((f"{k}=True" for k in ["fused", "foreach"] if options.get(k)), "foreach=False")
    return {
        "format": 1,
        "kind": "local_optimizer",
        "name": name,
        "description": description,
        "source": source or f"{SOURCE}, {path}",
        "input": {
            "optimizer": {"name": optimizer, "options": options},
            "initial_params": [tensor_json(p) for p in initial],
            "grads": [[None if g is None else tensor_json(g) for g in step] for step in grads],
        },
        "expected": expected,
        "tolerance": tolerance,
    }


def case(name, description, optimizer, options, dtype, missing=False, seed=0, shapes=SHAPES,
         steps=STEPS, tolerance=TOLERANCE):
    gen = torch.Generator().manual_seed(seed)
    dt = DTYPES[dtype]
    initial = [torch.randn(s, generator=gen).to(dt) for s in shapes]
    grads = []
    for t in range(steps):
        step = []
        for j, s in enumerate(shapes):
            # From the second step: PyTorch's fused SGD refuses (TypeError) a momentum buffer
            # that starts after the others did.
            if missing and t > 0 and (t + j) % 3 == 1:
                step.append(None)
            else:
                step.append(torch.randn(s, generator=gen).to(dt))
        grads.append(step)
    return trajectory(name, description, optimizer, options, initial, grads, tolerance)


def trajectory(name, description, optimizer, options, initial, grads, tolerance, source=None):
    """The case of one trajectory: PyTorch's optimizer from `initial`, one step per `grads`
    (`source`: the case's source text, by default this script's)."""
    steps = len(grads)
    params = [torch.nn.Parameter(p.clone()) for p in initial]
    kwargs = dict(options)
    if "betas" in kwargs:
        kwargs["betas"] = tuple(kwargs["betas"])
    opt = getattr(torch.optim, optimizer)(params, **kwargs)
    after = []
    for t in range(steps):
        opt.zero_grad(set_to_none=True)
        for p, g in zip(params, grads[t]):
            p.grad = None if g is None else g.clone()
        opt.step()
        after.append([tensor_json(p) for p in params])
    sd = opt.state_dict()
    state = {
        str(k): {key: state_json(v) for key, v in entry.items()} for k, entry in sd["state"].items()
    }
    groups = [dict(g) for g in sd["param_groups"]]
    for g in groups:
        if "betas" in g:
            g["betas"] = list(g["betas"])
    return envelope(
        name, description, optimizer, options, initial, grads,
        {"params_after_step": after, "state_dict": {"state": state, "param_groups": groups}},
        tolerance, source,
    )


def error_case(name, description, optimizer, options):
    params = [torch.nn.Parameter(torch.ones(3))]
    try:
        getattr(torch.optim, optimizer)(params, **options)
    except Exception as e:  # noqa: BLE001 - the error is the expected value
        error = {"type": type(e).__name__, "message_contains": str(e)}
    else:
        raise SystemExit(f"{name}: PyTorch accepted {options}")
    return envelope(
        name, description, optimizer, options, [params[0].detach()], [[torch.ones(3)]],
        {"error": error},
    )


EXACT = {dtype: {"rtol": 0.0, "atol": 0.0} for dtype in TOLERANCE}
GOLDEN_TOLERANCE = {
    "float32": {"rtol": 1e-05, "atol": 1e-06},
    "float16": {"rtol": 0.005, "atol": 0.005},
    "bfloat16": {"rtol": 0.02, "atol": 0.02},
    "float64": {"rtol": 1e-12, "atol": 1e-12},
}
# The shared cases' tolerance for ZeRO and DistributedOptimizer (tighter 16-bit atol).
ZERO_TOLERANCE = dict(GOLDEN_TOLERANCE, float16={"rtol": 0.005, "atol": 0.001},
                      bfloat16={"rtol": 0.02, "atol": 0.002})


def random_optimizer(rng, outer=False):
    """A random `{"name", "options"}` spec for the random-case scripts (torch-fuzz-gloo.py,
    torchft-cases.py): SGD, Adam or AdamW with any of their options, on either of PyTorch's
    per-tensor paths (`foreach=True` now and then); an outer optimizer's SGD learning rate is
    DiLoCo's order (0.5 to 1)."""
    name = rng.choice(["SGD", "SGD", "Adam", "AdamW"])
    if name == "SGD":
        momentum = rng.choice([0.0, 0.5, 0.9])
        nesterov = momentum > 0 and rng.random() < 0.5
        options = {"lr": rng.choice([0.5, 0.7, 1.0] if outer else [0.01, 0.03, 0.05, 0.1]),
                   "momentum": momentum, "nesterov": nesterov,
                   "dampening": 0.0 if nesterov or momentum == 0 else rng.choice([0.1, 0.2, 0.5])}
    else:
        options = {"lr": rng.choice([0.1, 0.5] if outer else [0.01, 0.02, 0.05]),
                   "betas": rng.choice([[0.9, 0.999], [0.9, 0.99], [0.8, 0.95], [0.5, 0.9]]),
                   "eps": rng.choice([1e-8, 1e-6, 1e-3]), "amsgrad": rng.random() < 0.3}
    options["weight_decay"] = rng.choice([0.0, 0.0, 0.01, 0.1])
    if rng.random() < 0.2:
        options["maximize"] = True
    if rng.random() < 0.35:
        options["foreach"] = True
    return {"name": name, "options": options}


def single_tensor_cases():
    cases = []
    for dtype in ["float32", "float64"]:
        cases += [
            case(f"local_optimizer_sgd_{dtype}_exact_nesterov_wd",
                 f"SGD(foreach=False) on {dtype}: Nesterov, weight decay; every add(alpha=) one "
                 "fused multiply-add, bit for bit",
                 "SGD", {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.01, "nesterov": True,
                         "foreach": False}, dtype, seed=31, shapes=TAIL_SHAPES, steps=6,
                 tolerance=EXACT),
            case(f"local_optimizer_sgd_{dtype}_exact_dampening_maximize",
                 f"SGD(foreach=False) on {dtype}: momentum, dampening, weight decay, maximize, "
                 "missing gradients, bit for bit",
                 "SGD", {"lr": 0.1, "momentum": 0.8, "dampening": 0.3, "weight_decay": 0.1,
                         "maximize": True, "foreach": False}, dtype, missing=True, seed=32,
                 shapes=TAIL_SHAPES, steps=6, tolerance=EXACT),
        ]
    # The element of the trajectory torch-fuzz.py found (--seed 2, case 808, element 54 of its
    # second parameter): at the fourth step the update
    # cancels the parameter to 0.0112, so a last-bit difference in the first moment is a
    # relative error of 3e-4 there.
    initial = [torch.tensor([-26.646961212158203])]
    grads = [[None if g is None else torch.tensor([g])]
             for g in [None, -1.8432592153549194, -41.7262077331543, -0.0054354555904865265,
                       0.011008678004145622, None]]
    cases.append(trajectory(
        "local_optimizer_adam_float32_cancellation",
        "Adam(foreach=False), betas (0.95, 0.0), decoupled weight decay 0: an update that "
        "cancels the parameter (found by scripts/torch-fuzz.py)",
        "Adam", {"lr": 0.01, "betas": [0.95, 0.0], "weight_decay": 0.0, "amsgrad": False,
                 "decoupled_weight_decay": True, "foreach": False},
        initial, grads, GOLDEN_TOLERANCE))
    return cases


def fused_cases():
    cases = []
    for dtype in ["bfloat16", "float16", "float32"]:
        cases += [
            case(f"local_optimizer_fused_sgd_{dtype}_momentum_wd",
                 f"SGD(fused=True) on {dtype}: momentum, dampening, weight decay",
                 "SGD", {"lr": 0.05, "momentum": 0.9, "dampening": 0.1, "weight_decay": 0.01,
                         "fused": True}, dtype, seed=1),
            case(f"local_optimizer_fused_sgd_{dtype}_nesterov_maximize",
                 f"SGD(fused=True) on {dtype}: Nesterov, maximize, a parameter without gradients on some steps",
                 "SGD", {"lr": 0.1, "momentum": 0.8, "nesterov": True, "maximize": True,
                         "fused": True}, dtype, missing=True, seed=2),
            case(f"local_optimizer_fused_adam_{dtype}_l2_amsgrad",
                 f"Adam(fused=True) on {dtype}: L2 weight decay, amsgrad, missing gradients",
                 "Adam", {"lr": 0.01, "betas": [0.8, 0.99], "eps": 1e-6, "weight_decay": 0.05,
                          "amsgrad": True, "fused": True}, dtype, missing=True, seed=3),
            case(f"local_optimizer_fused_adamw_{dtype}_maximize",
                 f"AdamW(fused=True) on {dtype}: maximize, beta1 0.3 (the other lerp formula)",
                 "AdamW", {"lr": 0.02, "betas": [0.3, 0.9], "weight_decay": 0.1, "maximize": True,
                           "fused": True}, dtype, seed=4),
        ]
    # float64: PyTorch's fused kernels compute in float64 ("opmath" is double for double).
    f64 = dict(tolerance=TOLERANCE_F64)
    cases += [
        case("local_optimizer_fused_sgd_float64_momentum_wd",
             "SGD(fused=True) on float64: momentum, dampening, weight decay (float64 math)",
             "SGD", {"lr": 0.05, "momentum": 0.9, "dampening": 0.1, "weight_decay": 0.01,
                     "fused": True}, "float64", seed=1, **f64),
        case("local_optimizer_fused_sgd_float64_nesterov_maximize",
             "SGD(fused=True) on float64: Nesterov, maximize, missing gradients (float64 math)",
             "SGD", {"lr": 0.1, "momentum": 0.8, "nesterov": True, "maximize": True,
                     "fused": True}, "float64", missing=True, seed=2, **f64),
        case("local_optimizer_fused_adam_float64_l2_amsgrad",
             "Adam(fused=True) on float64: L2 weight decay, amsgrad, missing gradients (float64 math)",
             "Adam", {"lr": 0.01, "betas": [0.8, 0.99], "eps": 1e-6, "weight_decay": 0.05,
                      "amsgrad": True, "fused": True}, "float64", missing=True, seed=3, **f64),
        case("local_optimizer_fused_adamw_float64_maximize",
             "AdamW(fused=True) on float64: maximize, beta1 0.3 (float64 math)",
             "AdamW", {"lr": 0.02, "betas": [0.3, 0.9], "weight_decay": 0.1, "maximize": True,
                       "fused": True}, "float64", seed=4, **f64),
        case("local_optimizer_fused_adamw_float64_beta1_085_tails",
             "AdamW(fused=True) on float64: beta1 0.85, weight decay, odd tails (float64 math)",
             "AdamW", {"lr": 0.02, "betas": [0.85, 0.995], "weight_decay": 0.1, "fused": True},
             "float64", seed=5, shapes=TAIL_SHAPES, **f64),
    ]
    # AdamW(fused=True) on the 16-bit formats, beta1 on both sides of 0.5 (the two lerp
    # formulas), with weight decay, over vector bodies with odd tails and a 3-d tensor.
    for dtype in ["bfloat16", "float16"]:
        for k, beta1 in enumerate([0.3, 0.6, 0.85, 0.9]):
            tag = f"{round(beta1 * 100):03d}"
            cases.append(case(
                f"local_optimizer_fused_adamw_{dtype}_beta1_{tag}_tails",
                f"AdamW(fused=True) on {dtype}: betas ({beta1}, 0.995), weight decay, odd tails",
                "AdamW", {"lr": 0.02, "betas": [beta1, 0.995], "weight_decay": 0.1,
                          "fused": True}, dtype, seed=10 + k, shapes=TAIL_SHAPES, steps=6))
        cases.append(case(
            f"local_optimizer_fused_adamw_{dtype}_amsgrad_missing_tails",
            f"AdamW(fused=True) on {dtype}: betas (0.85, 0.995), amsgrad, maximize, missing gradients, odd tails",
            "AdamW", {"lr": 0.01, "betas": [0.85, 0.995], "eps": 1e-6, "weight_decay": 0.05,
                      "amsgrad": True, "maximize": True, "fused": True}, dtype, missing=True,
            seed=20, shapes=TAIL_SHAPES + [[]], steps=6))
    cases += [
        error_case("local_optimizer_error_fused_sgd_foreach", "error: SGD fused with foreach",
                   "SGD", {"lr": 0.1, "foreach": True, "fused": True}),
        error_case("local_optimizer_error_fused_adam_differentiable",
                   "error: Adam fused with differentiable",
                   "Adam", {"differentiable": True, "foreach": True, "fused": True}),
        error_case("local_optimizer_error_fused_adamw_foreach", "error: AdamW fused with foreach",
                   "AdamW", {"foreach": True, "fused": True}),
    ]
    return cases


def fused_nan_cases():
    """Adam(fused=True, amsgrad=True) with NaN gradients in the vector body and the scalar
    remainder of PyTorch's fused CPU kernel: `maximum` keeps the NaN in the body, `std::max`
    keeps the old maximum in the remainder (the last `numel % V` elements, V = 8 float32, 4
    float64, 16 float16/bfloat16 on AVX2 and Arm, twice that on AVX-512). The sizes leave the
    same remainder on both (`numel % 2V < V`), and one size is all remainder on both."""
    sizes = {"float32": [21, 5], "float64": [11, 3], "float16": [39, 13], "bfloat16": [39, 13]}
    gen = torch.Generator().manual_seed(41)
    cases = []
    for dtype, shape_sizes in sizes.items():
        dt = DTYPES[dtype]
        initial = [torch.randn(n, generator=gen, dtype=torch.float64).to(dt) for n in shape_sizes]

        def grads(nan):
            out = []
            for n in shape_sizes:
                g = torch.randn(n, generator=gen, dtype=torch.float64)
                if nan:
                    body = n - n % (32 // torch.empty(0, dtype=dt).element_size())
                    for i in {1, body - 1, body + 1, n - 1}:
                        if 0 <= i < n:
                            g[i] = float("nan")
                out.append(g.to(dt))
            return out
        steps = [grads(False), grads(False), grads(True), grads(False)]
        cases.append(trajectory(
            f"local_optimizer_fused_adam_{dtype}_amsgrad_nan_remainder",
            f"Adam(fused=True, amsgrad=True) on {dtype}: NaN gradients in the fused kernel's "
            "vector body (the maximum becomes NaN) and its scalar remainder (it keeps the old "
            "maximum)",
            "Adam", {"lr": 0.01, "betas": [0.9, 0.99], "amsgrad": True, "fused": True},
            initial, steps, GOLDEN_TOLERANCE))
    return cases


def foreach_cases():
    """`foreach=True` on the 16-bit formats, where `_foreach_mul_` rounds its scalar to the
    format (bfloat16's 0.9 is 0.8984375) and the single-tensor `mul_` does not; PyTorch's other
    foreach operations compute as the single-tensor ones. SGD scales its momentum buffers so,
    but only at a step where every parameter with a gradient has a buffer: at the step where
    the last one gets its first gradient, each buffer takes its own `mul_`. Adam scales the
    second moment by `beta2`, AdamW the parameters by `1 - lr * weight_decay`. Every size is
    below one vector (16 elements), so the arithmetic is the scalar remainder's on every host,
    and the tolerance is below one unit in the last place."""
    shapes = [[15], [3, 4], []]
    # One generator per family, so that adding cases of one leaves the other's unchanged.
    gens = {"SGD": torch.Generator().manual_seed(43), "Adam": torch.Generator().manual_seed(44)}
    cases = []
    for dtype in ["float16", "bfloat16"]:
        dt = DTYPES[dtype]
        for optimizer, label, options in [
            ("SGD", "dampening", {"lr": 0.05, "momentum": 0.9, "dampening": 0.1}),
            ("SGD", "nesterov_wd", {"lr": 0.05, "momentum": 0.7, "nesterov": True,
                                    "weight_decay": 0.01}),
            ("Adam", "beta2_099", {"lr": 0.05, "betas": [0.9, 0.99], "weight_decay": 0.01}),
            ("AdamW", "decay", {"lr": 0.1, "betas": [0.8, 0.95], "weight_decay": 0.1,
                                "amsgrad": True}),
        ]:
            gen = gens[optimizer.removesuffix("W")]
            initial = [torch.randn(s, generator=gen).to(dt) for s in shapes]
            # The last parameter's first gradient comes at the third step.
            grads = [[None if (t < 2 and j == 2) else torch.randn(s, generator=gen).to(dt)
                      for j, s in enumerate(shapes)] for t in range(8)]
            what = {
                "SGD": "the momentum to the format once every parameter has a buffer; the step "
                       "that creates the last buffer scales each with `mul_`",
                "Adam": "beta2 to the format",
                "AdamW": "beta2 and `1 - lr * weight_decay` to the format",
            }[optimizer]
            cases.append(trajectory(
                f"local_optimizer_foreach_{optimizer.lower()}_{dtype}_{label}",
                f"{optimizer}(foreach=True, {label}) on {dtype}: `_foreach_mul_` rounds {what}",
                optimizer, dict(options, foreach=True), initial, grads, TOLERANCE))
    return cases


def vector_body_cases():
    """The single-tensor path on the 16-bit formats over sizes with a vector body and a scalar
    tail: PyTorch's `add(alpha=)` rounds once in the body of its loop (alpha rounded to the
    format, then one float32 multiply-add) and twice in its tail (the product, then the sum).
    The sizes are 64k + m with m < 16, whose tail is the last m elements on AVX2 (32 elements
    per iteration), AVX-512 (64) and Arm (16) alike; the tolerance is below one unit in the
    last place."""
    shapes = [[69], [2, 33], [131]]
    gen = torch.Generator().manual_seed(45)
    cases = []
    for dtype in ["float16", "bfloat16"]:
        dt = DTYPES[dtype]
        for optimizer, label, options in [
            ("SGD", "momentum_wd", {"lr": 0.1, "momentum": 0.9, "dampening": 0.2,
                                    "weight_decay": 0.05}),
            ("SGD", "nesterov", {"lr": 0.07, "momentum": 0.8, "nesterov": True}),
            ("Adam", "l2", {"lr": 0.02, "weight_decay": 0.1}),
        ]:
            initial = [torch.randn(s, generator=gen).to(dt) for s in shapes]
            grads = [[torch.randn(s, generator=gen).to(dt) for s in shapes] for _ in range(6)]
            cases.append(trajectory(
                f"local_optimizer_{optimizer.lower()}_{dtype}_{label}_vector_body",
                f"{optimizer}({label}) on {dtype} over sizes with a vector body and a tail: "
                "`add(alpha=)` rounds once in the body, twice in the tail",
                optimizer, options, initial, grads, TOLERANCE))
    return cases


def main():
    import sys
    args = sys.argv[1:]
    only = {"--fused-nan": fused_nan_cases, "--foreach": foreach_cases,
            "--vector-body": vector_body_cases}
    chosen = [make for flag, make in only.items() if flag in args]
    if chosen:
        cases = [c for make in chosen for c in make()]
    else:
        cases = single_tensor_cases()
    if not (set(only) | {"--single-tensor"}) & set(args):
        cases = fused_cases() + fused_nan_cases() + foreach_cases() + vector_body_cases() + cases
    OUT.mkdir(parents=True, exist_ok=True)
    for c in cases:
        (OUT / f"{c['name']}.json").write_text(json.dumps(c) + "\n")
    print(f"wrote {len(cases)} cases to {OUT}")


if __name__ == "__main__":
    main()
