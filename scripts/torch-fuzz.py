#!/usr/bin/env python3
"""Random cases made by real PyTorch, in the golden format, to check the general rule.

The golden cases are a sample. This writes N random configurations per single-process kind into
a scratch folder, each run through PyTorch as tests/golden/README.md says the kind was made:

* `local_optimizer`: SGD, Adam or AdamW with random options (valid ones, and now and then one
  invalid value, which must be PyTorch's constructor error), PyTorch's three paths (single-tensor,
  `foreach=True`, now and then `fused=True`, and both together, an error), random dtypes per
  parameter (mixed too), 0-d, empty and multi-dimensional shapes, missing gradients, 1 to 6
  steps;
* `dp_sgd_step`: the reference code of section 4 with random ranks, mixed parameter and gradient
  dtypes, missing gradients, special values and a random lr, and cases with exactly one of the
  section's defects.

Then run them through the golden runners, natively (both backends) and in Node (the package
built by scripts/build-npm.sh):

    /work/torchenv/bin/python scripts/torch-fuzz.py --out /tmp/fuzz --cases 300 --seed 1
    DISTOPT_GOLDEN_DIR=/tmp/fuzz cargo test --release --test golden
    (cd tests/js && DISTOPT_GOLDEN_DIR=/tmp/fuzz node --test node-cpu.test.js)

Never in CI (it needs torch); a case it finds failing is a real PyTorch result, and may be kept
in tests/torch-cases/.
"""

import argparse
import importlib.util
import json
import math
import pathlib
import random

import torch

# The trajectory and tensor encoding of scripts/torch-cases.py (a file name Python cannot import).
_spec = importlib.util.spec_from_file_location(
    "torch_cases", pathlib.Path(__file__).with_name("torch-cases.py"))
torch_cases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(torch_cases)
tensor_json = torch_cases.tensor_json

SOURCE = f"torch {torch.__version__}, CPU, single process (scripts/torch-fuzz.py)"
DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
}
TOL_OPTIM = {
    "float32": {"rtol": 1e-05, "atol": 1e-06},
    "float16": {"rtol": 0.005, "atol": 0.005},
    "bfloat16": {"rtol": 0.02, "atol": 0.02},
    "float64": {"rtol": 1e-12, "atol": 1e-12},
}
TOL_STEP = {
    "float32": {"rtol": 1e-05, "atol": 1e-06},
    "float16": {"rtol": 0.001, "atol": 6e-08},
    "bfloat16": {"rtol": 0.008, "atol": 1e-40},
    "float64": {"rtol": 1e-05, "atol": 1e-06},
}


def shape(rng):
    return rng.choice([[], [1], [0], [rng.randint(1, 9)], [rng.randint(1, 4), rng.randint(1, 5)],
                       [2, 0, 3], [rng.randint(1, 3), rng.randint(1, 3), rng.randint(1, 4)],
                       [rng.randint(30, 70)]])


def values(rng, gen, s, dtype, special=False):
    t = torch.randn(s, generator=gen, dtype=torch.float64) * rng.choice([1.0, 1.0, 0.01, 30.0])
    if special and t.numel() > 0 and rng.random() < 0.3:
        flat = t.view(-1)
        flat[rng.randrange(flat.numel())] = rng.choice(
            [float("nan"), float("inf"), -float("inf"), -0.0, 0.0, 1e-30, 7e4])
    return t.to(DTYPES[dtype])


def pick_dtypes(rng, n):
    if rng.random() < 0.6:
        return [rng.choice(list(DTYPES))] * n
    return [rng.choice(list(DTYPES)) for _ in range(n)]


# ---------------------------------------------------------------------------------------------
# local_optimizer

