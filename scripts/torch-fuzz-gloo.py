#!/usr/bin/env python3
"""Random multi-process cases made by real PyTorch over gloo, in the golden format.

The multi-process twin of scripts/torch-fuzz.py: for each world size it starts W processes
on one gloo process group (127.0.0.1) and runs N random configurations of each kind in it, as
tests/golden/README.md says the kinds were made:
* `periodic_averager` (W = 2, 4) and `hierarchical_averager` (W = 4, 8), sections 5 and 6:
  random periods, warm-ups, hierarchies (sorted or not, a last key of 1), parameters without
  gradients, mixed dtypes, special values, and now and then a constructor error or an error
  at a step;
* `zero_partition` (every W), section 9: random parameter groups of random shapes (0-d,
  empty, ties), and now and then a group added with `add_param_group`;
* `diloco` (W = 2, 3, 4), section 13b: random inner and outer optimizers (SGD, Adam, AdamW
  with any of their options, `foreach=True` now and then), `sync_every`, mixed dtypes (all
  four) and missing gradients;
* `post_local_sgd` (W = 4), section 8: SGD, Adam or AdamW (any of their options) under a
  periodic or hierarchical averager,
  either variant (`explicit_grads` with missing gradients, the same on every rank; `ddp_hook`:
  DDP with PyTorch's `post_localSGD_hook`), and now and then a save and load of the state
  dict, with or without its `"step"`;
* `zero_join` (W = 2, 3, 4), section 12: DDP and ZeRO inside `Join` with uneven steps per
  rank, SGD or Adam, either `zero_grad` placement, `divide_by_initial_world_size` either way,
  with or without the bucket view;
* `zero_errors` (W = 2, 3; only with `--zero-errors`), section 11: random parameter lists and
  groups (dtypes, meta, sparse and non-leaf tensors, repeated tensors, groups without
  `params`, the other `params` forms), valid and invalid local options, then random calls
  (gradients, `step`, `consolidate_state_dict(to=k)` for k from -1 to W, `state_dict`,
  `add_param_group`), with every rank's outcome, message and warning (`warnings` and
  `logging`) per stage. Some misuses leave PyTorch's ranks in different collectives, which
  never return (seed 7 at W = 2, case 38): these run in processes of their own, and a case
  that finishes nothing for 20 s is reported, skipped and the rest run in fresh
  processes (`zero_errors`). `params_after_per_rank` and
  `rank_of_param` cover the constructor's tensors only (the golden README leaves open whether
  a group added later counts);
* `zero_trajectory` (W = 2, 3, 4), section 10: SGD or Adam with random options (PyTorch's
  `foreach=True` or Adam's `fused=True` now and then) over random groups, float32 or bfloat16, with or without the bucket view, per-rank gradients with
  `null`s (the owner's too), and now and then a group added at a step, sometimes of another
  dtype (then without the bucket view); at W = 4 also cases with a `reload`: the run on a
  subgroup of 2 to 4 ranks, the reload on another.

    /work/torchenv/bin/python scripts/torch-fuzz-gloo.py --out /tmp/fuzz-gloo --cases 60
    DISTOPT_GOLDEN_DIR=/tmp/fuzz-gloo cargo test --release --test golden

Never in CI (it needs torch).
"""

import argparse
import importlib.util
import json
import math
import os
import pathlib
import random
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.algorithms.model_averaging import averagers, utils
from torch.distributed.algorithms.model_averaging.hierarchical_model_averager import (
    HierarchicalModelAverager,
)

_spec = importlib.util.spec_from_file_location(
    "torch_cases", pathlib.Path(__file__).with_name("torch-cases.py"))
torch_cases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(torch_cases)
tensor_json = torch_cases.tensor_json
free_port = torch_cases.free_port

TOLERANCE = torch_cases.GOLDEN_TOLERANCE
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


def config(rng, kind, W):
    n = rng.randint(1, 4)
    shapes = [rng.choice([[], [1], [3], [2, 3], [0], [17]]) for _ in range(n)]
    same = rng.random() < 0.5
    dtypes = [rng.choice(DTYPES)] * n if same else [rng.choice(DTYPES) for _ in range(n)]
    has_grad = [rng.random() < 0.85 for _ in range(n)]
    if rng.random() < 0.05:
        has_grad = [False] * n
    c = {"shapes": shapes, "dtypes": dtypes, "has_grad": has_grad,
         "steps": rng.randint(1, 9), "warmup": rng.choice([0, 0, 1, 2, 3, 5])}
    if kind == "periodic_averager":
        c["period"] = rng.choice([1, 2, 2, 3, 4])
        if rng.random() < 0.05:
            c["period"] = rng.choice([0, -1])
        if rng.random() < 0.03:
            c["warmup"] = -1
    else:
        sizes = [g for g in range(1, W + 1) if W % g == 0]
        k = rng.randint(1, 3)
        entries = [[rng.choice([1, 2, 3, 4, 6]), rng.choice(sizes)] for _ in range(k - 1)]
        entries.append([rng.choice([1, 2, 3, 4, 6, 8]), W])
        if rng.random() < 0.5:
            entries.sort()
        # Duplicate periods: the dict keeps the last value for a key.
        d = {}
        for p, g in entries:
            d[p] = g
        entries = [[p, g] for p, g in d.items()]
        if rng.random() < 0.08:
            entries[rng.randrange(len(entries))][1] = rng.choice([0, 3, 2 * W])
        if rng.random() < 0.04:
            entries[0][0] = rng.choice([0, -2])
        c["dict"] = entries
        if rng.random() < 0.03:
            c["warmup"] = -1
    return c


