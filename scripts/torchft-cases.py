#!/usr/bin/env python3
"""Writes Streaming DiLoCo cases made by torchft's own `DiLoCo` into tests/torchft-cases/.

Kind `streaming_diloco` (tests/torchft-cases/README.md): torchft 0.2's `torchft.local_sgd.DiLoCo`
with several model fragments, `fragment_sync_delay` and `fragment_update_alpha`, driven for
real: W processes (torch.multiprocessing, one replica group of one rank each), each with a
`torchft.manager.Manager` over torchft's `ProcessGroupGloo`, a `LighthouseServer` (from the wheel's
`torchft._torchft`) on 127.0.0.1, synchronous quorum (`use_async_quorum=False`, as DiLoCo
requires) and `init_sync=False` (every replica starts from the same parameters, so no replica heals
from another at its first quorum). Every step each process sets the case's gradients
(`None` for null), calls the inner optimizer's `step()`, and torchft's step post hook does the
rest: at `local_step == sync_every/F - fragment_sync_delay` it prepares (pseudo-gradient,
all-reduce started) fragment `manager.current_step() % F`, at `sync_every/F` it performs the
sync (outer step, `fragment_update_alpha` merge). The script only records what happened: it
wraps `_StreamingDiLoCoFragment.prepare_sync`/`perform_sync` to note the step and fragment
(calling the originals unchanged) and reads the parameters, the optimizers' state dicts and the
fragments' `original_parameters` after the run.

One outer optimizer per fragment, over that fragment's parameters (the list form of torchft's
`outer_optimizer`, as torchft's own Streaming DiLoCo tests and trainer build it; a single outer
optimizer over the whole model would also step the other fragments' parameters with their
inner gradients). `should_quantize` is not exercised: it needs CUDA and Triton, and distopt
does not support it.

Run it with the torchft peer's interpreter (never in CI):

    /work/torchenv/bin/python scripts/torchft-cases.py [NAME_SUBSTRING ...]

`--random N --seed S --out DIR` writes N random cases into DIR instead (for the golden runners'
`DISTOPT_GOLDEN_DIR`): 2 to 4 ranks, 1 to 4 fragments over 1 to 6 parameters (any grouping,
shapes of up to 3 dimensions), random `sync_every`, `fragment_sync_delay` and
`fragment_update_alpha`, inner and outer optimizers (SGD, Adam, AdamW with any of their options,
`foreach` or not), float32, float64, float16 and bfloat16 parameters, missing gradients.
"""

import importlib.util
import json
import math
import pathlib
import socket
import sys
import traceback
from datetime import timedelta

import torch
import torch.multiprocessing as mp

# The random optimizers of scripts/torch-cases.py (a file name Python cannot import).
_spec = importlib.util.spec_from_file_location(
    "torch_cases", pathlib.Path(__file__).with_name("torch-cases.py"))
torch_cases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(torch_cases)

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "torchft-cases"
KIND = "streaming_diloco"
# The periodic_averager tolerance (tests/golden/README.md section 13b): gloo's summation order
# for three or more ranks, and torch's fused lerp (a vectorized FMA) against distopt's.
TOLERANCE = {
    "float32": {"rtol": 1e-5, "atol": 1e-6},
    "float16": {"rtol": 5e-3, "atol": 5e-3},
    "bfloat16": {"rtol": 2e-2, "atol": 2e-2},
    "float64": {"rtol": 1e-12, "atol": 1e-12},
}
# Below one unit in the last place of each 16-bit format (scripts/torch-cases.py's): for cases
# whose every operation PyTorch and distopt round alike (two ranks: gloo's sum of two terms
# has one order).
EXACT_TOLERANCE = torch_cases.TOLERANCE
DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
}
NESTEROV = {"name": "SGD", "options": {"lr": 0.7, "momentum": 0.9, "nesterov": True}}
PLAIN = {"name": "SGD", "options": {"lr": 1.0}}


