// The synchronous data-parallel SGD step over one chunk of a replica arena.
//
// Per element i:  acc = sum_r grad[r][i] (f32, rank order, from +0.0)
//                 mean = round_P(acc / R)            (a true division)
//                 param[r][i] = round_P(param[0][i] - lr * mean) for every rank r
// Missing gradients are zeros in the arena: adding +0.0 leaves every accumulator value intact
// (the accumulator is never -0.0, since it starts at +0.0).

override PARAM_FORMAT: u32 = 0u;
override GRAD_FORMAT: u32 = 0u;

struct StepUniforms {
    pairs: u32,            // element pairs in this chunk (per rank)
    ranks: u32,
    param_rank_words: u32, // words between consecutive ranks of the parameter chunk
    grad_rank_words: u32,
    learning_rate: f32,
    divisor: f32,          // R as f32
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> step: StepUniforms;
@group(0) @binding(1) var<storage, read> grads: array<u32>;
@group(0) @binding(2) var<storage, read_write> params: array<u32>;
@group(0) @binding(3) var<storage, read_write> means: array<u32>;

fn load_grad(rank: u32, pair: u32) -> vec2<f32> {
    let base = rank * step.grad_rank_words;
    if (GRAD_FORMAT == FORMAT_F32) {
        let i = base + 2u * pair;
        return vec2<f32>(bitcast<f32>(grads[i]), bitcast<f32>(grads[i + 1u]));
    }
    return unpack_pair(GRAD_FORMAT, grads[base + pair]);
}

fn load_param0(pair: u32) -> vec2<f32> {
    if (PARAM_FORMAT == FORMAT_F32) {
        return vec2<f32>(bitcast<f32>(params[2u * pair]), bitcast<f32>(params[2u * pair + 1u]));
    }
    return unpack_pair(PARAM_FORMAT, params[pair]);
}

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) workgroup: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) local_index: u32,
) {
    let pair = pair_index(workgroup, groups, local_index);
    if (pair >= step.pairs) {
        return;
    }
    var acc = vec2<f32>(0.0, 0.0);
    for (var rank = 0u; rank < step.ranks; rank = rank + 1u) {
        acc = acc + load_grad(rank, pair);
    }
    let mean = round_pair(PARAM_FORMAT, acc / step.divisor);
    let scaled = step.learning_rate * mean;
    let updated = round_pair(PARAM_FORMAT, load_param0(pair) - scaled);
    if (PARAM_FORMAT == FORMAT_F32) {
        means[2u * pair] = bitcast<u32>(mean.x);
        means[2u * pair + 1u] = bitcast<u32>(mean.y);
        for (var rank = 0u; rank < step.ranks; rank = rank + 1u) {
            let i = rank * step.param_rank_words + 2u * pair;
            params[i] = bitcast<u32>(updated.x);
            params[i + 1u] = bitcast<u32>(updated.y);
        }
    } else {
        means[pair] = pack_pair(PARAM_FORMAT, mean);
        let packed = pack_pair(PARAM_FORMAT, updated);
        for (var rank = 0u; rank < step.ranks; rank = rank + 1u) {
            params[rank * step.param_rank_words + pair] = packed;
        }
    }
}