def run_case(rank, W, kind, c, seed):
    gen = torch.Generator().manual_seed(seed * 7919 + rank)
    scale = lambda: torch.randn([], generator=gen).abs().item() * 3 + 0.1
    initial = [(torch.randn(s, generator=gen, dtype=torch.float64) * scale()).to(d)
               for s, d in zip(c["shapes"], c["dtypes"])]
    updates = []
    for _ in range(c["steps"]):
        step = []
        for s, d in zip(c["shapes"], c["dtypes"]):
            u = torch.randn(s, generator=gen, dtype=torch.float64) * 0.1
            if u.numel() and torch.rand([], generator=gen).item() < 0.03:
                u.view(-1)[0] = float("inf")
            step.append(u.to(d))
        updates.append(step)
    averaged, sizes = [], []
    real_average = utils.average_parameters_or_parameter_groups

    def recording(params, process_group):
        averaged.append(len(sizes) - 1)
        sizes[-1] = dist.get_world_size(process_group)
        return real_average(params, process_group)

    out = {"rank": rank, "initial": [tensor_json(p) for p in initial],
           "updates": [[tensor_json(u) for u in step] for step in updates]}
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        try:
            if kind == "periodic_averager":
                avg = averagers.PeriodicModelAverager(period=c["period"], warmup_steps=c["warmup"])
            else:
                from collections import OrderedDict
                avg = HierarchicalModelAverager(
                    period_group_size_dict=OrderedDict((p, g) for p, g in c["dict"]),
                    warmup_steps=c["warmup"])
        except (ValueError, RuntimeError, ZeroDivisionError) as e:
            out["error"] = {"type": type(e).__name__, "message_contains": str(e)}
            out["constructor"] = True
            return out
        params = [torch.nn.Parameter(p.clone()) for p in initial]
        for p, g in zip(params, c["has_grad"]):
            if g:
                p.grad = torch.zeros_like(p)
        after = []
        # Both averagers call it through the utils module: one patch records either.
        utils.average_parameters_or_parameter_groups = recording
        try:
            for t in range(c["steps"]):
                with torch.no_grad():
                    for p, u in zip(params, updates[t]):
                        p.add_(u)
                sizes.append(None)
                try:
                    avg.average_parameters(params)
                except (ValueError, RuntimeError, ZeroDivisionError) as e:
                    out["error"] = {"type": type(e).__name__, "message_contains": str(e)}
                    out["error_at_step"] = t
                    return out
                after.append([tensor_json(p.detach()) for p in params])
        finally:
            utils.average_parameters_or_parameter_groups = real_average
        seen = []
        for x in w:
            text = str(x.message)
            if text not in seen:
                seen.append(text)
        out.update(after=after, averaged=averaged, sizes=sizes, counter=avg.step, warnings=seen)
    return out


def zero_partition_case(rank, W, rng_state):
    """One random ZeroRedundancyOptimizer partition: its input and expected value (rank 0)."""
    from torch.distributed.optim import ZeroRedundancyOptimizer
    rng = random.Random(rng_state)
    shape = lambda: rng.choice([[], [0], [1], [rng.randint(1, 9)], [2, rng.randint(1, 4)],
                                [rng.choice([3, 4, 6])], [rng.randint(10, 60)], [2, 0]])
    groups = [{"shapes": [shape() for _ in range(rng.randint(1, 5))],
               "options": rng.choice([{}, {}, {"lr": 0.3}, {"momentum": 0.9}])}
              for _ in range(rng.randint(1, 3))]
    added = ({"shapes": [shape() for _ in range(rng.randint(1, 4))], "options": {}}
             if rng.random() < 0.35 else None)
    tensors = [[torch.zeros(s) for s in g["shapes"]] for g in groups]
    zero = ZeroRedundancyOptimizer(
        [{"params": ts, **g["options"]} for ts, g in zip(tensors, groups)],
        optimizer_class=torch.optim.SGD, lr=0.01)
    everything = [t for ts in tensors for t in ts]

    def partition():
        index = {id(t): i for i, t in enumerate(everything)}
        per_group = [[[index[id(p)] for p in g["params"]] for g in rank_groups]
                     for rank_groups in zero._partition_parameters()]
        return {
            "rank_of_param": [zero._param_to_rank[t] for t in everything],
            "params_per_rank": [[i for g in r for i in g] for r in per_group],
            "params_per_rank_per_group": per_group,
            "numel_per_rank": [sum(everything[i].numel() for g in r for i in g)
                               for r in per_group],
        }, [[index[id(p)] for p in g["params"]] for g in zero.optim.param_groups]

    before, _ = partition()
    if added is not None:
        new = [torch.zeros(s) for s in added["shapes"]]
        zero.add_param_group({"params": new, **added["options"]})
        everything += new
    after, local = partition()
    inp = {"world_size": W, "param_groups": groups}
    if added is not None:
        inp["add_param_group"] = added
    return inp, after, local, (before if added is not None else None)


ZERO_TOLERANCE = torch_cases.ZERO_TOLERANCE