def tensor_json(t):
    data = [float(x) for x in t.detach().to(torch.float64).flatten().tolist()]
    data = [x if math.isfinite(x) else str(x) for x in data]
    return {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape), "data": data}


def state_json(value):
    if torch.is_tensor(value):
        return tensor_json(value)
    if isinstance(value, dict):
        return {str(k): state_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [state_json(v) for v in value]
    return value


def make_optimizer(spec, params):
    options = dict(spec["options"])
    options.setdefault("foreach", False)
    if "betas" in options:
        options["betas"] = tuple(options["betas"])
    return getattr(torch.optim, spec["name"])(params, **options)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, spec, lighthouse, results):
    """One replica group (one rank): torchft's DiLoCo over the case's fragments."""
    try:
        results[rank] = run_replica(rank, spec, lighthouse)
    except BaseException:  # noqa: BLE001 - reported to the parent
        results[rank] = {"error": traceback.format_exc()}


def run_replica(rank, spec, lighthouse):
    from torch.distributed import TCPStore

    from torchft import local_sgd
    from torchft.local_sgd import DiLoCo
    from torchft.manager import Manager
    from torchft.process_group import ProcessGroupGloo

    torch.set_num_threads(1)
    world = spec["world_size"]
    initial = [torch.tensor(0.0)] * 0
    initial = [from_json(t) for t in spec["initial_params"]]
    params = [torch.nn.Parameter(p.clone()) for p in initial]
    # Each fragment is a module holding its parameters, in the fragment's index order.
    fragments = []
    for members in spec["fragments"]:
        module = torch.nn.Module()
        module.params = torch.nn.ParameterList([params[j] for j in members])
        fragments.append(module)
    inner = make_optimizer(spec["inner_optimizer"], params)
    outers = [make_optimizer(spec["outer_optimizer"], list(m.parameters())) for m in fragments]

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    manager = Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=60)),
        min_replica_size=world,
        use_async_quorum=False,
        load_state_dict=lambda sd: None,
        state_dict=lambda: {},
        replica_id=f"replica_{rank}",
        store_addr="127.0.0.1",
        store_port=store.port,
        rank=0,
        world_size=1,
        lighthouse_addr=lighthouse,
        port=0,
        hostname="127.0.0.1",
        init_sync=False,
        connect_timeout=timedelta(seconds=60),
        quorum_timeout=timedelta(seconds=60),
        timeout=timedelta(seconds=60),
    )

    # Recorded around torchft's own methods, which run unchanged.
    events = {"prepared": [], "synced": []}
    step_now = {"t": -1}
    cls = local_sgd._StreamingDiLoCoFragment
    original_prepare, original_perform = cls.prepare_sync, cls.perform_sync

    def prepare(self):
        events["prepared"].append([step_now["t"], self._fragment_id])
        return original_prepare(self)

    def perform(self):
        committed = original_perform(self)
        assert committed, "a sync did not commit"
        events["synced"].append([step_now["t"], self._fragment_id])
        return committed

    cls.prepare_sync, cls.perform_sync = prepare, perform

    after = []
    with DiLoCo(
        manager,
        fragments,
        inner,
        outers,
        sync_every=spec["sync_every"],
        fragment_sync_delay=spec["fragment_sync_delay"],
        fragment_update_alpha=spec["fragment_update_alpha"],
    ) as diloco:
        for t, step in enumerate(spec["grads"]):
            step_now["t"] = t
            inner.zero_grad(set_to_none=True)
            for p, g in zip(params, step[rank]):
                p.grad = None if g is None else from_json(g)
            inner.step()
            after.append([tensor_json(p) for p in params])
        # The fragments' backups ("original_parameters"), in global parameter order.
        original = [None] * len(params)
        for members, fragment in zip(spec["fragments"], diloco._fragments):
            for k, name in enumerate(fragment.original_parameters):
                original[members[k]] = tensor_json(fragment.original_parameters[name])
    # The per-fragment outer states, keyed by global parameter index: what one outer
    # optimizer over every parameter (skipping those without a gradient) holds.
    outer_state = {}
    for members, outer in zip(spec["fragments"], outers):
        sd = outer.state_dict()
        for k, value in sd["state"].items():
            outer_state[str(members[k])] = state_json(value)
    group = dict(outers[0].state_dict()["param_groups"][0])
    group["params"] = list(range(len(params)))
    manager.shutdown(wait=False)
    return {
        "params_after_step": after,
        "prepared": events["prepared"],
        "synced": events["synced"],
        "inner_state_dict": state_json(inner.state_dict()),
        "outer_state_dict": {"state": outer_state, "param_groups": [state_json(group)]},
        "original_parameters": original,
    }