def optimizer_options(rng):
    name = rng.choice(["SGD", "Adam", "AdamW"])
    o = {}
    if name == "SGD":
        if rng.random() < 0.8:
            o["lr"] = rng.choice([0.1, 0.01, 0.5, 1, 0.0, 2.5e-3])
        if rng.random() < 0.6:
            o["momentum"] = rng.choice([0.0, 0.5, 0.9, 0.99, 0])
        if rng.random() < 0.4:
            o["dampening"] = rng.choice([0.0, 0.1, 0.5])
        if rng.random() < 0.4:
            o["weight_decay"] = rng.choice([0.0, 1e-2, 0.1, 0])
        if rng.random() < 0.3:
            o["nesterov"] = True
        if rng.random() < 0.3:
            o["maximize"] = rng.choice([True, False])
    else:
        if rng.random() < 0.8:
            o["lr"] = rng.choice([0.1, 0.01, 1e-3, 0.05, 1])
        if rng.random() < 0.5:
            o["betas"] = rng.choice([[0.9, 0.999], [0.5, 0.9], [0.0, 0.99], [0.95, 0.0], [0.8, 0.5]])
        if rng.random() < 0.4:
            o["eps"] = rng.choice([1e-8, 1e-3, 0.0, 1e-6])
        if rng.random() < 0.5:
            o["weight_decay"] = rng.choice([0.0, 1e-2, 0.1, 0, 0.5])
        if rng.random() < 0.4:
            o["amsgrad"] = rng.choice([True, False])
        if rng.random() < 0.3:
            o["maximize"] = rng.choice([True, False])
        if name == "Adam" and rng.random() < 0.15:
            o["decoupled_weight_decay"] = rng.choice([True, False])
    if rng.random() < 0.15:
        # One invalid value: PyTorch's constructor error.
        key, bad = rng.choice({
            "SGD": [("lr", -0.1), ("momentum", -0.5), ("weight_decay", -1e-2), ("lr", -1e-8)],
            "Adam": [("lr", -0.1), ("eps", -1e-8), ("weight_decay", -0.01), ("betas", [1.0, 0.9]),
                     ("betas", [0.9, 1.0]), ("betas", [-0.1, 0.9]), ("betas", [0.9, -0.5])],
            "AdamW": [("lr", -1.0), ("eps", -1e-3), ("weight_decay", -0.5), ("betas", [1.5, 0.9]),
                      ("betas", [0.9, 1.0000001])],
        }[name])
        o[key] = bad
    o["foreach"] = rng.choice([False, False, True])
    if rng.random() < 0.1:
        o["fused"] = rng.choice([True, False])
    return name, o


def local_optimizer_case(rng, seed, k):
    gen = torch.Generator().manual_seed(seed * 100003 + k)
    name, options = optimizer_options(rng)
    n = rng.randint(1, 4)
    shapes = [shape(rng) for _ in range(n)]
    dtypes = pick_dtypes(rng, n)
    steps = rng.randint(1, 6)
    initial = [values(rng, gen, s, d) for s, d in zip(shapes, dtypes)]
    grads = [[None if rng.random() < 0.2 else values(rng, gen, s, d, special=rng.random() < 0.1)
              for s, d in zip(shapes, dtypes)] for _ in range(steps)]
    name_k = f"local_optimizer_fuzz_{seed}_{k}"
    description = f"random {name} configuration"
    kwargs = dict(options)
    if "betas" in kwargs:
        kwargs["betas"] = tuple(kwargs["betas"])
    try:
        getattr(torch.optim, name)([torch.nn.Parameter(p.clone()) for p in initial], **kwargs)
    except (ValueError, TypeError, RuntimeError) as e:
        return {
            "format": 1, "kind": "local_optimizer", "name": name_k, "description": description,
            "source": SOURCE,
            "input": {
                "optimizer": {"name": name, "options": options},
                "initial_params": [tensor_json(p) for p in initial],
                "grads": [[None if g is None else tensor_json(g) for g in step] for step in grads],
            },
            "expected": {"error": {"type": type(e).__name__, "message_contains": str(e)}},
            "tolerance": TOL_OPTIM,
        }
    try:
        return torch_cases.trajectory(name_k, description, name, options, initial, grads,
                                      TOL_OPTIM, SOURCE)
    except (TypeError, RuntimeError) as e:
        # The golden format has no error at a step. Seen: fused SGD with momentum when a
        # parameter gets its first gradient after the others have momentum buffers (PyTorch's
        # `_fused_sgd_` is handed a None buffer).
        print(f"{name_k}: PyTorch failed at a step ({type(e).__name__}: {e}): skipped")
        return None


# ---------------------------------------------------------------------------------------------
# dp_sgd_step (section 4's reference, literally)

def dp_reference(params, grads, lr):
    R = len(params)
    means, updated = [], []
    for j in range(len(params[0])):
        p0j = params[0][j]
        acc = torch.zeros_like(p0j, dtype=torch.float32)
        for r in range(R):
            g = grads[r][j]
            if g is not None:
                acc += g.to(torch.float32)
        mean = (acc / R).to(p0j.dtype)
        means.append(mean)
        updated.append((p0j.to(torch.float32) - lr * mean.to(torch.float32)).to(p0j.dtype))
    return means, [list(updated) for _ in range(R)]