def zero_trajectory_case(rank, W, rng_state, subgroups=None):
    """One random ZeRO trajectory: (input, expected) on rank 0, None on the others.

    With `subgroups` ({size: process group of ranks 0..size-1}, in a world of 4), the run takes
    a random subgroup of 2 to 4 ranks, and a `reload` follows: fresh parameters and a fresh
    optimizer on another random subgroup load the consolidated state dict and step on.
    """
    from torch.distributed.optim import ZeroRedundancyOptimizer
    rng = random.Random(rng_state)
    W1, W2 = (rng.choice([2, 3, 4]), rng.choice([2, 3, 4])) if subgroups else (W, None)
    pg1 = subgroups[W1] if subgroups else None
    name = rng.choice(["SGD", "Adam"])
    if name == "SGD":
        options = rng.choice([{"lr": 0.1}, {"lr": 0.05, "momentum": 0.9},
                              {"lr": 0.1, "momentum": 0.8, "nesterov": True, "weight_decay": 0.01},
                              {"lr": 0.2, "momentum": 0.5, "dampening": 0.3, "maximize": True}])
    else:
        options = rng.choice([{"lr": 0.01}, {"lr": 0.02, "amsgrad": True},
                              {"lr": 0.01, "betas": [0.8, 0.9], "weight_decay": 0.1},
                              {"lr": 0.05, "eps": 1e-6, "maximize": True}])
    # PyTorch's three paths: foreach in a third of cases, Adam's fused now and then (fused
    # SGD fails when a buffer starts after the others, see torch-fuzz.py).
    options = dict(options, **rng.choice(
        [{}, {"foreach": True}, {}] + ([{"fused": True}] if name == "Adam" else [])))
    dtype = rng.choice([torch.float32, torch.float32, torch.bfloat16])
    gen = torch.Generator().manual_seed(rng.randrange(1 << 30))
    shape = lambda: rng.choice([[], [1], [5], [2, 3], [rng.randint(1, 20)], [4, 2]])
    n = rng.randint(1, 6)
    cut = sorted(rng.sample(range(1, n), rng.randint(0, min(2, n - 1)))) if n > 1 else []
    bounds = [0] + cut + [n]
    groups = [{"param_indices": list(range(a, b)),
               "options": rng.choice([{}, {}, {"lr": 0.03}])} for a, b in zip(bounds, bounds[1:])]
    initial = [torch.randn(shape(), generator=gen).to(dtype) for _ in range(n)]
    steps = rng.randint(1, 5)
    add = None
    if rng.random() < 0.3:
        # Now and then the group has another dtype: PyTorch checks dtypes only in the
        # constructor. Such a case goes without the bucket view, where PyTorch would cast the
        # rank's parameters to the dtype of its last one (distopt refuses that group), and
        # without a reload (whose constructor takes every group at once).
        add_dtype = dtype if subgroups or rng.random() < 0.6 else rng.choice(
            [torch.float64, torch.bfloat16 if dtype == torch.float32 else torch.float32])
        add = {"step": rng.randint(0, steps - 1),
               "initial_params": [torch.randn(shape(), generator=gen).to(add_dtype)
                                  for _ in range(rng.randint(1, 2))],
               "options": rng.choice([{}, {"lr": 0.07}])}
    mixed = add is not None and add["initial_params"][0].dtype != dtype

    def random_grads(count, like, ranks, same):
        one = [torch.randn(p.shape, generator=gen).to(p.dtype) for p in like]
        per_rank = []
        for r in range(ranks):
            g = one if same else [torch.randn(p.shape, generator=gen).to(p.dtype) for p in like]
            per_rank.append([None if rng.random() < 0.15 else x for x in g][:count])
        return per_rank

    same = rng.random() < 0.4
    grads = []
    for t in range(steps):
        count = n + (len(add["initial_params"]) if add and t >= add["step"] else 0)
        like = initial + (add["initial_params"] if add and t >= add["step"] else [])
        grads.append(random_grads(count, like, W1, same))
    bucket = rng.random() < 0.3 and not mixed
    reload = None
    if subgroups:
        everything = initial + (add["initial_params"] if add else [])
        reload = {"world_size": W2, "parameters_as_bucket_view": rng.random() < 0.3 and not mixed,
                  "grads": [[one[0]] * W2 for one in (
                      [random_grads(len(everything), everything, 1, True)
                       for _ in range(rng.randint(1, 3))])]}
    kwargs = dict(options)
    if "betas" in kwargs:
        kwargs["betas"] = tuple(kwargs["betas"])

    def run(ranks, pg, param_groups, values, grads, bucket, state_dict=None):
        """Steps a fresh ZeRO on `pg`; the records of every rank on rank 0, else None."""
        params = [p.clone().requires_grad_(True) for p in values]
        zero = ZeroRedundancyOptimizer(
            [{"params": [params[j] for j in g["param_indices"]], **g["options"]}
             for g in param_groups],
            optimizer_class=getattr(torch.optim, name), parameters_as_bucket_view=bucket,
            process_group=pg, **kwargs)
        out = {}
        if state_dict is not None:
            zero.load_state_dict(state_dict)
            out["local_state_sizes_after_load"] = gathered(
                sum(1 for v in zero.optim.state.values() if v), pg, ranks)
        after = []
        for t in range(len(grads)):
            if add and state_dict is None and t == add["step"]:
                out["rank_of_param_before_add"] = [zero._param_to_rank[p] for p in params]
                new = [x.clone().requires_grad_(True) for x in add["initial_params"]]
                zero.add_param_group({"params": new, **add["options"]})
                params += new
            for i, p in enumerate(params):
                g = grads[t][rank][i]
                p.grad = None if g is None else g.clone()
            zero.step()
            after.append([tensor_json(p.detach()) for p in params])
        zero.consolidate_state_dict(to=0)
        sizes = gathered(sum(1 for v in zero.optim.state.values() if v), pg, ranks)
        everyone = gathered(after, pg, ranks)
        if rank != 0:
            return None
        sd = zero.state_dict()
        state = {str(k): {key: (tensor_json(v) if torch.is_tensor(v) else v)
                          for key, v in entry.items()} for k, entry in sd["state"].items()}
        param_groups = [dict(g) for g in sd["param_groups"]]
        for g in param_groups:
            if "betas" in g:
                g["betas"] = list(g["betas"])
        index = {id(p): i for i, p in enumerate(params)}
        out.update({
            "params_after_step": [[everyone[r][t] for r in range(ranks)]
                                  for t in range(len(grads))],
            "consolidated_state_dict": {"state": state, "param_groups": param_groups},
            "local_state_sizes": sizes, "rank_of_param": [zero._param_to_rank[p] for p in params],
            "params_per_rank": [[index[id(p)] for g in rank_groups for p in g["params"]]
                                for rank_groups in zero._partition_parameters()]})
        return out, sd, [p.detach().clone() for p in params]

    first = run(W1, pg1, groups, initial, grads, bucket) if rank < W1 else None
    if reload:
        # Rank 0 hands every rank the state dict and its final parameters.
        shared = [first[1:] if rank == 0 else None]
        dist.broadcast_object_list(shared, src=0)
        sd, values = shared[0]
        all_groups = groups + ([{"param_indices": list(range(n, len(values))),
                                 "options": add["options"]}] if add else [])
        second = (run(W2, subgroups[W2], all_groups, values, reload["grads"],
                      reload["parameters_as_bucket_view"], sd) if rank < W2 else None)
    if rank != 0:
        return None
    inp = {"world_size": W1, "optimizer": {"name": name, "options": options},
           "parameters_as_bucket_view": bucket, "param_groups": groups,
           "initial_params": [tensor_json(p) for p in initial],
           "grads": [[[None if g is None else tensor_json(g) for g in rank_grads]
                      for rank_grads in step] for step in grads]}
    if add:
        inp["add_param_group_at_step"] = {
            "step": add["step"], "initial_params": [tensor_json(p) for p in add["initial_params"]],
            "options": add["options"]}
    expected = first[0]
    if reload:
        inp["reload"] = dict(reload, grads=[[[None if g is None else tensor_json(g) for g in r]
                                             for r in step] for step in reload["grads"]])
        expected["reload"] = {k: v for k, v in second[0].items()
                              if k != "params_per_rank"}
    return inp, expected


def gathered(value, pg, ranks):
    """`value` of every rank of `pg` (a list of `ranks` entries, on every member)."""
    out = [None] * ranks
    dist.all_gather_object(out, value, group=pg)
    return out


def state_dict_json(opt):
    sd = opt.state_dict()
    groups = [dict(g) for g in sd["param_groups"]]
    for g in groups:
        if "betas" in g:
            g["betas"] = list(g["betas"])
    return {"state": {str(k): {key: (tensor_json(v) if torch.is_tensor(v) else v)
                               for key, v in entry.items()} for k, entry in sd["state"].items()},
            "param_groups": groups}


