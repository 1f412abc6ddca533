#!/usr/bin/env python3
"""Random `distributed_optimizer` cases made by real PyTorch over RPC, in the golden format.

The RPC twin of scripts/torch-fuzz-gloo.py: one driver and n worker processes (n = 2, 3) on
TensorPipe (tcp://127.0.0.1), as tests/golden/README.md section 13 says the kind was made. Each
case draws SGD, Adam or AdamW with random options, parameters of random shapes and dtypes on
random owners (the driver too, as a local RRef), gradients with `null`s (a parameter left out
of a step's loss), and either local-optimizer path: the functional one, or `torch.optim` (the
constructor run with TorchScript disabled, where a parameter without a gradient steps again
with its stale one).

    /work/torchenv/bin/python scripts/torch-fuzz-rpc.py --out /tmp/fuzz-rpc --cases 40
    DISTOPT_GOLDEN_DIR=/tmp/fuzz-rpc cargo test --release --test golden

Never in CI (it needs torch).
"""

import argparse
import importlib.util
import json
import logging
import os
import pathlib
import random
import warnings

import torch
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp
from torch.distributed.optim import DistributedOptimizer

_spec = importlib.util.spec_from_file_location(
    "torch_cases", pathlib.Path(__file__).with_name("torch-cases.py"))
torch_cases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(torch_cases)
tensor_json = torch_cases.tensor_json
free_port = torch_cases.free_port

TOLERANCE = torch_cases.ZERO_TOLERANCE


# Run on the owners, through RPC.
def make_param(initial):
    return initial.clone().requires_grad_(True)


def loss_of(rref, g):
    return (rref.local_value() * g).sum()


def value_of(rref):
    return rref.local_value().detach().clone()


def grad_attr(rref):
    g = rref.local_value().grad
    return None if g is None else g.detach().clone()


def context_grad(rref, context_id):
    g = dist_autograd.get_gradients(context_id).get(rref.local_value())
    return None if g is None else g.clone()


def on_owner(owner, fn, *args):
    """`fn(*args)` on worker `owner`, or here for a driver-owned parameter (-1)."""
    return fn(*args) if owner < 0 else rpc.rpc_sync(f"worker{owner}", fn, args=args)


def random_case(rng, workers):
    name = rng.choice(["SGD", "SGD", "Adam", "Adam", "AdamW"])
    if name == "SGD":
        options = rng.choice([{"lr": 0.1}, {"lr": 0.05, "momentum": 0.9},
                              {"lr": 0.1, "momentum": 0.5, "nesterov": True, "weight_decay": 0.01},
                              {"lr": 0.2, "momentum": 0.5, "dampening": 0.3, "maximize": True}])
    else:
        options = rng.choice([{"lr": 0.01}, {"lr": 0.02, "amsgrad": True},
                              {"lr": 0.01, "betas": [0.8, 0.9], "weight_decay": 0.1},
                              {"lr": 0.05, "eps": 1e-6, "maximize": True}])
    dtype = rng.choice([torch.float32] * 4 + [torch.float64, torch.bfloat16])
    gen = torch.Generator().manual_seed(rng.randrange(1 << 30))
    owners = [rng.choice(list(range(workers)) + ([-1] if rng.random() < 0.3 else []))
              for _ in range(rng.randint(1, 5))]
    shapes = [rng.choice([[], [1], [3], [2, 2], [5]]) for _ in owners]
    initial = [torch.randn(s, generator=gen).to(dtype) for s in shapes]
    grads = []
    for _ in range(rng.randint(1, 5)):
        step = [None if rng.random() < 0.25 else torch.randn(s, generator=gen).to(dtype)
                for s in shapes]
        if all(g is None for g in step):
            k = rng.randrange(len(shapes))
            step[k] = torch.randn(shapes[k], generator=gen).to(dtype)
        grads.append(step)
    path = rng.choice(["functional", "torch.optim"])
    return name, options, owners, initial, grads, path


