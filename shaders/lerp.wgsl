// #import packing
// #import param_table
// #import optim_math
//
// torch's `params.lerp_(end, weight)` over one chunk of two arenas of one layout, for the
// parameters whose flag is set (Streaming DiLoCo's merge of the synced and the local
// parameters): ATen's two-sided `lerp_vec`,
//
// Per element i:  params[i] = round_FORMAT(fma(c, end[i] - params[i], base))
//
// in float32 (the difference too), rounded once to the format, where `weight` holds `c`'s
// bits and which operand is the base: `c = w` and `base = params[i]` for a small weight
// (`|w| < 0.5`), else `c = w - 1` and `base = end[i]` (see `lerp_reference` in
// src/backend/kernels/lerp.rs). Other parameters are left alone.
//
// From optim_math: `begin_update`, `exact_fma`.

override FORMAT: u32 = 0u;

@group(0) @binding(0) var<uniform> geometry: Dispatch;
@group(0) @binding(1) var<storage, read> starts: array<u32>;
@group(0) @binding(2) var<storage, read> merged: array<u32>;
@group(0) @binding(3) var<storage, read> weight: array<u32, 2>;
@group(0) @binding(4) var<storage, read> end: array<vec4<u32>>; // #arena FORMAT
@group(0) @binding(5) var<storage, read_write> params: array<vec4<u32>>; // #arena FORMAT

fn lerp4(s: vec4<f32>, e: vec4<f32>, c: f32, from_end: bool) -> vec4<f32> {
    var base = s;
    if (from_end) {
        base = e;
    }
    return exact_fma(vec4<f32>(c), e - s, base);
}

// One invocation: lane `rank`, eight elements at `octet`, parameter `j` (param_table's `main`).
fn run(rank: u32, octet: u32, j: u32) {
    if (merged[j] == 0u) {
        return;
    }
    let from_end = weight[1] != 0u;
    // Rounded only when stored; `weight[1]` (0 or 1) gives `one` a value no compiler can see.
    begin_update(true, weight[1]);
    let c = bitcast<f32>(weight[0]);
    let base = rank * geometry.rank_quads;
    let s = load_params(base, octet);
    let e = load_end(base, octet);
    store_params(base, octet, Eight(lerp4(s.lo, e.lo, c, from_end), lerp4(s.hi, e.hi, c, from_end)));
}