def diloco_case(rank, W, rng_state):
    """One random DiLoCo run (section 13b's code): (input, expected) on rank 0, else None."""
    rng = random.Random(rng_state)
    inner_spec = torch_cases.random_optimizer(rng)
    outer_spec = torch_cases.random_optimizer(rng, outer=True)
    sync_every = rng.choice([1, 2, 2, 3, 4])
    steps = rng.randint(1, 9)
    gen = torch.Generator().manual_seed(rng.randrange(1 << 30))
    shapes = [rng.choice([[], [3], [2, 4], [7], [1]]) for _ in range(rng.randint(1, 3))]
    dtypes = [rng.choice([torch.float32, torch.float32, torch.bfloat16, torch.float16,
                          torch.float64]) for _ in shapes]
    initial = [torch.randn(s, generator=gen).to(d) for s, d in zip(shapes, dtypes)]
    grads = [[[None if rng.random() < 0.15 else torch.randn(s, generator=gen).to(d)
               for s, d in zip(shapes, dtypes)] for _ in range(W)] for _ in range(steps)]

    def build(spec, params):
        kwargs = dict({"foreach": False}, **spec["options"])
        if "betas" in kwargs:
            kwargs["betas"] = tuple(kwargs["betas"])
        return getattr(torch.optim, spec["name"])(params, **kwargs)

    params = [torch.nn.Parameter(p.clone()) for p in initial]
    inner, outer = build(inner_spec, params), build(outer_spec, params)
    original = [p.detach().clone() for p in params]
    local_step, synced, after = 0, [], []
    for t in range(steps):
        inner.zero_grad(set_to_none=True)
        for p, g in zip(params, grads[t][rank]):
            p.grad = None if g is None else g.clone()
        inner.step()
        local_step += 1
        if local_step >= sync_every:
            with torch.no_grad():
                for p, o in zip(params, original):
                    p.grad = o - p
                for p in params:
                    dist.all_reduce(p.grad, dist.ReduceOp.SUM)
                    p.grad.div_(W)
                for p, o in zip(params, original):
                    p.copy_(o)
            outer.step()
            with torch.no_grad():
                for p, o in zip(params, original):
                    o.copy_(p)
            outer.zero_grad(set_to_none=True)
            local_step = 0
            synced.append(t)
        after.append([tensor_json(p.detach()) for p in params])
    everyone, inners = [None] * W, [None] * W
    dist.all_gather_object(everyone, after)
    dist.all_gather_object(inners, state_dict_json(inner))
    if rank != 0:
        return None
    inp = {"world_size": W, "sync_every": sync_every, "inner_optimizer": inner_spec,
           "outer_optimizer": outer_spec, "initial_params": [tensor_json(p) for p in initial],
           "grads": [[[None if g is None else tensor_json(g) for g in r] for r in step]
                     for step in grads]}
    expected = {"params_after_step": [[everyone[r][t] for r in range(W)] for t in range(steps)],
                "synced_at_steps": synced, "outer_state_dict": state_dict_json(outer),
                "inner_state_dicts": inners}
    return inp, expected


def post_local_sgd_case(rank, W, rng_state):
    """One random PostLocalSGDOptimizer run, either variant: (input, expected) on rank 0."""
    import copy
    from collections import OrderedDict
    from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import (
        PostLocalSGDState, post_localSGD_hook)
    from torch.distributed.optim import PostLocalSGDOptimizer
    rng = random.Random(rng_state)
    variant = rng.choice(["explicit_grads", "explicit_grads", "ddp_hook"])
    spec = torch_cases.random_optimizer(rng)
    name, options = spec["name"], dict({"foreach": False}, **spec["options"])
    warmup = rng.choice([0, 1, 2, 3])
    if rng.random() < 0.5:
        averager = {"type": "periodic", "period": rng.choice([1, 2, 3]), "warmup_steps": warmup}
    else:
        averager = {"type": "hierarchical",
                    "period_group_size_dict": rng.choice([[[2, 2], [4, 4]], [[1, 2], [3, 4]],
                                                          [[4, 4]], [[3, 2], [2, 4]]]),
                    "warmup_steps": warmup}
    steps = rng.randint(1, 8)
    load = ({"after_step": rng.randint(1, steps), "remove_step_key": rng.random() < 0.5}
            if rng.random() < 0.4 else None)
    gen = torch.Generator().manual_seed(rng.randrange(1 << 30))
    shapes = [rng.choice([[], [3], [2, 2], [5]]) for _ in range(rng.randint(1, 3))]
    dtype = rng.choice([torch.float32, torch.float32, torch.bfloat16, torch.float16])
    initial = [[torch.randn(s, generator=gen).to(dtype) for s in shapes] for _ in range(W)]
    # At least one gradient per step: with none, an averaging step is torch.cat's ValueError.
    # DDP's backward gives every parameter a gradient.
    missing = [[variant == "explicit_grads" and rng.random() < 0.15 for _ in shapes]
               for _ in range(steps)]
    for row in missing:
        row[rng.randrange(len(row))] = False
    grads = [[[None if missing[t][j] else torch.randn(s, generator=gen).to(dtype)
               for j, s in enumerate(shapes)] for _ in range(W)] for t in range(steps)]
    hook, ddp, seen, extra = None, None, {}, {}
    if variant == "ddp_hook":
        # The averager's warm-up equals the hook's start_localSGD_iter, as PyTorch's
        # documentation asks.
        hook = {"start_localSGD_iter": warmup, "subgroup_size": 2,
                "post_local_gradient_allreduce": True, "process_group": None}

        class Model(torch.nn.Module):
            def __init__(self, values):
                super().__init__()
                self.ps = torch.nn.ParameterList([torch.nn.Parameter(v.clone()) for v in values])

            def forward(self, gs):
                return sum((p * g).sum() for p, g in zip(self.ps, gs))

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ddp = torch.nn.parallel.DistributedDataParallel(Model(initial[rank]))
        subgroup, _ = dist.new_subgroups(group_size=2)
        ddp.register_comm_hook(PostLocalSGDState(process_group=None, subgroup=subgroup,
                                                 start_localSGD_iter=warmup),
                               post_localSGD_hook)
        params = list(ddp.module.parameters())
        seen["params_after_ddp_init"] = [tensor_json(p.detach()) for p in params]
        seen["grads_seen"] = []
    else:
        params = [torch.nn.Parameter(p.clone()) for p in initial[rank]]
    kwargs = dict(options)
    if "betas" in kwargs:
        kwargs["betas"] = tuple(kwargs["betas"])
    local = getattr(torch.optim, name)(params, **kwargs)
    caught = []
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        if averager["type"] == "periodic":
            avg = averagers.PeriodicModelAverager(period=averager["period"], warmup_steps=warmup)
        else:
            avg = HierarchicalModelAverager(
                period_group_size_dict=OrderedDict(
                    (p, g) for p, g in averager["period_group_size_dict"]),
                warmup_steps=warmup)
        opt = PostLocalSGDOptimizer(optim=local, averager=avg)
        sizes, before_each, after = [], [], []
        real_average = utils.average_parameters_or_parameter_groups

        def recording(p, process_group):
            sizes[-1] = dist.get_world_size(process_group)
            return real_average(p, process_group)

        utils.average_parameters_or_parameter_groups = recording
        try:
            for t in range(steps):
                opt.zero_grad()
                if ddp is None:
                    for p, g in zip(params, grads[t][rank]):
                        p.grad = None if g is None else g.clone()
                else:
                    ddp([g.clone() for g in grads[t][rank]]).backward()
                    seen["grads_seen"].append([tensor_json(p.grad) for p in params])
                before_each.append(avg.step)
                sizes.append(None)
                opt.step()
                after.append([tensor_json(p.detach()) for p in params])
                if load and t == load["after_step"] - 1:
                    sd = copy.deepcopy(opt.state_dict())
                    extra["saved_state_dict"] = post_local_state_json(sd)
                    extra["averager_step_before_load"] = avg.step
                    if load["remove_step_key"]:
                        del sd["step"]
                    opt.load_state_dict(sd)
                    extra["averager_step_after_load"] = avg.step
        finally:
            utils.average_parameters_or_parameter_groups = real_average
        for x in w:
            if str(x.message) not in caught:
                caught.append(str(x.message))
    mine = {"after": after, "sd": post_local_state_json(opt.state_dict()), "warnings": caught,
            "seen": seen}
    everyone = [None] * W
    dist.all_gather_object(everyone, mine)
    if rank != 0:
        return None
    union = []
    for r in everyone:
        for text in r["warnings"]:
            if text not in union:
                union.append(text)
    inp = {"world_size": W, "optimizer": {"name": name, "options": options},
           "averager": averager, "variant": variant, "hook": hook,
           "initial_params": [[tensor_json(p) for p in r] for r in initial],
           "grads": [[[None if g is None else tensor_json(g) for g in r] for r in step]
                     for step in grads],
           "load_state_dict": load}
    expected = {}
    if variant == "ddp_hook":
        expected["params_after_ddp_init"] = [r["seen"]["params_after_ddp_init"]
                                             for r in everyone]
        expected["grads_seen"] = [[r["seen"]["grads_seen"][t] for r in everyone]
                                  for t in range(steps)]
    expected.update({"params_after_step": [[everyone[r]["after"][t] for r in range(W)]
                                           for t in range(steps)],
                     "averaged_at_steps": [t for t, g in enumerate(sizes) if g is not None],
                     "averaging_group_size_at_step": sizes,
                     "averager_step_before_each_step": before_each,
                     "final_averager_step": avg.step, **extra,
                     "state_dict_rank0": everyone[0]["sd"],
                     "state_dict_per_rank": [r["sd"] for r in everyone],
                     "warnings": union})
    return inp, expected