def run(name, options, owners, initial, grads, path):
    """The case on the driver: its expected fields."""
    rrefs = [rpc.RRef(make_param(x)) if o < 0 else
             rpc.remote(f"worker{o}", make_param, args=(x,)) for o, x in zip(owners, initial)]
    kwargs = dict(options)
    if "betas" in kwargs:
        kwargs["betas"] = tuple(kwargs["betas"])
    events = []

    class Catch(logging.Handler):
        def emit(self, record):
            if record.levelno >= logging.WARNING:
                events.append(record.getMessage())

    handler = Catch()
    # torch's loggers do not propagate to the root logger.
    logger = logging.getLogger("torch.distributed.optim.optimizer")
    logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if path == "torch.optim":
                torch.jit._state.disable()
            try:
                dopt = DistributedOptimizer(getattr(torch.optim, name), rrefs, **kwargs)
            finally:
                torch.jit._state.enable()
    finally:
        logger.removeHandler(handler)
    texts = []
    for text in [str(w.message) for w in caught] + events:
        if text not in texts:
            texts.append(text)
    after, in_context, attr = [], [], []
    for step in grads:
        with dist_autograd.context() as ctx:
            loss = sum(on_owner(o, loss_of, r, g)
                       for o, r, g in zip(owners, rrefs, step) if g is not None)
            dist_autograd.backward(ctx, [loss])
            dopt.step(ctx)
            in_context.append([on_owner(o, context_grad, r, ctx) for o, r in zip(owners, rrefs)])
        after.append([on_owner(o, value_of, r) for o, r in zip(owners, rrefs)])
        attr.append([on_owner(o, grad_attr, r) for o, r in zip(owners, rrefs)])
    firsts = list(dict.fromkeys(owners))
    json_list = lambda ts: [None if t is None else tensor_json(t) for t in ts]
    return {"params_after_step": [json_list(s) for s in after],
            "grads_in_context": [json_list(s) for s in in_context],
            "param_grad_attr_after_step": [json_list(s) for s in attr],
            "is_functional_optim": dopt.is_functional_optim,
            "local_optimizers": [{"owner": o, "param_indices": [i for i, x in enumerate(owners)
                                                                if x == o]} for o in firsts],
            "warnings": texts}


def process(rank, workers, port, args):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    name = "driver" if rank == 0 else f"worker{rank - 1}"
    rpc.init_rpc(name, rank=rank, world_size=workers + 1,
                 rpc_backend_options=rpc.TensorPipeRpcBackendOptions(
                     init_method=f"tcp://127.0.0.1:{port}"))
    if rank == 0:
        out = pathlib.Path(args.out)
        for k in range(args.cases):
            rng = random.Random(f"do-{workers}-{args.seed}-{k}")
            name_, options, owners, initial, grads, path = random_case(rng, workers)
            expected = run(name_, options, owners, initial, grads, path)
            case_name = f"distributed_optimizer_fuzz_w{workers}_{args.seed}_{k}"
            case = {"format": 1, "kind": "distributed_optimizer", "name": case_name,
                    "description": "random DistributedOptimizer run",
                    "source": f"torch {torch.__version__}, CPU, torch.distributed.rpc TensorPipe "
                              f"(tcp://127.0.0.1), 1 driver + {workers} worker processes "
                              "(scripts/torch-fuzz-rpc.py)",
                    "input": {"workers": workers, "local_optimizer": path,
                              "optimizer": {"name": name_, "options": options},
                              "params": [{"owner": o, "initial": tensor_json(x)}
                                         for o, x in zip(owners, initial)],
                              "grads": [[None if g is None else tensor_json(g) for g in step]
                                        for step in grads]},
                    "expected": expected, "tolerance": TOLERANCE}
            (out / f"{case_name}.json").write_text(json.dumps(case))
    rpc.shutdown()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", type=int, default=40, help="cases per number of workers")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", default="2,3")
    args = ap.parse_args()
    pathlib.Path(args.out).mkdir(parents=True, exist_ok=True)
    for n in [int(w) for w in args.workers.split(",")]:
        mp.spawn(process, args=(n, free_port(), args), nprocs=n + 1, join=True)
        print(f"{n} workers: done")


if __name__ == "__main__":
    main()