DEFECTS = ["no replicas", "gradient replica count mismatch", "parameter count mismatch",
           "gradient count mismatch", "unsupported dtype param", "parameter shape mismatch",
           "unsupported dtype grad", "gradient shape mismatch"]


def dp_sgd_step_case(rng, seed, k):
    gen = torch.Generator().manual_seed(seed * 100019 + k)
    R = rng.randint(1, 5)
    n = rng.randint(1, 4)
    shapes = [shape(rng) for _ in range(n)]
    pdt = pick_dtypes(rng, n)
    p0 = [values(rng, gen, s, d, special=rng.random() < 0.2) for s, d in zip(shapes, pdt)]
    params = [[p.clone() for p in p0] for _ in range(R)]
    grads = [[None if rng.random() < 0.2 else
              values(rng, gen, s, rng.choice(list(DTYPES)) if rng.random() < 0.3 else d,
                     special=rng.random() < 0.2)
              for s, d in zip(shapes, pdt)] for _ in range(R)]
    lr = rng.choice([0.1, 0.5, -0.25, 0.0, 1, 0.01, 3.3])
    base = {"format": 1, "kind": "dp_sgd_step", "name": f"dp_sgd_step_fuzz_{seed}_{k}",
            "description": "random step", "source": SOURCE, "tolerance": TOL_STEP}

    def enc(ps, gs):
        enc_t = lambda t: t if isinstance(t, dict) else tensor_json(t)
        return {"parameter_replicas": [[enc_t(p) for p in rank] for rank in ps],
                "gradient_replicas": [[None if g is None else enc_t(g) for g in rank] for rank in gs],
                "learning_rate": lr}

    if rng.random() < 0.2:
        defect = rng.choice(DEFECTS)
        ps = [list(rank) for rank in params]
        gs = [list(rank) for rank in grads]
        r = rng.randrange(R)
        j = rng.randrange(n)
        if defect == "no replicas":
            ps, gs = [], []
        elif defect == "gradient replica count mismatch":
            gs = gs + [gs[0]] if rng.random() < 0.5 or R == 1 else gs[:-1]
        elif defect == "parameter count mismatch":
            if R == 1:
                return None
            r = rng.randrange(1, R)
            ps[r] = ps[r] + [ps[r][0]]
            gs[r] = gs[r] + [gs[r][0]]
        elif defect == "gradient count mismatch":
            gs[r] = gs[r][:-1]
        elif defect == "unsupported dtype param":
            ps[r][j] = {"dtype": "int64", "shape": [2], "data": [1, 2]}
        elif defect == "parameter shape mismatch":
            if R == 1:
                return None
            r = rng.randrange(1, R)
            ps[r][j] = tensor_json(torch.zeros(list(shapes[j]) + [2], dtype=DTYPES[pdt[j]]))
        elif defect == "unsupported dtype grad":
            gs[r][j] = {"dtype": "int32", "shape": list(shapes[j]),
                        "data": [1] * math.prod(shapes[j])}
        elif defect == "gradient shape mismatch":
            gs[r][j] = tensor_json(torch.zeros(list(shapes[j]) + [1], dtype=DTYPES[pdt[j]]))
        base["input"] = enc(ps, gs)
        text = defect.replace(" param", "").replace(" grad", "")
        base["description"] = f"error: {defect}"
        base["expected"] = {"error": {"type": "ValueError", "message_contains": text}}
        return base
    means, updated = dp_reference(params, grads, lr)
    base["input"] = enc(params, grads)
    base["expected"] = {"mean_gradients": [tensor_json(m) for m in means],
                        "updated_replicas": [[tensor_json(p) for p in rank] for rank in updated]}
    return base


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", type=int, default=200, help="cases per kind")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kinds", default="local_optimizer,dp_sgd_step")
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    makers = {"local_optimizer": local_optimizer_case, "dp_sgd_step": dp_sgd_step_case}
    for kind in args.kinds.split(","):
        rng = random.Random(f"{kind}-{args.seed}")
        made = 0
        for k in range(args.cases):
            case = makers[kind](rng, args.seed, k)
            if case is None:
                continue
            (out / f"{case['name']}.json").write_text(json.dumps(case))
            made += 1
        print(f"{kind}: {made} cases in {out}")


if __name__ == "__main__":
    main()