def zero_join_case(rank, W, rng_state):
    """One random Join([ddp, zero]) run with uneven inputs: (input, expected) on rank 0."""
    from torch.distributed.algorithms.join import Join
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel
    rng = random.Random(rng_state)
    name = rng.choice(["SGD", "Adam"])
    options = (rng.choice([{"lr": 0.1}, {"lr": 0.05, "momentum": 0.9}])
               if name == "SGD" else rng.choice([{"lr": 0.02}, {"lr": 0.01, "amsgrad": True}]))
    bucket = rng.random() < 0.5
    steps = [rng.randint(0 if r else 1, 4) for r in range(W)]
    rng.shuffle(steps)
    if max(steps) == 0:
        steps[0] = 1
    zero_grad = rng.choice(["before_forward", "after_step"])
    divide = rng.random() < 0.5
    gen = torch.Generator().manual_seed(rng.randrange(1 << 30))
    shapes = [rng.choice([[4, 3], [4], [2, 3], [2], [3, 3], [5]]) for _ in range(rng.randint(1, 6))]
    initial = [torch.randn(s, generator=gen) for s in shapes]
    T = max(steps)
    grads = [[[torch.randn(s, generator=gen) for s in shapes] if t < steps[r] else None
              for r in range(W)] for t in range(T)]

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ps = torch.nn.ParameterList([torch.nn.Parameter(p.clone()) for p in initial])

        def forward(self, *g):
            return sum((p * x).sum() for p, x in zip(self.ps, g))

    model = Model()
    ddp = DistributedDataParallel(model)
    kwargs = dict(options)
    zero = ZeroRedundancyOptimizer(list(model.ps), optimizer_class=getattr(torch.optim, name),
                                   parameters_as_bucket_view=bucket, **kwargs)
    seen, after = [], []
    with Join([ddp, zero], divide_by_initial_world_size=divide):
        for t in range(steps[rank]):
            if zero_grad == "before_forward":
                zero.zero_grad(set_to_none=True)
            ddp(*grads[t][rank]).backward()
            seen.append([tensor_json(p.grad) for p in model.ps])
            zero.step()
            if zero_grad == "after_step":
                zero.zero_grad(set_to_none=True)
            after.append([tensor_json(p.detach()) for p in model.ps])
    mine = {"seen": seen, "after": after,
            "params_after_join": [tensor_json(p.detach()) for p in model.ps],
            "grads_after_join": [None if p.grad is None else tensor_json(p.grad) for p in model.ps],
            "state": sum(1 for v in zero.optim.state.values() if v)}
    everyone = [None] * W
    dist.all_gather_object(everyone, mine)
    if rank != 0:
        return None
    pick = lambda key, t: [everyone[r][key][t] if t < steps[r] else None for r in range(W)]
    inp = {"world_size": W, "optimizer": {"name": name, "options": options},
           "parameters_as_bucket_view": bucket, "steps_per_rank": steps, "zero_grad": zero_grad,
           "divide_by_initial_world_size": divide,
           "initial_params": [tensor_json(p) for p in initial],
           "grads": [[None if g is None else [tensor_json(x) for x in g] for g in step]
                     for step in grads],
           "ddp": {"module": "loss = sum_i (p_i * G_i).sum()", "find_unused_parameters": False,
                   "gradient_as_bucket_view": False, "broadcast_buffers": True}}
    expected = {"rank_of_param": [zero._param_to_rank[p] for p in model.ps],
                "grads_after_backward": [pick("seen", t) for t in range(T)],
                "params_after_step": [pick("after", t) for t in range(T)],
                "params_after_join": [r["params_after_join"] for r in everyone],
                "grads_after_join": [r["grads_after_join"] for r in everyone],
                "local_state_sizes": [r["state"] for r in everyone]}
    return inp, expected


