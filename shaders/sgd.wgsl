// torch.optim.SGD's single-tensor step over every rank and parameter of an arena chunk.
// Every tensor operation's result is rounded to the storage format (FORMAT); the arithmetic
// is float32. A parameter without a gradient on a rank (flags bit 0 clear) is skipped.

override FORMAT: u32 = 0u;

const ACTIVE: u32 = 1u;
const FIRST_STEP: u32 = 2u;
const NESTEROV: u32 = 4u;
const MAXIMIZE: u32 = 8u;

struct SgdScalars {
    flags: u32,
    lr: f32,
    momentum: f32,
    one_minus_dampening: f32,
    weight_decay: f32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> geometry: Dispatch;
@group(0) @binding(1) var<storage, read> starts: array<u32>;
@group(0) @binding(2) var<storage, read> scalars: array<SgdScalars>;
@group(0) @binding(3) var<storage, read_write> params: array<u32>;
@group(0) @binding(4) var<storage, read> grads: array<u32>;
@group(0) @binding(5) var<storage, read_write> momentum: array<u32>;

fn rp(x: vec2<f32>) -> vec2<f32> {
    return round_pair(FORMAT, x);
}

fn load_params(base: u32, pair: u32) -> vec2<f32> {
    if (FORMAT == FORMAT_F32) {
        return vec2<f32>(bitcast<f32>(params[base + 2u * pair]), bitcast<f32>(params[base + 2u * pair + 1u]));
    }
    return unpack_pair(FORMAT, params[base + pair]);
}

fn store_params(base: u32, pair: u32, value: vec2<f32>) {
    if (FORMAT == FORMAT_F32) {
        params[base + 2u * pair] = bitcast<u32>(value.x);
        params[base + 2u * pair + 1u] = bitcast<u32>(value.y);
    } else {
        params[base + pair] = pack_pair(FORMAT, value);
    }
}

fn load_grads(base: u32, pair: u32) -> vec2<f32> {
    if (FORMAT == FORMAT_F32) {
        return vec2<f32>(bitcast<f32>(grads[base + 2u * pair]), bitcast<f32>(grads[base + 2u * pair + 1u]));
    }
    return unpack_pair(FORMAT, grads[base + pair]);
}

fn load_momentum(base: u32, pair: u32) -> vec2<f32> {
    if (FORMAT == FORMAT_F32) {
        return vec2<f32>(bitcast<f32>(momentum[base + 2u * pair]), bitcast<f32>(momentum[base + 2u * pair + 1u]));
    }
    return unpack_pair(FORMAT, momentum[base + pair]);
}

fn store_momentum(base: u32, pair: u32, value: vec2<f32>) {
    if (FORMAT == FORMAT_F32) {
        momentum[base + 2u * pair] = bitcast<u32>(value.x);
        momentum[base + 2u * pair + 1u] = bitcast<u32>(value.y);
    } else {
        momentum[base + pair] = pack_pair(FORMAT, value);
    }
}

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) workgroup: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) local_index: u32,
) {
    let index = pair_index(workgroup, groups, local_index);
    if (index >= geometry.pairs * geometry.ranks) {
        return;
    }
    let rank = index / geometry.pairs;
    let pair = index % geometry.pairs;
    let j = find_param(2u * (geometry.first_pair + pair), geometry.params);
    let s = scalars[rank * geometry.params + j];
    if ((s.flags & ACTIVE) == 0u) {
        return;
    }
    let base = rank * geometry.rank_words;
    let p = load_params(base, pair);
    var g = load_grads(base, pair);
    if ((s.flags & MAXIMIZE) != 0u) {
        g = -g;
    }
    if (s.weight_decay != 0.0) {
        g = rp(g + s.weight_decay * p);
    }
    if (s.momentum != 0.0) {
        var b = g;
        if ((s.flags & FIRST_STEP) == 0u) {
            let scaled = rp(load_momentum(base, pair) * s.momentum);
            b = rp(scaled + s.one_minus_dampening * g);
        }
        store_momentum(base, pair, b);
        if ((s.flags & NESTEROV) != 0u) {
            g = rp(g + s.momentum * b);
        } else {
            g = b;
        }
    }
    store_params(base, pair, rp(p + (-s.lr) * g));
}