def from_json(t):
    data = [float(x) for x in t["data"]]
    return torch.tensor(data, dtype=torch.float64).reshape(t["shape"]).to(DTYPES[t["dtype"]])


def run_torchft(spec):
    from torchft._torchft import LighthouseServer

    world = spec["world_size"]
    lighthouse = LighthouseServer(
        bind=f"127.0.0.1:{free_port()}", min_replicas=world, join_timeout_ms=100
    )
    ctx = mp.get_context("spawn")
    with ctx.Manager() as shared:
        results = shared.dict()
        procs = [
            ctx.Process(target=worker, args=(r, spec, lighthouse.address(), results))
            for r in range(world)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=600)
        out = [results.get(r) for r in range(world)]
    lighthouse.shutdown()
    for r, res in enumerate(out):
        if res is None or "error" in res:
            raise RuntimeError(f"rank {r}: {res and res['error']}")
    return out


def make_case(
    name,
    description,
    world,
    sync_every,
    fragments,
    delay,
    alpha,
    inner,
    outer=NESTEROV,
    dtypes=("float32",) * 4,
    shapes=([5], [2, 3], [1], [4]),  # torchft 0.2 cannot back up a 0-d parameter (torch.empty(*()))
    periods=3,
    missing=(),
    seed=0,
    tolerance=TOLERANCE,
):
    gen = torch.Generator().manual_seed(seed)
    initial = [torch.randn(s, generator=gen).to(DTYPES[d]) for s, d in zip(shapes, dtypes)]
    steps = periods * sync_every
    grads = []
    for t in range(steps):
        per_rank = []
        for r in range(world):
            row = []
            for j, (s, d) in enumerate(zip(shapes, dtypes)):
                if (t, r, j) in missing:
                    row.append(None)
                else:
                    row.append(tensor_json(torch.randn(s, generator=gen).to(DTYPES[d])))
            per_rank.append(row)
        grads.append(per_rank)
    spec = {
        "world_size": world,
        "sync_every": sync_every,
        "fragments": fragments,
        "fragment_sync_delay": delay,
        "fragment_update_alpha": alpha,
        "inner_optimizer": inner,
        "outer_optimizer": outer,
        "initial_params": [tensor_json(p) for p in initial],
        "grads": grads,
    }
    out = run_torchft(spec)
    first = out[0]
    for r, res in enumerate(out[1:], 1):
        assert res["prepared"] == first["prepared"] and res["synced"] == first["synced"], r
        assert res["outer_state_dict"] == first["outer_state_dict"], r
        assert res["original_parameters"] == first["original_parameters"], r
    expected = {
        "params_after_step": [[out[r]["params_after_step"][t] for r in range(world)] for t in range(steps)],
        "prepared_at_steps": first["prepared"],
        "synced_at_steps": first["synced"],
        "outer_state_dict": first["outer_state_dict"],
        "inner_state_dicts": [out[r]["inner_state_dict"] for r in range(world)],
        "original_parameters": first["original_parameters"],
    }
    import torchft  # noqa: F401 - for the version

    return {
        "format": 1,
        "kind": KIND,
        "name": name,
        "description": description,
        "source": (
            f"torch {torch.__version__}, torchft {torchft_version()}, CPU, {world} processes, "
            "torchft.local_sgd.DiLoCo with a Manager per replica over ProcessGroupGloo "
            "(LighthouseServer on 127.0.0.1), torch.optim inner/outer (foreach=False unless their "
            "options say), one outer optimizer per fragment"
        ),
        "input": spec,
        "expected": expected,
        "tolerance": tolerance,
    }