def zero_errors_case(rank, W, rng_state):
    """One random misuse of ZeroRedundancyOptimizer: (input, expected) on rank 0, else None."""
    import logging
    from torch.distributed.optim import ZeroRedundancyOptimizer
    rng = random.Random(rng_state)
    names = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
             "bfloat16": torch.bfloat16}
    main = rng.choice(["float32", "float32", "float64", "bfloat16", "float16"])
    created = []
    odd = rng.random() < 0.3

    def description():
        if created and rng.random() < 0.07:
            return {"ref": rng.randrange(len(created))}
        d = {"dtype": rng.choice(list(names)) if odd and rng.random() < 0.3 else main,
             "shape": rng.choice([[3], [2], [4], [2, 2]])}
        if odd and rng.random() < 0.1:
            d["device"] = "meta"
        elif odd and rng.random() < 0.1:
            d["layout"] = "sparse_coo"
            d["dtype"] = "float32"
        elif odd and rng.random() < 0.1:
            d["leaf"] = False
        created.append(d)
        return d

    form = rng.choices(["tensor_list", "param_groups", "empty_list", "python_floats",
                        "single_tensor", "python_int", "mixed_tensor_and_group"],
                       [10, 6, 1, 1, 1, 1, 1])[0]
    if form == "tensor_list":
        params = {"form": form, "tensors": [description() for _ in range(rng.randint(1, 4))]}
    elif form == "param_groups":
        groups = []
        for _ in range(rng.randint(1, 3)):
            before = len(created)
            g = {"params": [description() for _ in range(rng.randint(1, 3))],
                 "options": rng.choice([{}, {}, {"lr": 0.5}])}
            if rng.random() < 0.05:
                # A group without `params` creates no tensors: a later `ref` cannot name them.
                del g["params"]
                del created[before:]
            groups.append(g)
        params = {"form": form, "groups": groups}
    elif form == "empty_list":
        params = {"form": form}
    elif form == "python_floats":
        params = {"form": form, "values": [1.0, 2.5]}
    elif form == "single_tensor":
        params = {"form": form, "tensor": description()}
    elif form == "python_int":
        params = {"form": form, "value": 3}
    else:
        params = {"form": form, "tensor": description(), "group_params": [description()]}
    # Now and then a functional optimizer, or one without a functional equivalent (NAdam,
    # with overlap_with_ddp only: distopt has no NAdam to run).
    name = rng.choices(["SGD", "Adam", "_FunctionalSGD", "_FunctionalAdam", "NAdam"],
                       [10, 6, 1, 1, 1])[0]
    sgd_like = name in ("SGD", "_FunctionalSGD")
    options = dict(rng.choice([{"lr": 0.1}, {"lr": 0.01}]))
    if sgd_like and rng.random() < 0.4:
        options["momentum"] = 0.9
    if name == "Adam" and rng.random() < 0.2:
        options["amsgrad"] = True
    if rng.random() < 0.1:
        key, bad = rng.choice([("lr", -1.0), ("lr", -0.5)] + (
            [("momentum", -0.5), ("weight_decay", -0.1)] if sgd_like else
            [("eps", -1e-3), ("betas", [1.0, 0.9]), ("weight_decay", -0.2)]))
        options[key] = bad
    bucket = rng.random() < 0.5
    overlap = name == "NAdam" or rng.random() < 0.15

    tensors = []

    def make(d):
        if "ref" in d:
            return tensors[d["ref"]]
        dt = names[d["dtype"]]
        if d.get("layout") == "sparse_coo":
            t = torch.sparse_coo_tensor([[0]], [1.0], (d["shape"][0],)).requires_grad_()
        elif d.get("device") == "meta":
            t = torch.zeros(d["shape"], dtype=dt, device="meta", requires_grad=True)
        elif d.get("leaf") is False:
            t = torch.zeros(d["shape"], dtype=dt, requires_grad=True) * 2
        else:
            t = torch.zeros(d["shape"], dtype=dt, requires_grad=True)
        tensors.append(t)
        return t

    def build_params():
        f = params["form"]
        if f == "tensor_list":
            return [make(d) for d in params["tensors"]]
        if f == "param_groups":
            out = []
            for g in params["groups"]:
                group = dict(g["options"])
                if "params" in g:
                    group["params"] = [make(d) for d in g["params"]]
                out.append(group)
            return out
        if f == "empty_list":
            return []
        if f == "python_floats":
            return list(params["values"])
        if f == "single_tensor":
            return make(params["tensor"])
        if f == "python_int":
            return params["value"]
        return [make(params["tensor"]), {"params": [make(d) for d in params["group_params"]]}]

    calls = []
    # The constructor's dtype (where it succeeds, every tensor has it).
    ctor_dtype = next((d["dtype"] for d in created if "dtype" in d), main)
    plain = all("device" not in d and "layout" not in d and d.get("leaf", True) for d in created)
    # A state dict to load is made as the call runs (from the optimizer's groups then): only
    # where every tensor is distinct, so that global indices are positions.
    loadable = plain and not any("ref" in d for d in created)
    for _ in range(rng.randint(0, 4)):
        kind = rng.choice(["step", "consolidate", "state_dict", "state_dict", "add"]
                          + (["grads"] * 2 if plain else [])
                          + (["requires"] if plain and created else [])
                          + (["load"] * 2 if loadable else []))
        if kind == "grads":
            calls.append({"method": "set_grads", "grads": [
                {"dtype": d["dtype"], "shape": d["shape"],
                 "data": [round(rng.uniform(-1, 1), 3) for _ in range(math.prod(d["shape"]))]}
                for d in created]})
        elif kind == "step":
            calls.append({"method": "step"})
        elif kind == "consolidate":
            calls.append({"method": "consolidate_state_dict", "to": rng.randint(-1, W)})
        elif kind == "state_dict":
            calls.append({"method": "state_dict"})
        elif kind == "requires":
            calls.append({"method": "set_requires_grad", "param": rng.randrange(len(created)),
                          "value": rng.random() < 0.3})
        elif kind == "load":
            calls.append({"method": "load_state_dict", "variant": rng.choice(
                ["valid", "valid", "valid", "group_count", "index_out_of_range"])})
        else:
            # Another dtype only without the bucket view: with it PyTorch casts the rank's
            # parameters to the dtype of its last one, and distopt refuses the group.
            calls.append({"method": "add_param_group", "params": [
                {"dtype": ctor_dtype if bucket else rng.choice([main, main, "float64"]),
                 "shape": [2]}]})

    events = []

    class Catch(logging.Handler):
        def emit(self, record):
            if record.levelno >= logging.WARNING:
                events.append(("logging", "WARNING", record.getMessage()))

    handler = Catch()
    # ZeroRedundancyOptimizer logs through its own logger, which does not propagate.
    loggers = [logging.getLogger(), logging.getLogger(ZeroRedundancyOptimizer.__module__)]
    for logger in loggers:
        logger.addHandler(handler)
    stages, failed = [], False

    def stage(label, fn):
        events.clear()
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = lambda message, category, *a, **k: events.append(
                ("warnings", category.__name__, str(message)))
            try:
                fn()
                outcome = None
            except Exception as e:  # noqa: BLE001 - the error is the recorded outcome
                outcome = (type(e).__name__, str(e))
        stages.append((label, outcome, list(events)))
        return outcome

    zero = None
    # The tensors exist before the constructor runs (a sparse tensor's own warning is not the
    # constructor's).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        built = build_params()
    made_by_constructor = list(tensors)
    try:
        def construct():
            nonlocal zero
            kwargs = dict(options)
            if "betas" in kwargs:
                kwargs["betas"] = tuple(kwargs["betas"])
            if name.startswith("_Functional"):
                from torch.distributed.optim.functional_adam import _FunctionalAdam
                from torch.distributed.optim.functional_sgd import _FunctionalSGD
                cls = {"_FunctionalSGD": _FunctionalSGD, "_FunctionalAdam": _FunctionalAdam}[name]
            else:
                cls = getattr(torch.optim, name)
            zero = ZeroRedundancyOptimizer(built, optimizer_class=cls,
                                           parameters_as_bucket_view=bucket,
                                           overlap_with_ddp=overlap, **kwargs)
        failed = stage("constructor", construct) is not None
        if not failed:
            for k, call in enumerate(calls):
                m = call["method"]
                if m == "set_grads":
                    for t, g in zip(made_by_constructor, call["grads"]):
                        t.grad = torch.tensor(g["data"], dtype=names[g["dtype"]]).reshape(g["shape"])
                    continue
                if m == "step":
                    stage(f"calls[{k}]", zero.step)
                elif m == "consolidate_state_dict":
                    stage(f"calls[{k}]", lambda: zero.consolidate_state_dict(to=call["to"]))
                elif m == "state_dict":
                    stage(f"calls[{k}]", zero.state_dict)
                elif m == "set_requires_grad":
                    tensors[call["param"]].requires_grad_(call["value"])
                elif m == "load_state_dict":
                    sd = state_dict_to_load(zero, call.pop("variant"),
                                            random.Random(f"{rng_state}-{k}"))
                    call["state_dict"] = sd
                    stage(f"calls[{k}]", lambda sd=sd: zero.load_state_dict(torch_state(sd)))
                else:
                    new = [torch.zeros(d["shape"], dtype=names[d["dtype"]], requires_grad=True)
                           for d in call["params"]]

                    stage(f"calls[{k}]", lambda new=new: zero.add_param_group({"params": new}))
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
    # The constructor's tensors, in creation order (a group added later is not recorded).
    mine = {"stages": stages, "failed": failed,
            "params": None if failed else [
                None if (t.is_sparse or t.device.type == "meta") else tensor_json(t.detach())
                for t in made_by_constructor],
            "ranks": None if failed else [zero._param_to_rank.get(t)
                                          for t in made_by_constructor]}
    everyone = [None] * W
    dist.all_gather_object(everyone, mine)
    if rank != 0:
        return None
    for call in calls:
        if call.pop("variant", None) is not None:
            # Never made: the constructor failed first.
            call["state_dict"] = {"state": {}, "param_groups": []}
    inp = {"world_size": W, "constructor": {
        "params": params, "optimizer": {"name": name, "options": options},
        "parameters_as_bucket_view": bucket, "overlap_with_ddp": overlap}, "calls": calls}
    expected, stage_list, texts, details = {}, [], [], []
    for i, (label, _, _) in enumerate(everyone[0]["stages"]):
        per = [r["stages"][i] for r in everyone]
        entry = {"stage": label,
                 "outcome_per_rank": ["ok" if o is None else "error" for _, o, _ in per]}
        raised = [r for r, (_, o, _) in enumerate(per) if o is not None]
        if raised:
            entry["error_type"] = per[raised[0]][1][0]
            types = [None if o is None else o[0] for _, o, _ in per]
            if len({t for t in types if t is not None}) > 1:
                # Not in the golden format, which has one class per stage: the runners read it.
                entry["error_types_per_rank"] = types
            entry["messages_per_rank"] = [None if o is None else o[1] for _, o, _ in per]
            if "error" not in expected:
                messages = [per[r][1][1] for r in raised]
                common = os.path.commonprefix(messages)
                expected["error"] = {"type": per[raised[0]][1][0], "message_contains": common}
                expected["error_at"] = label
                expected["raised_on_ranks"] = raised
        entry["warnings_per_rank"] = [[m for _, _, m in ev] for _, _, ev in per]
        for _, _, ev in per:
            for channel, category, message in ev:
                if message not in texts:
                    texts.append(message)
                    details.append({"channel": channel, "category": category, "message": message})
        stage_list.append(entry)
    expected["warnings"] = texts
    expected["warning_details"] = details
    expected["stages"] = stage_list
    if not everyone[0]["failed"]:
        expected["params_after_per_rank"] = [r["params"] for r in everyone]
        if not overlap:
            # With overlap_with_ddp the assignment follows DDP's buckets, which never exist here.
            expected["rank_of_param"] = everyone[0]["ranks"]
    return inp, expected


