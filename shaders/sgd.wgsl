// #import packing
// #import param_table
// #import optim_math
//
// torch.optim.SGD's single-tensor step over every rank and parameter of an arena chunk.
// Every tensor operation's result is rounded to the storage format (FORMAT); the arithmetic
// is float32, and PyTorch's `add(alpha=)` is one fused multiply-add but for the 16-bit
// formats' single-tensor arithmetic (`add_scaled`). With the FUSED flag (PyTorch's
// `fused=True`) a value is rounded only when stored (see `sgd_rank` in
// src/backend/kernels/sgd.rs).
// A parameter without a gradient on a rank (flags bit 0 clear) is skipped.

// From optim_math: `r`, `add_scaled`. `struct SgdScalars` and the flag bits (ACTIVE,
// FIRST_STEP, NESTEROV, MAXIMIZE, FUSED, FOREACH_MOMENTUM) are declared in front of this file from the Rust side
// (`SGD` in src/backend/gpu/contract.rs).

override FORMAT: u32 = 0u;

@group(0) @binding(0) var<uniform> geometry: Dispatch;
@group(0) @binding(1) var<storage, read> starts: array<u32>;
@group(0) @binding(2) var<storage, read> scalars: array<SgdScalars>;
@group(0) @binding(3) var<storage, read_write> params: array<vec4<u32>>; // #arena FORMAT
@group(0) @binding(4) var<storage, read> grads: array<vec4<u32>>; // #arena FORMAT
@group(0) @binding(5) var<storage, read_write> momentum: array<vec4<u32>>; // #arena FORMAT
// `// #arena FORMAT`: the assembler generates load_<binding> (and, read_write, store_<binding>)
// for the packed arena, in that storage format (src/backend/gpu/bindings.rs).


// One half (four elements) of the update; `b_old` is ignored on the first step. Under `fused`
// (PyTorch's `fused=True`): float32 throughout.
// `first`: the index of the first of the four elements in its parameter.
fn update(p: vec4<f32>, g_in: vec4<f32>, b_old: vec4<f32>, s: SgdScalars, first: u32) -> array<vec4<f32>, 2> {
    let t = s.half_tail_from;
    var g = g_in;
    if ((s.flags & MAXIMIZE) != 0u) {
        g = -g;
    }
    if (s.weight_decay != 0.0) {
        g = add_scaled(g, s.weight_decay, p, first, t);
    }
    var b = b_old;
    if (s.momentum != 0.0) {
        // The scalar of the buffer's `mul_`; `_foreach_mul_` (FOREACH_MOMENTUM) rounds it to
        // the format first.
        var decay = vec4<f32>(s.momentum);
        if ((s.flags & FOREACH_MOMENTUM) != 0u) {
            decay = r(decay);
        }
        if ((s.flags & FIRST_STEP) != 0u) {
            b = g;
        } else {
            b = add_scaled(r(b_old * decay), s.one_minus_dampening, g, first, t);
        }
        if ((s.flags & NESTEROV) != 0u) {
            g = add_scaled(g, s.momentum, b, first, t);
        } else {
            g = b;
        }
    }
    return array<vec4<f32>, 2>(add_scaled(p, -s.lr, g, first, t), b);
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
    var b = Eight(vec4<f32>(0.0), vec4<f32>(0.0));
    if (s.momentum != 0.0 && (s.flags & FIRST_STEP) == 0u) {
        b = load_momentum(base, octet);
    }
    let first = 8u * (geometry.first_octet + octet) - starts[j];
    let lo = update(p.lo, g.lo, b.lo, s, first);
    let hi = update(p.hi, g.hi, b.hi, s, first + 4u);
    if (s.momentum != 0.0) {
        store_momentum(base, octet, Eight(lo[1], hi[1]));
    }
    store_params(base, octet, Eight(lo[0], hi[0]));
}
