// torch.optim.Adam / AdamW's single-tensor step over every rank and parameter of an arena
// chunk. The host precomputes each (rank, parameter)'s bias corrections from its own step
// count. Every tensor operation's result is rounded to the storage format (FORMAT).

override FORMAT: u32 = 0u;

const ACTIVE: u32 = 1u;
const MAXIMIZE: u32 = 2u;
const AMSGRAD: u32 = 4u;
const DECOUPLED: u32 = 8u;

struct AdamScalars {
    flags: u32,
    weight_decay: f32,
    decay_factor: f32,
    one_minus_beta1: f32,
    beta2: f32,
    one_minus_beta2: f32,
    neg_step_size: f32,
    bias_correction2_sqrt: f32,
    eps: f32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> geometry: Dispatch;
@group(0) @binding(1) var<storage, read> starts: array<u32>;
@group(0) @binding(2) var<storage, read> scalars: array<AdamScalars>;
@group(0) @binding(3) var<storage, read_write> params: array<u32>;
@group(0) @binding(4) var<storage, read> grads: array<u32>;
@group(0) @binding(5) var<storage, read_write> exp_avg: array<u32>;
@group(0) @binding(6) var<storage, read_write> exp_avg_sq: array<u32>;
@group(0) @binding(7) var<storage, read_write> max_exp_avg_sq: array<u32>;

fn rp(x: vec2<f32>) -> vec2<f32> {
    return round_pair(FORMAT, x);
}

fn word_pair(a: u32, b: u32) -> vec2<f32> {
    return vec2<f32>(bitcast<f32>(a), bitcast<f32>(b));
}

fn load_params(base: u32, pair: u32) -> vec2<f32> {
    if (FORMAT == FORMAT_F32) {
        return word_pair(params[base + 2u * pair], params[base + 2u * pair + 1u]);
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
        return word_pair(grads[base + 2u * pair], grads[base + 2u * pair + 1u]);
    }
    return unpack_pair(FORMAT, grads[base + pair]);
}

fn load_exp_avg(base: u32, pair: u32) -> vec2<f32> {
    if (FORMAT == FORMAT_F32) {
        return word_pair(exp_avg[base + 2u * pair], exp_avg[base + 2u * pair + 1u]);
    }
    return unpack_pair(FORMAT, exp_avg[base + pair]);
}

fn store_exp_avg(base: u32, pair: u32, value: vec2<f32>) {
    if (FORMAT == FORMAT_F32) {
        exp_avg[base + 2u * pair] = bitcast<u32>(value.x);
        exp_avg[base + 2u * pair + 1u] = bitcast<u32>(value.y);
    } else {
        exp_avg[base + pair] = pack_pair(FORMAT, value);
    }
}

fn load_exp_avg_sq(base: u32, pair: u32) -> vec2<f32> {
    if (FORMAT == FORMAT_F32) {
        return word_pair(exp_avg_sq[base + 2u * pair], exp_avg_sq[base + 2u * pair + 1u]);
    }
    return unpack_pair(FORMAT, exp_avg_sq[base + pair]);
}

fn store_exp_avg_sq(base: u32, pair: u32, value: vec2<f32>) {
    if (FORMAT == FORMAT_F32) {
        exp_avg_sq[base + 2u * pair] = bitcast<u32>(value.x);
        exp_avg_sq[base + 2u * pair + 1u] = bitcast<u32>(value.y);
    } else {
        exp_avg_sq[base + pair] = pack_pair(FORMAT, value);
    }
}

fn load_max(base: u32, pair: u32) -> vec2<f32> {
    if (FORMAT == FORMAT_F32) {
        return word_pair(max_exp_avg_sq[base + 2u * pair], max_exp_avg_sq[base + 2u * pair + 1u]);
    }
    return unpack_pair(FORMAT, max_exp_avg_sq[base + pair]);
}

fn store_max(base: u32, pair: u32, value: vec2<f32>) {
    if (FORMAT == FORMAT_F32) {
        max_exp_avg_sq[base + 2u * pair] = bitcast<u32>(value.x);
        max_exp_avg_sq[base + 2u * pair + 1u] = bitcast<u32>(value.y);
    } else {
        max_exp_avg_sq[base + pair] = pack_pair(FORMAT, value);
    }
}

// torch.maximum: NaN wins.
fn nan_max(a: f32, b: f32) -> f32 {
    if (a != a) {
        return a;
    }
    if (b != b) {
        return b;
    }
    return max(a, b);
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
    var p = load_params(base, pair);
    var g = load_grads(base, pair);
    if ((s.flags & MAXIMIZE) != 0u) {
        g = -g;
    }
    if ((s.flags & DECOUPLED) != 0u) {
        p = rp(p * s.decay_factor);
    } else if (s.weight_decay != 0.0) {
        g = rp(g + s.weight_decay * p);
    }
    // exp_avg.lerp_(grad, 1 - beta1), PyTorch's two-sided formula.
    let m_old = load_exp_avg(base, pair);
    let w = s.one_minus_beta1;
    let diff = g - m_old;
    var m: vec2<f32>;
    if (w < 0.5) {
        m = rp(m_old + w * diff);
    } else {
        m = rp(g - diff * (1.0 - w));
    }
    store_exp_avg(base, pair, m);
    let v_scaled = rp(load_exp_avg_sq(base, pair) * s.beta2);
    let v = rp(v_scaled + (s.one_minus_beta2 * g) * g);
    store_exp_avg_sq(base, pair, v);
    var second = v;
    if ((s.flags & AMSGRAD) != 0u) {
        let old = load_max(base, pair);
        second = vec2<f32>(nan_max(v.x, old.x), nan_max(v.y, old.y));
        store_max(base, pair, second);
    }
    let root = rp(sqrt(second));
    let denom = rp(rp(root / s.bias_correction2_sqrt) + s.eps);
    let update = s.neg_step_size * (m / denom);
    store_params(base, pair, rp(p + update));
}