def state_dict_to_load(zero, variant, rng):
    """A state dict for `zero.load_state_dict`, in the golden JSON form: `valid` (every group
    as the optimizer has it, with another lr, and random state for some parameters),
    `group_count` (no groups) or `index_out_of_range` (state for an index past the last)."""
    groups = zero.param_groups
    params = [p for g in groups for p in g["params"]]
    if variant == "group_count":
        return {"state": {}, "param_groups": []}
    json_groups, start = [], 0
    for g in groups:
        entry = {k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items() if k != "params"}
        entry["params"] = list(range(start, start + len(g["params"])))
        if variant == "valid" and rng.random() < 0.7:
            entry["lr"] = rng.choice([0.5, 0.05, 0.2])
        start += len(g["params"])
        json_groups.append(entry)
    if variant == "index_out_of_range":
        return {"state": {str(len(params) + 2): {"momentum_buffer": tensor_json(torch.zeros(1))}},
                "param_groups": json_groups}
    state = {}
    for i, p in enumerate(params):
        if p.is_sparse or p.device.type == "meta" or rng.random() < 0.4:
            continue
        like = lambda low=-1.0: torch.tensor(
            [round(rng.uniform(low, 1.0), 3) for _ in range(p.numel())]).reshape(p.shape).to(p.dtype)
        g = next(g for g in groups if any(q is p for q in g["params"]))
        if "betas" in g:
            entry = {"step": tensor_json(torch.tensor(float(rng.randint(1, 5)))),
                     "exp_avg": tensor_json(like()), "exp_avg_sq": tensor_json(like(0.0))}
            if g.get("amsgrad"):
                entry["max_exp_avg_sq"] = tensor_json(like(0.0))
        elif g.get("momentum", 0) != 0:
            entry = {"momentum_buffer": tensor_json(like())}
        else:
            continue
        state[str(i)] = entry
    return {"state": state, "param_groups": json_groups}


def torch_state(sd):
    """The golden JSON state dict as PyTorch's (integer keys, tensors; a fresh copy, since
    ZeroRedundancyOptimizer.load_state_dict writes into the dict it is given)."""
    tensor = lambda t: torch.tensor(t["data"], dtype=getattr(torch, t["dtype"])).reshape(t["shape"])
    return {"state": {int(k): {n: tensor(v) for n, v in entry.items()}
                      for k, entry in sd["state"].items()},
            "param_groups": [dict(g, **({"betas": tuple(g["betas"])} if "betas" in g else {}))
                             for g in sd["param_groups"]]}


def post_local_state_json(sd):
    """PostLocalSGDOptimizer's state dict: the local optimizer's plus the averager's `step`."""
    out = {"state": {str(k): {key: (tensor_json(v) if torch.is_tensor(v) else v)
                              for key, v in entry.items()} for k, entry in sd["state"].items()},
           "param_groups": [dict(g, **({"betas": list(g["betas"])} if "betas" in g else {}))
                            for g in sd["param_groups"]]}
    if "step" in sd:
        out["step"] = sd["step"]
    return out


