// #import packing
// #import param_table
// #import optim_math
//
// torch.optim.Adam / AdamW's single-tensor step over every rank and parameter of an arena
// chunk. The host precomputes each (rank, parameter)'s bias corrections from its own step
// count. Every tensor operation's result is rounded to the storage format (FORMAT); with the
// FUSED flag (PyTorch's `fused=True`) a value is rounded only when stored. The three
// multiply-adds PyTorch single-rounds (the L2 term, the lerp, the second moment's
// `(1 - beta2) * g * g` term) are single-rounded here too (`exact_fma`; see `adam_rank` in
// src/backend/kernels/adam.rs).

// From optim_math: `fused`, `one`, `r`, `add_scaled`, `exact_fma`. `struct
// AdamScalars` and the flag bits (ACTIVE, MAXIMIZE, AMSGRAD, DECOUPLED, FUSED) are declared in
// front of this file from the Rust side (`ADAM` in src/backend/gpu/contract.rs).

override FORMAT: u32 = 0u;

@group(0) @binding(0) var<uniform> geometry: Dispatch;
@group(0) @binding(1) var<storage, read> starts: array<u32>;
@group(0) @binding(2) var<storage, read> scalars: array<AdamScalars>;
@group(0) @binding(3) var<storage, read_write> params: array<vec4<u32>>; // #arena FORMAT
@group(0) @binding(4) var<storage, read> grads: array<vec4<u32>>; // #arena FORMAT
@group(0) @binding(5) var<storage, read_write> exp_avg: array<vec4<u32>>; // #arena FORMAT
@group(0) @binding(6) var<storage, read_write> exp_avg_sq: array<vec4<u32>>; // #arena FORMAT
@group(0) @binding(7) var<storage, read_write> max_exp_avg_sq: array<vec4<u32>>; // #arena FORMAT
// `// #arena FORMAT`: the assembler generates load_<binding> (and, read_write, store_<binding>)
// for the packed arena, in that storage format (src/backend/gpu/bindings.rs).

// Whether `a` is a NaN, from its bits: a compiler may fold `a != a` to false (llvmpipe does).
fn is_nan(a: f32) -> bool {
    return (bitcast<u32>(a) & 0x7fffffffu) > 0x7f800000u;
}

// torch.maximum: NaN wins.
fn nan_max(a: f32, b: f32) -> f32 {
    if (is_nan(a)) {
        return a;
    }
    if (is_nan(b)) {
        return b;
    }
    return max(a, b);
}

// The running maximum of four elements, the first `first` of its parameter: torch.maximum,
// but C++'s `std::max(old, v)` from `s.remainder_from` on (PyTorch's fused kernel's scalar
// remainder, where a NaN `v` keeps `old`; see `AdamScalars::remainder_from` in
// src/backend/kernels/tables.rs).
fn running_max4(v: vec4<f32>, old: vec4<f32>, first: u32, remainder_from: u32) -> vec4<f32> {
    var out = vec4<f32>(nan_max(v.x, old.x), nan_max(v.y, old.y), nan_max(v.z, old.z), nan_max(v.w, old.w));
    for (var l = 0u; l < 4u; l = l + 1u) {
        if (first + l >= remainder_from) {
            if (is_nan(old[l]) || is_nan(v[l])) {
                out[l] = old[l];
            } else {
                out[l] = select(old[l], v[l], old[l] < v[l]);
            }
        }
    }
    return out;
}


// One half (four elements) of the update: the new parameter, first and second moments, and
// the running maximum (amsgrad).
// `first`: the index of the first of the four elements in its parameter.
fn update(p_in: vec4<f32>, g_in: vec4<f32>, m_old: vec4<f32>, v_old: vec4<f32>, max_old: vec4<f32>, s: AdamScalars, first: u32) -> array<vec4<f32>, 4> {
    var p = p_in;
    var g = g_in;
    if ((s.flags & MAXIMIZE) != 0u) {
        g = -g;
    }
    if ((s.flags & DECOUPLED) != 0u) {
        p = r(p * s.decay_factor);
    } else if (s.weight_decay != 0.0) {
        g = add_scaled(g, s.weight_decay, p, first, s.half_tail_from);
    }
    // exp_avg.lerp_(grad, 1 - beta1), PyTorch's two-sided formula, one fused multiply-add.
    let w = s.one_minus_beta1;
    let diff = g - m_old;
    var m: vec4<f32>;
    if (w < 0.5) {
        m = r(exact_fma(vec4<f32>(w), diff, m_old));
    } else {
        m = r(exact_fma(vec4<f32>(w - 1.0), diff, g));
    }
    let v_scaled = r(v_old * s.beta2);
    let v = r(exact_fma(s.one_minus_beta2 * g, g, v_scaled));
    var second = v;
    if ((s.flags & AMSGRAD) != 0u) {
        second = running_max4(v, max_old, first, s.remainder_from);
    }
    let root = r(sqrt(second));
    // `(sqrt / bc2).add_(eps)`: eps becomes a tensor of the parameter's dtype first.
    let denom = r(r(root / s.bias_correction2_sqrt) + r(vec4<f32>(s.eps)));
    // `param.addcdiv_(exp_avg, denom, value=-step_size)`: `p + value * m / d`, left to right.
    return array<vec4<f32>, 4>(r(p + s.neg_step_size * m / denom), m, v, second);
}

// One invocation: lane `rank`, eight elements at `octet`, parameter `j` (param_table's `main`).
fn run(rank: u32, octet: u32, j: u32) {
    let s = scalars[rank * geometry.params + j];
    if ((s.flags & ACTIVE) == 0u) {
        return;
    }
    begin_update((s.flags & FUSED) != 0u, s.flags);
    let base = rank * geometry.rank_quads;
    let p = load_params(base, octet);
    let g = load_grads(base, octet);
    let m = load_exp_avg(base, octet);
    let v = load_exp_avg_sq(base, octet);
    let amsgrad = (s.flags & AMSGRAD) != 0u;
    var old_max = Eight(vec4<f32>(0.0), vec4<f32>(0.0));
    if (amsgrad) {
        old_max = load_max_exp_avg_sq(base, octet);
    }
    let first = 8u * (geometry.first_octet + octet) - starts[j];
    let lo = update(p.lo, g.lo, m.lo, v.lo, old_max.lo, s, first);
    let hi = update(p.hi, g.hi, m.hi, v.hi, old_max.hi, s, first + 4u);
    store_exp_avg(base, octet, Eight(lo[1], hi[1]));
    store_exp_avg_sq(base, octet, Eight(lo[2], hi[2]));
    if (amsgrad) {
        store_max_exp_avg_sq(base, octet, Eight(lo[3], hi[3]));
    }
    store_params(base, octet, Eight(lo[0], hi[0]));
}