def torchft_version():
    from importlib.metadata import version

    return version("torchft")


SGD_INNER = {"name": "SGD", "options": {"lr": 0.05, "momentum": 0.9}}
ADAM_INNER = {"name": "Adam", "options": {"lr": 0.02, "betas": [0.9, 0.99], "eps": 1e-8}}
ADAMW_INNER = {
    "name": "AdamW",
    "options": {"lr": 0.02, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1},
}
F2 = [[0, 1], [2, 3]]
F3 = [[0], [1, 2], [3]]

CASES = [
    dict(
        name="streaming_diloco_w2_f2_delay0_alpha0_sgd",
        description="2 fragments, no delay, alpha 0: fragment k syncs after k*sync_every/2 steps, in turn",
        world=2, sync_every=4, fragments=F2, delay=0, alpha=0.0, inner=SGD_INNER,
    ),
    dict(
        name="streaming_diloco_w2_f2_delay1_alpha0_adamw",
        description="2 fragments, delay 1: the all-reduce starts one inner step before the outer step, whose local progress alpha 0 discards",
        world=2, sync_every=4, fragments=F2, delay=1, alpha=0.0, inner=ADAMW_INNER, seed=1,
    ),
    dict(
        name="streaming_diloco_w3_f3_delay1_alpha05_adam",
        description="3 fragments of 1, 2 and 1 parameters, delay 1, alpha 0.5: the outer-updated parameters lerped halfway to the local ones",
        world=3, sync_every=6, fragments=F3, delay=1, alpha=0.5, inner=ADAM_INNER, seed=2,
    ),
    dict(
        name="streaming_diloco_w4_f2_delay2_alpha03_sgd_plain_outer",
        description="4 ranks, 2 fragments, delay 2, alpha 0.3 (lerp's small-weight branch), plain outer SGD(lr=1)",
        world=4, sync_every=6, fragments=F2, delay=2, alpha=0.3, inner=SGD_INNER, outer=PLAIN, seed=3,
    ),
    dict(
        name="streaming_diloco_w3_f2_delay2_alpha09_adamw",
        description="3 ranks, 2 fragments, delay 2, alpha 0.9 (lerp's large-weight branch)",
        world=3, sync_every=8, fragments=[[0, 2], [1, 3]], delay=2, alpha=0.9, inner=ADAMW_INNER, seed=4,
    ),
    dict(
        name="streaming_diloco_w4_f3_delay0_alpha1_adam",
        description="4 ranks, 3 fragments, alpha 1: every sync keeps the local parameters, the backups take the outer step",
        world=4, sync_every=6, fragments=F3, delay=0, alpha=1.0, inner=ADAM_INNER, seed=5,
    ),
    dict(
        name="streaming_diloco_w2_f3_delay1_alpha0_missing_grads",
        description="3 fragments, delay 1, null inner gradients on some rank and step (inside and outside the delay window)",
        world=2, sync_every=6, fragments=F3, delay=1, alpha=0.0, inner=ADAM_INNER, seed=6,
        missing={(0, 0, 1), (1, 1, 0), (4, 0, 3), (5, 1, 2), (8, 1, 1), (9, 0, 0), (9, 1, 0), (13, 0, 2)},
    ),
    dict(
        name="streaming_diloco_w3_f2_delay1_alpha05_bfloat16_mixed",
        description="mixed dtypes (bfloat16, float32, bfloat16, float32), 2 fragments, delay 1, alpha 0.5",
        world=3, sync_every=4, fragments=F2, delay=1, alpha=0.5, inner=ADAMW_INNER, seed=7,
        dtypes=("bfloat16", "float32", "bfloat16", "float32"),
    ),
    dict(
        name="streaming_diloco_w2_f1_delay2_alpha05",
        description="one fragment (plain DiLoCo's schedule) with delay 2 and alpha 0.5",
        world=2, sync_every=4, fragments=[[0, 1, 2, 3]], delay=2, alpha=0.5, inner=SGD_INNER, seed=8,
    ),
    dict(
        name="streaming_diloco_w4_f2_delay1_alpha0_plain_outer_sgd_inner",
        description="4 ranks, 2 fragments, delay 1, alpha 0, plain outer SGD(lr=0.5), inner SGD with nesterov",
        world=4, sync_every=4, fragments=[[1, 3], [0, 2]], delay=1, alpha=0.0,
        inner={"name": "SGD", "options": {"lr": 0.03, "momentum": 0.8, "nesterov": True}},
        outer={"name": "SGD", "options": {"lr": 0.5}}, seed=9,
    ),
    # torch's lerp_ on 16-bit parameters computes `end - self` in float32: a merge that rounded
    # the difference to the parameter's dtype first is a unit off where the outer step moved a
    # parameter far from its local value. Both of lerp's branches, sizes with a vector body and
    # a scalar tail, two ranks (one summation order), a tolerance below one unit in the last place.
    dict(
        name="streaming_diloco_w2_f2_delay1_alpha03_16bit_lerp",
        description="16-bit parameters, alpha 0.3 (lerp's small-weight branch), Adam inner steps",
        world=2, sync_every=4, fragments=[[0, 2], [1, 3]], delay=1, alpha=0.3,
        inner={"name": "Adam", "options": {"lr": 0.05, "betas": [0.9, 0.99], "eps": 1e-8}},
        dtypes=("bfloat16", "float16", "float16", "bfloat16"),
        shapes=([37], [3, 33], [5], [2, 9]), seed=10, tolerance=EXACT_TOLERANCE,
    ),
    dict(
        name="streaming_diloco_w2_f2_delay0_alpha07_16bit_lerp",
        description="16-bit parameters, alpha 0.7 (lerp's other branch), SGD inner steps",
        world=2, sync_every=4, fragments=[[1, 2], [0, 3]], delay=0, alpha=0.7,
        inner={"name": "SGD", "options": {"lr": 0.1, "momentum": 0.9}},
        dtypes=("float16", "bfloat16", "bfloat16", "float16"),
        shapes=([37], [3, 33], [5], [2, 9]), seed=11, tolerance=EXACT_TOLERANCE,
    ),
    # torchft's Manager.allreduce sums the pseudo-gradients, then divides the sum (`SUM`, then
    # `tensor /= num_participants`). Dividing each value first, as PyTorch's model averagers
    # do, differs for three ranks; with 16-bit parameters a few units in the last place apart
    # after the inner steps, a sum that cancels to 0 becomes a tiny mean, and a float16 AdamW
    # with a small eps (its second moment underflowing to 0) moves that element by a tenth of
    # lr where torchft leaves it. Found by `--random 30 --seed 1212` (case 11).
    dict(
        name="streaming_diloco_w3_f2_delay0_alpha0_16bit_sum_then_divide",
        description="3 ranks, 16-bit parameters a few units in the last place apart after the inner steps, outer AdamW(eps=1e-6): the mean is the sum divided by 3, not the sum of thirds",
        world=3, sync_every=4, fragments=[[0, 1], [2, 3]], delay=0, alpha=0.0,
        inner={"name": "SGD", "options": {"lr": 0.003}},
        outer={"name": "AdamW", "options": {"lr": 0.1, "betas": [0.9, 0.999], "eps": 1e-6, "weight_decay": 0.1}},
        dtypes=("float16", "float32", "float16", "bfloat16"), shapes=([64], [5], [3, 16], [32]), seed=12,
    ),
    # torchft mixes with `global.lerp_(local, α)` at every sync, at α = 0 too, where lerp keeps
    # the outer step's result but turns a value that is not finite into NaN (0 * inf). Tiny
    # float16 pseudo-gradients square to 0 in Adam's second moment, and eps = 1e-8 is 0 in
    # float16, so the outer step overflows to ±inf, which torchft's mix makes NaN. Found by
    # `--random 30 --seed 1216` (case 10).
    dict(
        name="streaming_diloco_w2_f2_delay0_alpha0_float16_overflow",
        description="float16 parameters whose outer Adam step overflows (the second moment underflows to 0 and eps 1e-8 is 0 in float16): torchft's lerp at alpha 0 makes the infinities NaN",
        world=2, sync_every=4, fragments=F2, delay=0, alpha=0.0,
        inner={"name": "SGD", "options": {"lr": 1e-4}},
        outer={"name": "Adam", "options": {"lr": 0.1, "betas": [0.9, 0.99], "eps": 1e-8}},
        dtypes=("float16", "float32", "float16", "float32"), seed=13,
    ),
]