def writer(W, args):
    """write(kind, k, description, input, expected, tolerance): one case file in `--out`."""
    def write(kind, k, description, inp, expected, tolerance):
        name = f"{kind}_fuzz_w{W}_{args.seed}_{k}"
        case = {"format": 1, "kind": kind, "name": name, "description": description,
                "source": f"torch {torch.__version__}, CPU, gloo, {W} processes "
                          "(scripts/torch-fuzz-gloo.py)",
                "input": inp, "expected": expected, "tolerance": tolerance}
        (pathlib.Path(args.out) / f"{name}.json").write_text(json.dumps(case))
    return write


def worker(rank, W, port, args):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=W)
    write = writer(W, args)
    wanted = lambda kind: args.kinds is None or kind in args.kinds.split(",")
    for k in range(args.cases if wanted("zero_partition") else 0):
        inp, after, local, before = zero_partition_case(rank, W, f"zp-{W}-{args.seed}-{k}")
        locals_ = [None] * W
        dist.all_gather_object(locals_, local)
        if rank == 0:
            expected = dict(after, local_optimizer_param_groups=locals_)
            if before is not None:
                expected["before_add"] = before
            write("zero_partition", k, "random parameter groups", inp, expected,
                  {d: {"rtol": 0.0, "atol": 0.0} for d in TOLERANCE})
    for kind, tag, make, description, tolerance in [
        ("diloco", "dl", diloco_case, "random DiLoCo run", TOLERANCE),
        ("zero_trajectory", "zt", zero_trajectory_case, "random ZeRO trajectory", ZERO_TOLERANCE),
        ("post_local_sgd", "pl", post_local_sgd_case, "random PostLocalSGDOptimizer run",
         TOLERANCE),
        ("zero_join", "zj", zero_join_case, "random uneven inputs under Join([ddp, zero])",
         ZERO_TOLERANCE),
    ]:
        if (kind == "post_local_sgd" and W != 4) or not wanted(kind):
            continue
        for k in range(args.cases if W in (2, 3, 4) else 0):
            made = make(rank, W, f"{tag}-{W}-{args.seed}-{k}")
            if made is not None:
                write(kind, k, description, *made, tolerance)
    if W == 4 and wanted("zero_trajectory"):
        # Reloads into another world size: runs on subgroups of this world's ranks.
        subgroups = {2: dist.new_group([0, 1]), 3: dist.new_group([0, 1, 2]), 4: None}
        for k in range(args.cases):
            made = zero_trajectory_case(rank, W, f"zr-{W}-{args.seed}-{k}", subgroups)
            if made is not None:
                write("zero_trajectory", f"reload{k}", "random ZeRO trajectory and reload",
                      *made, ZERO_TOLERANCE)
    for kind in ["periodic_averager", "hierarchical_averager"]:
        if kind == "periodic_averager" and W not in (2, 4):
            continue
        if (kind == "hierarchical_averager" and W not in (4, 8)) or not wanted(kind):
            continue
        rng = random.Random(f"{kind}-{W}-{args.seed}")
        for k in range(args.cases):
            c = config(rng, kind, W)
            res = run_case(rank, W, kind, c, args.seed * 1000 + k)
            gathered = [None] * W
            dist.all_gather_object(gathered, res)
            if rank != 0:
                continue
            inp = {"world_size": W}
            if kind == "periodic_averager":
                inp["period"] = c["period"]
            else:
                inp["period_group_size_dict"] = c["dict"]
            inp["warmup_steps"] = c["warmup"]
            r0 = gathered[0]
            if "error" in r0 and r0.get("constructor"):
                write(kind, k, "random configuration", inp, {"error": r0["error"]}, TOLERANCE)
                continue
            inp.update(param_has_grad=c["has_grad"],
                       initial_params=[g["initial"] for g in gathered],
                       updates=[[g["updates"][t] for g in gathered] for t in range(c["steps"])])
            if "error" in r0:
                expected = {"error": r0["error"], "error_at_step": r0["error_at_step"]}
            else:
                expected = {"params_after_step": [[g["after"][t] for g in gathered]
                                                  for t in range(c["steps"])],
                            "averaged_at_steps": r0["averaged"]}
                if kind == "hierarchical_averager":
                    expected["group_size_used_at_step"] = r0["sizes"]
                expected["final_step_counter"] = r0["counter"]
                expected["warnings"] = r0["warnings"]
            write(kind, k, "random configuration", inp, expected, TOLERANCE)
    dist.barrier()
    dist.destroy_process_group()


def zero_errors_worker(rank, W, port, args, first, progress):
    """zero_errors cases `first`, `first + 1`, …; `progress` gets each finished case's index."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=W)
    write = writer(W, args)
    for k in range(first, args.cases):
        made = zero_errors_case(rank, W, f"ze-{W}-{args.seed}-{k}")
        if made is not None:
            write("zero_errors", k, "random misuse of ZeroRedundancyOptimizer", *made,
                  ZERO_TOLERANCE)
            pathlib.Path(progress).write_text(str(k))
    dist.barrier()
    dist.destroy_process_group()


def zero_errors(W, args, hang_seconds=20):
    """The zero_errors cases of world size W. Some misuses leave PyTorch's own ranks in
    different collectives, which never return: when no case finishes for `hang_seconds`, the
    processes are killed, the case is reported and skipped, and fresh processes go on."""
    import tempfile
    import time
    progress = pathlib.Path(tempfile.mkdtemp()) / "progress"
    first = 0
    while first < args.cases:
        progress.write_text(str(first - 1))
        ctx = mp.start_processes(zero_errors_worker,
                                 args=(W, free_port(), args, first, str(progress)),
                                 nprocs=W, join=False, start_method="spawn")
        seen, since = progress.read_text(), time.monotonic()
        while not ctx.join(timeout=1):
            now = progress.read_text()
            if now != seen:
                seen, since = now, time.monotonic()
            elif time.monotonic() - since > hang_seconds:
                for p in ctx.processes:
                    p.kill()
                    p.join()
                hung = int(now) + 1
                print(f"W = {W}: zero_errors case {hung} hangs in PyTorch: skipped")
                first = hung + 1
                break
        else:
            first = args.cases


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", type=int, default=40, help="cases per kind and world size")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--worlds", default="1,2,3,4,8")
    ap.add_argument("--kinds", help="only these kinds (comma-separated; default: all)")
    ap.add_argument("--zero-errors", action="store_true",
                    help="also zero_errors (slower: see the module's documentation)")
    args = ap.parse_args()
    pathlib.Path(args.out).mkdir(parents=True, exist_ok=True)
    for W in [int(w) for w in args.worlds.split(",")]:
        mp.spawn(worker, args=(W, free_port(), args), nprocs=W, join=True)
        if args.zero_errors and W in (2, 3) and (args.kinds is None
                                                 or "zero_errors" in args.kinds.split(",")):
            zero_errors(W, args)
        print(f"W = {W}: done")


if __name__ == "__main__":
    main()