def random_spec(rng, k, seed):
    """Case `k` of `--random`: make_case's arguments."""
    world = rng.randint(2, 4)
    count_params = rng.randint(1, 6)
    order = list(range(count_params))
    rng.shuffle(order)
    count = rng.randint(1, min(4, count_params))
    cuts = sorted(rng.sample(range(1, count_params), count - 1))
    fragments = [sorted(order[a:b]) for a, b in zip([0] + cuts, cuts + [count_params])]
    per_fragment = rng.randint(1, 3)
    sync_every = per_fragment * count
    inner = torch_cases.random_optimizer(rng)
    outer = torch_cases.random_optimizer(rng, outer=True)
    dtypes = tuple(rng.choice(["float32", "float32", "float32", "bfloat16", "float16", "float64"])
                   for _ in range(count_params))
    shapes = tuple(rng.choice([[1], [3], [5], [2, 3], [4, 1], [7], [2, 2, 2]])
                   for _ in range(count_params))
    periods = rng.randint(2, 3)
    missing = {(t, r, j) for t in range(periods * sync_every) for r in range(world)
               for j in range(count_params) if rng.random() < 0.08}
    delay = rng.randint(0, per_fragment - 1)
    alpha = rng.choice([0.0, 0.0, 0.3, 0.5, 0.9, 1.0])
    return dict(
        name=f"streaming_diloco_fuzz_{seed}_{k}",
        description=f"random: {world} ranks, fragments {fragments}, sync_every {sync_every}, "
                    f"delay {delay}, alpha {alpha}",
        world=world, sync_every=sync_every, fragments=fragments, delay=delay, alpha=alpha,
        inner=inner, outer=outer, dtypes=dtypes, shapes=shapes, periods=periods, missing=missing,
        seed=rng.randrange(1 << 30))


def main():
    if sys.argv[1:2] == ["--random"]:
        import argparse
        import random
        ap = argparse.ArgumentParser()
        ap.add_argument("--random", type=int, required=True)
        ap.add_argument("--seed", type=int, default=0)
        ap.add_argument("--out", required=True)
        args = ap.parse_args()
        out = pathlib.Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        rng = random.Random(args.seed)
        for k in range(args.random):
            case = make_case(**random_spec(rng, k, args.seed))
            (out / f"{case['name']}.json").write_text(json.dumps(case) + "\n")
            print(f"wrote {case['name']}: synced at {case['expected']['synced_at_steps']}",
                  flush=True)
        return
    OUT.mkdir(exist_ok=True)
    wanted = sys.argv[1:]
    for spec in CASES:
        if wanted and not any(w in spec["name"] for w in wanted):
            continue
        case = make_case(**spec)
        path = OUT / f"{case['name']}.json"
        path.write_text(json.dumps(case, indent=1) + "\n")
        print(f"wrote {path.name}: synced at {case['expected']['synced_at_steps']}", flush=True)


if __name__ == "__main__":
    main()
